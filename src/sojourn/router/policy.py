"""Policies: when to move a workspace, decided from a record-like :class:`Situation` and a
list of offers, returned as :class:`Decision` data (each one an event dict).

Nothing here acts. A decision says ``move`` or ``resume`` only when the policy that makes
it was switched on for the workspace (``PolicyConfig``); otherwise it says ``propose-…``
and a person decides. Every decision carries the numbers that made it.

The three policies:

- auto-move (opt-in): another offer is >= ``min_fraction`` cheaper for the remaining time and
  the saving is >= ``min_factor`` x the move's cost (``cost.move_verdict``);
- out of memory: resume on the cheapest offer with more memory than the recorded high-water
  mark (and than the limit the session ran under);
- GPU idle: the GPU has been idle for ``gpu_idle_after_s`` (the program moved to CPU work):
  a move to the cheapest CPU machine, with the saving.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

from sojourn.providers.base import Offer, Requirements
from sojourn.router import cost
from sojourn.router.cost import DEFAULT, Assumptions, MoveRule, Site, Work

if TYPE_CHECKING:
    from sojourn.workspace.records import WorkspaceRecord

MODES = ("off", "propose", "perform")


@dataclass(frozen=True)
class PolicyConfig:
    """Per-workspace switches. The defaults spend nothing: auto-move off, the other two
    only propose."""

    auto_move: bool = False
    min_fraction: float = 0.20
    min_factor: float = 3.0
    oom: str = "propose"
    gpu_idle: str = "propose"
    gpu_idle_after_s: float = 900.0
    allow_doubtful_prices: bool = False  # let choices use rows whose price the catalog marks doubtful

    def __post_init__(self) -> None:
        for name in ("oom", "gpu_idle"):
            if getattr(self, name) not in MODES:
                raise ValueError(f"policy {name} must be one of {', '.join(MODES)}, not {getattr(self, name)!r}")
        if not (0 <= self.min_fraction < 1) or self.min_factor < 0:
            raise ValueError("min_fraction must be in [0, 1) and min_factor >= 0")

    @property
    def rule(self) -> MoveRule:
        return MoveRule(self.min_fraction, self.min_factor)

    @classmethod
    def from_json(cls, d: dict[str, Any] | None) -> PolicyConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d or {}) - known)
        if unknown:
            raise ValueError(f"unknown policy setting(s): {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return cls(**(d or {}))


@dataclass(frozen=True)
class Situation:
    """What the policies look at: a summary of a workspace record plus live facts."""

    workspace: str
    current: Offer | None = None  # where it runs now (None: not running)
    state: str = "running"
    stop_reason: str | None = None
    remaining_s: float | None = None  # estimate of the compute left; None: unknown
    capsule_bytes: int = 0
    write_bps: float | None = None
    memory_high_water: int | None = None  # bytes
    memory_limit: int | None = None  # the limit the last session ran under
    gpu_idle_s: float = 0.0
    requirements: Requirements = field(default_factory=Requirements)
    source: Site | None = None  # where its capsule is (default: where it runs)

    def work(self, remaining_s: float | None = None) -> Work:
        r = self.remaining_s if remaining_s is None else remaining_s
        return Work(r or 0.0, self.capsule_bytes, self.write_bps)


def situation_from_record(
    rec: WorkspaceRecord,
    *,
    current: Offer | None = None,
    remaining_s: float | None = None,
    gpu_idle_s: float = 0.0,
    write_bps: float | None = None,
    requirements: Requirements | None = None,
) -> Situation:
    """A :class:`Situation` from a workspace record: the last good capsule's size, the
    memory high-water mark, the last allocation's memory limit and stop reason."""
    last = rec.last_allocation
    hwm = rec.requirements.get("memory_high_water")
    return Situation(
        workspace=rec.id, current=current, state=rec.state, stop_reason=rec.stop_reason,
        remaining_s=remaining_s, capsule_bytes=rec.last_capsule.size if rec.last_capsule else 0,
        write_bps=write_bps, memory_high_water=int(hwm) if hwm else None,
        memory_limit=last.memory_limit if last is not None else None, gpu_idle_s=gpu_idle_s,
        requirements=requirements or Requirements(),
    )


