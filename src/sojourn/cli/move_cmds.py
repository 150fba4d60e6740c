"""``sojourn move WS --to MACHINE``: a live move (docs/moves.md)."""

from __future__ import annotations

import sys
from typing import Any

import click

from sojourn.cli.capsule_cmds import repo_option
from sojourn.cli.output import emit_json


def _say(message: str) -> None:
    click.echo(f"sojourn: {message}", err=True)


@click.command("move")
@click.argument("workspace")
@click.option("--to", "to", required=True,
              help="Where: `local` (this host), a Python interpreter (path or command), or a machine name.")
@repo_option
@click.option("--deadline", type=float, default=600.0, show_default=True,
              help="Seconds the program may take to reach a statement where it can pause.")
@click.option("--timeout", type=float, default=None,
              help="Seconds the source waits for the destination's restore (default: from the capsule's size).")
@click.option("--max-duration", default=None,
              help="Hard stop of the destination, e.g. 2h, 90m (default: the machine's max_duration).")
@click.option("--build-env", is_flag=True,
              help="Build the capsule's environment (uv, cached) for the destination interpreter if it lacks it.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for programs.")
def move_cmd(workspace: str, to: str, repo: str | None, deadline: float, timeout: float | None,
             max_duration: str | None, build_env: bool, as_json: bool) -> None:
    """Move a running WORKSPACE to another machine, live: it keeps running here until the
    destination has restored and checked its capsule, then carries on there.

    Exits 0 when moved, 1 when not (the program keeps running where it was, or the message
    says what state the workspace is in)."""
    from sojourn.ops.moves import move

    def progress(kind: str, info: dict[str, Any]) -> None:
        if kind == "launched" and not as_json:
            where = f" in {info['scratch']}" if info.get("scratch") else ""
            _say(f"move {info['move']}: destination {info['allocation']} starting on {info['provider']}:"
                 f"{info['machine']}{where}")

    res = move(workspace, to, repo=repo, deadline=deadline, timeout=timeout, max_duration=max_duration,
               on_progress=progress, build_env=build_env)
    if as_json:
        emit_json(res.to_json())
    elif res.moved:
        paused = f", paused {res.paused_ms:.0f} ms" if res.paused_ms is not None else ""
        _say(f"workspace {res.workspace} moved to {res.destination} on {res.provider}:{res.machine} ({res.python}): capsule "
             f"{res.capsule}{paused}; it runs there now")
    else:
        _say(f"workspace {res.workspace}: {res.message}; state {res.state}")
    sys.exit(0 if res.moved else 1)
