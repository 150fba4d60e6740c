"""``sojourn fork``, ``sojourn history`` and ``sojourn gc``."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from sojourn import ops
from sojourn.cli.capsule_cmds import repo_option
from sojourn.cli.output import emit_json, human_size, table

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for programs.")


def _say(message: str) -> None:
    click.echo(f"sojourn: {message}", err=True)


@click.command("fork")
@click.argument("workspace")
@repo_option
@click.option("--name", default=None, help="Name of the new workspace (default: WORKSPACE's name + '-fork').")
@click.option("--capsule", default=None,
              help="Fork from this capsule of WORKSPACE (id or unique prefix; default: its last good one).")
@click.option("--now", is_flag=True,
              help="Ask the running WORKSPACE for a checkpoint first and fork from it (it keeps running).")
@click.option("--deadline", type=float, default=600.0, show_default=True,
              help="With --now: seconds the program may take to reach a statement where it can pause.")
@json_option
def fork_cmd(workspace: str, repo: str | None, name: str | None, capsule: str | None, now: bool,
             deadline: float, as_json: bool) -> None:
    """Make a new workspace that carries on from a capsule of WORKSPACE.

    The fork is suspended: `sojourn resume NEW` runs it. WORKSPACE itself is untouched (it
    may be running); the two then go their own ways and share every chunk they have in common.
    """
    with _refusal(as_json):
        res = ops.fork(workspace, repo=repo, name=name, capsule=capsule, now=now, deadline=deadline or None,
                       on_progress=_waiting)
    if as_json:
        emit_json(res.to_json())
        return
    click.echo(res.workspace)
    _say(f"workspace {res.workspace} ({res.name}) forked from {res.source_name} at {res.capsule}; {res.hint}")


def _waiting(kind: str, ev: dict[str, Any]) -> None:
    if kind == "waiting":
        _say(f"waiting for the program to reach a statement where it can pause ({ev.get('seconds', 0):.0f} s): "
             f"{ev.get('why')}")


@contextmanager
def _refusal(as_json: bool) -> Iterator[None]:
    """A refused checkpoint: say why (each object that cannot travel) and exit 1."""
    from sojourn.workspace.requests import PauseRefused

    try:
        yield
    except PauseRefused as e:
        if as_json:
            emit_json({"ok": False, "refused": str(e), "problems": e.problems})
        lines = [f"checkpoint refused; the program keeps running: {e}"]
        if e.problems and str(e).count("\n") == 0:
            lines += [f"  - {p['path']} ({p['type']}): {p['reason']}" for p in e.problems]
        _say("\n".join(lines))
        sys.exit(1)


@click.command("checkpoint")
@click.argument("workspace")
@repo_option
@click.option("--deadline", type=float, default=600.0, show_default=True,
              help="Seconds the program may take to reach a statement where it can pause (0: no limit).")
@json_option
def checkpoint_cmd(workspace: str, repo: str | None, deadline: float, as_json: bool) -> None:
    """Take a checkpoint of a running WORKSPACE: a capsule written between two statements while
    the program keeps running. Prints its id once it passed the write check; it is then the
    workspace's last good capsule (`sojourn fork --capsule`, or what a crash resumes from)."""
    with _refusal(as_json):
        res = ops.checkpoint(workspace, repo=repo, deadline=deadline or None, on_progress=_waiting)
    if as_json:
        emit_json({"ok": True, **res.to_json()})
        return
    click.echo(res.capsule.id)
    _say(f"workspace {res.workspace}: checkpoint {res.capsule.id} at {res.capsule.where} in {res.seconds:.2f} s "
         f"({human_size(res.capsule.size)}, checked); the program keeps running")


def _when(node: Any) -> str:
    if node.time:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(node.time))
    if node.created:
        return node.created.replace("T", " ").rstrip("Z") + " UTC"
    return "-"


