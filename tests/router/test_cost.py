"""The cost model's properties (hypothesis) and its arithmetic on known numbers."""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from sojourn.providers.base import Offer
from sojourn.router import cost
from sojourn.router.cost import GIB, Assumptions, MoveRule, Site, Work

prices = st.floats(min_value=0.01, max_value=100.0, allow_nan=False)
providers = st.sampled_from(["aws", "gcp", "azure", "lambda", "local"])
regions = st.sampled_from(["r1", "r2"])


@st.composite
def offers(draw: st.DrawFn, spot: bool | None = None) -> Offer:
    is_spot = draw(st.booleans()) if spot is None else spot
    return Offer(draw(providers), f"m{draw(st.integers(0, 50))}", region=draw(regions),
                 price_per_hour=draw(prices), spot_price_per_hour=draw(prices), spot=is_spot,
                 notice_s=draw(st.sampled_from([None, 30.0, 120.0])) if is_spot else None)


works = st.builds(Work, remaining_s=st.floats(0, 100 * 3600), capsule_bytes=st.integers(0, 500 * GIB),
                  write_bps=st.one_of(st.none(), st.floats(1e6, 5e9)))
rules = st.builds(MoveRule, min_fraction=st.floats(0, 0.9), min_factor=st.floats(0, 10))


@settings(max_examples=300, deadline=None)
@given(offers(), offers(), works, rules)
def test_never_move_under_the_thresholds(current: Offer, target: Offer, work: Work, rule: MoveRule) -> None:
    v = cost.move_verdict(current, target, work, rule=rule)
    # a value that is the bound but for float rounding reaches it (rel 1e-9): see the boundary test
    if v.move:
        assert v.saving_fraction >= rule.min_fraction * (1 - 1e-9)
        assert v.saving_usd >= rule.min_factor * v.move_usd * (1 - 1e-9)
        assert v.saving_usd > 0 or (rule.min_factor == 0 and rule.min_fraction == 0)
    if (v.saving_fraction < rule.min_fraction * (1 - 1e-8)
            or v.saving_usd < rule.min_factor * v.move_usd * (1 - 1e-8)):
        assert not v.move
    # the numbers recorded are the ones that decided
    assert v.saving_usd == pytest.approx(v.stay_usd - v.go_usd)


@pytest.mark.parametrize("stay, go", [(1.00, 0.80), (0.10, 0.08), (3.0, 2.4), (0.7, 0.56)])
def test_exactly_20_percent_cheaper_qualifies_and_a_cent_less_does_not(stay: float, go: float) -> None:
    """The boundary itself: in binary floats 1 - 0.8/1.0 is 0.19999999999999996, which a plain
    ``<`` called "under 20%"."""
    current = Offer("local", "here", price_per_hour=stay)
    work = Work(remaining_s=10 * 3600, capsule_bytes=0, write_bps=None)
    at = cost.move_verdict(current, Offer("local", "there", price_per_hour=go), work)
    assert at.move, at.reason
    assert "is >= 20%" in at.reason and "20.0%" in at.reason
    above = cost.move_verdict(current, Offer("local", "there", price_per_hour=go * 1.001), work)
    assert not above.move and "is under 20%" in above.reason
    # and the 3x factor at its boundary: a saving exactly 3x the move's cost qualifies
    v = cost.move_verdict(current, Offer("local", "there", price_per_hour=go), work,
                          rule=MoveRule(min_fraction=0.2, min_factor=at.saving_usd / at.move_usd if at.move_usd else 3.0))
    assert v.move, v.reason


@settings(max_examples=200, deadline=None)
@given(offers(spot=False), st.floats(0.01, 50), works)
def test_default_rule_needs_20_percent(current: Offer, factor: float, work: Work) -> None:
    """A target less than 20 % cheaper is never worth a move under the default rule."""
    target = Offer("gcp", "t", region="r1", price_per_hour=current.price * min(factor, 0.8 + 1e-9 + 0.199))
    assume(target.price > current.price * 0.8 + 1e-9)
    assert not cost.move_verdict(current, target, work).move


