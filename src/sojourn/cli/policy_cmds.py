"""``sojourn policy WS set NAME=VALUE ...`` / ``sojourn policy WS show``, and the policy steps
of ``run``/``resume``: ``--cheapest``, ``--policy``, the out-of-memory decision
(docs/offers-and-router.md, "Policies in action")."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from sojourn.cli.capsule_cmds import repo_option
from sojourn.cli.output import emit_json, table


def _say(message: str) -> None:
    click.echo(f"sojourn: {message}", err=True)


@click.group("policy")
@click.argument("workspace")
@repo_option
@click.pass_context
def policy_cmd(ctx: click.Context, workspace: str, repo: str | None) -> None:
    """A workspace's policies: when it moves, what happens when it runs out of memory or its
    GPU sits idle. Nothing spends money unless a setting says so; every decision is an event."""
    ctx.obj = {"workspace": workspace, "repo": repo}


@policy_cmd.command("set", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("settings", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON for programs.")
@click.pass_context
def set_cmd(ctx: click.Context, settings: tuple[str, ...], as_json: bool) -> None:
    """Change settings, NAME=VALUE each (auto_move=on oom=perform min_saving=25% remaining=2h).

    \b
    Settings (the defaults spend nothing):
      auto_move=on|off       move while running when another machine pays (off: propose)
      oom=off|propose|perform  after an out-of-memory stop: resume on a bigger machine
      gpu_idle=off|propose|perform  GPU idle for gpu_idle_after: a CPU machine
      min_saving=20%         auto-move: the target must be this much cheaper
      min_factor=3           auto-move: the saving must be this many times the move's cost
      gpu_idle_after=15m     how long the GPU must be idle
      interval=1m            how often the watcher evaluates a running workspace
      remaining=2h           estimate of the compute left, from now (auto-move needs one)
      watch=on|off           run the watcher (default: on with auto_move or gpu_idle)
      allow_doubtful=on|off  let policies choose prices the catalog marks doubtful
    """
    from sojourn.ops.policy import set_policy

    view = set_policy(ctx.obj["workspace"], list(settings), repo=ctx.obj["repo"])
    _show(view, as_json)


@policy_cmd.command("show")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for programs.")
@click.pass_context
def show_cmd(ctx: click.Context, as_json: bool) -> None:
    """The settings, what each policy would decide now (not recorded), the decisions recorded."""
    from sojourn.ops.policy import show_policy

    _show(show_policy(ctx.obj["workspace"], repo=ctx.obj["repo"]), as_json)


def _show(view: Any, as_json: bool) -> None:
    if as_json:
        emit_json(view.to_json())
        return
    cfg = view.settings.config
    given = view.settings.values
    click.echo(f"workspace   {view.workspace} ({view.state})")
    click.echo(f"auto_move   {'on' if cfg.auto_move else 'off (propose)'}; move when >= {cfg.min_fraction:.0%} cheaper "
               f"and the saving >= {cfg.min_factor:g} x the move's cost")
    click.echo(f"oom         {cfg.oom}")
    click.echo(f"gpu_idle    {cfg.gpu_idle} after {cfg.gpu_idle_after_s:g} s")
    rem = view.settings.remaining_s()
    click.echo(f"watcher     {'on' if view.settings.watch else 'off'}, every {view.settings.interval_s:g} s"
               + (f"; running (pid {view.watcher.get('pid')} on {view.watcher.get('host')})" if view.watcher else "")
               + (f"; remaining {rem:.0f} s" if rem is not None else "; remaining time unknown"))
    if given:
        click.echo("set         " + ", ".join(f"{k}={v}" for k, v in sorted(given.items()) if k != "remaining_at"))
    table("now (not recorded)", ["POLICY", "ACTION", "TARGET", "REASON"],
          [[d.policy, d.action, f"{d.target.provider}:{d.target.name}" if d.target else "-", d.reason]
           for d in view.now])
    if view.recorded:
        table("recorded", ["#", "POLICY", "ACTION", "TARGET", "REASON / OUTCOME"],
              [[e.get("seq"), e.get("policy"), e.get("action"), e.get("target") or e.get("machine") or "-",
                e.get("reason") or f"{e.get('outcome')}: {e.get('message') or ''}".rstrip(": ")]
               for e in view.recorded])
    for n in view.notes:
        click.echo(f"note: {n}", err=True)


# -- the steps of run/resume ---------------------------------------------------------------------


cheapest_options = [
    click.option("--cheapest", is_flag=True,
                 help="Run on the cheapest offer that fits --gpu/--gpus/--memory/--cpus/--spot (with --cheapest, "
                      "--memory is a requirement, not a limit)."),
    click.option("--gpu", default=None, help="With --cheapest: a GPU model (A100, H100...)."),
    click.option("--gpus", type=int, default=0, help="With --cheapest: this many GPUs."),
    click.option("--cpus", type=int, default=None, help="With --cheapest: at least this many CPUs."),
    click.option("--spot", is_flag=True, help="With --cheapest: spot offers only."),
    click.option("--policy", "policies", multiple=True, metavar="NAME=VALUE",
                 help="A policy setting for the new workspace (repeatable; see `sojourn policy WS set --help`)."),
]


def cheapest_options_of(f: Any) -> Any:
    for opt in reversed(cheapest_options):
        f = opt(f)
    return f


def choose(repo: str | None, memory: str | None, gpu: str | None, gpus: int, cpus: int | None, spot: bool) -> str:
    """``--cheapest``: the machine to run on (says which offer and why)."""
    from sojourn.ops.policy import choose_machine
    from sojourn.providers.base import Requirements
    from sojourn.workspace.sessions import parse_size

    req = Requirements(memory=parse_size(memory), cpus=cpus, gpus=gpus or (1 if gpu else 0), gpu=gpu,
                       spot=True if spot else None)
    c = choose_machine(req, repo=repo)
    o = c.offer
    mem = f", {o.memory / 2**30:.1f} GiB" if o.memory else ""
    _say(f"cheapest offer that fits: {o.provider}:{o.name} (${o.price:.4g}/h{mem}, {o.cpus or '?'} CPUs"
         f"{f', {o.gpus} x {o.gpu}' if o.gpus else ''}), machine {c.machine}, of {c.considered} offer(s)")
    return c.machine


def apply_policies(workspace: str, policies: tuple[str, ...], repo: str | None) -> None:
    """``--policy``: record the settings and start the watcher when they need one."""
    from sojourn.ops.policy import set_policy

    if policies:
        set_policy(workspace, list(policies), repo=repo)


def keep_watching(workspace: str, repo: str | None) -> None:
    """A resumed workspace whose settings want a watcher gets one again."""
    from sojourn.ops.policy import settings_of
    from sojourn.ops.policyrun import ensure_watcher
    from sojourn.ops.workspaces import _Workspaces

    with _Workspaces(repo) as store:
        ws = store.resolve(workspace)
        if settings_of(store.events(ws)).watch:
            ensure_watcher(store, ws)


def after_oom(result: Any, repo: str | None, on_output: Callable[[str, bytes], None],
              on_start: Callable[[Any], None]) -> Any | None:
    """The OOM policy after a foreground session stopped out of memory: say what it proposes,
    or (``oom=perform``) resume on that machine in the foreground. Returns the resumed
    session's result, or None when nothing was resumed here."""
    from sojourn import ops
    from sojourn.ops.policy import after_oom as decide
    from sojourn.ops.policy import record_result

    if result.reason != "oom" or result.state != "suspended":
        return None
    h = decide(result.workspace, repo=repo)
    if h is None:
        return None
    _say(h.message())
    if not (h.claimed and h.event and h.event.get("action") == "resume" and h.machine):
        return None
    try:
        res = ops.resume(result.workspace, repo=repo, on=h.machine, on_output=on_output, on_start=on_start)
    except Exception as e:
        record_result(result.workspace, "oom", "resume", "error", repo=repo, machine=h.machine, message=str(e))
        _say(f"the policy's resume on {h.machine} failed: {e}")
        return None
    record_result(result.workspace, "oom", "resume", "resumed", repo=repo, machine=h.machine,
                  allocation=getattr(res, "allocation", None))
    return res


def register(group: click.Group) -> None:
    group.add_command(policy_cmd)
