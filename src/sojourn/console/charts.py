"""Inline SVG charts rendered on the server: an allocation timeline, spend over time and
capsule sizes. Plain strings, so that a page needs no script and no chart library."""

from __future__ import annotations

import time
from dataclasses import dataclass
from html import escape
from typing import Any

W, ROW, PAD, LEFT = 760, 22, 8, 120
_COLOURS = {"running": "#2b8a3e", "finished": "#1c7ed6", "suspended": "#f59f00", "moved": "#7048e8",
            "failed": "#e03131", "killed": "#e03131", "oom": "#d9480f"}


def size(n: float | None) -> str:
    """Bytes as people read them."""
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def duration(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def when(t: float | None) -> str:
    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _frame(height: int, label: str, body: list[str]) -> str:
    return (f'<svg class="chart" role="img" aria-label="{escape(label)}" viewBox="0 0 {W} {height}" '
            f'width="{W}" height="{height}" xmlns="http://www.w3.org/2000/svg">'
            f'<title>{escape(label)}</title>{"".join(body)}</svg>')


def _text(x: float, y: float, s: str, anchor: str = "start", cls: str = "") -> str:
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" class="{cls}">{escape(s)}</text>'


def timeline(allocations: list[dict[str, Any]], now: float | None = None) -> str:
    """One bar per allocation from its start to its end (or now), coloured by how it stopped."""
    if not allocations:
        return ""
    now = now or time.time()
    t0 = min(a["started"] for a in allocations)
    t1 = max((a["ended"] or now) for a in allocations)
    span = max(t1 - t0, 1e-3)
    scale = (W - LEFT - PAD) / span
    height = PAD * 2 + ROW * len(allocations) + 16
    body = []
    for i, a in enumerate(allocations):
        y = PAD + i * ROW
        end = a["ended"] or now
        reason = a["stop_reason"] or "running"
        x = LEFT + (a["started"] - t0) * scale
        w = max((end - a["started"]) * scale, 2.0)
        tip = f"{a['id']} on {a['provider']}:{a['machine']}, {reason}, {duration(end - a['started'])}"
        body.append(_text(4, y + 14, f"{a['machine']}"))
        body.append(f'<rect class="bar alloc-{escape(reason)}" x="{x:.1f}" y="{y + 3}" width="{w:.1f}" '
                    f'height="{ROW - 6}" fill="{_COLOURS.get(reason, "#868e96")}"><title>{escape(tip)}</title></rect>')
        body.append(_text(min(x + w + 4, W - 90), y + 14, reason, cls="small"))
    y = height - 4
    body.append(_text(LEFT, y, when(t0), cls="small"))
    body.append(_text(W - PAD, y, f"{when(t1)} ({duration(span)})", "end", "small"))
    return _frame(height, "allocation timeline", body)


@dataclass
class Point:
    t: float
    v: float


def spend_points(allocations: list[dict[str, Any]], now: float | None = None) -> list[Point]:
    """Cumulative spend: each allocation adds its price over its wall time (a running one up
    to now), a step at each start and end so that the line rises while it runs."""
    now = now or time.time()
    marks: list[tuple[float, float]] = []  # (time, $/s change)
    for a in allocations:
        rate = float(a.get("price_per_hour") or 0.0) / 3600.0
        if rate <= 0:
            continue
        marks.append((a["started"], rate))
        marks.append((a["ended"] or now, -rate))
    marks.sort()
    out: list[Point] = []
    total = rate = 0.0
    last = marks[0][0] if marks else now
    for t, d in marks:
        total += rate * (t - last)
        out.append(Point(t, total))
        rate += d
        last = t
    return out


def spend(allocations: list[dict[str, Any]], now: float | None = None) -> str:
    pts = spend_points(allocations, now)
    if len(pts) < 2:
        return ""
    t0, t1 = pts[0].t, pts[-1].t
    top = max(p.v for p in pts) or 1.0
    height, bottom = 150, 130
    sx = (W - LEFT - PAD) / max(t1 - t0, 1e-3)
    sy = (bottom - PAD) / top
    path = " ".join(f"{'M' if i == 0 else 'L'}{LEFT + (p.t - t0) * sx:.1f},{bottom - p.v * sy:.1f}"
                    for i, p in enumerate(pts))
    body = [f'<path class="line" d="{path}" fill="none" stroke="#1c7ed6" stroke-width="2"/>',
            f'<line x1="{LEFT}" y1="{bottom}" x2="{W - PAD}" y2="{bottom}" stroke="#adb5bd"/>',
            _text(LEFT - 6, PAD + 8, f"${top:.4f}", "end", "small"), _text(LEFT - 6, bottom, "$0", "end", "small"),
            _text(LEFT, height - 4, when(t0), cls="small"), _text(W - PAD, height - 4, when(t1), "end", "small")]
    return _frame(height, f"spend over time, ${top:.4f} in all", body)


def sizes(capsules: list[dict[str, Any]]) -> str:
    """One bar per capsule, in the order they were written."""
    if not capsules:
        return ""
    top = max(c["size"] for c in capsules) or 1
    height = PAD * 2 + ROW * len(capsules)
    body = []
    for i, c in enumerate(capsules):
        y = PAD + i * ROW
        w = max((W - LEFT - PAD - 90) * c["size"] / top, 2.0)
        body.append(_text(4, y + 14, c["id"][:14]))
        body.append(f'<rect class="bar capsule" x="{LEFT}" y="{y + 3}" width="{w:.1f}" height="{ROW - 6}" '
                    f'fill="#5c7cfa"><title>{escape(c["id"])}: {size(c["size"])} ({escape(c["reason"])})</title></rect>')
        body.append(_text(LEFT + w + 4, y + 14, f"{size(c['size'])} {c['reason']}", cls="small"))
    return _frame(height, "capsule sizes", body)
