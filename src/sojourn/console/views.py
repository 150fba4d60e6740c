"""What each page shows, read through ``sojourn.ops`` (plain dicts for the templates)."""

from __future__ import annotations

import json
import time
from typing import Any

from sojourn import ops
from sojourn.console import charts

# The keys every event has; the rest is the event's own detail.
_EVENT_KEYS = ("type", "time", "workspace", "epoch", "allocation", "seq", "stale")


def workspaces(repo: str | None) -> dict[str, Any]:
    rows = [r.to_json() for r in ops.ps(repo)]
    allocations: list[dict[str, Any]] = []
    for r in rows[:50]:  # the spend chart: the latest workspaces' allocations
        try:
            allocations += ops.show(r["id"], repo=repo).record.to_json()["allocations"]
        except ops_errors():
            continue
    return {"rows": rows, "total": sum(r["spend"] for r in rows), "spend_svg": charts.spend(allocations),
            "machines": [m.__dict__ for m in ops.machines(repo)]}


def ops_errors() -> type[Exception]:
    from sojourn.errors import SojournError

    return SojournError


def workspace(ws: str, repo: str | None) -> dict[str, Any]:
    d = ops.show(ws, repo=repo).to_json()
    now = time.time()
    for a in d["allocations"]:
        a["spent"] = a["spend"] if a["ended"] is not None else (a["price_per_hour"] or 0.0) * (now - a["started"]) / 3600
    events = []
    for e in d["events"]:
        detail = {k: v for k, v in e.items() if k not in _EVENT_KEYS}
        events.append({"type": e.get("type"), "time": e.get("time"), "allocation": e.get("allocation"),
                       "stale": e.get("stale"), "detail": json.dumps(detail, default=str)[:300]})
    current = next((a for a in reversed(d["allocations"]) if a["ended"] is None), None)
    last = d["allocations"][-1] if d["allocations"] else None
    return {"w": d, "events": events[-200:], "current": current, "last": last,
            "spend": sum(a["spent"] for a in d["allocations"]),
            "timeline_svg": charts.timeline(d["allocations"], now), "spend_svg": charts.spend(d["allocations"], now),
            "sizes_svg": charts.sizes(d["capsules"]),
            "machines": [m.name for m in ops.machines(repo)]}


def capsule(cap: str, repo: str | None) -> dict[str, Any]:
    info = ops.inspect(cap, repo=repo)
    return {"c": info, "variables": sorted(info.variables, key=lambda v: -v.size)}


def diff(a: str, b: str, repo: str | None) -> dict[str, Any]:
    """What changed between capsules ``a`` and ``b``: variables added, removed, changed (by
    fingerprint) and unchanged, with their sizes; files likewise."""
    ia, ib = ops.inspect(a, repo=repo), ops.inspect(b, repo=repo)
    va, vb = {v.name: v for v in ia.variables}, {v.name: v for v in ib.variables}
    rows: list[dict[str, Any]] = []
    for name in sorted(va.keys() | vb.keys()):
        x, y = va.get(name), vb.get(name)
        if x is None:
            change = "added"
        elif y is None:
            change = "removed"
        else:
            change = "changed" if x.fingerprint != y.fingerprint else "same"
        rows.append({"name": name, "change": change, "type": (y or x).type,  # type: ignore[union-attr]
                     "before": x.size if x else None, "after": y.size if y else None})
    fa = {f.get("path"): f for f in ia.files}
    fb = {f.get("path"): f for f in ib.files}
    files = []
    for p in sorted(k for k in fa.keys() | fb.keys() if k is not None):
        fx, fy = fa.get(p), fb.get(p)
        if fx is None or fy is None or fx.get("hash") != fy.get("hash"):
            files.append({"path": p, "change": "added" if fx is None else "removed" if fy is None else "changed",
                          "before": fx.get("size") if fx else None, "after": fy.get("size") if fy else None})
    order = {"changed": 0, "added": 1, "removed": 2, "same": 3}
    rows.sort(key=lambda r: (order[r["change"]], r["name"]))
    return {"a": ia, "b": ib, "rows": rows, "files": files,
            "counts": {k: sum(r["change"] == k for r in rows) for k in order}}


def offers(repo: str | None, workspace: str | None) -> dict[str, Any]:
    from sojourn.ops import offers as offer_ops

    table = offer_ops.offers(repo=repo, workspace=workspace or None)
    return {"t": table.to_json(), "workspaces": [r.id for r in ops.ps(repo)]}


def plan(ws: str, to: str, repo: str | None, remaining: str | None) -> dict[str, Any]:
    from sojourn.ops import offers as offer_ops

    p = offer_ops.plan(ws, to, repo=repo, remaining=remaining or None)
    return {"p": p.to_json(), "text": p.explain()}
