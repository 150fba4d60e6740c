"""The cost model: what finishing a workspace's remaining work on an offer costs, in USD and
seconds, term by term. Pure: no I/O, no clock, no randomness; inputs in, a :class:`Plan` out.

    route cost = price x expected time on that machine            (compute)
               + price x launch/queue time                         (launch)
               + capsule bytes x egress price, bytes / bandwidth   (transfer)
               + preemption rate x hours x cost of a forced move   (risk)

Every number that is an assumption rather than a measurement lives in :class:`Assumptions`,
so a plan can say which numbers it assumed, and a caller (or a test) can change them.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from sojourn.providers.base import Offer

GIB = 1024**3
MIB = 1024**2


@dataclass(frozen=True)
class Assumptions:
    """Defaults for what the model cannot measure. Conservative where it matters: a slow
    write speed (so a notice is judged too short rather than long enough), list egress
    prices (first tier, per GiB), and a non-zero preemption rate for spot machines."""

    launch_s: dict[str, float] = field(default_factory=lambda: {
        "local": 2.0, "ssh": 10.0, "slurm": 60.0, "kubernetes": 60.0})
    launch_s_cloud: float = 180.0  # boot + image + environment on a cloud VM
    egress_usd_per_gib: dict[str, float] = field(default_factory=lambda: {
        "aws": 0.09, "gcp": 0.12, "azure": 0.087, "lambda": 0.0, "runpod": 0.0, "local": 0.0,
        "ssh": 0.0, "slurm": 0.0})
    egress_unknown_usd_per_gib: float = 0.12  # the dearest of the big three, for a provider not listed
    inter_region_usd_per_gib: dict[str, float] = field(default_factory=lambda: {
        "aws": 0.02, "gcp": 0.02, "azure": 0.02})
    same_host_bps: float = 1024 * MIB
    same_region_bps: float = 500 * MIB
    same_provider_bps: float = 100 * MIB
    internet_bps: float = 50 * MIB
    spot_preemptions_per_hour: float = 0.02  # about one every two days
    write_bps: float = 50 * MIB  # capture speed when none was measured
    pause_s: float = 5.0  # reach a statement boundary, flush files, verify the write
    checkpoint_interval_s: float = 3600.0  # work lost on average is half of it, if a notice is too short

    def launch_for(self, provider: str) -> float:
        return self.launch_s.get(provider, self.launch_s_cloud)


DEFAULT = Assumptions()


@dataclass(frozen=True)
class Site:
    """Where the capsule's bytes are: a provider, a region, and for ``local`` a machine."""

    provider: str
    region: str | None = None
    machine: str | None = None

    @classmethod
    def of(cls, offer: Offer) -> Site:
        return cls(offer.provider, offer.region, offer.name if offer.provider == "local" else None)


@dataclass(frozen=True)
class Work:
    """What is left to do: seconds of compute at reference speed, and the state to carry."""

    remaining_s: float
    capsule_bytes: int = 0
    write_bps: float | None = None  # measured capture speed; None: Assumptions.write_bps

    def __post_init__(self) -> None:
        if not (self.remaining_s >= 0 and math.isfinite(self.remaining_s)):
            raise ValueError(f"remaining time must be a finite number of seconds >= 0, not {self.remaining_s!r}")
        if self.capsule_bytes < 0:
            raise ValueError("capsule size cannot be negative")


@dataclass(frozen=True)
class Term:
    name: str  # compute, launch, transfer, risk
    usd: float
    seconds: float
    detail: str  # the arithmetic, in words

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Plan:
    """The cost of finishing the work on ``offer``, term by term."""

    offer: Offer
    terms: tuple[Term, ...]
    assumed: tuple[str, ...] = ()  # which inputs were assumptions, not measurements

    @property
    def usd(self) -> float:
        return sum(t.usd for t in self.terms)

    @property
    def seconds(self) -> float:
        return sum(t.seconds for t in self.terms)

    def term(self, name: str) -> Term:
        for t in self.terms:
            if t.name == name:
                return t
        raise KeyError(name)

    def explain(self) -> str:
        o = self.offer
        kind = "spot" if o.spot else "on-demand"
        lines = [f"plan: {o.provider}:{o.name} ({kind}, ${o.price:.4g}/h)"]
        for t in self.terms:
            lines.append(f"  {t.name:<9} ${t.usd:>10.4f}  {duration(t.seconds):>9}  {t.detail}")
        lines.append(f"  {'total':<9} ${self.usd:>10.4f}  {duration(self.seconds):>9}")
        if self.assumed:
            lines.append("  assumed: " + "; ".join(self.assumed))
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {"offer": f"{self.offer.provider}:{self.offer.name}", "spot": self.offer.spot,
                "price_per_hour": self.offer.price, "usd": self.usd, "seconds": self.seconds,
                "terms": [t.to_json() for t in self.terms], "assumed": list(self.assumed)}