@dataclass(frozen=True)
class Decision:
    policy: str  # auto-move, oom, gpu-idle
    action: str  # none, propose-move, move, propose-resume, resume
    workspace: str
    reason: str
    target: Offer | None = None
    numbers: dict[str, Any] = field(default_factory=dict)

    @property
    def spends(self) -> bool:
        """Whether carrying this decision out starts paying for a machine without asking."""
        return self.action in ("move", "resume")

    def to_event(self) -> dict[str, Any]:
        ev: dict[str, Any] = {"type": "policy", "policy": self.policy, "action": self.action,
                              "workspace": self.workspace, "reason": self.reason, "numbers": dict(self.numbers),
                              "spends": self.spends}
        if self.target is not None:
            ev["target"] = f"{self.target.provider}:{self.target.name}"
            ev["target_price_per_hour"] = self.target.price
        return ev


# -- choosing among offers -----------------------------------------------------------------


def usable(offers: list[Offer], req: Requirements, *, allow_doubtful: bool = False) -> list[Offer]:
    """Offers that fit ``req`` with a known price. A requirement without ``spot`` means
    on-demand: a policy never takes on preemption risk that nobody asked for."""
    from sojourn.providers.catalog import doubtful

    if req.spot is None:
        req = replace(req, spot=False)
    return [o for o in offers if o.fits(req) and math.isfinite(o.price)
            and (allow_doubtful or doubtful(o) is None)]


def cheapest(offers: list[Offer], req: Requirements, *, work: Work | None = None, source: Site | None = None,
             allow_doubtful: bool = False, a: Assumptions = DEFAULT) -> tuple[Offer, cost.Plan | None] | None:
    """The cheapest usable offer: by the plan's total when ``work`` is given (so launch,
    transfer and risk count), else by hourly price."""
    cands = usable(offers, req, allow_doubtful=allow_doubtful)
    if not cands:
        return None
    if work is not None:
        plans = cost.rank(cands, work, source=source, a=a)
        return (plans[0].offer, plans[0]) if plans else None
    best = min(cands, key=lambda o: (o.price, o.provider, o.name))
    return best, None


# -- the policies --------------------------------------------------------------------------


def auto_move(s: Situation, offers: list[Offer], cfg: PolicyConfig, a: Assumptions = DEFAULT) -> Decision:
    def none(why: str, **numbers: Any) -> Decision:
        return Decision("auto-move", "none", s.workspace, why, numbers=numbers)

    if s.current is None or s.state != "running":
        return none("not running")
    if s.remaining_s is None:
        return none("no estimate of the remaining time, so no saving can be computed")
    req = s.requirements
    if s.memory_high_water:
        req = replace(req, memory=max(req.memory or 0, s.memory_high_water))
    here = (s.current.provider, s.current.name)
    cands = [o for o in usable(offers, req, allow_doubtful=cfg.allow_doubtful_prices) if (o.provider, o.name) != here]
    work = s.work()
    verdicts = [cost.move_verdict(s.current, o, work, source=s.source, rule=cfg.rule, a=a) for o in cands]
    if not verdicts:
        return none("no other offer fits")
    best = max(verdicts, key=lambda v: (v.move, v.saving_usd - v.move_usd))
    numbers = {**best.numbers(), "min_fraction": cfg.min_fraction, "min_factor": cfg.min_factor,
               "remaining_s": s.remaining_s, "capsule_bytes": s.capsule_bytes}
    if not best.move:
        return Decision("auto-move", "none", s.workspace, f"best candidate {_ref(best.go.offer)}: {best.reason}",
                        best.go.offer, numbers)
    action = "move" if cfg.auto_move else "propose-move"
    return Decision("auto-move", action, s.workspace, f"move to {_ref(best.go.offer)}: {best.reason}",
                    best.go.offer, numbers)


