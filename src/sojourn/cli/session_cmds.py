"""``sojourn run``, ``resume``, ``suspend``, ``ps``, ``show`` and ``logs``."""

from __future__ import annotations

import sys
import time
from typing import Any

import click

from sojourn import ops
from sojourn.cli import policy_cmds
from sojourn.cli.capsule_cmds import repo_option
from sojourn.cli.output import emit_json, human_size, table

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for programs.")


def _when(t: float | None) -> str:
    if not t:
        return "-"
    if time.strftime("%Y-%m-%d", time.localtime(t)) == time.strftime("%Y-%m-%d"):
        return time.strftime("%H:%M:%S", time.localtime(t))
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t))


def _say(message: str) -> None:
    click.echo(f"sojourn: {message}", err=True)


def _echo(stream: str, data: bytes) -> None:
    out = sys.stdout if stream == "stdout" else sys.stderr
    out.flush()
    out.buffer.write(data)
    out.buffer.flush()


def _started(start: Any) -> None:
    verb = f"resumed from {start.capsule}" if start.capsule else "started"
    where = f" on {start.machine} (in {start.scratch})" if getattr(start, "machine", None) else ""
    _say(f"workspace {start.workspace} ({start.name}) {verb}{where}; `sojourn suspend {start.workspace}` pauses it")


def _detached(d: Any, as_json: bool = False) -> None:
    """A detached run: its workspace id on stdout, how to follow it on stderr."""
    if as_json:
        emit_json({"ok": True, **d.to_json()})
        return
    click.echo(d.workspace)
    verb = f"resumed from {d.capsule}" if d.capsule else "started"
    _say(f"workspace {d.workspace} ({d.name}) {verb} on {d.machine} in the background (pid "
         f"{d.handle.get('data', {}).get('pid')}); `sojourn logs -f {d.workspace}` follows it, "
         f"`sojourn suspend {d.workspace}` pauses it")


machine_options = [
    click.option("--on", "on", default=None, metavar="MACHINE",
                 help="Run on a machine of `sojourn machines`: in its own scratch directory, on a copy of the "
                      "working directory's files, with its Python and limits."),
    click.option("--max-duration", default=None, metavar="DURATION",
                 help="Hard stop, e.g. 2h, 90m, 30s: the session is suspended then (default: the machine's)."),
    click.option("--detach", is_flag=True,
                 help="Start the supervisor in the background on the machine (default: local) and print the "
                      "workspace id; `sojourn logs -f WS` follows it."),
]


def _machine_options(f: Any) -> Any:
    for opt in reversed(machine_options):
        f = opt(f)
    return f


def _finish(result: Any, repo: str | None = None) -> None:
    """Say how the session ended (unless it simply finished) and exit with its code."""
    if result.reason == "oom":  # issue 6: the OOM policy proposes a machine, or resumes there
        from sojourn.cli.policy_cmds import after_oom

        resumed = after_oom(result, repo, _echo, _started)
        if resumed is not None:
            _finish(resumed, repo)
    ws = result.workspace
    cap = result.capsule
    if result.reason == "oom" and cap is not None and cap.verified:
        _say(f"workspace {ws} ran out of memory at {cap.where}; its state is in capsule {cap.id} "
             f"({human_size(cap.size)}), positioned at the failing statement. Resume it with more memory: "
             f"`sojourn resume {ws}` (without --memory, or with a bigger one)")
    elif result.reason == "hard-stop" and result.state == "suspended" and cap is not None and cap.verified:
        _say(f"workspace {ws} reached its hard stop and was suspended at {cap.where}: capsule {cap.id} "
             f"({human_size(cap.size)}, checked); `sojourn resume {ws}` carries on ({result.detail.split(':')[0]})")
    elif result.state == "suspended" and cap is not None and cap.verified:
        _say(f"workspace {ws} suspended at {cap.where}: capsule {cap.id} ({human_size(cap.size)}, checked); "
             f"`sojourn resume {ws}` carries on")
    elif result.reason != "finished":
        _say(f"workspace {ws} {result.state} ({result.reason}): {result.detail}. Next: {result.next_action.hint}")
    sys.exit(result.exit_code)


