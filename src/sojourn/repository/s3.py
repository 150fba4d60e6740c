"""A repository in an S3 bucket (``s3://bucket/prefix``), through boto3.

Credentials come from boto3's usual chain; ``AWS_ENDPOINT_URL`` (or
``AWS_ENDPOINT_URL_S3``) points it at an S3-compatible server. Exclusive creates use a
conditional ``PutObject`` with ``If-None-Match: *``, which AWS S3, Ceph radosgw, MinIO and
moto honour; a server that silently ignores it would break the compare-and-swap, so
:meth:`S3Backend.create` and the first exclusive save check it, once per bucket and process,
and refuse such a server. The tests run against a real Ceph radosgw (``tools/s3-radosgw``).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

from sojourn.errors import (
    AlreadyExists,
    ObjectNotFound,
    RepositoryError,
    RepositoryNotFound,
    StoreUnavailable,
)
from sojourn.repository.backend import check_kind, check_name

# (endpoint, bucket) pairs whose server was seen to honour If-None-Match: checked once per
# process, because a server that ignores it would let two writers both "win" a create.
_CONDITIONAL_OK: set[tuple[str, str]] = set()
_CONDITIONAL_LOCK = threading.Lock()
_PRECONDITION_FAILED = ("PreconditionFailed", "412", "ConditionalRequestConflict")
# Answers that say "not now" rather than "no": retried by repository/retry.py, like any 5xx.
_TRANSIENT_CODES = frozenset({
    "RequestTimeout", "RequestTimeoutException", "Throttling", "ThrottlingException", "ThrottledException",
    "SlowDown", "RequestThrottled", "RequestLimitExceeded", "TooManyRequests", "TooManyRequestsException",
    "ProvisionedThroughputExceededException", "InternalError", "ServiceUnavailable", "BandwidthLimitExceeded",
    "EC2ThrottledException", "PriorRequestNotComplete", "429",
})


def _boto3() -> Any:
    try:
        import boto3
        import botocore.config
    except ImportError as e:
        raise RepositoryError(
            "an s3:// repository needs boto3: install it with `pip install 'sojourn[s3]'`"
        ) from e
    return boto3, botocore.config


class S3Backend:
    def __init__(self, url: str):
        rest = url.removeprefix("s3://")
        bucket, _, prefix = rest.partition("/")
        if not bucket:
            raise RepositoryNotFound(f"{url!r} names no bucket; expected s3://bucket/prefix")
        self.url = url.rstrip("/")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        boto3, config = _boto3()
        # One attempt per call: repository/retry.py retries, visibly and up to the caller's
        # deadline. Retries hidden inside botocore would also turn an exclusive create whose
        # answer was lost into a create "someone else" won (the retry sees our own object).
        self._client = boto3.session.Session().client(
            "s3",
            config=config.Config(
                max_pool_connections=32,
                retries={"total_max_attempts": 1, "mode": "standard"},
                connect_timeout=10,
                read_timeout=60,
                s3={"addressing_style": "path"},
            ),
        )

    def _key(self, kind: str, name: str) -> str:
        check_kind(kind)
        check_name(name)
        return f"{self.prefix}/{kind}/{name}" if self.prefix else f"{kind}/{name}"

    def _error(self, exc: Exception, action: str) -> RepositoryError:
        code = _code(exc)
        status = _status(exc)
        if code in _TRANSIENT_CODES or (status is not None and status >= 500):
            return StoreUnavailable(f"{action} {self.url} failed: {code or status}: {exc}")
        if code in ("NoSuchBucket",):
            return RepositoryNotFound(f"bucket {self.bucket!r} does not exist ({self.url})")
        if code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403", "Forbidden"):
            return RepositoryError(
                f"access denied while {action} {self.url}: check the AWS credentials "
                "(AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or the profile) and the bucket policy"
            )
        if code is None:
            message = (f"cannot reach {self.url} while {action}: {exc}. Check AWS_ENDPOINT_URL and "
                       "the network; nothing was published.")
            # No answer at all (refused, reset, timed out, cut mid-body): the network's fault,
            # which passes. Any other exception is a bug or a misconfiguration: not retried.
            return StoreUnavailable(message) if _no_answer(exc) else RepositoryError(message)
        return RepositoryError(f"{action} {self.url} failed: {code}: {exc}")

    # -- location ---------------------------------------------------------------------------

    def exists(self) -> bool:
        try:
            self._client.head_bucket(Bucket=self.bucket)
        except Exception as e:
            if _code(e) in ("404", "NoSuchBucket", "NotFound"):
                return False
            raise self._error(e, "opening") from e
        return True

    def create(self) -> None:
        if not self.exists():
            extra: dict[str, Any] = {}
            region = self._client.meta.region_name
            # AWS wants the region spelled out outside us-east-1; other servers have their own
            # notion of location and take the default.
            if "amazonaws.com" in (self._client.meta.endpoint_url or "") and region not in (None, "us-east-1"):
                extra["CreateBucketConfiguration"] = {"LocationConstraint": region}
            try:
                self._client.create_bucket(Bucket=self.bucket, **extra)
            except Exception as e:
                if _code(e) not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                    raise self._error(e, "creating the bucket for") from e
        self.check_conditional_writes()

    def check_conditional_writes(self) -> None:
        """Refuse a server that ignores ``If-None-Match: *`` (once per bucket and process).

        Two conditional PUTs of one fresh key: the second must fail with 412. The probe key
        lives under ``locks/`` and is removed afterwards.
        """
        ident = (str(self._client.meta.endpoint_url), self.bucket)
        with _CONDITIONAL_LOCK:
            if ident in _CONDITIONAL_OK:
                return
            key = self._key("locks", f"probe-if-none-match-{uuid.uuid4().hex}")
            try:
                self._client.put_object(Bucket=self.bucket, Key=key, Body=b"1", IfNoneMatch="*")
                try:
                    self._client.put_object(Bucket=self.bucket, Key=key, Body=b"2", IfNoneMatch="*")
                    honoured = False
                except Exception as e:
                    if _code(e) not in _PRECONDITION_FAILED:
                        raise
                    honoured = True
            except Exception as e:
                raise self._error(e, "checking conditional writes on") from e
            finally:
                try:
                    self._client.delete_object(Bucket=self.bucket, Key=key)
                except Exception:
                    pass  # a leftover probe object is harmless
            if not honoured:
                raise RepositoryError(
                    f"the S3 server at {ident[0]} ignores conditional writes (PutObject with "
                    "If-None-Match: *), so two writers could both create the same object and "
                    "corrupt the repository. Use a server that supports them (AWS S3, Ceph "
                    "radosgw, MinIO) or a local repository."
                )
            _CONDITIONAL_OK.add(ident)

    # -- objects ----------------------------------------------------------------------------

    def save(self, kind: str, name: str, data: bytes | memoryview, *, exclusive: bool = False) -> None:
        key = self._key(kind, name)
        extra: dict[str, Any] = {}
        if exclusive:
            self.check_conditional_writes()
            extra["IfNoneMatch"] = "*"
        try:
            self._client.put_object(Bucket=self.bucket, Key=key, Body=bytes(data), **extra)
        except Exception as e:
            if exclusive and _code(e) in _PRECONDITION_FAILED:
                raise AlreadyExists(f"{kind}/{name} already exists in {self.url}") from None
            raise self._error(e, f"writing {kind}/{name} to") from e

    def load(self, kind: str, name: str) -> bytes:
        key = self._key(kind, name)
        try:
            resp = self._client.get_object(Bucket=self.bucket, Key=key)
            data: bytes = resp["Body"].read()
            return data
        except Exception as e:
            if _code(e) in ("NoSuchKey", "404", "NotFound"):
                raise ObjectNotFound(f"{kind}/{name} not found in {self.url}") from None
            raise self._error(e, f"reading {kind}/{name} from") from e

    def load_into(self, kind: str, name: str, out: memoryview) -> int:
        key = self._key(kind, name)
        try:
            resp = self._client.get_object(Bucket=self.bucket, Key=key)
            size = resp["ContentLength"]
            if size != len(out):
                raise ObjectNotFound(
                    f"{kind}/{name} in {self.url} is {size} bytes, expected {len(out)}"
                )
            body = resp["Body"]
            got = 0
            while got < size:
                piece = body.read(min(8 << 20, size - got))
                if not piece:
                    raise StoreUnavailable(f"reading {kind}/{name} from {self.url} was cut short")
                out[got : got + len(piece)] = piece
                got += len(piece)
            return got
        except RepositoryError:
            raise
        except Exception as e:
            if _code(e) in ("NoSuchKey", "404", "NotFound"):
                raise ObjectNotFound(f"{kind}/{name} not found in {self.url}") from None
            raise self._error(e, f"reading {kind}/{name} from") from e

    def load_scatter(self, kind: str, name: str, parts: list[memoryview]) -> int:
        """Read the object into ``parts`` in order when its size is their total; return its
        size (nothing is read when it differs)."""
        key = self._key(kind, name)
        try:
            resp = self._client.get_object(Bucket=self.bucket, Key=key)
            size = int(resp["ContentLength"])
            body = resp["Body"]
            if size != sum(len(p) for p in parts):
                body.close()
                return size
            for part in parts:
                got = 0
                while got < len(part):
                    piece = body.read(min(8 << 20, len(part) - got))
                    if not piece:
                        raise StoreUnavailable(f"reading {kind}/{name} from {self.url} was cut short")
                    part[got : got + len(piece)] = piece
                    got += len(piece)
            return size
        except RepositoryError:
            raise
        except Exception as e:
            if _code(e) in ("NoSuchKey", "404", "NotFound"):
                raise ObjectNotFound(f"{kind}/{name} not found in {self.url}") from None
            raise self._error(e, f"reading {kind}/{name} from") from e

    def stat(self, kind: str, name: str) -> int | None:
        key = self._key(kind, name)
        try:
            resp = self._client.head_object(Bucket=self.bucket, Key=key)
        except Exception as e:
            if _code(e) in ("404", "NoSuchKey", "NotFound"):
                return None
            raise self._error(e, f"reading {kind}/{name} from") from e
        return int(resp["ContentLength"])

    def list(self, kind: str, prefix: str = "") -> Iterator[str]:
        check_kind(kind)
        base = f"{self.prefix}/{kind}/" if self.prefix else f"{kind}/"
        paginator = self._client.get_paginator("list_objects_v2")
        try:
            for page in paginator.paginate(Bucket=self.bucket, Prefix=base + prefix):
                for obj in page.get("Contents", []):
                    yield obj["Key"][len(base) :]
        except Exception as e:
            raise self._error(e, "listing") from e

    def remove(self, kind: str, name: str) -> None:
        if self.stat(kind, name) is None:
            raise ObjectNotFound(f"{kind}/{name} not found in {self.url}")
        try:
            self._client.delete_object(Bucket=self.bucket, Key=self._key(kind, name))
        except Exception as e:
            raise self._error(e, f"removing {kind}/{name} from") from e

    def flush(self) -> None:
        pass  # a successful PutObject is durable


def _status(exc: Exception) -> int | None:
    resp = getattr(exc, "response", None)
    if isinstance(resp, dict):
        status = resp.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return int(status) if status else None
    return None


def _no_answer(exc: BaseException) -> bool:
    """Whether ``exc`` is the network failing (botocore's connection and timeout errors, the
    body's stream cut by urllib3, a socket error) rather than a bug."""
    if isinstance(exc, OSError):
        return True
    names = {c.__name__ for c in type(exc).__mro__}
    return bool(names & {"HTTPClientError", "ConnectionError", "ResponseStreamingError", "ProtocolError",
                         "ReadTimeoutError", "IncompleteRead", "IncompleteReadError", "HTTPError"}) or type(exc).__module__.startswith("urllib3")


def _code(exc: Exception) -> str | None:
    resp = getattr(exc, "response", None)
    if isinstance(resp, dict):
        err = resp.get("Error", {})
        code = err.get("Code")
        if code is None:
            status = resp.get("ResponseMetadata", {}).get("HTTPStatusCode")
            return str(status) if status else None
        return str(code)
    return None


