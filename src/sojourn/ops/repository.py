"""Making a repository on purpose: ``sojourn init`` and :func:`sojourn.init_repository`."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from sojourn.ops.capsules import PathLike


@dataclass
class RepositoryInfo:
    url: str
    id: str
    encrypted: bool
    created: bool  # False: it was there already
    key: str  # where this machine keeps its key ($SOJOURN_KEY or the key file)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def init_repository(repo: PathLike | None = None, *, encrypt: bool | None = None) -> RepositoryInfo:
    """Create the repository at ``repo`` (default ``$SOJOURN_REPO``, else ``~/.sojourn/repo``).

    ``encrypt``: seal chunks, manifests and records with keys derived from the repository
    key (None: yes for ``s3://``, no for a local path unless ``$SOJOURN_ENCRYPT=1``). It is
    chosen once; an existing repository is opened and reported, and asking it to be the
    other kind is refused.
    """
    import os

    from sojourn.errors import RepositoryNotFound
    from sojourn.repository.repo import key_path, open_repository

    created = False
    try:
        r = open_repository(repo, encrypt=encrypt)
    except RepositoryNotFound:
        r = open_repository(repo, create=True, encrypt=encrypt)
        created = True
    with r:
        key = "$SOJOURN_KEY" if os.environ.get("SOJOURN_KEY") else str(key_path(r.id))
        return RepositoryInfo(r.url, r.id, r.encrypted, created, key)