def duration(s: float) -> str:
    if not math.isfinite(s):
        return "inf"
    s = round(s)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def size(n: float) -> str:
    return f"{n / GIB:.2f} GiB" if n >= GIB / 10 else f"{n / MIB:.1f} MiB"


# -- the pieces ----------------------------------------------------------------------------


def save_seconds(capsule_bytes: int, write_bps: float | None, a: Assumptions = DEFAULT) -> float:
    """Seconds to pause and write ``capsule_bytes`` (what a preemption notice must cover)."""
    return a.pause_s + capsule_bytes / (write_bps or a.write_bps)


def notice_ok(offer: Offer, save_s: float) -> bool | None:
    """Whether ``offer``'s preemption notice covers a save of ``save_s``; None: unknown."""
    if not offer.spot:
        return True  # no preemption notice to race against
    if offer.notice_s is None:
        return None
    return offer.notice_s >= save_s


def transfer(capsule_bytes: int, src: Site | None, dst: Offer, a: Assumptions = DEFAULT) -> Term:
    """Carrying the capsule from where it is to ``dst``: egress from the source provider, and
    time at the slowest link. ``src`` None: nothing to carry (a fresh start)."""
    if src is None or capsule_bytes == 0:
        return Term("transfer", 0.0, 0.0, "nothing to carry")
    gib = capsule_bytes / GIB
    if src.provider == dst.provider and src.provider == "local" and src.machine == dst.name:
        bps, rate, how = a.same_host_bps, 0.0, "same machine"
    elif src.provider == dst.provider and (src.region == dst.region or src.provider == "local"):
        bps, rate, how = a.same_region_bps, 0.0, "same provider and region, no egress"
    elif src.provider == dst.provider:
        bps = a.same_provider_bps
        rate = a.inter_region_usd_per_gib.get(src.provider, a.egress_usd_per_gib.get(
            src.provider, a.egress_unknown_usd_per_gib))
        how = f"{src.region} -> {dst.region} at {rate:g} $/GiB"
    else:
        bps = a.internet_bps
        rate = a.egress_usd_per_gib.get(src.provider, a.egress_unknown_usd_per_gib)
        how = f"egress from {src.provider} at {rate:g} $/GiB"
    seconds = capsule_bytes / bps
    waiting = dst.price * seconds / 3600 if _finite(dst.price) else 0.0
    return Term("transfer", gib * rate + waiting, seconds,
                f"{size(capsule_bytes)}: {how}; {size(bps)}/s -> {duration(seconds)} paid at the destination")


def launch(dst: Offer, a: Assumptions = DEFAULT) -> Term:
    s = a.launch_for(dst.provider)
    return Term("launch", dst.price * s / 3600, s, f"{s:g} s to launch/queue at ${dst.price:.4g}/h")


def compute(dst: Offer, work: Work, speed: float = 1.0) -> Term:
    s = work.remaining_s / speed
    extra = f" (speed {speed:g}x)" if speed != 1.0 else ""
    return Term("compute", dst.price * s / 3600, s, f"${dst.price:.4g}/h x {s / 3600:.3g} h{extra}")


def forced_move(dst: Offer, work: Work, a: Assumptions = DEFAULT) -> tuple[float, float, str]:
    """USD and seconds one preemption of ``dst`` costs: save, relaunch, reload the capsule in
    the same region, and the work lost since the last checkpoint when the notice is too short."""
    save_s = save_seconds(work.capsule_bytes, work.write_bps, a)
    reload_s = work.capsule_bytes / a.same_region_bps
    s = save_s + a.launch_for(dst.provider) + reload_s
    ok = notice_ok(dst, save_s)
    lost = "" if ok else f", {'unknown notice' if ok is None else 'notice too short'}: half a checkpoint lost"
    if not ok:
        s += a.checkpoint_interval_s / 2
    return dst.price * s / 3600, s, f"save {duration(save_s)} + relaunch + reload{lost}"


def risk(dst: Offer, work: Work, speed: float = 1.0, a: Assumptions = DEFAULT) -> Term:
    if not dst.spot:
        return Term("risk", 0.0, 0.0, "on-demand: no preemption assumed")
    hours = work.remaining_s / speed / 3600
    n = a.spot_preemptions_per_hour * hours
    usd, s, how = forced_move(dst, work, a)
    return Term("risk", n * usd, n * s,
                f"{a.spot_preemptions_per_hour:g}/h x {hours:.3g} h = {n:.3g} preemption(s) x "
                f"(${usd:.4f}, {duration(s)}: {how})")


