"""Policies in action: the service layer that turns ``router/policy.py``'s decisions into
events and, where a policy was switched on, into moves and resumes (docs/offers-and-router.md,
"Policies in action").

- settings: ``sojourn policy WS set auto_move=on oom=perform ...`` appends a
  ``policy-settings`` event (the whole settings after the change); every reader folds the log
  for the last one. Without any, the defaults spend nothing.
- offers a policy may choose: the machines of the repository's machines config, of every
  provider (``local``, ``slurm``, ``ssh``), as their providers offer them now: what
  ``resume --on`` and ``move --to`` can name. Catalog cloud offers are not launchable from
  here, so they are never a policy's target.
- decisions: each is a ``policy`` event with the numbers that made it. A watcher records a
  decision when it differs (action or target) from the last one of the same policy.
- out of memory: whoever sees the stop first (the foreground ``sojourn run``/``resume``, or
  the watcher) claims it with an exclusive object, records the decision and, with
  ``oom=perform``, resumes on the chosen machine.
- launch checks: ``launch-check`` events for launches that do not go through
  ``providers.checks.launch_checked`` (a foreground supervisor, a move's destination).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from sojourn.errors import AlreadyExists
from sojourn.ops.workspaces import PathLike, _Workspaces
from sojourn.providers.base import Offer, ProviderError, Requirements
from sojourn.router.policy import MODES, Decision, PolicyConfig, Situation, situation_from_record

if TYPE_CHECKING:
    from sojourn.repository.repo import Repository
    from sojourn.workspace.records import WorkspaceRecord
    from sojourn.workspace.store import WorkspaceStore

SETTINGS_EVENT = "policy-settings"
DECISION_EVENT = "policy"
RESULT_EVENT = "policy-result"
DEFAULT_INTERVAL_S = 60.0
LOOP_KEYS = ("interval_s", "remaining_s", "remaining_at", "watch")  # the watcher's, not PolicyConfig's


class PolicyError(ProviderError):
    """A policy setting is wrong, or a policy cannot do what it decided."""


# -- settings ------------------------------------------------------------------------------


def _onoff(v: str) -> bool:
    s = v.strip().lower()
    if s in ("on", "true", "yes", "1"):
        return True
    if s in ("off", "false", "no", "0"):
        return False
    raise PolicyError(f"{v!r} is not on or off")


def _mode(v: str) -> str:
    if v.strip().lower() not in MODES:
        raise PolicyError(f"{v!r} is not one of {', '.join(MODES)}")
    return v.strip().lower()


def _fraction(v: str) -> float:
    s = v.strip()
    x = float(s[:-1]) / 100 if s.endswith("%") else float(s)
    if not 0 <= x < 1:
        raise PolicyError(f"{v!r} is not a fraction in [0, 1) (write 0.2 or 20%)")
    return x


def _duration(v: str) -> float:
    from sojourn.workspace.machine import parse_duration

    d = parse_duration(v)
    assert d is not None
    return d


def _nonneg(v: str) -> float:
    x = float(v)
    if x < 0:
        raise PolicyError(f"{v!r} must be >= 0")
    return x


# `sojourn policy WS set NAME=VALUE`: NAME -> (stored key, parser, what it means)
KEYS: dict[str, tuple[str, Callable[[str], Any], str]] = {
    "auto_move": ("auto_move", _onoff, "on: move while running when another machine pays (default off: propose)"),
    "oom": ("oom", _mode, "after an out-of-memory stop: off, propose (default), perform (resume on a bigger one)"),
    "gpu_idle": ("gpu_idle", _mode, "GPU idle for gpu_idle_after: off, propose (default), perform"),
    "min_saving": ("min_fraction", _fraction, "auto-move: the target must be this much cheaper (default 20%)"),
    "min_factor": ("min_factor", _nonneg, "auto-move: the saving must be this many times the move's cost (3)"),
    "gpu_idle_after": ("gpu_idle_after_s", _duration, "GPU idle this long before gpu_idle acts (default 15m)"),
    "allow_doubtful": ("allow_doubtful_prices", _onoff, "let policies choose prices the catalog marks doubtful"),
    "interval": ("interval_s", _duration, "how often the watcher evaluates a running workspace (default 1m)"),
    "remaining": ("remaining_s", _duration, "estimate of the compute left, from now (auto-move needs one)"),
    "watch": ("watch", _onoff, "run the watcher (default: on when auto_move or gpu_idle is set)"),
}
ALIASES = {"min_fraction": "min_saving"}


def parse_settings(pairs: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """``["auto_move=on", "min_saving=25%"]`` -> stored settings (``{"auto_move": True,
    "min_fraction": 0.25}``); a clear error for an unknown name or a bad value."""
    out: dict[str, Any] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        name = ALIASES.get(name.strip(), name.strip())
        if not sep or name not in KEYS:
            raise PolicyError(f"cannot read the policy setting {pair!r}: write NAME=VALUE with NAME one of "
                              f"{', '.join(KEYS)}")
        key, parse, _ = KEYS[name]
        try:
            out[key] = parse(value)
        except (ValueError, PolicyError) as e:  # parse_duration raises a WorkspaceError (a SojournError)
            raise PolicyError(f"policy setting {name}: {e}") from None
        except Exception as e:
            raise PolicyError(f"policy setting {name}: {e}") from None
    return out


@dataclass
class Settings:
    """A workspace's policy settings as the log says (``values``: stored keys)."""

    values: dict[str, Any] = field(default_factory=dict)
    set_at: float | None = None  # the event's time

    @property
    def config(self) -> PolicyConfig:
        return PolicyConfig.from_json({k: v for k, v in self.values.items() if k not in LOOP_KEYS})

    @property
    def interval_s(self) -> float:
        return float(self.values.get("interval_s") or DEFAULT_INTERVAL_S)

    @property
    def watch(self) -> bool:
        """Whether a watcher runs for this workspace: only where someone asked for a policy
        that acts while it runs."""
        if "watch" in self.values:
            return bool(self.values["watch"])
        return bool(self.values.get("auto_move")) or "gpu_idle" in self.values

    def remaining_s(self, now: float | None = None) -> float | None:
        """The estimate given with ``remaining=``, less the time since it was given."""
        r = self.values.get("remaining_s")
        if r is None:
            return None
        at = float(self.values.get("remaining_at") or self.set_at or 0.0)
        return max(0.0, float(r) - max(0.0, (now or time.time()) - at)) if at else float(r)

    def to_json(self) -> dict[str, Any]:
        return {"values": dict(self.values), "config": asdict(self.config), "interval_s": self.interval_s,
                "watch": self.watch, "set_at": self.set_at}


