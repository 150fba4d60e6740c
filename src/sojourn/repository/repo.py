"""Opening a repository: resolve its URL, check its config, find and check its key.

A repository's ``config/config.json`` is the one object nobody signs or seals (it says how
to open the rest), so everything read from it is checked before it is used: the id names
the key file (``~/.sojourn/keys/<id>.key``) and must match :data:`REPO_ID` before it names any
path; the key file and its directory must belong to this user and be closed to others (as
ssh refuses a private key others can read); an encrypted repository's key check must match
the key (so a wrong key is named as such, not as a thousand damaged objects).

Version 1 is a plain repository; version 2 an encrypted one (``encryption`` in the config,
see :mod:`sojourn.repository.crypto`), which a version-1 reader refuses rather than misreads.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import stat
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sojourn.errors import (
    AlreadyExists,
    IntegrityError,
    ObjectNotFound,
    RepositoryChanged,
    RepositoryError,
    RepositoryNotFound,
)
from sojourn.repository.backend import Backend
from sojourn.repository.retry import RetryPolicy

if TYPE_CHECKING:
    from sojourn.repository.chunks import ChunkStore
    from sojourn.repository.guarded import GuardedBackend

REPO_FORMAT = "sojourn.repository"
REPO_VERSION = 1  # plain
ENCRYPTED_VERSION = 2
VERSIONS = (REPO_VERSION, ENCRYPTED_VERSION)
# What sojourn itself writes is "repo_" and 16 hex digits; a few more are allowed, nothing
# that could climb out of the keys directory or name another file.
REPO_ID = re.compile(r"repo_[0-9a-f]{8,64}")


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
    """An open repository. The chunk store (zstd, blake3, a thread pool) is built on first
    use: workspace commands (`ps`, `show`, a supervisor) never touch chunks and start faster.

    ``backend`` retries transient faults (``policy``) and, in an encrypted repository, seals
    and opens objects; ``raw`` is the plain backend underneath (tests and tools only)."""

    def __init__(self, backend: Backend, config: dict[str, Any], key: bytes, chunks: ChunkStore | None = None,
                 *, raw: Backend | None = None, policy: RetryPolicy | None = None):
        self.backend = backend
        self.config = config
        self.key = key
        self.raw = raw if raw is not None else backend
        self.policy = policy if policy is not None else getattr(backend, "policy", None) or RetryPolicy(backend.url)
        self._chunks = chunks

    @property
    def chunks(self) -> ChunkStore:
        if self._chunks is None:
            from sojourn.repository.chunks import DEFAULT_CHUNK_SIZE, ChunkStore

            sealer = getattr(self.backend, "sealer", None)
            self._chunks = ChunkStore(self.backend, int(self.config.get("chunk_size", DEFAULT_CHUNK_SIZE)),
                                      naming=sealer.keys.chunk_name if sealer is not None else None)
        return self._chunks

    @property
    def url(self) -> str:
        return self.backend.url

    @property
    def id(self) -> str:
        return str(self.config["id"])

    @property
    def encrypted(self) -> bool:
        return bool(self.config.get("encryption"))

    def retry_deadline(self, seconds: float) -> contextlib.AbstractContextManager[None]:
        """Every store operation in the block, on any thread, gives up retrying ``seconds``
        from now (a pause that must land before a preemption, say)."""
        return self.policy.deadline(seconds)

    def check_identity(self) -> None:
        """Refuse (:class:`RepositoryChanged`) when the location no longer holds this
        repository: deleted or unmounted (no config), or replaced by another one (another
        id). A session calls this before it writes, so that it never writes into a fresh
        directory where its repository used to be."""
        try:
            raw = self.backend.load("config", "config.json")
        except (ObjectNotFound, RepositoryNotFound):
            raise RepositoryChanged(
                f"the repository {self.id} is gone from {self.url} (no config/config.json: deleted, moved or "
                "unmounted); nothing was written. Mount or restore it and try again"
            ) from None
        try:
            now = json.loads(raw)
        except ValueError:
            now = None
        if not isinstance(now, dict) or now.get("id") != self.id or bool(now.get("encryption")) != self.encrypted:
            other = now.get("id") if isinstance(now, dict) else "an unreadable config"
            raise RepositoryChanged(
                f"{self.url} now holds {other}, not the repository {self.id} this process opened (replaced or "
                "remounted); nothing was written into it"
            )

    def close(self) -> None:
        if self._chunks is not None:
            self._chunks.close()

    def __enter__(self) -> Repository:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# The repositories this process works in, by URL: once a workspace process (a supervisor, a
# session, a move's destination) opened a repository, every later opening of the same URL
# in it, and in the sojourn processes it starts (``PIN_ENV``, set by
# ``workspace.capsules.child_env``), expects the same id. A repository deleted or unmounted
# mid-run is then refused rather than silently created again (a new id, a new key) at pause.
_PINS: dict[str, str] = {}
PIN_ENV = "SOJOURN_REPOSITORY_IDS"


_PIN_MAX = 16  # a process works in one or two; a long test run in many (the environment stays small)


def _pin_key(url: str) -> str:
    return url if "://" in url else os.path.abspath(os.path.expanduser(url))


def pin(repo: Repository) -> None:
    """Expect ``repo``'s id wherever this process (and its sojourn children) opens its URL.
    (A ``memory://`` repository lives in this process alone, and nothing can unmount it.)"""
    if repo.url.startswith("memory://"):
        return
    key = _pin_key(repo.url)
    _PINS.pop(key, None)
    _PINS[key] = repo.id
    while len(_PINS) > _PIN_MAX:
        del _PINS[next(iter(_PINS))]


def pins() -> dict[str, str]:
    """URL -> id of every repository this process expects (inherited ones included)."""
    out: dict[str, str] = {}
    try:
        inherited = json.loads(os.environ.get(PIN_ENV) or "{}")
    except ValueError:
        inherited = {}
    if isinstance(inherited, dict):
        out.update({str(k): str(v) for k, v in inherited.items() if isinstance(v, str) and REPO_ID.fullmatch(v)})
    out.update(_PINS)
    return out


def default_encrypt(url: str) -> bool:
    """Whether a repository created at ``url`` without saying is encrypted: yes for remote
    ones (their bytes sit with a provider), no for local ones unless ``$SOJOURN_ENCRYPT``."""
    env = os.environ.get("SOJOURN_ENCRYPT", "").strip().lower()
    if env in ("1", "yes", "on", "true"):
        return True
    if env in ("0", "no", "off", "false"):
        return False
    return url.startswith("s3://")


def open_repository(
    repo: str | os.PathLike[str] | None = None,
    *,
    create: bool = False,
    encrypt: bool | None = None,
    expect_id: str | None = None,
    policy: RetryPolicy | None = None,
) -> Repository:
    """Open the repository at ``repo``; with ``create``, initialise it if there is none.

    ``create`` is for commands that make repositories on purpose (``sojourn init``, a first
    ``capture``); a process that works in an existing repository (a session, a supervisor)
    opens it without, and with ``expect_id`` the id it started with, so that a location that
    vanished or was replaced is refused rather than taken for another repository.
    ``encrypt`` (for a new repository; None: :func:`default_encrypt`) cannot change an
    existing one: asking for the other kind is refused. A URL this process works in
    (:func:`pin`) is opened with the id it was pinned with, whatever ``create`` says.
    """
    url = resolve_url(repo)
    if expect_id is None:
        expect_id = pins().get(_pin_key(url))
    raw_backend = backend_for(url)
    policy = policy or RetryPolicy(url)
    from sojourn.repository.guarded import guard

    plain = guard(raw_backend, policy)
    try:
        raw = plain.load("config", "config.json")
    except (ObjectNotFound, RepositoryNotFound):
        raw = None
    if raw is None:
        if expect_id is not None:
            raise RepositoryChanged(
                f"the repository {expect_id} is gone from {url} (no config/config.json: deleted, moved or "
                "unmounted); nothing was written. Mount or restore it and try again"
            )
        if not create:
            if plain.exists():
                raise RepositoryNotFound(
                    f"{url} is not a sojourn repository (no config/config.json); "
                    "capture something into it first (or `sojourn init`), or check the path"
                )
            raise RepositoryNotFound(f"no sojourn repository at {url}: the location does not exist")
        want = default_encrypt(url) if encrypt is None else encrypt
        config, key = _initialise(plain, want)
    else:
        config = parse_config(raw, url)
        if expect_id is not None and config["id"] != expect_id:
            raise RepositoryChanged(
                f"{url} now holds the repository {config['id']}, not {expect_id} (replaced or remounted); "
                "nothing was written into it"
            )
        key = _load_key(str(config["id"]))
        if encrypt is not None and encrypt != bool(config.get("encryption")):
            raise RepositoryError(
                f"{url} is {'an encrypted' if config.get('encryption') else 'a plain'} repository; whether a "
                "repository is encrypted is chosen when it is created. Create a new one to change it"
            )
    sealer = None
    if config.get("encryption"):
        from sojourn.repository.crypto import RepoKeys, Sealer

        keys = RepoKeys(key, str(config["id"]))
        if keys.check != config["encryption"].get("check"):
            raise RepositoryError(
                f"the key for {config['id']} ({_key_source(str(config['id']))}) does not open {url}: it is another "
                "repository's key, or the config's key check was altered. Use the key of the machine that created it"
            )
        sealer = Sealer(keys)
    backend = guard(raw_backend, policy, sealer) if sealer is not None else plain
    return Repository(backend, config, key, raw=raw_backend, policy=policy)


def _initialise(backend: GuardedBackend, encrypt: bool) -> tuple[dict[str, Any], bytes]:
    backend.create()
    repo_id = "repo_" + secrets.token_hex(8)
    config: dict[str, Any] = {
        "format": REPO_FORMAT,
        "version": ENCRYPTED_VERSION if encrypt else REPO_VERSION,
        "id": repo_id,
        "chunk_size": 4 << 20,  # repository/chunks.py DEFAULT_CHUNK_SIZE; not imported here, see Repository
        "hash": "blake3",
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    # The key exists before the config that needs it: a crash in between leaves a stray key
    # file, never a repository nobody can open.
    key = _load_key(repo_id) if os.environ.get("SOJOURN_KEY") else _write_key(repo_id)
    if encrypt:
        from sojourn.repository.crypto import CIPHER, RepoKeys

        config["encryption"] = {"cipher": CIPHER, "kdf": "hkdf-sha256", "names": "blake3-keyed",
                                "check": RepoKeys(key, repo_id).check}
    try:
        backend.save("config", "config.json", json.dumps(config, indent=2).encode(), exclusive=True)
    except AlreadyExists:
        # Another process initialised it first: use theirs.
        _discard_key(repo_id)
        config = parse_config(backend.load("config", "config.json"), backend.url)
        return config, _load_key(str(config["id"]))
    backend.flush()
    return config, key


def parse_config(raw: bytes, url: str) -> dict[str, Any]:
    """The checked config: format, version, an id that is safe to name a key file with."""
    try:
        config = json.loads(raw)
    except ValueError as e:
        raise IntegrityError(f"{url}: config/config.json is not valid JSON ({e})") from e
    if not isinstance(config, dict) or config.get("format") != REPO_FORMAT:
        raise IntegrityError(f"{url}: config/config.json is not a sojourn repository config")
    version = config.get("version")
    if version not in VERSIONS:
        raise IntegrityError(
            f"{url} has repository format version {version}, this sojourn reads versions "
            f"{', '.join(map(str, VERSIONS))}: upgrade sojourn (pip install -U sojourn)"
        )
    repo_id = config.get("id")
    if not isinstance(repo_id, str) or not REPO_ID.fullmatch(repo_id):
        raise IntegrityError(
            f"{url}: config/config.json names the repository {str(repo_id)[:80]!r}, which is not a repository id "
            "(repo_ and hex digits); the config was altered. Nothing was read with it"
        )
    enc = config.get("encryption")
    if (version == ENCRYPTED_VERSION) != bool(enc) or (
        enc and (not isinstance(enc, dict) or enc.get("cipher") != "aes-256-gcm" or not isinstance(enc.get("check"), str))
    ):
        raise IntegrityError(f"{url}: config/config.json has version {version} and encryption {enc!r}, which do not go "
                             "together; the config was altered")
    return config


def key_path(repo_id: str) -> Path:
    if not REPO_ID.fullmatch(repo_id):
        raise ValueError(f"{repo_id!r} is not a repository id")
    return sojourn_home() / "keys" / f"{repo_id}.key"


def _key_source(repo_id: str) -> str:
    return "$SOJOURN_KEY" if os.environ.get("SOJOURN_KEY") else str(key_path(repo_id))


def _check_private(path: Path, st: os.stat_result, what: str, fix: str) -> None:
    """Refuse a key file or keys directory that is not this user's alone (ssh's rule)."""
    if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
        raise RepositoryError(
            f"{what} {path} belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()}): another user could "
            f"have planted it. Refusing to use it; if it is yours, `chown {os.geteuid()} {path}`"
        )
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        raise RepositoryError(
            f"{what} {path} is open to other users (mode {mode:04o}): anyone on this machine could read or "
            f"replace the key. Refusing to use it; fix it with `{fix}`"
        )


def _keys_dir(create: bool) -> Path:
    d = sojourn_home() / "keys"
    if create:
        d.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            d.mkdir(mode=0o700)
        except FileExistsError:
            pass
    st = os.stat(d)  # FileNotFoundError: the caller says what is missing
    if not stat.S_ISDIR(st.st_mode):
        raise RepositoryError(f"{d} is not a directory: it must hold sojourn's repository keys")
    _check_private(d, st, "the keys directory", f"chmod 700 {d}")
    return d


def _write_key(repo_id: str) -> bytes:
    d = _keys_dir(create=True)
    path = d / f"{repo_id}.key"
    tmp = d / f".{repo_id}.tmp{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
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
    return _load_key(repo_id)


def _discard_key(repo_id: str) -> None:
    if os.environ.get("SOJOURN_KEY"):
        return
    try:
        key_path(repo_id).unlink()
    except OSError:
        pass


def _load_key(repo_id: str) -> bytes:
    env = os.environ.get("SOJOURN_KEY")
    if env:
        try:
            return bytes.fromhex(env.strip())
        except ValueError as e:
            raise RepositoryError("SOJOURN_KEY must be the key in hex (64 hex digits)") from e
    path = key_path(repo_id)
    try:
        _keys_dir(create=False)
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise RepositoryError(
            f"no signing key for repository {repo_id} on this machine: copy {path} from the "
            "machine that created the repository (then `chmod 600` it), or set SOJOURN_KEY"
        ) from None
    with os.fdopen(fd) as f:
        # The file opened, not the name: a link to someone else's file is theirs.
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise RepositoryError(f"{path} is not a regular file; it must hold the repository key")
        _check_private(path, st, "the key file", f"chmod 600 {path}")
        text = f.read()
    try:
        return bytes.fromhex(text.strip())
    except ValueError as e:
        raise RepositoryError(f"{path} does not hold a hex key") from e
