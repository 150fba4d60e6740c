"""The four checks of a launch, each recorded on its own (DESIGN: "Providers, offers, router").

1. ``catalog``: the offer is one the provider lists (it exists, in that region, at that price);
2. ``permission``: credentials and quota allow it;
3. ``capacity``: the provider has one free now;
4. ``launch``: it started and answers (``status`` says pending or running).

A provider implements checks 2 and 3 as optional methods, ``check_permission(offer)`` and
``check_capacity(offer)``, which return a short detail string (or None) when the check
passes and raise :class:`~sojourn.providers.base.LaunchFailed` (or any ``ProviderError``)
when it does not. A provider without them has them recorded as ``skipped``: its launch
covers them (and a ``LaunchFailed`` raised by ``launch`` names the check that failed).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from sojourn.providers.base import (
    Handle,
    LaunchFailed,
    LaunchSpec,
    Offer,
    Provider,
    ProviderError,
    Requirements,
)

CHECKS = ("catalog", "permission", "capacity", "launch")


@dataclass
class CheckResult:
    check: str  # one of CHECKS
    outcome: str  # passed, failed, skipped, not-run
    detail: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.outcome in ("passed", "skipped")

    def to_event(self, offer: Offer, workspace: str | None = None, allocation: str | None = None) -> dict[str, Any]:
        """The workspace event that records this check."""
        ev = {"type": "launch-check", **asdict(self), "provider": offer.provider, "offer": offer.name,
              "spot": offer.spot}
        if workspace:
            ev["workspace"] = workspace
        if allocation:
            ev["allocation"] = allocation
        return ev


@dataclass
class LaunchOutcome:
    offer: Offer
    results: list[CheckResult] = field(default_factory=list)
    handle: Handle | None = None

    @property
    def ok(self) -> bool:
        return self.handle is not None and all(r.ok for r in self.results)

    @property
    def failed(self) -> CheckResult | None:
        return next((r for r in self.results if r.outcome == "failed"), None)

    def events(self, workspace: str | None = None, allocation: str | None = None) -> list[dict[str, Any]]:
        return [r.to_event(self.offer, workspace, allocation) for r in self.results]

    def raise_for_failure(self) -> Handle:
        """The handle, or :class:`LaunchFailed` naming the check that failed and why."""
        bad = self.failed
        if bad is not None or self.handle is None:
            check = bad.check if bad else "launch"
            detail = bad.detail if bad else "no handle"
            raise LaunchFailed(f"launch of {self.offer.provider}:{self.offer.name} failed at the {check} check: "
                               f"{detail}", check)
        return self.handle


def launch_checked(
    provider: Provider,
    offer: Offer,
    spec: LaunchSpec,
    *,
    listed: list[Offer] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> LaunchOutcome:
    """Run the four checks in order, stopping at the first that fails; later ones are
    recorded as ``not-run``. ``listed``: the offers to look ``offer`` up in (default: the
    provider's own ``offers``)."""
    out = LaunchOutcome(offer)

    def run(check: str, fn: Callable[[], str | None] | None) -> bool:
        if fn is None:
            out.results.append(CheckResult(check, "skipped", f"{provider.name} has no separate {check} check"))
            return True
        t0 = clock()
        try:
            detail = fn() or ""
        except LaunchFailed as e:
            # A provider may discover a different check failing (no capacity during launch).
            check_name = e.check if e.check in CHECKS else check
            out.results.append(CheckResult(check_name, "failed", str(e), clock() - t0))
            return False
        except ProviderError as e:
            out.results.append(CheckResult(check, "failed", str(e), clock() - t0))
            return False
        out.results.append(CheckResult(check, "passed", detail, clock() - t0))
        return True

    def in_catalog() -> str:
        offers = listed if listed is not None else provider.offers(Requirements(provider=offer.provider))
        for o in offers:
            if o.provider == offer.provider and o.name == offer.name:
                return f"listed at ${o.price:.4g}/h"
        raise LaunchFailed(f"{offer.provider} does not list {offer.name}", "catalog")

    def launched() -> str:
        handle = provider.launch(offer, spec)
        out.handle = handle
        st = provider.status(handle)
        if st not in ("pending", "running"):
            # Started but not answering: release it so that a failed check never keeps paying.
            try:
                provider.terminate(handle)
            except ProviderError:
                pass
            out.handle = None
            raise LaunchFailed(f"launched, but its status is {st!r} (terminated)", "launch")
        return f"{st} ({', '.join(f'{k}={v}' for k, v in sorted(handle.data.items())[:3])})"

    steps: list[tuple[str, Callable[[], str | None] | None]] = [
        ("catalog", in_catalog),
        ("permission", getattr(provider, "check_permission", None) and (lambda: provider.check_permission(offer))),  # type: ignore[attr-defined]
        ("capacity", getattr(provider, "check_capacity", None) and (lambda: provider.check_capacity(offer))),  # type: ignore[attr-defined]
        ("launch", launched),
    ]
    for i, (name, fn) in enumerate(steps):
        if not run(name, fn):
            out.results += [CheckResult(n, "not-run") for n, _ in steps[i + 1:]]
            break
    return out