def settings_of(events: list[dict[str, Any]], base: Settings | None = None) -> Settings:
    """The last ``policy-settings`` event of ``events`` (or ``base``). Settings are a
    person's choice, not a holder's: they count whatever epoch they were written under."""
    s = base or Settings()
    for ev in events:
        if ev.get("type") == SETTINGS_EVENT:
            s = Settings(dict(ev.get("settings") or {}), float(ev.get("t") or 0.0))
    return s


@dataclass
class PolicyView:
    """``sojourn policy WS show``: the settings, what the policies would decide now (not
    recorded), and the decisions recorded so far."""

    workspace: str
    state: str
    settings: Settings
    now: list[Decision]
    recorded: list[dict[str, Any]]
    watcher: dict[str, Any] | None
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"workspace": self.workspace, "state": self.state, "settings": self.settings.to_json(),
                "now": [d.to_event() for d in self.now], "recorded": self.recorded, "watcher": self.watcher,
                "notes": self.notes}


def set_policy(workspace: str, pairs: list[str] | tuple[str, ...], *, repo: PathLike | None = None,
               start_watcher: bool = True) -> PolicyView:
    """Change a workspace's policy settings (one ``policy-settings`` event) and, when it runs
    and now wants watching, make sure a watcher runs."""
    changed = parse_settings(pairs)
    with _Workspaces(repo) as store:
        ws = store.resolve(workspace)
        rec = store.record(ws, save=False)
        old = settings_of(store.events(ws))
        values = {**old.values, **changed}
        if "remaining_s" in changed:
            values["remaining_at"] = time.time()
        new = Settings(values)
        new.config  # noqa: B018 (validates the combination before anything is written)
        record(store, ws, rec.epoch, "policy", {"type": SETTINGS_EVENT, "settings": values, "changed": changed})
        if start_watcher and new.watch and rec.state == "running":
            from sojourn.ops.policyrun import ensure_watcher

            ensure_watcher(store, ws)
    return show_policy(ws, repo=repo)


