"""Credential files stay on the machine they belong to.

A capsule's workspace files (``capture(files=DIR)``) and the files ``sojourn run --on MACHINE``
copies onto a machine leave out what looks like credentials: ``.env*``, ``.netrc``,
``.git-credentials``, ``*.pem``, ``*.key``, ssh and cloud CLI directories and configs. They are
named at capture (a :class:`~sojourn.errors.SojournWarning`, and ``secrets`` in the file
manifest), and taken only on purpose: ``include_secrets=True`` (all of them) or a list of
patterns or workspace paths, or ``$SOJOURN_INCLUDE_SECRETS`` (comma-separated; ``*`` for all)
for commands that take no argument for it.
"""

from __future__ import annotations

import fnmatch
import os
import warnings
from collections.abc import Iterable

from sojourn.errors import SojournWarning

# Credentials stay on the machine they belong to: a capsule (and the files `sojourn run --on`
# copies onto a machine) leaves them out unless asked for by name (``include_secrets``). A
# pattern ending in "/" is a directory, one with a "/" a path's last parts, any other a name;
# each matches at any depth of the workspace.
SECRET_PATTERNS = (
    ".env", ".env.*", ".envrc", ".netrc", "_netrc", ".git-credentials", ".pypirc", ".npmrc", ".pgpass", ".htpasswd",
    "*.pem", "*.key", "*.p12", "*.pfx", "id_rsa", "id_dsa", "id_ecdsa", "id_ed25519",
    ".aws/", ".ssh/", ".gnupg/", ".azure/", ".config/gcloud/", ".config/gh/",
    ".kube/config", ".docker/config.json", ".config/rclone/rclone.conf", ".huggingface/token",
    ".cache/huggingface/token", ".terraform.d/credentials.tfrc.json",
)
INCLUDE_SECRETS_ENV = "SOJOURN_INCLUDE_SECRETS"


def _matches(rel: str, is_dir: bool, pattern: str) -> bool:
    parts = rel.split("/")
    if pattern.endswith("/"):
        if not is_dir:
            return False
        pattern = pattern[:-1]
    elif is_dir and "/" in pattern:
        return False
    want = pattern.split("/")
    if len(want) > len(parts):
        return False
    return all(fnmatch.fnmatchcase(p, w) for p, w in zip(parts[-len(want):], want, strict=True))


class Secrets:
    """Which credential files a snapshot leaves out: :data:`SECRET_PATTERNS`, less what
    ``include`` names (True: every one; patterns or workspace paths: those; None: what
    ``$SOJOURN_INCLUDE_SECRETS`` names, comma-separated, ``*`` for all)."""

    def __init__(self, include: bool | Iterable[str] | None = None):
        if include is None:
            env = os.environ.get(INCLUDE_SECRETS_ENV, "").strip()
            include = True if env in ("*", "all", "1") else [p.strip() for p in env.split(",") if p.strip()]
        self.all = include is True
        self.include = [] if isinstance(include, bool) else [p.strip("/") for p in include]
        self.left_out: list[str] = []
        self._dirs: dict[str, str] = {}  # secret directories walked into: "taken" whole, or "secret"

    def leaves_out(self, rel: str, is_dir: bool) -> bool:
        """Whether ``rel`` (a workspace-relative path; directories are asked before their
        content) stays out. Asked once per path, in walking order."""
        if self.all:
            return False
        within = self._within(rel)
        if within == "taken":
            return False
        if within is None and not any(_matches(rel, is_dir, p) for p in SECRET_PATTERNS):
            return False
        if any(rel == p or _matches(rel, is_dir, p) or _matches(rel, is_dir, p + "/") for p in self.include):
            if is_dir:
                self._dirs[rel] = "taken"
            return False
        if is_dir and any(p.startswith(rel + "/") for p in self.include):
            self._dirs[rel] = "secret"  # walked for the files asked of it; the rest stays out
            return False
        self.left_out.append(rel + ("/" if is_dir else ""))
        return True

    def _within(self, rel: str) -> str | None:
        parts = rel.split("/")
        for n in range(len(parts) - 1, 0, -1):
            got = self._dirs.get("/".join(parts[:n]))
            if got is not None:
                return got
        return None

    def warn(self) -> None:
        if not self.left_out:
            return
        names = ", ".join(self.left_out[:20]) + (f" and {len(self.left_out) - 20} more" if len(self.left_out) > 20 else "")
        warnings.warn(
            f"credential files stayed on this machine, out of the capsule's workspace files: {names}. "
            f"To take one on purpose, pass include_secrets=[...] (or set {INCLUDE_SECRETS_ENV}=path,...)",
            SojournWarning,
            stacklevel=2,
        )
