"""A detached supervisor: ``python -m sojourn.workspace.supervise --repo URL --workspace WS
--allocation AL --epoch N --machine JSON [--capsule CAP]``.

A provider starts this on the machine (``sojourn run --detach``; a live move's destination is
``python -m sojourn.workspace.incoming``, launched the same way). The epoch ``N`` was already taken for allocation ``AL`` by whoever launched it;
this process records the allocation (naming itself), puts the workspace's files in the
scratch directory, and supervises the session there (``onmachine.attach``): the same code as
a foreground ``sojourn run --on``, with the output going to the workspace log only.
Without ``--capsule`` it runs the workspace's script; with it, it resumes that capsule.

Its own messages (not the program's output) go to its stderr, which the local provider
keeps in ``$SOJOURN_HOME/machines/<machine>/<allocation>.log``. Exit code: as ``sojourn run``.
"""

from __future__ import annotations

import argparse
import sys

from sojourn.workspace.machine import MachineSpec


def supervise_argv(repo_url: str, workspace: str, allocation: str, epoch: int, machine: MachineSpec,
                   capsule: str | None = None, python: str | None = None) -> list[str]:
    """The command line that starts a detached supervisor (``python``: this interpreter)."""
    argv = [python or sys.executable, "-m", "sojourn.workspace.supervise", "--repo", repo_url,
            "--workspace", workspace, "--allocation", allocation, "--epoch", str(epoch), "--machine", machine.dumps()]
    return argv + (["--capsule", capsule] if capsule else [])


def main(argv: list[str] | None = None) -> int:
    import signal

    from sojourn.workspace import held

    # First: a signal while this supervisor starts up is served once it runs, not its death.
    held.hold((signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1))
    parser = argparse.ArgumentParser(prog="python -m sojourn.workspace.supervise")
    parser.add_argument("--repo", required=True)
    parser.add_argument("--workspace", required=True)
    parser.add_argument("--allocation", required=True)
    parser.add_argument("--epoch", type=int, required=True)
    parser.add_argument("--machine", required=True, help="the machine as JSON (workspace.machine.MachineSpec)")
    parser.add_argument("--capsule", default=None, help="resume this capsule (default: run the script)")
    parser.add_argument("--scan-interval", type=float, default=600.0)
    ns = parser.parse_args(argv)

    from sojourn.errors import SojournError
    from sojourn.repository.repo import open_repository
    from sojourn.workspace.onmachine import Prepared, attach
    from sojourn.workspace.store import WorkspaceStore

    try:
        machine = MachineSpec.from_json(ns.machine)
        with open_repository(ns.repo) as repo:
            store = WorkspaceStore(repo)
            rec = store.record(ns.workspace, save=False)
            if rec.holder != ns.allocation or rec.epoch != ns.epoch:
                print(f"sojourn: workspace {ns.workspace} is held by {rec.holder} (epoch {rec.epoch}), not by "
                      f"{ns.allocation} (epoch {ns.epoch}); nothing was started", file=sys.stderr)
                return 2
            p = Prepared(ns.workspace, rec.name, ns.allocation, ns.epoch, machine, ns.capsule)
            res = attach(store, p, scan_interval=ns.scan_interval)
    except SojournError as e:
        print(f"sojourn: error: {e}", file=sys.stderr)
        return 2
    print(f"sojourn: workspace {res.workspace} {res.state} ({res.reason}): {res.detail}", file=sys.stderr)
    return int(res.exit_code)


if __name__ == "__main__":
    sys.exit(main())