def show_policy(workspace: str, *, repo: PathLike | None = None) -> PolicyView:
    from sojourn.ops.policyrun import watcher_info

    with _Workspaces(repo) as store:
        ws = store.resolve(workspace)
        events = store.events(ws)
        rec = store.record(ws, save=False)
        settings = settings_of(events)
        offers, notes = machine_offers(store.repo)
        sit = situation(rec, events, settings, offers)
        now = decide_now(sit, offers, settings)
        recorded = [ev for ev in events if ev.get("type") in (DECISION_EVENT, RESULT_EVENT)]
        return PolicyView(ws, rec.state, settings, now, recorded, watcher_info(store, ws), notes)


# -- the offers a policy may choose ------------------------------------------------------------


def machine_offers(repo: Repository) -> tuple[list[Offer], list[str]]:
    """Every machine of the machines config as its provider offers it now, with the machine's
    name in ``extra["machine"]``; notes say which machines are left out and why."""
    from sojourn.providers.base import get_provider
    from sojourn.providers.machines import load_machines

    listed: dict[str, list[Offer]] = {}
    out: list[Offer] = []
    notes: list[str] = []
    for name, m in sorted(load_machines(repo).items()):
        if m.provider not in listed:
            try:
                listed[m.provider] = get_provider(m.provider, repo).offers(Requirements(provider=m.provider))
            except (ProviderError, ImportError) as e:
                listed[m.provider] = []
                notes.append(f"provider {m.provider}: {e}")
        o = next((o for o in listed[m.provider] if o.name == name), None)
        if o is None:
            notes.append(f"machine {name}: provider {m.provider} offers no {name!r} now")
            continue
        if o.extra.get("python_error"):
            notes.append(f"machine {name}: {o.extra['python_error']}")
            continue
        out.append(replace(o, extra={**o.extra, "machine": name}))
    return out, notes


def machine_of(offer: Offer) -> str | None:
    """The machines-config name that launches ``offer`` (None: a catalog offer)."""
    m = offer.extra.get("machine")
    return str(m) if m else None


def ref(offer: Offer) -> str:
    return f"{offer.provider}:{offer.name}"


@dataclass
class Choice:
    """``run --cheapest``: the offer chosen, and the machine that launches it."""

    offer: Offer
    machine: str
    considered: int
    notes: list[str] = field(default_factory=list)


def choose_machine(req: Requirements, *, repo: PathLike | None = None, remaining_s: float | None = None) -> Choice:
    """The cheapest offer that fits ``req`` among the catalog and the configured machines of
    every provider (``ops.offers.choose`` plus slurm/ssh machines). A catalog offer that wins
    cannot be launched from here: the error names it and what to configure."""
    from sojourn.ops.offers import NoOffer, gather
    from sojourn.router import policy
    from sojourn.router.cost import Work

    with _Workspaces(repo, create=True) as store:
        machines, notes = machine_offers(store.repo)
    catalog, _ = gather(req, repo=repo, include_local=False)
    found = [o for o in machines if o.fits(req)] + catalog
    work = Work(remaining_s) if remaining_s is not None else None
    best = policy.cheapest(found, req, work=work)
    if best is None:
        wanted = ", ".join(f"{k}={v}" for k, v in asdict(req).items() if v not in (None, 0))
        raise NoOffer(f"no offer fits ({wanted or 'no requirement'}): neither a machine of `sojourn machines` nor a "
                      "catalog row; `sojourn offers` lists what there is (spot offers need --spot)")
    offer = best[0]
    machine = machine_of(offer)
    if machine is None:
        raise NoOffer(
            f"the cheapest offer that fits is {ref(offer)} (${offer.price:.4g}/h), a catalog row of {offer.provider}; "
            f"this repository has no machine that launches it. sojourn launches the machines of `sojourn machines` "
            f"(providers local, slurm, ssh): add one that fits (`sojourn machines set NAME --provider ...`), or, for "
            f"{offer.provider}, install and configure SkyPilot (`pip install \"skypilot[{offer.provider}]\"`, "
            f"`sky check`, a [skypilot] table in machines.toml) and launch it through the skypilot provider")
    return Choice(offer, machine, len(found), notes)