def _label(node: Any, names: dict[str, str]) -> str:
    from rich.markup import escape

    if node.missing:
        return f"[dim]{node.capsule[:16]}  ({escape(node.missing)})[/dim]"
    parts = [f"[bold]{node.capsule[:16]}[/bold]", _when(node), human_size(node.size), escape(node.reason)]
    who = node.workspace_name or (node.workspace or "no workspace")
    where = " ".join(x for x in (node.allocation, node.machine) if x)
    parts.append(escape(f"{who}" + (f" {where}" if where else "")))
    if node.verified is False:
        parts.append("[red]failed its check[/red]")
    text = "  ".join(parts)
    if node.last_of:
        text += "  [green]← " + ", ".join(escape(names.get(w, w)) for w in node.last_of) + "[/green]"
    for f in node.forks:
        text += f"  [magenta]⑂ fork → {escape(f['name'])} ({f['workspace']})[/magenta]"
    return text


@click.command("history")
@click.argument("workspace")
@repo_option
@json_option
def history_cmd(workspace: str, repo: str | None, as_json: bool) -> None:
    """The capsule DAG of WORKSPACE and of every workspace forked from it: each capsule's
    time, size, reason and allocation, where forks branch off, and what each workspace stands
    on now (←)."""
    h = ops.history(workspace, repo=repo)
    if as_json:
        emit_json(h.to_json())
        return
    from rich.console import Console
    from rich.tree import Tree

    names = {w["id"]: w["name"] for w in h.workspaces}
    nodes = {n.capsule: n for n in h.nodes}
    tree = Tree(f"[bold]{h.name}[/bold] ({h.workspace}): {len(h.nodes)} capsule(s), "
                f"{len(h.workspaces)} workspace(s)")

    def add(branch: Any, cap: str) -> None:
        node = nodes[cap]
        sub = branch.add(_label(node, names))
        for child in node.children:
            add(sub, child)

    for root in h.roots:
        add(tree, root)
    Console().print(tree)
    table("workspaces", ["WORKSPACE", "NAME", "STATE", "FORKED FROM", "STANDS ON"],
          [[w["id"], w["name"], w["state"],
            f"{w['forked_from']['name']} at {str(w['forked_from']['capsule'])[:16]}" if w["forked_from"] else "-",
            (w["last_capsule"] or "-")[:16]] for w in h.workspaces])


@click.command("gc")
@repo_option
@click.option("--dry-run", is_flag=True, help="Say what would be deleted and how many bytes it frees; delete nothing.")
@click.option("--keep-last", type=int, default=None,
              help="Also prune each workspace's capsules older than its N newest (never the one it stands on, "
                   "a fork point, or those of a running workspace).")
@click.option("--prune-orphans", is_flag=True,
              help="Also prune capsules that belong to no workspace (written by sojourn.capture).")
@click.option("--wait", type=float, default=300.0, show_default=True,
              help="Seconds to wait for captures in progress to finish before giving up.")
@json_option
def gc_cmd(repo: str | None, dry_run: bool, keep_last: int | None, prune_orphans: bool, wait: float,
           as_json: bool) -> None:
    """Delete the chunks that no kept capsule needs.

    Every capsule is kept (history keeps working) unless --keep-last or --prune-orphans
    prunes it. Safe while programs capture: gc waits for captures in progress, and captures
    that start meanwhile wait for gc.
    """
    def progress(kind: str, data: dict[str, Any]) -> None:
        if kind == "waiting" and not as_json:
            _say(f"waiting for {data['captures']} capture(s) in progress to finish")

    res = ops.gc(repo=repo, keep_last=keep_last, prune_orphans=prune_orphans, dry_run=dry_run, wait=wait,
                 on_progress=progress)
    if as_json:
        emit_json(res.to_json())
        return
    verb = "would delete" if res.dry_run else "deleted"
    if res.capsules_pruned:
        table(f"capsules pruned{' (dry run)' if res.dry_run else ''}", ["CAPSULE"],
              [[c] for c in res.capsules_pruned])
    click.echo(f"{verb} {res.chunks_deleted} of {res.chunks} chunk(s), {human_size(res.bytes_freed)}; "
               f"{verb} {len(res.capsules_pruned)} capsule(s), kept {res.capsules_kept} "
               f"({len(res.orphans)} of no workspace) in {res.seconds:.2f} s")
    for note in res.notes:
        _say(note)
