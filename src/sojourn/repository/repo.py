"""Opening a repository: resolve its URL, check its config version, find its key."""

from __future__ import annotations

import json
import os
import secrets
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sojourn.errors import (
    AlreadyExists,
    IntegrityError,
    ObjectNotFound,
    RepositoryError,
    RepositoryNotFound,
)
from sojourn.repository.backend import Backend

if TYPE_CHECKING:
    from sojourn.repository.chunks import ChunkStore

REPO_FORMAT = "sojourn.repository"
REPO_VERSION = 1


def sojourn_home() -> Path:
    return Path(os.environ.get("SOJOURN_HOME", "~/.sojourn")).expanduser()


def resolve_url(repo: str | os.PathLike[str] | None) -> str:
    """``repo`` if given, else ``$SOJOURN_REPO``, else ``~/.sojourn/repo``."""
    if repo is None:
        repo = os.environ.get("SOJOURN_REPO") or str(sojourn_home() / "repo")
    url = os.fspath(repo)
    if url.startswith("file://"):
        url = url[len("file://") :]
    return url


def backend_for(url: str) -> Backend:
    if url.startswith("s3://"):
        from sojourn.repository.s3 import S3Backend

        return S3Backend(url)
    if url.startswith("memory://"):
        from sojourn.repository.memory import MemoryBackend

        return MemoryBackend(url[len("memory://") :] or "default")
    if "://" in url:
        scheme = url.split("://", 1)[0]
        raise RepositoryNotFound(
            f"unsupported repository URL scheme {scheme!r} in {url!r}; use a local path, "
            "s3://bucket/prefix or memory://name"
        )
    from sojourn.repository.local import LocalBackend

    return LocalBackend(url)


class Repository:
    """An open repository. The chunk store (zstandard, blake3, a thread pool) is built on first
    use: workspace commands (`ps`, `show`, a supervisor) never touch chunks and start faster."""

    def __init__(self, backend: Backend, config: dict[str, Any], key: bytes, chunks: ChunkStore | None = None):
        self.backend = backend
        self.config = config
        self.key = key
        self._chunks = chunks

    @property
    def chunks(self) -> ChunkStore:
        if self._chunks is None:
            from sojourn.repository.chunks import DEFAULT_CHUNK_SIZE, ChunkStore

            self._chunks = ChunkStore(self.backend, int(self.config.get("chunk_size", DEFAULT_CHUNK_SIZE)))
        return self._chunks

    @property
    def url(self) -> str:
        return self.backend.url

    @property
    def id(self) -> str:
        return str(self.config["id"])

    def close(self) -> None:
        if self._chunks is not None:
            self._chunks.close()

    def __enter__(self) -> Repository:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_repository(repo: str | os.PathLike[str] | None = None, *, create: bool = False) -> Repository:
    """Open (and with ``create``, initialise) the repository at ``repo``."""
    url = resolve_url(repo)
    backend = backend_for(url)
    try:
        raw = backend.load("config", "config.json")
    except (ObjectNotFound, RepositoryNotFound):
        raw = None
    if raw is None:
        if not create:
            if backend.exists():
                raise RepositoryNotFound(
                    f"{url} is not a sojourn repository (no config/config.json); "
                    "capture something into it first, or check the path"
                )
            raise RepositoryNotFound(f"no sojourn repository at {url}: the location does not exist")
        config = _initialise(backend)
    else:
        config = _parse_config(raw, url)
    key = _load_key(config["id"], create=raw is None)
    return Repository(backend, config, key)


def _initialise(backend: Backend) -> dict[str, Any]:
    backend.create()
    config = {
        "format": REPO_FORMAT,
        "version": REPO_VERSION,
        "id": "repo_" + secrets.token_hex(8),
        "chunk_size": 4 << 20,  # repository/chunks.py DEFAULT_CHUNK_SIZE; not imported here, see Repository
        "hash": "blake3",
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    try:
        backend.save("config", "config.json", json.dumps(config, indent=2).encode(), exclusive=True)
    except AlreadyExists:
        # Another process initialised it first: use theirs.
        return _parse_config(backend.load("config", "config.json"), backend.url)
    backend.flush()
    _write_key(str(config["id"]))
    return config


def _parse_config(raw: bytes, url: str) -> dict[str, Any]:
    try:
        config = json.loads(raw)
    except ValueError as e:
        raise IntegrityError(f"{url}: config/config.json is not valid JSON ({e})") from e
    if not isinstance(config, dict) or config.get("format") != REPO_FORMAT:
        raise IntegrityError(f"{url}: config/config.json is not a sojourn repository config")
    version = config.get("version")
    if version != REPO_VERSION:
        raise IntegrityError(
            f"{url} has repository format version {version}, this sojourn reads version "
            f"{REPO_VERSION}: upgrade sojourn (pip install -U sojourn)"
        )
    return config


def key_path(repo_id: str) -> Path:
    return sojourn_home() / "keys" / f"{repo_id}.key"


def _write_key(repo_id: str) -> None:
    path = key_path(repo_id)
    if path.exists() or os.environ.get("SOJOURN_KEY"):
        return
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32) + "\n")
        f.flush()
        os.fsync(f.fileno())
    try:
        os.link(tmp, path)  # never replace a key another process just wrote
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)


def _load_key(repo_id: str, *, create: bool) -> bytes:
    env = os.environ.get("SOJOURN_KEY")
    if env:
        try:
            return bytes.fromhex(env.strip())
        except ValueError as e:
            raise RepositoryError("SOJOURN_KEY must be the key in hex (64 hex digits)") from e
    path = key_path(repo_id)
    if not path.exists() and create:
        _write_key(repo_id)
    try:
        return bytes.fromhex(path.read_text().strip())
    except FileNotFoundError:
        raise RepositoryError(
            f"no signing key for repository {repo_id} on this machine: copy {path} from the "
            "machine that created the repository, or set SOJOURN_KEY"
        ) from None
    except ValueError as e:
        raise RepositoryError(f"{path} does not hold a hex key") from e