@click.command("run", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@repo_option
@click.option("--name", default=None, help="A name for the workspace (default: the script's, made unique).")
@click.option("--python", "python", default=None, help="Interpreter for the session (default: this one).")
@click.option("--memory", default=None, help="Memory limit of the session, e.g. 512MiB or 4G.")
@click.option("--scan-interval", type=float, default=600.0, show_default=True,
              help="Seconds between background checks that warn about state a pause would refuse (0: never).")
@_machine_options
@policy_cmds.cheapest_options_of
@click.argument("script")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def run_cmd(repo: str | None, name: str | None, python: str | None, memory: str | None, scan_interval: float,
            on: str | None, max_duration: str | None, detach: bool, cheapest: bool, gpu: str | None, gpus: int,
            cpus: int | None, spot: bool, policies: tuple[str, ...], script: str, args: tuple[str, ...]) -> None:
    """Run SCRIPT with ARGS as __main__ in the current directory, in a new workspace.

    SIGTERM or SIGUSR1 (to this command or to the session), or `sojourn suspend`, pause it
    between two statements; `sojourn resume` carries it on. Exits with the script's own code
    when it finishes, 75 when it paused, 77 when it ran out of memory and was captured.
    """
    if cheapest:  # issue 6: the machine is the cheapest offer that fits
        if on:
            raise click.UsageError("--cheapest chooses the machine: leave out --on")
        on, memory = policy_cmds.choose(repo, memory, gpu, gpus, cpus, spot), None
    elif gpu or gpus or cpus or spot:
        raise click.UsageError("--gpu, --gpus, --cpus and --spot are requirements for --cheapest")

    def started(start: Any) -> None:
        _started(start)
        policy_cmds.apply_policies(start.workspace, policies, repo)

    result = ops.run(script, list(args), repo=repo, name=name, python=python, memory=memory,
                     on_output=_echo, on_start=started, scan_interval=scan_interval, on=on,
                     max_duration=max_duration, detach=detach)
    if isinstance(result, ops.DetachedSession):
        policy_cmds.apply_policies(result.workspace, policies, repo)
        _detached(result)
        return
    _finish(result, repo)


@click.command("resume")
@click.argument("workspace")
@repo_option
@click.option("--python", "python", default=None,
              help="Interpreter for the session (default: the one the workspace last ran with).")
@click.option("--memory", default=None, help="Memory limit of the session, e.g. 512MiB or 4G (default: none).")
@_machine_options
@click.option("--build-env", is_flag=True,
              help="Build the capsule's environment (uv, cached) for the interpreter if it lacks it.")
@click.option("--env-mode", type=click.Choice(["exact", "compatible"]), default="exact", show_default=True,
              help="With --build-env: the recorded versions, or the same major versions.")
def resume_cmd(workspace: str, repo: str | None, python: str | None, memory: str | None, on: str | None,
               max_duration: str | None, detach: bool, build_env: bool, env_mode: str) -> None:
    """Carry WORKSPACE on from its last capsule, in a new process, in the foreground (a
    workspace that last ran on a machine goes back to it unless --on says another)."""
    def started(start: Any) -> None:
        _started(start)
        policy_cmds.keep_watching(start.workspace, repo)

    result = ops.resume(workspace, repo=repo, python=python, memory=memory, on_output=_echo, on_start=started,
                        on=on, max_duration=max_duration, detach=detach, build_env=build_env, env_mode=env_mode)
    if isinstance(result, ops.DetachedSession):
        policy_cmds.keep_watching(result.workspace, repo)
        _detached(result)
        return
    _finish(result, repo)


@click.command("suspend")
@click.argument("workspace")
@repo_option
@click.option("--deadline", type=float, default=600.0, show_default=True,
              help="Seconds the program may take to reach a statement where it can pause; then the pause "
                   "is given up and it keeps running (0: no limit).")
@json_option
def suspend_cmd(workspace: str, repo: str | None, deadline: float, as_json: bool) -> None:
    """Pause a running WORKSPACE between two statements; print its capsule id once the capsule
    is written and checked and the session has exited."""
    from sojourn.workspace.requests import PauseRefused

    def progress(kind: str, ev: dict[str, Any]) -> None:
        if kind == "waiting":
            _say(f"waiting for the program to reach a statement where it can pause "
                 f"({ev.get('seconds', 0):.0f} s): {ev.get('why')}")

    try:
        res = ops.suspend(workspace, repo=repo, deadline=deadline or None, on_progress=progress)
    except KeyboardInterrupt:
        _say("stopped waiting; the pause request stays with the session, which pauses when it can "
             "(or gives up at the deadline); `sojourn show` tells what happened")
        sys.exit(130)
    except PauseRefused as e:
        lines = [f"pause refused; the program keeps running: {e}"]
        if e.problems and str(e).count("\n") == 0:
            lines += [f"  - {p['path']} ({p['type']}): {p['reason']}" for p in e.problems]
        if as_json:
            emit_json({"ok": False, "refused": str(e), "problems": e.problems})
        _say("\n".join(lines))
        sys.exit(1)
    if as_json:
        emit_json({"ok": True, **res.to_json()})
        return
    click.echo(res.capsule.id)
    _say(f"workspace {res.workspace} suspended at {res.capsule.where} in {res.seconds:.2f} s "
         f"({human_size(res.capsule.size)}, checked); `sojourn resume {res.workspace}` carries on")


@click.command("ps")
@repo_option
@json_option
def ps_cmd(repo: str | None, as_json: bool) -> None:
    """List workspaces: state, where, last capsule, size."""
    rows = ops.ps(repo)
    if as_json:
        emit_json([r.to_json() for r in rows])
        return
    table(None, ["WORKSPACE", "NAME", "STATE", "WHERE", "LAST CAPSULE", "SIZE", "SPEND", "UPDATED"],
          [[r.id, r.name, r.state + (f" ({r.stop_reason})" if r.stop_reason and r.stop_reason != r.state else ""),
            r.where, (r.last_capsule or "-")[:20], human_size(r.size) if r.size else "-", f"${r.spend:.2f}",
            _when(r.updated)] for r in rows])


@click.command("show")
@click.argument("workspace")
@repo_option
@json_option
def show_cmd(workspace: str, repo: str | None, as_json: bool) -> None:
    """Show a workspace's record: state, command, allocations, capsules, events."""
    detail = ops.show(workspace, repo)
    if as_json:
        emit_json(detail.to_json())
        return
    from sojourn.workspace.records import describe_event

    rec = detail.record
    c = rec.command
    req = rec.requirements
    click.echo(f"workspace   {rec.id} ({rec.name})")
    click.echo(f"state       {rec.state}" + (f" ({rec.stop_reason}: {rec.detail})" if rec.stop_reason else ""))
    click.echo(f"authority   epoch {rec.epoch}, held by {rec.holder}")
    click.echo(f"command     {c.script} {' '.join(c.argv)}".rstrip())
    click.echo(f"in          {c.cwd} with {c.python}")
    cap = rec.last_capsule
    click.echo(f"capsule     {cap.id} ({human_size(cap.size)}) at {cap.where}" if cap else "capsule     -")
    click.echo(f"next        {rec.next_action.hint}")
    hw = req.get("memory_high_water")
    click.echo(f"requires    Python {req.get('python', '?')}, {req.get('arch', '?')}"
               + (f", memory high-water {human_size(hw)}" if hw else "")
               + (f", {len(req.get('packages') or {})} package(s)" if req.get("packages") else ""))
    table("allocations", ["ALLOCATION", "WHERE", "PID", "PYTHON", "START", "END", "STOP", "EXIT", "MAX RSS", "SPEND"],
          [[a.id, f"{a.provider}:{a.machine}", a.session_pid or a.pid or "-", a.python_version or "-",
            _when(a.started), _when(a.ended), a.stop_reason or "running", "-" if a.exit_code is None else a.exit_code,
            human_size(a.max_rss) if a.max_rss else "-", _spend(a)] for a in rec.allocations])
    _show_machines(rec)
    if rec.files:
        f = rec.files
        table(f"files ({f.get('count')} file(s), {human_size(int(f.get('bytes') or 0))}, in {f.get('capsule')})",
              ["PATH", "SIZE", "MODE", "HASH"],
              [[e["path"], human_size(e["size"]), oct(e["mode"]), (e.get("hash") or e.get("target", ""))[:16]]
               for e in detail.files[:50]])
        if len(detail.files) > 50:
            click.echo(f"... and {len(detail.files) - 50} more (`sojourn show --json` lists every file)")
    if rec.capsules:
        table("capsules", ["CAPSULE", "REASON", "WHERE", "SIZE", "CHECK"],
              [[k.id, k.reason, k.where, human_size(k.size), "ok" if k.verified else f"FAILED: {k.error}"]
               for k in rec.capsules])
    table("events", ["#", "TIME", "EPOCH", "EVENT"],
          [[e["seq"], _when(e.get("t")), e.get("epoch"), ("(stale) " if e.get("stale") else "") + describe_event(e)]
           for e in detail.events])


def _spend(a: Any) -> str:
    if a.price_per_hour and a.ended is None:
        return f"${a.price_per_hour:.2f}/h"
    return f"${a.spend:.2f}" if a.spend >= 0.01 or not a.spend else f"${a.spend:.4f}"


def _show_machines(rec: Any) -> None:
    """Where each allocation on a machine ran: the offer, its scratch directory, its hard stop."""
    rows = [[a.id, a.machine, f"${a.price_per_hour:.2f}/h", _when(a.hard_stop) if a.hard_stop else "-",
             a.scratch] for a in rec.allocations if a.scratch]
    if rows:
        table("machines", ["ALLOCATION", "MACHINE", "PRICE", "HARD STOP", "SCRATCH"], rows)


@click.command("logs")
@click.argument("workspace")
@repo_option
@click.option("--stream", type=click.Choice(["all", "stdout", "stderr"]), default="all", show_default=True)
@click.option("--follow", "-f", is_flag=True, help="Keep printing new output until the workspace stops running.")
@json_option
def logs_cmd(workspace: str, repo: str | None, stream: str, follow: bool, as_json: bool) -> None:
    """The workspace's whole output, continuous across every process it ran in (stdout to
    stdout, stderr to stderr)."""
    if follow and not as_json:
        for r in ops.follow_logs(workspace, repo):
            if stream in ("all", r.stream):
                _echo(r.stream, r.data)
        return
    log = ops.logs(workspace, repo)
    if as_json:
        data = log.to_json()
        if stream != "all":
            data["records"] = [r for r in data["records"] if r["stream"] == stream]
        emit_json(data)
        return
    for r in log.records:
        if stream in ("all", r.stream):
            _echo(r.stream, r.data)


def register(group: click.Group) -> None:
    for cmd in (run_cmd, resume_cmd, suspend_cmd, ps_cmd, show_cmd, logs_cmd):
        group.add_command(cmd)
