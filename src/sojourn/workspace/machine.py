"""What a session needs to know about the machine it runs on: the resolved interpreter, the
limits, the price, the hard stop, and where its scratch directory is.

The machines config and the providers live above this layer (``sojourn.providers``); they
hand the workspace a :class:`MachineSpec`, plain data that also travels as JSON on the
command line of a detached supervisor (``python -m sojourn.workspace.supervise``).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sojourn.repository.repo import sojourn_home
from sojourn.workspace.errors import WorkspaceError

_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(d|h|m|s|ms)?", re.IGNORECASE)
_UNITS = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "": 1.0}


def parse_duration(text: str | float | int | None) -> float | None:
    """``"2h"``, ``"90m"``, ``"30s"``, ``"1h30m"`` or a number of seconds; None stays None."""
    if text is None or isinstance(text, int | float):
        return None if text is None else float(text)
    s = str(text).strip().replace(" ", "")
    pos, total = 0, 0.0
    for m in _DURATION.finditer(s):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNITS[(m.group(2) or "").lower()]
        pos = m.end()
    if not s or pos != len(s) or total <= 0:
        raise WorkspaceError(f"cannot read the duration {text!r}: write e.g. 2h, 90m, 30s or 1h30m")
    return total


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g}h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g}m"
    return f"{seconds:g}s"


def machines_home() -> Path:
    return sojourn_home() / "machines"


def scratch_dir(machine: str, allocation: str) -> Path:
    """``$SOJOURN_HOME/machines/<machine>/<allocation>/``: the allocation's own directory."""
    return machines_home() / machine / allocation


@dataclass
class MachineSpec:
    """One machine as a session sees it. ``python`` is an absolute path (resolved by the
    provider); ``None`` limits mean none."""

    name: str
    python: str
    provider: str = "local"
    memory: int | None = None  # bytes: RLIMIT_DATA of the session
    cpus: int | None = None  # CPUs the session may run on (sched_setaffinity)
    price_per_hour: float = 0.0
    max_duration: float | None = None  # seconds: the hard stop
    scratch: str | None = None  # None: scratch_dir(name, allocation)
    offer: dict[str, Any] = field(default_factory=dict)  # the provider's offer, as recorded

    def scratch_for(self, allocation: str) -> Path:
        return Path(self.scratch) if self.scratch else scratch_dir(self.name, allocation)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def dumps(self) -> str:
        return json.dumps(self.to_json(), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, d: dict[str, Any] | str) -> MachineSpec:
        if isinstance(d, str):
            d = json.loads(d)
        assert isinstance(d, dict)
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in known})


def spend(price_per_hour: float, seconds: float) -> float:
    """What ``seconds`` of wall time cost at ``price_per_hour`` (USD, to a millionth)."""
    return round(max(price_per_hour, 0.0) * max(seconds, 0.0) / 3600.0, 6)