def route(
    dst: Offer,
    work: Work,
    *,
    source: Site | None = None,
    moving: bool = True,
    speed: float = 1.0,
    a: Assumptions = DEFAULT,
) -> Plan:
    """The plan for finishing ``work`` on ``dst``. ``moving`` False: already running there
    (no launch, nothing to carry). ``source``: where the capsule is (None: nothing to carry)."""
    if speed <= 0:
        raise ValueError("speed must be > 0")
    terms = [compute(dst, work, speed)]
    if moving:
        terms += [launch(dst, a), transfer(work.capsule_bytes, source, dst, a)]
    terms.append(risk(dst, work, speed, a))
    assumed = []
    if moving:
        assumed.append(f"launch {a.launch_for(dst.provider):g} s for {dst.provider}")
    if dst.spot:
        assumed.append(f"{a.spot_preemptions_per_hour:g} preemptions/h on spot")
    if work.write_bps is None and (dst.spot or moving):
        assumed.append(f"write speed {size(a.write_bps)}/s (none measured)")
    return Plan(dst, tuple(terms), tuple(assumed))


def rank(offers: list[Offer], work: Work, *, source: Site | None = None, a: Assumptions = DEFAULT) -> list[Plan]:
    """Plans for each offer, cheapest total first (ties: faster, then by name)."""
    plans = [route(o, work, source=source, a=a) for o in offers if _finite(o.price)]
    return sorted(plans, key=lambda p: (p.usd, p.seconds, p.offer.provider, p.offer.name))


# -- moving --------------------------------------------------------------------------------


@dataclass(frozen=True)
class MoveRule:
    """Move only when the target is at least ``min_fraction`` cheaper for the remaining time
    and the saving is at least ``min_factor`` times what the move itself costs."""

    min_fraction: float = 0.20
    min_factor: float = 3.0


@dataclass(frozen=True)
class MoveVerdict:
    move: bool
    stay: Plan
    go: Plan
    stay_usd: float  # finishing where it runs
    go_usd: float  # finishing on the target, not counting the move
    move_usd: float  # the move: save on the source, launch and transfer to the target
    move_s: float
    saving_usd: float
    saving_fraction: float
    reason: str

    def numbers(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("stay_usd", "go_usd", "move_usd", "move_s", "saving_usd",
                                              "saving_fraction")}


def move_verdict(
    current: Offer,
    target: Offer,
    work: Work,
    *,
    source: Site | None = None,
    rule: MoveRule | None = None,
    a: Assumptions = DEFAULT,
) -> MoveVerdict:
    """Whether moving from ``current`` to ``target`` pays, under ``rule`` (default: 20 %, 3x).
    ``source``: where the capsule is (default: where ``current`` runs)."""
    rule = rule or MoveRule()
    src = source if source is not None else Site.of(current)
    stay = route(current, work, moving=False, a=a)
    go = route(target, work, source=src, moving=True, a=a)
    stay_usd = stay.usd
    go_usd = go.term("compute").usd + go.term("risk").usd
    save_s = save_seconds(work.capsule_bytes, work.write_bps, a)
    save_usd = current.price * save_s / 3600 if _finite(current.price) else 0.0
    move_usd = save_usd + go.term("launch").usd + go.term("transfer").usd
    move_s = save_s + go.term("launch").seconds + go.term("transfer").seconds
    saving = stay_usd - go_usd
    fraction = saving / stay_usd if stay_usd > 0 else 0.0
    if not (_finite(target.price) and _finite(current.price)):
        ok, why = False, "a price is unknown"
    elif not _at_least(fraction, rule.min_fraction):
        ok, why = False, f"saving {fraction:.1%} is under {rule.min_fraction:.0%}"
    elif not _at_least(saving, rule.min_factor * move_usd):
        ok, why = False, f"saving ${saving:.4f} is under {rule.min_factor:g} x the move's ${move_usd:.4f}"
    else:
        ok, why = True, (f"saving ${saving:.4f} ({fraction:.1%}) is >= {rule.min_fraction:.0%} and "
                         f">= {rule.min_factor:g} x the move's ${move_usd:.4f}")
    return MoveVerdict(ok, stay, go, stay_usd, go_usd, move_usd, move_s, saving, fraction, why)


def _at_least(x: float, bound: float) -> bool:
    """``x >= bound``, where a value that is the bound but for the rounding of binary floats
    counts as reaching it: $1.00 -> $0.80 is 20 % cheaper, though 0.2 comes out 0.19999999999999996."""
    return x >= bound or math.isclose(x, bound, rel_tol=1e-9)


def _finite(x: float) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)