def oom(s: Situation, offers: list[Offer], cfg: PolicyConfig, a: Assumptions = DEFAULT) -> Decision:
    if cfg.oom == "off" or s.stop_reason != "oom":
        return Decision("oom", "none", s.workspace, "policy off" if cfg.oom == "off" else "no out-of-memory stop")
    floor = max(s.memory_high_water or 0, s.memory_limit or 0)
    if floor == 0:
        return Decision("oom", "none", s.workspace, "no memory high-water mark or limit recorded")
    req = replace(s.requirements, memory=floor + 1)  # strictly more than what ran out
    found = cheapest(offers, req, allow_doubtful=cfg.allow_doubtful_prices, a=a)
    numbers: dict[str, Any] = {"memory_high_water": s.memory_high_water, "memory_limit": s.memory_limit, "memory_needed_over": floor}
    if found is None:
        return Decision("oom", "none", s.workspace, f"no offer has more than {cost.size(floor)} of memory", None, numbers)
    target, _ = found
    numbers.update(target_memory=target.memory, price_per_hour=target.price)
    action = "resume" if cfg.oom == "perform" else "propose-resume"
    return Decision("oom", action, s.workspace,
                    f"ran out of memory at {cost.size(floor)}; cheapest offer with more: {_ref(target)} "
                    f"({cost.size(target.memory or 0)}, ${target.price:.4g}/h)", target, numbers)


def gpu_idle(s: Situation, offers: list[Offer], cfg: PolicyConfig, a: Assumptions = DEFAULT) -> Decision:
    def none(why: str) -> Decision:
        return Decision("gpu-idle", "none", s.workspace, why)

    if cfg.gpu_idle == "off":
        return none("policy off")
    if s.current is None or not s.current.gpus or s.state != "running":
        return none("not running on a GPU")
    if s.gpu_idle_s < cfg.gpu_idle_after_s:
        return none(f"GPU idle {s.gpu_idle_s:.0f} s < {cfg.gpu_idle_after_s:.0f} s")
    req = replace(s.requirements, gpus=0, gpu=None,
                  memory=max(s.requirements.memory or 0, s.memory_high_water or 0) or None)
    cpu = [o for o in usable(offers, req, allow_doubtful=cfg.allow_doubtful_prices) if o.gpus == 0]
    if not cpu:
        return none("no CPU offer fits")
    horizon = s.remaining_s if s.remaining_s is not None else 3600.0
    work = s.work(horizon)
    verdicts = [cost.move_verdict(s.current, o, work, source=s.source, rule=cfg.rule, a=a) for o in cpu]
    best = max(verdicts, key=lambda v: v.saving_usd - v.move_usd)
    per_hour = s.current.price - best.go.offer.price
    numbers = {**best.numbers(), "gpu_idle_s": s.gpu_idle_s, "saving_per_hour": per_hour,
               "break_even_s": best.move_usd / per_hour * 3600 if per_hour > 0 else None,
               "remaining_s": s.remaining_s, "horizon_s": horizon}
    target = best.go.offer
    if per_hour <= 0 or best.saving_usd <= best.move_usd:
        return Decision("gpu-idle", "none", s.workspace,
                        f"GPU idle but no CPU machine saves more than the move costs (best {_ref(target)})",
                        target, numbers)
    horizon_note = "" if s.remaining_s is not None else " over the next hour (remaining time unknown)"
    action = "move" if cfg.gpu_idle == "perform" and s.remaining_s is not None and best.move else "propose-move"
    return Decision("gpu-idle", action, s.workspace,
                    f"GPU idle for {s.gpu_idle_s:.0f} s: {_ref(target)} saves ${per_hour:.4g}/h, "
                    f"${best.saving_usd - best.move_usd:.4f} net{horizon_note}", target, numbers)


def decide(s: Situation, offers: list[Offer], cfg: PolicyConfig | None = None,
           a: Assumptions = DEFAULT) -> list[Decision]:
    """Every policy's decision for ``s`` (those with nothing to do say ``none``)."""
    cfg = cfg or PolicyConfig()
    return [auto_move(s, offers, cfg, a), oom(s, offers, cfg, a), gpu_idle(s, offers, cfg, a)]


def _ref(o: Offer) -> str:
    return f"{o.provider}:{o.name}"
