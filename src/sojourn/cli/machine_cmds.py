"""``sojourn machines`` (list), ``machines set NAME ...`` and ``machines remove NAME``."""

from __future__ import annotations

import click

from sojourn import ops
from sojourn.cli.capsule_cmds import repo_option
from sojourn.cli.output import emit_json, human_size, table

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for programs.")


def _duration(seconds: float | None) -> str:
    from sojourn.workspace.machine import format_duration

    return format_duration(seconds)


def _python(m: ops.MachineInfo) -> str:
    if m.python_error:
        return f"MISSING: {m.python or 'python'}"
    return f"{m.python_path} ({m.python_version})"


def _show(rows: list[ops.MachineInfo]) -> None:
    table(None, ["NAME", "PROVIDER", "CPUS", "MEMORY", "PYTHON", "PRICE/H", "MAX DURATION"],
          [[m.name, m.provider, m.cpus or "all", human_size(m.memory) if m.memory else "no limit", _python(m),
            f"${m.price_per_hour:.2f}", _duration(m.max_duration)] for m in rows])


@click.group("machines", invoke_without_command=True)
@repo_option
@json_option
@click.pass_context
def machines_cmd(ctx: click.Context, repo: str | None, as_json: bool) -> None:
    """List the machines sessions can run on (`sojourn run --on NAME`): limits, interpreter,
    price. They live in the repository (config/machines.toml); without a config there is one,
    `local`: this host, no limit, this Python, price 0."""
    if ctx.invoked_subcommand is not None:
        return
    rows = ops.machines(repo)
    if as_json:
        emit_json([m.to_json() for m in rows])
        return
    _show(rows)
    if not any(m.configured for m in rows):
        click.echo("(the default machine; `sojourn machines set NAME --memory 2GiB --cpus 1 --price 0.10` adds one)",
                   err=True)
    for m in rows:
        if m.python_error:
            click.echo(f"sojourn: machine {m.name}: {m.python_error}", err=True)


@machines_cmd.command("set")
@click.argument("name")
@repo_option
@click.option("--memory", default=None, help="Memory limit of its sessions, e.g. 2GiB ('none': no limit).")
@click.option("--cpus", default=None, help="CPUs its sessions run on ('none': all).")
@click.option("--python", "python", default=None, help="Interpreter: a command on PATH or a path ('none': sojourn's).")
@click.option("--price", "price", type=float, default=None, help="Price per hour in USD, for the spend.")
@click.option("--max-duration", default=None, help="Default hard stop, e.g. 2h, 90m ('none': no hard stop).")
@click.option("--provider", default=None, help="Provider of the machine (default: local).")
@json_option
def set_cmd(name: str, repo: str | None, memory: str | None, cpus: str | None, python: str | None,
            price: float | None, max_duration: str | None, provider: str | None, as_json: bool) -> None:
    """Add machine NAME, or change the settings given."""
    m = ops.set_machine(name, repo=repo, provider=provider, memory=memory, cpus=cpus, python=python,
                        price_per_hour=price, max_duration=max_duration)
    if as_json:
        emit_json(m.to_json())
        return
    _show([m])
    if m.python_error:
        click.echo(f"sojourn: warning: machine {m.name}: {m.python_error}; sessions cannot start on it until "
                   "that is fixed", err=True)


@machines_cmd.command("sign")
@repo_option
def sign_cmd(repo: str | None) -> None:
    """Sign config/machines.toml with the repository key after editing it by hand. Its
    interpreters, hosts and provider options are used only when signed: check what it says
    first (printed here), since signing vouches for all of it."""
    text = ops.sign_machines(repo=repo)
    click.echo(text, nl=False)
    click.echo("sojourn: machines.toml signed with the repository key", err=True)


@machines_cmd.command("remove")
@click.argument("name")
@repo_option
def remove_cmd(name: str, repo: str | None) -> None:
    """Remove machine NAME from the config (workspaces that ran on it keep their records)."""
    ops.remove_machine(name, repo=repo)
    click.echo(f"sojourn: machine {name} removed", err=True)
