"""The service layer for offers and plans: ``sojourn offers``, ``offers refresh``, ``plan``,
and the choice behind ``run --cheapest`` (see docs/offers-and-router.md).

Offers come from the shipped (or refreshed) price catalog and from the repository's
machines config (the ``local`` provider). The catalog is read on first use only.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from sojourn.errors import SojournError
from sojourn.providers.base import Offer, ProviderError, Requirements

if TYPE_CHECKING:
    from sojourn.providers.catalog import Catalog
    from sojourn.providers.catalog_fetch import Opener, RefreshReport
    from sojourn.router.cost import MoveVerdict, Plan
    from sojourn.workspace.records import WorkspaceRecord

PathLike = str | os.PathLike[str]


class NoOffer(ProviderError):
    """No offer fits the requirements."""


# -- gathering offers ----------------------------------------------------------------------


@dataclass
class Sources:
    """Where the offers came from, for the table's caption."""

    catalog: Catalog
    local: str  # how the local machines were found, or why not

    def caption(self) -> str:
        return f"{self.catalog.caption()}; {self.local}"


def gather(req: Requirements | None = None, *, repo: PathLike | None = None, catalog: PathLike | None = None,
           include_local: bool = True) -> tuple[list[Offer], Sources]:
    """Every offer that fits ``req`` (both variants of each catalog row), and their sources."""
    from sojourn.providers import catalog as C

    req = req or Requirements()
    cat = C.load(catalog)
    offers = cat.offers(req)
    local_note = "local machines: not asked for"
    if include_local:
        local, local_note = _local_offers(req, repo)
        offers += local
    return offers, Sources(cat, local_note)


def _local_offers(req: Requirements, repo: PathLike | None) -> tuple[list[Offer], str]:
    from sojourn.providers.base import get_provider
    from sojourn.repository.repo import backend_for, open_repository, resolve_url

    try:
        if not backend_for(resolve_url(repo)).exists():
            return [], "local machines: no repository yet"
        r = open_repository(repo)
    except Exception as e:  # an unreadable repository must not hide the catalog
        return [], f"local machines: repository not readable ({e})"
    try:
        out: list[Offer] = []
        notes = []
        for name in _configured_providers(r):
            if req.provider not in (None, name):
                continue
            try:
                out += get_provider(name, r).offers(req)
            except ModuleNotFoundError as e:
                if not (e.name or "").startswith("sojourn"):
                    raise
                notes.append(f"{name}: provider not available")
            except SojournError as e:  # one unreachable cluster must not hide the other machines
                notes.append(f"{name}: {e}")
        return out, "; ".join(["machines from the repository's machines config", *notes])
    finally:
        r.close()


def _configured_providers(r: Any) -> list[str]:
    """Every provider the repository's machines config uses: ``local`` always, those its
    ``[machines.*]`` name, ``ssh`` with ``[ssh.*]`` hosts, ``slurm`` with a ``[slurm]`` table."""
    from sojourn.providers.machines import load_machines
    from sojourn.providers.slurm import provider_config

    found = {"local"} | {m.provider for m in load_machines(r).values()}
    for table in ("ssh", "slurm"):
        try:
            if provider_config(r, table):
                found.add(table)
        except SojournError:
            found.add(table)  # an unsigned table: its provider says so in the note
    return sorted(found, key=lambda n: (n != "local", n))


# -- the offers table ----------------------------------------------------------------------


@dataclass
class OfferRow:
    """One machine type in one place, with both of its prices (either may be absent)."""

    on_demand: Offer | None
    spot: Offer | None
    can_save: bool | None = None  # the spot notice covers saving this workspace's state
    sort_price: float = 0.0

    @property
    def offer(self) -> Offer:
        o = self.on_demand or self.spot
        assert o is not None
        return o

    @property
    def ref(self) -> str:
        return f"{self.offer.provider}:{self.offer.name}"

    @property
    def notes(self) -> list[str]:
        return list(self.offer.extra.get("notes") or [])

    def to_json(self) -> dict[str, Any]:
        o = self.offer
        return {"offer": self.ref, "provider": o.provider, "name": o.name, "region": o.region, "cpus": o.cpus,
                "memory": o.memory, "gpus": o.gpus, "gpu": o.gpu, "gpu_memory": o.gpu_memory, "arch": o.arch,
                "price_per_hour": self.on_demand.price if self.on_demand else None,
                "spot_price_per_hour": self.spot.price if self.spot else None,
                "notice_s": self.spot.notice_s if self.spot else None, "can_save": self.can_save,
                "notes": self.notes}


@dataclass
class OfferTable:
    rows: list[OfferRow]
    caption: str
    catalog_date: str
    workspace: str | None = None
    state_bytes: int | None = None
    save_s: float | None = None
    save_basis: str = ""  # how the save time was worked out

    def to_json(self) -> dict[str, Any]:
        return {"caption": self.caption, "catalog_date": self.catalog_date, "workspace": self.workspace,
                "state_bytes": self.state_bytes, "save_s": self.save_s, "save_basis": self.save_basis,
                "offers": [r.to_json() for r in self.rows]}


