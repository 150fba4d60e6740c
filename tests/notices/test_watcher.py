"""The watcher: which sources run where, one callback per notice, signals, acknowledgement,
and that an absent metadata server neither slows the start nor floods the log."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from sojourn import notices
from sojourn.notices import aws, azure, gcp
from sojourn.notices.base import Notice
from sojourn.notices.watcher import AZURE_ASSET_TAG, wait_notice
from tests.notices.metadata_server import MetadataServer


def _dmi(tmp_path: Path, **files: str) -> str:
    for k, v in files.items():
        (tmp_path / k).write_text(v + "\n")
    return str(tmp_path)


def test_auto_detects_only_what_is_cheap_to_know(tmp_path: Path) -> None:
    (tmp_path / "none").mkdir()
    empty = str(tmp_path / "none")
    assert notices.configured_names({}, empty) == []
    assert notices.configured_names({"SLURM_JOB_ID": "7"}, empty) == ["slurm"]
    # In a pod, only the container's PID 1 is what Kubernetes signals.
    assert notices.detect({"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, empty, pid=1) == ["kubernetes"]
    assert notices.detect({"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, empty, pid=4321) == []
    ec2 = tmp_path / "ec2"
    ec2.mkdir()
    assert notices.configured_names({}, _dmi(ec2, sys_vendor="Amazon EC2")) == ["aws", "aws-rebalance"]
    gce = tmp_path / "gce"
    gce.mkdir()
    assert notices.configured_names({}, _dmi(gce, product_name="Google Compute Engine")) == ["gcp"]
    az = tmp_path / "az"
    az.mkdir()
    assert notices.configured_names({}, _dmi(az, sys_vendor="Microsoft Corporation",
                                             chassis_asset_tag=AZURE_ASSET_TAG)) == ["azure"]
    # An explicit endpoint counts as configured.
    assert notices.configured_names({"SOJOURN_IMDS_ENDPOINT": "http://127.0.0.1:1"}, empty) == ["aws", "aws-rebalance"]


def test_explicit_lists_and_errors(tmp_path: Path) -> None:
    assert notices.configured_names({"SOJOURN_NOTICES": "none", "SLURM_JOB_ID": "1"}) == []
    assert notices.configured_names({"SOJOURN_NOTICES": "gcp, azure,gcp"}) == ["gcp", "azure"]
    with pytest.raises(notices.NoticeConfigError, match="unknown sources ibm"):
        notices.configured_names({"SOJOURN_NOTICES": "aws,ibm"})
    logged: list[str] = []
    assert notices.watch(lambda n: None, env={"SOJOURN_NOTICES": "ibm"}, log=logged.append) is None
    assert "notices are off" in logged[0] and "ibm" in logged[0]
    assert notices.watch(lambda n: None, env={"SOJOURN_NOTICES": "none"}) is None


def test_build_points_sources_at_their_endpoints() -> None:
    env = {"SOJOURN_IMDS_ENDPOINT": "http://a:1", "SOJOURN_GCE_METADATA_ENDPOINT": "http://g:2",
           "SOJOURN_AZURE_IMDS_ENDPOINT": "http://z:3", "SOJOURN_NOTICE_POLL_S": "0.5"}
    srcs = notices.build(["aws", "aws-rebalance", "gcp", "azure", "slurm", "kubernetes"], env)
    a, r, g, z = srcs[:4]
    assert isinstance(a, aws.SpotInstanceAction) and a.imds.base == "http://a:1" and a.interval == 0.5
    assert isinstance(r, aws.RebalanceRecommendation) and r.imds is a.imds  # one IMDS token
    assert isinstance(g, gcp.Preempted) and g.base == "http://g:2"
    assert isinstance(z, azure.ScheduledEvents) and z.base == "http://z:3"
    assert [s.name for s in srcs[4:]] == ["slurm", "kubernetes"]


def test_watcher_delivers_each_polled_notice_once(metadata: MetadataServer) -> None:
    got: list[Notice] = []
    env = {"SOJOURN_NOTICES": "aws,aws-rebalance,gcp,azure", "SOJOURN_IMDS_ENDPOINT": metadata.url,
           "SOJOURN_GCE_METADATA_ENDPOINT": metadata.url, "SOJOURN_AZURE_IMDS_ENDPOINT": metadata.url,
           "SOJOURN_NOTICE_POLL_S": "0.05"}
    w = notices.watch(got.append, env=env)
    assert w is not None
    try:
        time.sleep(0.3)
        assert got == []
        metadata.aws_notice()
        assert wait_notice(w, 5) is not None
        metadata.aws_rebalance()
        metadata.gcp_preempt()
        event = metadata.azure_preempt()
        deadline = time.monotonic() + 5
        while len(got) < 4 and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.3)  # and nothing more arrives
        assert sorted(n.source for n in got) == ["aws", "aws-rebalance", "azure", "gcp"]
        assert got[0].source == "aws"
    finally:
        w.stop()
    assert metadata.azure_acks == [event]  # acknowledged when the watcher stops


def test_signal_sources_claim_their_signal_once() -> None:
    got: list[Notice] = []
    w = notices.watch(got.append, env={"SOJOURN_NOTICES": "slurm", "SOJOURN_SLURM_NOTICE_S": "120"})
    assert w is not None
    try:
        assert not w.signal(signal.SIGTERM)  # not Slurm's: the caller handles it as before
        assert w.signal(signal.SIGUSR1) and w.signal(signal.SIGUSR1)
        assert wait_notice(w, 2) is not None
        time.sleep(0.1)
        assert len(got) == 1 and got[0].source == "slurm" and got[0].deadline == 120
    finally:
        w.stop()


def test_an_absent_metadata_server_costs_nothing_at_start_and_is_reported_once() -> None:
    logged: list[str] = []
    env = {"SOJOURN_NOTICES": "aws", "SOJOURN_IMDS_ENDPOINT": "http://127.0.0.1:9", "SOJOURN_NOTICE_POLL_S": "0.05"}
    t0 = time.monotonic()
    w = notices.watch(lambda n: None, env=env, log=logged.append)
    assert time.monotonic() - t0 < 0.05  # no request on the caller's thread
    assert w is not None
    time.sleep(0.8)
    w.stop()
    assert len(logged) == 1 and "cannot be read" in logged[0] and "127.0.0.1:9" in logged[0]


def test_a_failing_callback_is_reported_not_raised(metadata: MetadataServer) -> None:
    logged: list[str] = []

    def boom(n: Notice) -> None:
        raise RuntimeError("callback bug")

    w = notices.watch(boom, env={"SOJOURN_NOTICES": "kubernetes"}, log=logged.append)
    assert w is not None
    assert w.signal(signal.SIGTERM)
    deadline = time.monotonic() + 2
    while not logged and time.monotonic() < deadline:
        time.sleep(0.02)
    w.stop()
    assert "callback bug" in logged[0]
