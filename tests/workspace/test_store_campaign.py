"""A randomized campaign of store faults, next to the kill campaign (test_campaign.py).

Faults: S3 unreachable (a TCP proxy in front of the real S3 server resets every connection,
open ones mid-request), a slow S3 link (the proxy delays every piece), a full disk (the
repository on a small tmpfs, filled), EIO and slow writes at the local backend's fsync (no
device-mapper here: tests/workspace/storefault_hook/sitecustomize.py), a repository
directory that vanished, and one swapped for another repository. Each trial draws when the
fault starts, when the pause comes (`sojourn suspend`, or SIGTERM to `sojourn run`) and how
long the fault lasts (some longer than the retry deadline), then resumes in a fresh process
(store_campaign_lib.py). Invariants: 0 lost (after the pause the workspace is suspended on a
verified capsule, or it keeps running and the next pause lands), 0 doubled (no step done
twice, never two live sessions), 0 silently wrong (the output is an unpaused run's).

``SOJOURN_CAMPAIGN_SEED`` replays a campaign, ``SOJOURN_STORE_CAMPAIGN_TRIALS`` sizes it
(default 200), ``SOJOURN_STORE_CAMPAIGN_ONLY=3,9`` runs those trials,
``SOJOURN_STORE_CAMPAIGN_JOBS`` how many at once (default 4)."""

from __future__ import annotations

import os
import random
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.workspace.store_campaign_lib import LOCAL_FAULTS, S3_FAULTS, StoreTrial, run_trial


@pytest.mark.timeout(3600)
def test_store_fault_campaign(tmp_path: Path, capsys: pytest.CaptureFixture[str], ws_s3_server: Any) -> None:
    from tests.repository.s3server import s3_client

    seed = int(os.environ.get("SOJOURN_CAMPAIGN_SEED") or random.SystemRandom().randrange(1, 10**9))
    sized = int(os.environ.get("SOJOURN_STORE_CAMPAIGN_TRIALS") or 200)
    only = [int(x) for x in os.environ.get("SOJOURN_STORE_CAMPAIGN_ONLY", "").split(",") if x.strip()]
    jobs = int(os.environ.get("SOJOURN_STORE_CAMPAIGN_JOBS") or 4)
    kinds = list(LOCAL_FAULTS) + list(S3_FAULTS)
    if os.geteuid() != 0:
        kinds.remove("enospc")  # a tmpfs mount needs root
    bucket = "sojourn-store-campaign"
    client = s3_client(ws_s3_server)
    try:
        client.create_bucket(Bucket=bucket)
    except client.exceptions.BucketAlreadyOwnedByYou:
        pass
    root = Path(tempfile.mkdtemp(prefix="ssc-", dir=tmp_path))
    t0 = time.monotonic()
    with ThreadPoolExecutor(jobs) as pool:
        trials: list[StoreTrial] = list(pool.map(
            lambda i: run_trial(seed, i, root, kinds, ws_s3_server, bucket), only or range(sized)))
    by_fault = Counter(t.fault for t in trials)
    outcomes = Counter((t.fault, t.outcome or "-") for t in trials)
    bad = [t for t in trials if t.failed]
    with capsys.disabled():
        print(f"\nstore fault campaign, seed {seed}: {len(trials)} trials in {time.monotonic() - t0:.0f} s "
              f"({jobs} at a time); lost {sum(bool(t.lost) for t in trials)}, doubled "
              f"{sum(bool(t.doubled) for t in trials)}, wrong {sum(bool(t.wrong) for t in trials)}, "
              f"trial errors {sum(bool(t.errors) for t in trials)}", flush=True)
        for f in kinds:
            print(f"  {f:10} {by_fault[f]:4} trials: " + ", ".join(
                f"{o} {n}" for (k, o), n in sorted(outcomes.items()) if k == f), flush=True)
        for t in bad:
            print(f"\nFAILED trial {t.index} ({t.fault}, {t.pause} after {t.at_step} steps, fault {t.hold} s; replay "
                  f"with SOJOURN_CAMPAIGN_SEED={seed} SOJOURN_STORE_CAMPAIGN_ONLY={t.index}):\n  "
                  + "\n  ".join(t.lost + t.doubled + t.wrong + t.errors), flush=True)
    assert not bad, (f"{len(bad)} trial(s) failed; replay with SOJOURN_CAMPAIGN_SEED={seed} "
                     f"SOJOURN_STORE_CAMPAIGN_ONLY={','.join(str(t.index) for t in bad)}")


# -- bugs the campaign found, each replayed deterministically -------------------------------


def test_a_refused_event_is_not_written_into_a_swapped_repository(tmp_path: Path, ws_s3_server: Any) -> None:
    """Found by the campaign (seed 1, trial 1): the repository directory was swapped for
    another repository, SIGTERM's pause was refused (the session checks the repository's id
    before it writes), but the supervisor wrote the `refused` event into the other repository
    without looking. Once the real one was back, the next event left a hole in the log, and
    `sojourn suspend` (and every later read) refused the whole record as cut in the middle:
    the workspace was lost. Every append now checks the repository's id first."""
    from tests.workspace.store_campaign_lib import StoreBench, _trial

    t = StoreTrial(0, "swapped", pause="sigterm", at_step=3, hold=1.0)
    b = StoreBench(tmp_path / "t", t, None, None)
    try:
        _trial(b, 10, 0.0)
    finally:
        b.cleanup()
    assert t.outcome == "refused" and not t.failed, (t.lost, t.doubled, t.wrong, t.errors)
