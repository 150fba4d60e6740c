"""Every notice source, end to end: a real `sojourn run` (supervisor + session processes)
watching a local metadata server (or receiving Slurm's / Kubernetes' signal), a notice,
a workspace suspended on a verified capsule with stop reason ``preempted``, and a resume that
prints exactly what an unmoved run prints."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable

import pytest

from tests.notices.metadata_server import MetadataServer
from tests.workspace.conftest import Shell, finish

COUNT = """
import time
import numpy as np
total = np.zeros(3)
for i in range(60):
    total += i
    print(i, int(total.sum()), flush=True)
    time.sleep(0.05)
print("done", total.tolist())
"""


def _env(metadata: MetadataServer, names: str) -> dict[str, str]:
    return {"SOJOURN_NOTICES": names, "SOJOURN_IMDS_ENDPOINT": metadata.url,
            "SOJOURN_GCE_METADATA_ENDPOINT": metadata.url, "SOJOURN_AZURE_IMDS_ENDPOINT": metadata.url,
            "SOJOURN_NOTICE_POLL_S": "0.1"}


CASES: dict[str, tuple[dict[str, str], Callable[[MetadataServer, int], None]]] = {
    "aws": ({"SOJOURN_NOTICES": "aws"}, lambda m, pid: m.aws_notice("terminate", 120)),
    "aws-rebalance": ({"SOJOURN_NOTICES": "aws-rebalance"}, lambda m, pid: m.aws_rebalance()),
    "gcp": ({"SOJOURN_NOTICES": "gcp"}, lambda m, pid: m.gcp_preempt()),
    "azure": ({"SOJOURN_NOTICES": "azure"}, lambda m, pid: m.azure_preempt(30) and None),
    # Slurm's --signal=B:USR1@N reaches the batch shell, which exec'd `sojourn run`.
    "slurm": ({"SOJOURN_NOTICES": "auto", "SLURM_JOB_ID": "4242", "SOJOURN_SLURM_NOTICE_S": "60"},
              lambda m, pid: os.kill(pid, signal.SIGUSR1)),
    # Kubernetes sends SIGTERM to the container's PID 1, which is `sojourn run` (`auto` detects
    # that only at PID 1, which a test cannot be: the source is named).
    "kubernetes": ({"SOJOURN_NOTICES": "kubernetes", "KUBERNETES_SERVICE_HOST": "10.96.0.1"},
                   lambda m, pid: os.kill(pid, signal.SIGTERM)),
}


@pytest.mark.parametrize("source", list(CASES))
def test_notice_suspends_with_stop_reason_preempted(sh: Shell, metadata: MetadataServer, source: str) -> None:
    extra, flip = CASES[source]
    sh.write("count.py", COUNT, prelude=False)
    expected = sh.plain("count.py")
    run = sh.start("run", "count.py", env={**_env(metadata, extra["SOJOURN_NOTICES"]), **extra})
    ws = sh.workspace_of(run)
    first = sh.read_lines(run, 5)
    assert len(first) == 5
    flip(metadata, run.pid)
    code, out, err = finish(run)
    assert code == 75, err
    assert "preemption notice" in err
    rec = sh.show(ws)
    assert rec["state"] == "suspended", rec
    assert rec["allocations"][-1]["stop_reason"] == "preempted"
    assert rec["last_capsule"]["verified"] and rec["last_capsule"]["reason"] == "preempted"
    req = [e for e in rec["events"] if e["type"] == "request"]
    assert len(req) == 1 and req[0]["kind"] == "preempted" and req[0]["requested_by"] == source
    assert req[0]["notice"]["source"] == source
    if source == "azure":
        assert len(metadata.azure_acks) == 1  # acknowledged after the capsule was durable
        assert req[0]["notice"]["payload"]["event"]["EventType"] == "Preempt"
    resumed = sh.cli("resume", ws)
    assert resumed.returncode == 0, resumed.stderr
    assert "".join(first) + out + resumed.stdout == expected


def test_usr1_without_a_notice_source_is_an_ordinary_suspend(sh: Shell) -> None:
    """Outside Slurm, SIGUSR1 keeps its meaning: pause, stop reason ``suspended``."""
    sh.write("count.py", COUNT, prelude=False)
    run = sh.start("run", "count.py", env={"SOJOURN_NOTICES": "auto"})
    ws = sh.workspace_of(run)
    sh.read_lines(run, 3)
    run.send_signal(signal.SIGUSR1)
    code, _, err = finish(run)
    assert code == 75, err
    assert "preemption notice" not in err
    assert sh.show(ws)["allocations"][-1]["stop_reason"] == "suspended"


def test_notice_to_durable_capsule_is_timed(sh: Shell, metadata: MetadataServer) -> None:
    """From the server's flip to the workspace's verified capsule event: printed, and well
    inside AWS's two minutes."""
    sh.write("count.py", COUNT, prelude=False)
    run = sh.start("run", "count.py", env=_env(metadata, "aws"))
    ws = sh.workspace_of(run)
    sh.read_lines(run, 3)
    metadata.aws_notice("terminate", 120)
    assert metadata.flipped_at is not None
    t_flip = metadata.flipped_at
    finish(run)
    events = sh.show(ws)["events"]
    cap = next(e for e in events if e["type"] == "capsule" and e["capsule"]["verified"])
    req = next(e for e in events if e["type"] == "request")
    total = cap["t"] - t_flip
    print(json.dumps({"notice_to_request_event_s": round(req["t"] - t_flip, 3),
                      "notice_to_capsule_durable_s": round(total, 3)}))
    assert 0 < total < 60
    assert time.time() - t_flip < 120
