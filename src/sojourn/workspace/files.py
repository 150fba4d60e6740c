"""The workspace's files: a snapshot of the working directory in the repository, and its
materialization in a machine's scratch directory.

A snapshot is a capsule with an empty namespace and a file manifest (the same manifest every
capsule carries with ``files=``; see ``capsule/workspace_files.py``): path, size, mode and
content hash per file, contents in content-addressed chunks, so a snapshot of an unchanged
tree writes no new chunk. Making it a capsule gives it the capsule's signature, integrity
checks and lifetime (it is named by the workspace's ``files`` event, so ``gc`` keeps it).

A ``files`` event names the capsule that holds the workspace's current file manifest:

* ``sojourn run --on MACHINE`` snapshots the working directory before the session starts;
* each capsule a session on a machine writes carries the scratch directory's files, and the
  supervisor records it as the new manifest;
* ``sojourn resume --on MACHINE`` materializes the manifest of the capsule it resumes from
  (or, for a capsule written without files, the workspace's last ``files`` snapshot).

Left out of a snapshot: ``.git``, ``__pycache__``, ``.venv*``, ``*.pyc`` and the repository
itself when it lies inside the directory (``workspace_files.snapshot`` decides that).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sojourn.repository.repo import Repository, sojourn_home
from sojourn.workspace import records as R
from sojourn.workspace.errors import WorkspaceError

LABEL = "sojourn.files"


@dataclass
class FilesSnapshot:
    capsule: str
    source: str
    count: int
    bytes: int
    skipped: list[str]

    def event(self, allocation: str | None) -> dict[str, Any]:
        return {"type": "files", "capsule": self.capsule, "source": self.source, "count": self.count,
                "bytes": self.bytes, "allocation": allocation, "skipped": self.skipped[:20]}


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def snapshot(repo: Repository, root: str | Path, *, workspace: str | None) -> FilesSnapshot:
    """Write the files under ``root`` into the repository as a files-only capsule."""
    from sojourn.capsule.capture import capture_namespace
    from sojourn.errors import CaptureError

    root = Path(root).absolute()
    home = sojourn_home().expanduser().absolute()
    if _inside(home.resolve(), root.resolve()):
        raise WorkspaceError(f"{root} holds sojourn's own directory {home} (machines' scratch directories, keys): "
                             "its files would be copied into every machine. Run from your project's directory, "
                             "or set SOJOURN_HOME to a place outside it")
    try:
        m = capture_namespace({}, repo, files=root, labels={LABEL: {"workspace": workspace, "source": str(root)}})
    except CaptureError as e:
        raise WorkspaceError(f"the files of {root} could not be copied into the repository: {e}") from e
    files = m.files or {}
    return FilesSnapshot(m.id, str(root), int(files.get("files", 0)), int(files.get("bytes", 0)),
                         list(files.get("skipped") or []))


def capsule_files(repo: Repository, capsule: str) -> dict[str, Any] | None:
    """The ``manifest.files`` of a capsule (None when it carries no files)."""
    from sojourn.capsule import format as fmt

    files = fmt.load_manifest(repo, capsule).files
    return files if files and files.get("manifest") else None


def files_event_of(repo: Repository, capsule: str, allocation: str, source: str) -> dict[str, Any] | None:
    """The ``files`` event for a capsule a session wrote with its files, else None."""
    files = capsule_files(repo, capsule)
    if files is None:
        return None
    return FilesSnapshot(capsule, source, int(files.get("files", 0)), int(files.get("bytes", 0)),
                         list(files.get("skipped") or [])).event(allocation)


def materialize(repo: Repository, capsule: str, dest: str | Path) -> int:
    """Write the files of ``capsule`` under ``dest`` (small files first, each atomically);
    return how many. A capsule without files writes nothing."""
    from sojourn.capsule.workspace_files import materialize as write_files

    files = capsule_files(repo, capsule)
    if files is None:
        return 0
    Path(dest).mkdir(parents=True, exist_ok=True)
    write_files(files, repo.chunks, Path(dest))
    return int(files.get("files", 0))


def source_for_resume(repo: Repository, rec: R.WorkspaceRecord, capsule: str) -> str | None:
    """The capsule whose files a resume on a machine starts from: the resumed capsule when it
    carries files, else the workspace's last snapshot, else None (nothing to copy)."""
    if capsule_files(repo, capsule) is not None:
        return capsule
    if rec.files and rec.files.get("capsule"):
        return str(rec.files["capsule"])
    return None


def list_files(repo: Repository, rec: R.WorkspaceRecord) -> list[dict[str, Any]]:
    """The workspace's file manifest: path, size, mode and hash of each file (``show``)."""
    from sojourn.capsule.workspace_files import list_entries

    if not rec.files or not rec.files.get("capsule"):
        return []
    files = capsule_files(repo, str(rec.files["capsule"]))
    return list_entries(files, repo.chunks) if files else []