@settings(max_examples=200, deadline=None)
@given(st.floats(0.05, 20), st.floats(0.01, 0.9), st.floats(60, 50 * 3600))
def test_cheaper_with_transfer_beats_cheaper_without_when_the_capsule_is_large(
        price: float, discount: float, remaining_s: float) -> None:
    """A remote offer with a lower hourly price loses to a dearer one next to the capsule
    once the capsule is large enough that carrying it costs more than the hourly saving."""
    here = Site("aws", "us-east-1")
    near = Offer("aws", "near", region="us-east-1", price_per_hour=price)
    far = Offer("gcp", "far", region="us-central1", price_per_hour=price * (1 - discount))
    hours = remaining_s / 3600
    a = cost.DEFAULT
    small = cost.rank([near, far], Work(remaining_s, 0), source=here)
    assert small[0].offer.name == "far"  # nothing to carry: the lower price wins
    # big enough that egress alone exceeds what the lower price saves (compute and launch)
    saving = small[1].usd - small[0].usd
    assert saving == pytest.approx((near.price - far.price) * (hours + a.launch_s_cloud / 3600))
    big_bytes = int((saving / a.egress_usd_per_gib["aws"] + 1) * GIB * 2)
    big = cost.rank([near, far], Work(remaining_s, big_bytes), source=here)
    assert big[0].offer.name == "near"
    assert big[1].term("transfer").usd > saving


@given(offers(), works)
def test_terms_are_finite_non_negative_and_sum(o: Offer, work: Work) -> None:
    p = cost.route(o, work, source=Site("aws", "r1"))
    assert [t.name for t in p.terms] == ["compute", "launch", "transfer", "risk"]
    assert all(t.usd >= 0 and t.seconds >= 0 and math.isfinite(t.usd) for t in p.terms)
    assert p.usd == pytest.approx(sum(t.usd for t in p.terms))
    stay = cost.route(o, work, moving=False)
    assert [t.name for t in stay.terms] == ["compute", "risk"] and stay.usd <= p.usd + 1e-12


def test_known_numbers_and_explain() -> None:
    a = Assumptions()
    o = Offer("aws", "g5.xlarge@us-east-1", region="us-east-1", price_per_hour=1.0, spot_price_per_hour=0.4,
              spot=True, notice_s=120)
    work = Work(2 * 3600, 10 * GIB, write_bps=100 * 1024**2)
    p = cost.route(o, work, source=Site("gcp", "us-central1"))
    assert p.term("compute").usd == pytest.approx(0.8)
    assert p.term("launch").seconds == a.launch_s_cloud
    t = p.term("transfer")
    assert t.usd == pytest.approx(10 * 0.12 + 0.4 * (10 * GIB / a.internet_bps) / 3600)
    # 10 GiB at 100 MiB/s = 102.4 s + 5 s pause < 120 s notice: no lost work in the risk
    save_s = cost.save_seconds(work.capsule_bytes, work.write_bps)
    assert save_s == pytest.approx(107.4) and cost.notice_ok(o, save_s) is True
    r = p.term("risk")
    n = a.spot_preemptions_per_hour * 2
    assert r.usd == pytest.approx(n * 0.4 * (save_s + a.launch_s_cloud + 10 * GIB / a.same_region_bps) / 3600)
    text = p.explain()
    for word in ("compute", "launch", "transfer", "risk", "total", "egress from gcp", "assumed"):
        assert word in text


def test_notice_too_short_adds_lost_work() -> None:
    o = Offer("gcp", "x", price_per_hour=1.0, spot_price_per_hour=0.3, spot=True, notice_s=30)
    small, big = Work(3600, 100 * 1024**2), Work(3600, 50 * GIB)
    assert cost.notice_ok(o, cost.save_seconds(small.capsule_bytes, None)) is True
    assert cost.notice_ok(o, cost.save_seconds(big.capsule_bytes, None)) is False
    assert cost.route(o, big).term("risk").usd > cost.route(o, small).term("risk").usd * 10
    assert "notice too short" in cost.route(o, big).term("risk").detail
    assert cost.notice_ok(Offer("runpod", "y", spot=True), 10) is None
    assert cost.notice_ok(Offer("aws", "z"), 1e9) is True  # on-demand: nothing to race


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match="remaining time"):
        Work(float("inf"))
    with pytest.raises(ValueError, match="negative"):
        Work(10, -1)
    with pytest.raises(ValueError, match="speed"):
        cost.route(Offer("a", "b"), Work(1), speed=0)