def offers(req: Requirements | None = None, *, repo: PathLike | None = None, workspace: str | None = None,
           catalog: PathLike | None = None, include_local: bool = True) -> OfferTable:
    """``sojourn offers``: offers that fit, cheapest first (by spot price with ``spot=True``,
    on-demand with ``spot=False``, else the cheaper of the two). With ``workspace``, whether
    each spot notice is long enough to save that workspace's state."""
    from sojourn.router.cost import notice_ok

    req = req or Requirements()
    found, src = gather(replace(req, spot=None), repo=repo, catalog=catalog, include_local=include_local)
    pairs: dict[tuple[str, str], list[Offer | None]] = {}
    for o in found:
        key = (o.provider, o.name.removesuffix(":spot"))
        slot = pairs.setdefault(key, [None, None])
        slot[1 if o.spot else 0] = o
    table = OfferTable([], src.caption(), src.catalog.date)
    if workspace is not None:
        table.workspace, table.state_bytes, table.save_s, table.save_basis = _save_estimate(workspace, repo)
    for od, sp in pairs.values():
        if req.spot is True and sp is None:
            continue
        if req.spot is False and od is None:
            continue
        row = OfferRow(od, sp)
        wanted = {True: [sp], False: [od], None: [od, sp]}[req.spot]
        prices = [x.price for x in wanted if x is not None and x.price == x.price]
        if not prices:
            continue
        row.sort_price = min(prices)
        if table.save_s is not None:
            row.can_save = notice_ok(row.spot, table.save_s) if row.spot else True
        table.rows.append(row)
    table.rows.sort(key=lambda r: (r.sort_price, r.offer.provider, r.offer.name))
    return table


def _save_estimate(workspace: str, repo: PathLike | None) -> tuple[str, int, float, str]:
    from sojourn.router.cost import DEFAULT, save_seconds, size

    rec, events = _record(workspace, repo)
    if rec.last_capsule is None:
        raise NoOffer(f"workspace {rec.id} has no capsule yet, so its state size is unknown; "
                      "suspend it once (or leave out --workspace)")
    nbytes = rec.last_capsule.size
    bps, basis = write_speed(events)
    s = save_seconds(nbytes, bps)
    how = basis if bps else f"assumed {size(DEFAULT.write_bps)}/s: no capture speed recorded"
    return rec.id, nbytes, s, f"state {size(nbytes)} (last capsule {rec.last_capsule.id[:16]}), write speed {how}"


def write_speed(events: list[dict[str, Any]]) -> tuple[float | None, str]:
    """The write speed of the workspace's last measured capture (bytes / seconds), if any
    capsule event recorded how long its capture took."""
    from sojourn.router.cost import size

    for ev in reversed(events):
        if ev.get("type") != "capsule":
            continue
        cap = ev.get("capsule") or {}
        secs = ev.get("seconds_capture") or cap.get("seconds_capture")
        if cap.get("verified") and secs and cap.get("size"):
            bps = float(cap["size"]) / float(secs)
            return bps, f"{size(bps)}/s measured by capture of {str(cap.get('id'))[:16]}"
    return None, ""


def _record(workspace: str, repo: PathLike | None) -> tuple[WorkspaceRecord, list[dict[str, Any]]]:
    from sojourn.repository.repo import open_repository
    from sojourn.workspace.store import WorkspaceStore

    r = open_repository(repo)
    try:
        store = WorkspaceStore(r)
        ws = store.resolve(workspace)
        return store.record(ws, save=False), store.events(ws)
    finally:
        r.close()


# -- refresh -------------------------------------------------------------------------------


@dataclass
class RefreshResult:
    path: str
    report: RefreshReport
    rows: int

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "rows": self.rows, **self.report.to_json()}


def refresh(source: str = "skypilot", *, providers: list[str] | None = None, path: PathLike | None = None,
            opener: Opener | None = None, today: str | None = None) -> RefreshResult:
    """Fetch new prices for the catalog's rows and write the refreshed catalog to the user's
    copy (``$SOJOURN_CATALOG`` or ~/.cache/sojourn/offers.csv), which is used from then on."""
    from sojourn.providers import catalog as C
    from sojourn.providers import catalog_fetch as F

    cat = C.load()
    day = today or datetime.datetime.now(datetime.UTC).date().isoformat()
    new, rep = F.refresh(cat, source, day, providers=providers, opener=opener or F.urlopen)
    dest = C.save(new, path if path is not None else C.user_path())
    return RefreshResult(str(dest), rep, len(new.rows))


# -- choosing and planning -----------------------------------------------------------------