# -- evaluating -------------------------------------------------------------------------------


def current_offer(rec: WorkspaceRecord, offers: list[Offer]) -> Offer | None:
    """The offer the workspace runs on (or last ran on): the machine's, else one made from
    the allocation's own record (a run without --on: this host at its recorded price)."""
    a = rec.current if rec.state == "running" else rec.last_allocation
    if a is None:
        return None
    for o in offers:
        if o.provider == a.provider and machine_of(o) == a.machine:
            return o
    return Offer(a.provider, a.machine, memory=a.memory_limit, price_per_hour=a.price_per_hour,
                 region=a.host if a.provider == "local" else None, extra={"machine": a.machine, "recorded": True})


def situation(rec: WorkspaceRecord, events: list[dict[str, Any]], settings: Settings, offers: list[Offer], *,
              gpu_idle_s: float = 0.0, now: float | None = None) -> Situation:
    from sojourn.ops.offers import write_speed

    bps, _ = write_speed(events)
    remaining = settings.remaining_s(now)
    if remaining is None and rec.requirements.get("remaining_s"):
        remaining = float(rec.requirements["remaining_s"])
    return situation_from_record(rec, current=current_offer(rec, offers), remaining_s=remaining,
                                 gpu_idle_s=gpu_idle_s, write_bps=bps)


def decide_now(s: Situation, offers: list[Offer], settings: Settings) -> list[Decision]:
    """The policies that apply to ``s``: auto-move and GPU idle while it runs, out of memory
    once it stopped that way. A decision to move somewhere ``move --to`` cannot go (another
    provider) stays a proposal."""
    from sojourn.router import policy

    cfg = settings.config
    if s.state == "running":
        out = [policy.auto_move(s, offers, cfg), policy.gpu_idle(s, offers, cfg)]
    else:
        out = [policy.oom(s, offers, cfg)]
    return [_launchable(d) for d in out]


def _launchable(d: Decision) -> Decision:
    if d.action == "move" and d.target is not None and d.target.provider != "local":
        return replace(d, action="propose-move",
                       reason=d.reason + f"; proposed only: `sojourn move` reaches local machines, not "
                                         f"{d.target.provider} ones (suspend, then `sojourn resume --on`)")
    return d


def decision_event(d: Decision, allocation: str | None) -> dict[str, Any]:
    ev = d.to_event()
    ev["allocation"] = allocation
    if d.target is not None and machine_of(d.target):
        ev["machine"] = machine_of(d.target)
    return ev


def changed(d: Decision, last: dict[str, Any] | None) -> bool:
    """Whether ``d`` says something the last recorded decision of its policy did not."""
    if last is None:
        return True
    target = ref(d.target) if d.target is not None else None
    return (last.get("action"), last.get("target")) != (d.action, target)


def record(store: WorkspaceStore, ws: str, epoch: int, by: str, *events: dict[str, Any]) -> None:
    store.append(ws, max(epoch, current_epoch(store, ws)), by, *events)


# -- out of memory -------------------------------------------------------------------------------


@dataclass
class OomHandling:
    """What the OOM policy decided for one out-of-memory stop (``claimed``: by this caller;
    otherwise another process decided, and ``event`` is what it recorded, if anything yet)."""

    workspace: str
    allocation: str
    claimed: bool
    decision: Decision | None
    event: dict[str, Any] | None

    @property
    def machine(self) -> str | None:
        return (self.event or {}).get("machine")

    def message(self) -> str:
        ev = self.event or {}
        n = ev.get("numbers") or {}
        action = ev.get("action")
        if action in ("propose-resume", "resume"):
            from sojourn.router.cost import size

            hw = n.get("memory_needed_over") or 0
            text = (f"resume on {ev.get('target')} (memory {size(n.get('target_memory') or 0)} > high-water mark "
                    f"{size(hw)}): `sojourn resume {self.workspace} --on {self.machine}`")
            if action == "resume":
                return f"policy oom=perform: {text}; resuming now" if self.claimed else \
                    f"policy oom=perform: {text}; another process is resuming it (`sojourn logs -f {self.workspace}`)"
            return f"policy: {text}"
        return f"policy: no resume proposed ({ev.get('reason') or 'not decided yet'})"


