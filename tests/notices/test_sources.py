"""Each notice source against a local server that speaks its cloud's real metadata protocol
(tests/notices/metadata_server.py): headers, tokens, 404-until-notice, long polls, payloads.
The clouds themselves cannot be reached from here."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from sojourn.notices import aws, azure, gcp, kubernetes, slurm
from sojourn.notices.base import Notice, Unreachable, http, seconds_until
from tests.notices.metadata_server import MetadataServer


def test_aws_instance_action_uses_the_imdsv2_token_flow(metadata: MetadataServer) -> None:
    src = aws.SpotInstanceAction(aws.Imds(metadata.url))
    assert src.poll() is None  # 404: no notice
    assert src.poll() is None
    # One token for both polls, and every GET carried it (the server answers 401 otherwise).
    assert [m for m, _ in metadata.requests].count("PUT") == 1
    metadata.aws_notice("terminate", in_seconds=120)
    n = src.poll()
    assert n is not None and n.source == "aws" and n.action == "terminate"
    assert n.payload["action"] == "terminate" and n.payload["time"].endswith("Z")
    assert n.deadline is not None and 110 < n.deadline <= 121
    assert 100 < (n.pause_deadline() or 0) < n.deadline  # room left to write the capsule


def test_aws_token_is_renewed_when_refused(metadata: MetadataServer) -> None:
    imds = aws.Imds(metadata.url)
    src = aws.SpotInstanceAction(imds)
    assert src.poll() is None
    metadata.tokens.clear()  # the metadata service restarted: our token is unknown now
    metadata.aws_notice("stop", in_seconds=60)
    n = src.poll()
    assert n is not None and n.action == "stop"
    assert [m for m, _ in metadata.requests].count("PUT") == 2


def test_imds_without_a_token_header_is_refused(metadata: MetadataServer) -> None:
    r = http("GET", metadata.url + aws.INSTANCE_ACTION)
    assert r.status == 401  # what an instance that requires IMDSv2 answers; our client never does this
    r = http("PUT", metadata.url + "/latest/api/token")
    assert r.status == 400


def test_aws_rebalance_recommendation(metadata: MetadataServer) -> None:
    src = aws.RebalanceRecommendation(aws.Imds(metadata.url))
    assert src.poll() is None
    metadata.aws_rebalance()
    n = src.poll()
    assert n is not None and n.source == "aws-rebalance" and n.deadline is None
    assert "noticeTime" in n.payload and n.pause_deadline() is None


def test_gcp_reads_then_long_polls_and_sees_the_flip_at_once(metadata: MetadataServer) -> None:
    src = gcp.Preempted(metadata.url, hang=30)
    assert src.poll() is None and src.etag == metadata.gcp_etag
    got: list[Notice | None] = []
    t = threading.Thread(target=lambda: got.append(src.poll()))
    t0 = time.monotonic()
    t.start()
    time.sleep(0.5)
    assert t.is_alive()  # the long poll waits on the server
    metadata.gcp_preempt()
    t.join(10)
    assert time.monotonic() - t0 < 5, "the long poll did not return on the change"
    n = got[0]
    assert n is not None and n.source == "gcp" and n.payload == "TRUE" and n.deadline == 30.0
    assert any("wait_for_change=true" in p and "last_etag=" in p for _, p in metadata.requests)


def test_gcp_without_the_flavor_header_is_refused(metadata: MetadataServer) -> None:
    r = http("GET", metadata.url + gcp.PATH)
    assert r.status == 403


def test_gcp_long_poll_times_out_quietly(metadata: MetadataServer) -> None:
    src = gcp.Preempted(metadata.url, hang=1)
    assert src.poll() is None
    t0 = time.monotonic()
    assert src.poll() is None  # nothing changed within timeout_sec
    assert 0.8 < time.monotonic() - t0 < 5


def test_azure_preempt_event_and_its_acknowledgement(metadata: MetadataServer) -> None:
    src = azure.ScheduledEvents(metadata.url)
    assert src.poll() is None
    metadata.azure_event("Freeze")  # maintenance, not a preemption
    assert src.poll() is None
    event_id = metadata.azure_preempt(in_seconds=30)
    n = src.poll()
    assert n is not None and n.source == "azure" and n.action == "preempt"
    assert n.payload["event"]["EventId"] == event_id and n.payload["event"]["EventType"] == "Preempt"
    assert n.deadline is not None and 25 < n.deadline <= 31
    assert src.poll() is None  # seen once
    src.acknowledge(n)
    assert metadata.azure_acks == [event_id]
    assert all(e["EventId"] != event_id for e in metadata.azure_doc["Events"])


def test_azure_needs_the_metadata_header(metadata: MetadataServer) -> None:
    assert http("GET", metadata.url + azure.PATH).status == 400


def test_azure_ignores_other_vms_events(metadata: MetadataServer) -> None:
    src = azure.ScheduledEvents(metadata.url, vm_name="mine")
    metadata.azure_preempt(resources=["someone-else"])
    assert src.poll() is None
    metadata.azure_preempt(resources=["mine"])
    assert src.poll() is not None


def test_unreachable_endpoint_raises_quickly() -> None:
    # A closed port on this host: refused at once (a link-local address off the cloud would
    # time out after base.CONNECT_TIMEOUT instead, in the watcher's thread).
    src = aws.SpotInstanceAction(aws.Imds("http://127.0.0.1:9", timeout=1.0))
    t0 = time.monotonic()
    with pytest.raises(Unreachable):
        src.poll()
    assert time.monotonic() - t0 < 2


def test_signal_sources_from_the_environment() -> None:
    s = slurm.source({"SOJOURN_SLURM_SIGNAL": "USR2", "SOJOURN_SLURM_NOTICE_S": "90"})
    assert s.signum == signal.SIGUSR2 and s.deadline == 90
    n = s.notice()
    assert n.source == "slurm" and n.payload == "SIGUSR2" and n.deadline == 90
    assert slurm.source({}).signum == signal.SIGUSR1
    assert slurm.signal_number("10") == 10 and slurm.signal_number("sigusr1") == signal.SIGUSR1
    with pytest.raises(ValueError, match="no signal"):
        slurm.signal_number("BOGUS")
    k = kubernetes.source({"SOJOURN_K8S_GRACE_S": "45"})
    assert k.signum == signal.SIGTERM and k.deadline == 45


def test_times_in_both_formats() -> None:
    now = 1_660_000_000.0  # 2022-08-08T23:06:40Z
    assert seconds_until("2022-08-08T23:08:40Z", now) == pytest.approx(120)
    assert seconds_until("Mon, 08 Aug 2022 23:07:10 GMT", now) == pytest.approx(30)
    assert seconds_until("", now) is None and seconds_until("soon", now) is None