def choose(req: Requirements, *, repo: PathLike | None = None, remaining_s: float | None = None,
           capsule_bytes: int = 0, include_local: bool = True, allow_doubtful: bool = False) -> Offer:
    """The cheapest offer that fits ``req`` (``run --cheapest``): by the plan's total when
    ``remaining_s`` is known, else by hourly price. Spot only when ``req.spot`` is True; rows
    whose price the catalog marks doubtful only with ``allow_doubtful``."""
    from sojourn.router import policy
    from sojourn.router.cost import Work

    found, _ = gather(req, repo=repo, include_local=include_local)
    work = Work(remaining_s, capsule_bytes) if remaining_s is not None else None
    best = policy.cheapest(found, req, work=work, allow_doubtful=allow_doubtful)
    if best is None:
        wanted = ", ".join(f"{k}={v}" for k, v in req.__dict__.items() if v not in (None, 0))
        raise NoOffer(f"no offer fits ({wanted or 'no requirement'}); `sojourn offers` lists what there is "
                      "(spot offers need --spot)")
    return best[0]


def find_offer(ref: str, offers_: list[Offer]) -> Offer:
    """The offer named ``provider:name`` (``name`` alone when it is unique)."""
    provider, sep, name = ref.partition(":")
    if not sep:
        provider, name = "", ref
    hits = [o for o in offers_ if o.name == name and (not provider or o.provider == provider)]
    if len(hits) == 1:
        return hits[0]
    if not hits:
        raise NoOffer(f"no offer {ref!r}; write provider:name as `sojourn offers` shows it "
                      "(e.g. aws:g5.xlarge@us-east-1, add :spot for the spot variant)")
    raise NoOffer(f"{ref!r} names {len(hits)} offers ({', '.join(o.provider for o in hits)}): add the provider")


@dataclass
class PlanResult:
    workspace: str
    plan: Plan
    remaining_s: float
    remaining_basis: str
    capsule_bytes: int
    source: str  # where the capsule is
    current: Offer | None = None
    verdict: MoveVerdict | None = None
    notes: list[str] = field(default_factory=list)

    def explain(self) -> str:
        from sojourn.router.cost import duration, size

        lines = [f"workspace {self.workspace}: remaining {duration(self.remaining_s)} ({self.remaining_basis}), "
                 f"capsule {size(self.capsule_bytes)} at {self.source}", self.plan.explain()]
        if self.verdict is not None and self.current is not None:
            v = self.verdict
            lines.append(f"against staying on {self.current.provider}:{self.current.name}: stay ${v.stay_usd:.4f}, "
                         f"go ${v.go_usd:.4f} + move ${v.move_usd:.4f} -> "
                         f"{'move' if v.move else 'stay'} ({v.reason})")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {"workspace": self.workspace, "remaining_s": self.remaining_s, "remaining_basis": self.remaining_basis,
                "capsule_bytes": self.capsule_bytes, "source": self.source, "plan": self.plan.to_json(),
                "current": f"{self.current.provider}:{self.current.name}" if self.current else None,
                "verdict": ({"move": self.verdict.move, "reason": self.verdict.reason, **self.verdict.numbers()}
                            if self.verdict else None), "notes": self.notes}


def plan(workspace: str, to: str, *, repo: PathLike | None = None, remaining: str | float | None = None,
         catalog: PathLike | None = None) -> PlanResult:
    """``sojourn plan WS --to OFFER``: what finishing ``workspace`` on ``to`` would cost,
    term by term, and (when it runs on a known offer) whether moving there pays."""
    from sojourn.providers.catalog import doubtful
    from sojourn.router import cost
    from sojourn.workspace.machine import parse_duration

    rec, events = _record(workspace, repo)
    found, _ = gather(None, repo=repo, catalog=catalog)
    target = find_offer(to, found)
    notes = []
    if (why := doubtful(target)) is not None:
        notes.append(f"{target.provider}:{target.name}: {why}")
    if remaining is not None:
        remaining_s, basis = float(parse_duration(remaining) or 0.0), "given"
    elif rec.requirements.get("remaining_s"):
        remaining_s, basis = float(rec.requirements["remaining_s"]), "from the workspace record"
    else:
        remaining_s, basis = 3600.0, "assumed 1 h: give --remaining for a real estimate"
    cap = rec.last_capsule.size if rec.last_capsule else 0
    last = rec.current if rec.state == "running" else rec.last_allocation
    current = next((o for o in found if last is not None and o.provider == last.provider and o.name == last.machine),
                   None)
    if last is None:
        site, where = None, "nowhere yet"
    elif current is not None:
        site, where = cost.Site.of(current), f"{current.provider}:{current.name}"
    else:
        site, where = cost.Site(last.provider, None, last.machine), f"{last.provider}:{last.machine}"
    bps, speed_basis = write_speed(events)
    if bps:
        notes.append(f"write speed {speed_basis}")
    work = cost.Work(remaining_s, cap, bps)
    p = cost.route(target, work, source=site if cap else None, moving=True)
    verdict = None
    if current is not None and rec.state == "running" and (current.provider, current.name) != (
            target.provider, target.name):
        verdict = cost.move_verdict(current, target, work, source=site)
    return PlanResult(rec.id, p, remaining_s, basis, cap, where, current, verdict, notes)
