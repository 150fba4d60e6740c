"""Encryption at rest: objects sealed with AES-256-GCM under keys derived from the repository
key, and chunk names keyed so that a name says nothing about its content.

What an encrypted repository stores (see ``docs/capsule-format.md``, "Encryption"):

* every object but ``config/config.json`` is ``"SJE" 0x01 · nonce (12) · ciphertext · tag (16)``:
  chunks, capsule manifests, workspace records and logs, locks, the shared machine config;
* the key of each kind is derived from the repository key with HKDF-SHA256, salted with the
  repository id: chunks, manifests and records each have their own, and chunk names a fourth;
* the associated data of each object is its kind and name, so an object moved to another
  name (a chunk swapped for another, an old event copied over a newer one) fails its tag;
* a chunk's name is BLAKE3 in keyed mode over its content hash and codec: deterministic per
  repository (deduplication and incremental captures work as before) and unguessable without
  the key (a plain hash would let anyone who can list the bucket test a guess about the
  content). Manifests keep the plain content hashes inside their encrypted body, so
  fingerprints are those of a plain repository.

Nonces are 96 random bits per object (``os.urandom``). AES-GCM stays within its bounds for
about 2^32 objects per key with random nonces (NIST SP 800-38D); at 4 MiB a chunk that is
16 PiB under one chunk key, and the other kinds hold far fewer objects. A counter would need
state shared by every writer of the repository (several hosts at once); XChaCha20's 192-bit
nonces would lift the bound but `cryptography` does not offer it, and AES-GCM runs on the
CPU's AES instructions at several times ChaCha20-Poly1305's speed here.

``cryptography`` is imported on first use: a plain repository never loads it.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import threading
from typing import Any

from sojourn.errors import IntegrityError, RepositoryError

MAGIC = b"SJE\x01"
NONCE = 12
HEADER = len(MAGIC) + NONCE
TAG = 16
OVERHEAD = HEADER + TAG
CIPHER = "aes-256-gcm"
# Which key seals each kind. ``config/config.json`` stays plain: it says how to open the rest.
_KIND_KEYS = {"chunks": "chunk", "capsules": "manifest", "workspaces": "record", "locks": "record", "config": "record"}
PLAIN = ("config", "config.json")
_REUSE_MAX = 8 << 20  # per-thread output buffers up to this size are kept for the next object
_SCRATCH = 256 << 10  # in-place decryption goes through this much cache-sized scratch at a time
_local = threading.local()


def _cryptography() -> Any:
    try:
        from cryptography.exceptions import InvalidTag
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError as e:
        raise RepositoryError(
            "this repository is encrypted, which needs the cryptography package: "
            "pip install 'sojourn[encrypt]'"
        ) from e
    return AESGCM, InvalidTag, Cipher, algorithms, modes


def hkdf(master: bytes, salt: bytes, info: bytes, length: int = 32) -> bytes:
    """HKDF-SHA256 (RFC 5869)."""
    prk = hmac.new(salt, master, hashlib.sha256).digest()
    out, block = b"", b""
    counter = 1
    while len(out) < length:
        block = hmac.new(prk, block + info + bytes([counter]), hashlib.sha256).digest()
        out += block
        counter += 1
    return out[:length]


class RepoKeys:
    """The subkeys of one repository, derived from its key and bound to its id."""

    def __init__(self, master: bytes, repo_id: str):
        salt = b"sojourn repository " + repo_id.encode()
        self.repo_id = repo_id
        self.object_keys = {
            role: hkdf(master, salt, f"sojourn {role} encryption v1".encode()) for role in set(_KIND_KEYS.values())
        }
        self.name_key = hkdf(master, salt, b"sojourn chunk names v1")
        # Stored in the config: tells a wrong key from a damaged object at open time.
        self.check = hkdf(master, salt, b"sojourn key check v1", 16).hex()

    def chunk_name(self, h: str, codec: str) -> str:
        import blake3  # here, not at import: opening a repository for its records needs none of it

        return blake3.blake3(bytes.fromhex(h) + b"\0" + codec.encode(), key=self.name_key).hexdigest()


def encrypts(kind: str, name: str) -> bool:
    return kind in _KIND_KEYS and (kind, name) != PLAIN


def _ad(kind: str, name: str) -> bytes:
    return f"sojourn.object.v1\0{kind}/{name}".encode()


class Sealer:
    """Seals and opens the objects of one encrypted repository."""

    def __init__(self, keys: RepoKeys):
        aesgcm, self._invalid, self._cipher, self._algorithms, self._modes = _cryptography()
        self.keys = keys
        self._aead = {role: aesgcm(k) for role, k in keys.object_keys.items()}

    def _key_of(self, kind: str) -> str:
        return _KIND_KEYS[kind]

    def seal(self, kind: str, name: str, data: bytes | memoryview) -> memoryview:
        """The stored form of ``data``. The view is into a buffer this thread reuses for its
        next object: hand it to the backend, which copies or writes it before returning."""
        view = memoryview(data).cast("B") if isinstance(data, memoryview) else memoryview(data)
        size = OVERHEAD + len(view)
        buf: bytearray | None = getattr(_local, "buf", None)
        if buf is None or len(buf) < size:
            buf = bytearray(size)
            if size <= _REUSE_MAX + OVERHEAD:
                _local.buf = buf
        out = memoryview(buf)[:size]
        nonce = os.urandom(NONCE)
        out[: len(MAGIC)] = MAGIC
        out[len(MAGIC) : HEADER] = nonce
        aead = self._aead[self._key_of(kind)]
        if hasattr(aead, "encrypt_into"):  # cryptography >= 44: straight into the buffer
            aead.encrypt_into(nonce, view, _ad(kind, name), out[HEADER:])
        else:
            out[HEADER:] = aead.encrypt(nonce, view, _ad(kind, name))
        return out

    def _refused(self, kind: str, name: str, why: str) -> IntegrityError:
        return IntegrityError(
            f"{kind}/{name} {why}: it was altered, moved from another name, or written with another "
            "repository key (check SOJOURN_KEY and ~/.sojourn/keys); nothing of it was used"
        )

    def _header(self, kind: str, name: str, head: bytes | memoryview) -> bytes:
        if bytes(head[: len(MAGIC)]) != MAGIC:
            raise self._refused(kind, name, "is not an encrypted object although the repository is encrypted")
        return bytes(head[len(MAGIC) : HEADER])

    def open(self, kind: str, name: str, blob: bytes | memoryview) -> bytes:
        if len(blob) < OVERHEAD:
            raise self._refused(kind, name, f"is {len(blob)} bytes, too short for an encrypted object")
        view = memoryview(blob)
        nonce = self._header(kind, name, view[:HEADER])
        try:
            return bytes(self._aead[self._key_of(kind)].decrypt(nonce, view[HEADER:], _ad(kind, name)))
        except self._invalid:
            raise self._refused(kind, name, "fails its authentication tag") from None

    def open_into(self, kind: str, name: str, head: memoryview, body: memoryview, tag: memoryview) -> None:
        """Decrypt ``body`` (the ciphertext, read straight into the caller's memory) in place."""
        nonce = self._header(kind, name, head)
        key = self.keys.object_keys[self._key_of(kind)]
        dec = self._cipher(self._algorithms.AES(key), self._modes.GCM(nonce, bytes(tag))).decryptor()
        dec.authenticate_additional_data(_ad(kind, name))
        scratch: bytearray | None = getattr(_local, "scratch", None)
        if scratch is None:
            scratch = _local.scratch = bytearray(_SCRATCH + 16)
        for start in range(0, len(body), _SCRATCH):
            piece = body[start : start + _SCRATCH]
            n = dec.update_into(piece, scratch)
            if n != len(piece):  # GCM is a stream mode: never happens, but a short copy would be silent
                raise self._refused(kind, name, "did not decrypt to its own size")
            piece[:] = memoryview(scratch)[:n]
        try:
            dec.finalize()
        except self._invalid:
            raise self._refused(kind, name, "fails its authentication tag") from None
