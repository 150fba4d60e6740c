"""Policy decisions as data: auto-move, out of memory, GPU idle. Offers are plain Offer
objects (catalog-like clouds and local machines from a machines config)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sojourn.providers.base import Offer, Requirements
from sojourn.router import policy
from sojourn.router.cost import GIB, Work
from sojourn.router.policy import Decision, PolicyConfig, Situation

MACHINES = [  # as LocalProvider.offers gives them for a machines config
    Offer("local", "small", cpus=2, memory=2 * GIB, price_per_hour=0.05, region="host"),
    Offer("local", "big", cpus=8, memory=16 * GIB, price_per_hour=0.40, region="host"),
]
CLOUD = [
    Offer("aws", "m7i.large@us-east-1", cpus=2, memory=8 * GIB, price_per_hour=0.1008, region="us-east-1",
          spot_price_per_hour=0.0316),
    Offer("aws", "m7i.large@us-east-1:spot", cpus=2, memory=8 * GIB, price_per_hour=0.1008, region="us-east-1",
          spot_price_per_hour=0.0316, spot=True, notice_s=120),
    Offer("aws", "r6i.xlarge@us-east-1", cpus=4, memory=32 * GIB, price_per_hour=0.252, region="us-east-1"),
    Offer("aws", "g5.xlarge@us-east-1", cpus=4, memory=16 * GIB, gpus=1, gpu="A10G", price_per_hour=1.006,
          region="us-east-1"),
    Offer("gcp", "a2-ultragpu-1g@us-central1", cpus=12, memory=170 * GIB, gpus=1, gpu="A100-80GB",
          price_per_hour=0.5, region="us-central1", extra={"notes": ["gpu-price-unverified"]}),
]
ALL = MACHINES + CLOUD


def test_oom_resumes_on_the_cheapest_offer_with_more_memory_than_the_high_water_mark() -> None:
    s = Situation("ws_1", state="suspended", stop_reason="oom", memory_high_water=3 * GIB, memory_limit=2 * GIB)
    d = policy.oom(s, ALL, PolicyConfig())
    assert d.action == "propose-resume" and not d.spends
    assert d.target is not None and d.target.name == "m7i.large@us-east-1"  # 8 GiB at 0.10: cheapest > 3 GiB
    ev = d.to_event()
    assert ev["type"] == "policy" and ev["policy"] == "oom" and ev["target"] == "aws:m7i.large@us-east-1"
    assert ev["numbers"]["memory_high_water"] == 3 * GIB and ev["numbers"]["memory_needed_over"] == 3 * GIB
    # a local machine wins when it has the memory and is cheapest
    s2 = Situation("ws_1", state="suspended", stop_reason="oom", memory_high_water=1 * GIB, memory_limit=1 * GIB)
    assert policy.oom(s2, ALL, PolicyConfig()).target == MACHINES[0]
    # performing is opt-in
    assert policy.oom(s, ALL, PolicyConfig(oom="perform")).action == "resume"
    assert policy.oom(s, ALL, PolicyConfig(oom="off")).action == "none"


def test_oom_needs_strictly_more_and_respects_requirements() -> None:
    s = Situation("ws_1", state="suspended", stop_reason="oom", memory_high_water=16 * GIB)
    d = policy.oom(s, ALL, PolicyConfig())
    assert d.target is not None and d.target.memory is not None and d.target.memory > 16 * GIB
    assert d.target.name == "r6i.xlarge@us-east-1"  # not "big" (16 GiB, not more), not the doubtful gcp row
    gpu = Situation("ws_1", state="suspended", stop_reason="oom", memory_high_water=8 * GIB,
                    requirements=Requirements(gpus=1))
    dg = policy.oom(gpu, ALL, PolicyConfig())
    assert dg.target is not None and dg.target.name == "g5.xlarge@us-east-1"
    assert policy.oom(gpu, ALL, PolicyConfig(allow_doubtful_prices=True)).target == CLOUD[-1]
    huge = Situation("ws_1", state="suspended", stop_reason="oom", memory_high_water=4096 * GIB)
    d = policy.oom(huge, ALL, PolicyConfig())
    assert d.action == "none" and "no offer has more than" in d.reason
    assert policy.oom(Situation("ws_1", stop_reason="finished"), ALL, PolicyConfig()).action == "none"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 64), st.floats(0.01, 10)), min_size=1, max_size=12),
       st.integers(1, 64))
def test_oom_target_is_the_cheapest_with_more_memory(specs: list[tuple[int, float]], hwm_gib: int) -> None:
    offers = [Offer("x", f"o{i}", memory=m * GIB, price_per_hour=p) for i, (m, p) in enumerate(specs)]
    d = policy.oom(Situation("w", state="suspended", stop_reason="oom", memory_high_water=hwm_gib * GIB),
                   offers, PolicyConfig())
    bigger = [o for o in offers if (o.memory or 0) > hwm_gib * GIB]
    if not bigger:
        assert d.action == "none" and d.target is None
    else:
        assert d.target is not None and d.target.price == min(o.price for o in bigger)
        assert (d.target.memory or 0) > hwm_gib * GIB


def running_on(offer: Offer, **kw: object) -> Situation:
    return Situation("ws_2", current=offer, state="running", **kw)  # type: ignore[arg-type]


def test_auto_move_is_opt_in_and_recorded_with_numbers() -> None:
    cur = CLOUD[2]  # r6i.xlarge 0.252 $/h
    s = running_on(cur, remaining_s=24 * 3600, capsule_bytes=1 * GIB, memory_high_water=1 * GIB)
    off = policy.auto_move(s, ALL, PolicyConfig())
    assert off.action == "propose-move" and not off.spends
    assert off.target is not None and off.target.name == "small"
    on = policy.auto_move(s, ALL, PolicyConfig(auto_move=True))
    assert on.action == "move" and on.spends
    n = on.numbers
    assert n["saving_fraction"] >= 0.2 and n["saving_usd"] >= 3 * n["move_usd"]
    assert n["min_fraction"] == 0.2 and n["min_factor"] == 3.0
    # spot is never chosen unless asked for
    assert on.target is not None and not on.target.spot


def test_auto_move_stays_when_the_saving_is_small() -> None:
    s = running_on(CLOUD[2], remaining_s=600, capsule_bytes=50 * GIB, memory_high_water=1 * GIB)
    d = policy.auto_move(s, ALL, PolicyConfig(auto_move=True))
    assert d.action == "none" and "under" in d.reason  # 10 minutes left: the move costs more than it saves
    assert policy.auto_move(running_on(CLOUD[2]), ALL, PolicyConfig(auto_move=True)).reason.startswith("no estimate")
    stricter = PolicyConfig(auto_move=True, min_fraction=0.99)
    big = running_on(CLOUD[2], remaining_s=24 * 3600, memory_high_water=1 * GIB)
    assert policy.auto_move(big, ALL, stricter).action == "none"


@settings(max_examples=150, deadline=None)
@given(st.floats(0.05, 20), st.lists(st.floats(0.01, 20), min_size=1, max_size=6), st.floats(0, 48 * 3600),
       st.integers(0, 200 * GIB), st.floats(0, 0.9), st.floats(0, 10))
def test_auto_move_never_moves_under_the_thresholds(cur_price: float, others: list[float], remaining: float,
                                                    nbytes: int, frac: float, factor: float) -> None:
    cur = Offer("aws", "cur", region="r", price_per_hour=cur_price)
    offers = [Offer("gcp", f"o{i}", region="q", price_per_hour=p) for i, p in enumerate(others)]
    cfg = PolicyConfig(auto_move=True, min_fraction=frac, min_factor=factor)
    d = policy.auto_move(running_on(cur, remaining_s=remaining, capsule_bytes=nbytes), offers, cfg)
    if d.action == "move":
        assert d.numbers["saving_fraction"] >= frac
        assert d.numbers["saving_usd"] >= factor * d.numbers["move_usd"]


def test_gpu_idle_proposes_a_cpu_machine_with_the_saving() -> None:
    gpu = CLOUD[3]  # g5.xlarge 1.006 $/h
    s = running_on(gpu, gpu_idle_s=1800, remaining_s=5 * 3600, capsule_bytes=2 * GIB, memory_high_water=6 * GIB)
    d = policy.gpu_idle(s, ALL, PolicyConfig())
    assert d.action == "propose-move" and d.target is not None and d.target.gpus == 0
    assert (d.target.memory or 0) >= 6 * GIB
    assert d.numbers["saving_per_hour"] == pytest.approx(gpu.price - d.target.price)
    assert d.numbers["break_even_s"] > 0 and "saves" in d.reason
    assert policy.gpu_idle(s, ALL, PolicyConfig(gpu_idle="perform")).action == "move"
    assert policy.gpu_idle(running_on(gpu, gpu_idle_s=60), ALL, PolicyConfig()).action == "none"
    assert policy.gpu_idle(running_on(CLOUD[2], gpu_idle_s=9999), ALL, PolicyConfig()).action == "none"
    unknown = policy.gpu_idle(running_on(gpu, gpu_idle_s=1800), ALL, PolicyConfig(gpu_idle="perform"))
    assert unknown.action == "propose-move" and "next hour" in unknown.reason  # unknown remaining: only proposes


def test_decide_runs_every_policy_and_spends_nothing_by_default() -> None:
    s = running_on(CLOUD[3], gpu_idle_s=3600, remaining_s=10 * 3600, memory_high_water=GIB)
    ds = policy.decide(s, ALL)
    assert [d.policy for d in ds] == ["auto-move", "oom", "gpu-idle"]
    assert not any(d.spends for d in ds)
    assert all(isinstance(d, Decision) and d.to_event()["type"] == "policy" for d in ds)


def test_config_from_json() -> None:
    assert PolicyConfig.from_json({"auto_move": True, "min_fraction": 0.3}).rule.min_fraction == 0.3
    assert PolicyConfig.from_json(None) == PolicyConfig()
    with pytest.raises(ValueError, match="unknown policy setting"):
        PolicyConfig.from_json({"auto_mvoe": True})
    with pytest.raises(ValueError, match="oom must be one of"):
        PolicyConfig(oom="always")


def test_situation_from_a_workspace_record() -> None:
    from sojourn.workspace import records as R

    rec = R.WorkspaceRecord("ws_9", "job", 0.0, R.Command("s.py", [], "/", "python"), state="suspended",
                            stop_reason="oom")
    rec.last_capsule = R.CapsuleEntry("cap_1", None, "oom", "s.py:3", 5 * GIB, 1.0, "al_1", True)
    rec.allocations.append(R.Allocation("al_1", "local", "small", "h", "b", 1, 1, "python", 2 * GIB, 0.0, 1))
    rec.requirements["memory_high_water"] = 2 * GIB
    s = policy.situation_from_record(rec)
    assert (s.capsule_bytes, s.memory_high_water, s.memory_limit, s.stop_reason) == (5 * GIB, 2 * GIB, 2 * GIB, "oom")
    d = policy.oom(s, ALL, PolicyConfig())
    assert d.target is not None and d.target.name == "m7i.large@us-east-1"
    assert s.work(60) == Work(60, 5 * GIB, None)