def _claim_name(ws: str, al: str) -> str:
    return f"policy.{ws}.{al}.oom"


def settle_oom(store: WorkspaceStore, ws: str, *, by: str) -> OomHandling | None:
    """If the workspace stands suspended after an out-of-memory stop and nobody decided about
    that stop yet, claim it (an exclusive object) and record the OOM policy's decision. None
    when the workspace did not stop out of memory."""
    from sojourn.workspace.store import KIND, _dump

    rec = store.record(ws, save=False)
    a = rec.last_allocation
    if rec.state != "suspended" or rec.stop_reason != "oom" or a is None or rec.last_capsule is None:
        return None
    try:
        store.backend.save(KIND, _claim_name(ws, a.id), _dump({"by": by, "pid": os.getpid(), "t": time.time()}),
                           exclusive=True)
    except AlreadyExists:
        return OomHandling(ws, a.id, False, None, _oom_event(store.events(ws), a.id))
    events = store.events(ws)
    settings = settings_of(events)
    offers, _ = machine_offers(store.repo)
    d = decide_now(situation(rec, events, settings, offers), offers, settings)[0]
    ev = decision_event(d, a.id)
    record(store, ws, rec.epoch, by, ev)
    return OomHandling(ws, a.id, True, d, ev)


def _oom_event(events: list[dict[str, Any]], al: str) -> dict[str, Any] | None:
    return next((ev for ev in reversed(events)
                 if ev.get("type") == DECISION_EVENT and ev.get("policy") == "oom" and ev.get("allocation") == al), None)


def after_oom(workspace: str, *, repo: PathLike | None = None, by: str = "policy:cli") -> OomHandling | None:
    """The OOM policy for a workspace that just stopped out of memory (``settle_oom`` with
    its own repository handle)."""
    with _Workspaces(repo) as store:
        return settle_oom(store, store.resolve(workspace), by=by)


def record_result(workspace: str, policy_name: str, action: str, outcome: str, *, repo: PathLike | None = None,
                  by: str = "policy", **extra: Any) -> None:
    """A ``policy-result`` event: what carrying a decision out did."""
    with _Workspaces(repo) as store:
        ws = store.resolve(workspace)
        record(store, ws, 0, by, {"type": RESULT_EVENT, "policy": policy_name, "action": action,
                                          "outcome": outcome, **extra})


# -- launch checks outside launch_checked ----------------------------------------------------


def check_events(offer: Offer, ws: str, al: str, *, listed: bool, launch: str, launched: bool,
                 detail: str = "") -> list[dict[str, Any]]:
    """The four ``launch-check`` events of a launch that does not go through a provider's
    ``launch`` (a foreground supervisor is this very process; a move's destination is
    started by the move command): catalog as looked up, permission and capacity skipped
    (no separate check for a machine of this host), launch as it went."""
    from sojourn.providers.checks import CheckResult

    cat = CheckResult("catalog", "passed" if listed else "failed",
                      f"listed at ${offer.price:.4g}/h" if listed else f"{offer.provider} does not list {offer.name}")
    rest = [CheckResult(c, "skipped", f"{offer.provider} has no separate {c} check") for c in ("permission", "capacity")]
    last = CheckResult("launch", "passed" if launched else "failed", launch + (f" ({detail})" if detail else ""))
    return [r.to_event(offer, ws, al) for r in [cat, *rest, last]]



def checked_launch(store: WorkspaceStore, ws: str, al: str, provider: Any, offer: Offer, spec: Any) -> Any:
    """``provider.launch`` with the four checks (``providers.checks.launch_checked``), each a
    ``launch-check`` event of allocation ``al``; the handle, or ``LaunchFailed`` naming the
    check that failed (``move --to MACHINE`` launches its destination through this)."""
    from sojourn.providers.checks import launch_checked

    out = launch_checked(provider, offer, spec)
    store.append(ws, current_epoch(store, ws), al, *out.events(ws, al))
    return out.raise_for_failure()


def current_epoch(store: WorkspaceStore, ws: str) -> int:
    """The workspace's epoch now (the record may lag behind a move's commit): events a policy
    appends are stamped with it, so that the fold does not void them as a stale writer's."""
    rec = store.record(ws, save=False)
    return max(rec.epoch, store.epoch(ws, rec.epoch)[0])
