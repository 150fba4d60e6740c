"""The S3 backend against a real S3-compatible server (Ceph radosgw, started by conftest.py)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import sojourn
from sojourn.errors import AlreadyExists, RepositoryError, RepositoryNotFound
from sojourn.repository import s3 as s3mod
from sojourn.repository.repo import open_repository
from sojourn.repository.s3 import S3Backend
from tests.conftest import last_json, run_py
from tests.repository.conformance import (
    BackendConformance,
    ChunkStoreConformance,
    NewBackend,
    SealedConformance,
)
from tests.repository.s3server import S3Server, free_port, new_bucket_name, s3_client

pytestmark = pytest.mark.s3


def _drop_bucket(server: S3Server, bucket: str) -> None:
    client = s3_client(server)
    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if keys:
                client.delete_objects(Bucket=bucket, Delete={"Objects": keys})
        client.delete_bucket(Bucket=bucket)
    except client.exceptions.NoSuchBucket:
        pass


class TestS3Backend(BackendConformance, ChunkStoreConformance):
    @pytest.fixture
    def new_backend(self, s3_env: S3Server) -> Iterator[NewBackend]:
        buckets: list[str] = []

        def make() -> S3Backend:
            buckets.append(new_bucket_name())
            return S3Backend(f"s3://{buckets[-1]}/some/prefix")

        yield make
        for bucket in buckets:
            _drop_bucket(s3_env, bucket)


class TestS3Sealed(SealedConformance):
    @pytest.fixture
    def new_plain_backend(self, s3_env: S3Server) -> Iterator[NewBackend]:
        buckets: list[str] = []

        def make() -> S3Backend:
            buckets.append(new_bucket_name())
            return S3Backend(f"s3://{buckets[-1]}/some/prefix")

        yield make
        for bucket in buckets:
            _drop_bucket(s3_env, bucket)


def test_objects_live_under_the_prefix(s3_url: str, s3_env: S3Server) -> None:
    other = S3Backend(s3_url + "-other")
    b = S3Backend(s3_url + "/")  # a trailing slash names the same place
    b.save("chunks", "ab01", b"1")
    other.save("chunks", "ab02", b"2")
    assert list(b.list("chunks")) == ["ab01"]
    assert list(other.list("chunks")) == ["ab02"]
    bucket, prefix = s3_url.removeprefix("s3://").split("/", 1)
    keys = [o["Key"] for o in s3_client(s3_env).list_objects_v2(Bucket=bucket, Prefix=prefix + "/")["Contents"]]
    assert keys == [f"{prefix}/chunks/ab01"]


def test_a_server_that_ignores_if_none_match_is_refused(s3_env: S3Server) -> None:
    bucket = new_bucket_name()
    b = S3Backend(f"s3://{bucket}/p")

    # Make this client drop the condition before the request is built: the server then sees
    # what a server that does not implement conditional writes would act on.
    def strip_condition(params: dict[str, Any], **_: Any) -> None:
        params.pop("IfNoneMatch", None)

    b._client.meta.events.register("provide-client-params.s3.PutObject", strip_condition)
    try:
        with pytest.raises(RepositoryError, match=r"ignores conditional writes \(PutObject with If-None-Match"):
            b.create()
        with pytest.raises(RepositoryError, match="ignores conditional writes"):
            b.save("locks", "lock", b"x", exclusive=True)
        assert b.stat("locks", "lock") is None  # refused before writing anything
        assert list(b.list("locks")) == []  # and the probe cleaned up after itself
    finally:
        _drop_bucket(s3_env, bucket)


def test_conditional_writes_are_checked_once_per_bucket(s3_env: S3Server) -> None:
    bucket = new_bucket_name()
    try:
        b = S3Backend(f"s3://{bucket}/p")
        b.create()
        assert (str(b._client.meta.endpoint_url), bucket) in s3mod._CONDITIONAL_OK
        puts: list[str] = []
        b._client.meta.events.register(
            "provide-client-params.s3.PutObject", lambda params, **_: puts.append(params["Key"])
        )
        b.save("locks", "one", b"1", exclusive=True)
        with pytest.raises(AlreadyExists):
            b.save("locks", "one", b"2", exclusive=True)
        assert puts == ["p/locks/one", "p/locks/one"]  # no probe this time
    finally:
        _drop_bucket(s3_env, bucket)


def test_open_a_missing_bucket_or_an_empty_prefix(s3_env: S3Server, s3_url: str) -> None:
    with pytest.raises(RepositoryNotFound, match=r"no sojourn repository at s3://sj-missing.*does not exist"):
        open_repository(f"s3://sj-missing-{uuid.uuid4().hex[:8]}/p")
    with pytest.raises(RepositoryNotFound, match="is not a sojourn repository"):
        open_repository(s3_url)


def test_wrong_credentials_are_reported(s3_env: S3Server, s3_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if s3_env.kind == "moto":
        pytest.skip("moto's server accepts any credentials")
    with open_repository(s3_url, create=True):
        pass
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    with pytest.raises(RepositoryError, match=r"access denied .* check the AWS credentials"):
        open_repository(s3_url)
    b = S3Backend(s3_url)
    with pytest.raises(RepositoryError, match="access denied"):
        b.exists()


def test_an_unreachable_endpoint_is_reported(s3_env: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("SOJOURN_STORE_RETRY", "0")  # an outage is retried (test_store_faults.py): not here
    with pytest.raises(RepositoryError, match=r"cannot reach s3://sojourn-tests/x .*AWS_ENDPOINT_URL"):
        open_repository("s3://sojourn-tests/x")


def test_an_s3_repository_is_encrypted_unless_asked_otherwise(s3_env: S3Server, s3_url: str) -> None:
    import numpy as np

    with open_repository(s3_url, create=True) as r:
        assert r.encrypted and r.config["version"] == 2
        ref = sojourn.capture({"secret": "hunter2 " * 500, "w": np.arange(10_000.0)}, s3_url)
    bucket, prefix = s3_url.removeprefix("s3://").split("/", 1)
    client = s3_client(s3_env)
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix=prefix + "/")["Contents"]]
    assert any(k.endswith(f"capsules/{ref.id}.json") for k in keys)
    for key in keys:
        body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
        if key.endswith("config/config.json"):
            continue
        assert body.startswith(b"SJE\x01") and b"hunter2" not in body, key
    assert sojourn.verify(ref.id, s3_url).ok
    with open_repository(s3_url + "-plain", create=True, encrypt=False) as r:
        assert not r.encrypted


def test_capture_restore_verify_through_s3(tmp_path: Path, s3_env: S3Server, s3_url: str) -> None:
    """End to end: capture in one process, restore in a fresh one, verify, dedup."""
    cap = run_py(
        """
import sys, json
import numpy as np
import sojourn
rng = np.random.default_rng(7)
weights = rng.random(1_200_000)          # 9.6 MB: three 4 MiB chunks
view = weights[10:20]
config = {"lr": 0.1, "layers": [64, 32], "weights": weights}
ref = sojourn.capture(globals(), sys.argv[1])
weights[500_000] = -1.0                    # one element changes: one chunk
ref2 = sojourn.capture(globals(), sys.argv[1], parent=ref.id)
print(json.dumps({"id": ref.id, "id2": ref2.id, "written": ref.bytes_written,
                  "written2": ref2.bytes_written, "repo": ref.repo}))
""",
        s3_url,
        cwd=tmp_path,
    )
    out = last_json(cap)
    assert isinstance(out, dict)
    assert out["repo"] == s3_url
    assert out["written"] > 9_000_000
    assert out["written2"] < (4 << 20) + 200_000, "a one-element change rewrote more than its chunk"

    res = run_py(
        """
import sys, json
import numpy as np
import sojourn
ns = sojourn.restore(sys.argv[2], sys.argv[1])
w = ns["weights"]
print(json.dumps({"shape": list(w.shape), "changed": float(w[500_000]),
                  "view_shares": ns["view"].base is w, "alias": ns["config"]["weights"] is w,
                  "lr": ns["config"]["lr"]}))
""",
        s3_url,
        out["id2"],
        cwd=tmp_path,
    )
    got = last_json(res)
    assert got == {"shape": [1_200_000], "changed": -1.0, "view_shares": True, "alias": True, "lr": 0.1}

    report = sojourn.verify(out["id"], s3_url)
    assert report.ok, report.error
    assert {v["name"] for v in report.variables} >= {"weights", "view", "config"}
    info = sojourn.inspect(out["id2"], s3_url)
    assert info.parent == out["id"]
