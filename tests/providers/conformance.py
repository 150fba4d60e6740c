"""The conformance suite every provider passes (local, slurm, ssh, ...).

A provider's test module subclasses :class:`ProviderConformance` and gives two fixtures:

* ``provider``: the provider under test (a ``sojourn.providers.base.Provider``);
* ``launchable``: an offer of that provider on which a short command can really start.

and may override :meth:`ProviderConformance.sleep_argv` / :meth:`quick_argv` when its
machines need another command line. Every test launches real processes and leaves none
behind (each handle is terminated at the end).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from sojourn.providers.base import Handle, LaunchSpec, Offer, Provider, Requirements, cheapest_first


def wait_status(provider: Provider, handle: Handle, want: set[str], timeout: float) -> str:
    deadline = time.monotonic() + timeout
    status = provider.status(handle)
    while status not in want and time.monotonic() < deadline:
        time.sleep(0.05)
        status = provider.status(handle)
    return status


class ProviderConformance:
    start_timeout = 60.0  # seconds a launch may stay pending (a batch queue)
    end_timeout = 60.0

    def sleep_argv(self, seconds: int) -> list[str]:
        return ["sleep", str(seconds)]

    def quick_argv(self) -> list[str]:
        return ["true"]

    @pytest.fixture
    def launched(self, provider: Provider) -> Iterator[list[Handle]]:
        handles: list[Handle] = []
        yield handles
        for h in handles:
            provider.terminate(h)

    def spec(self, argv: list[str], name: str = "conformance") -> LaunchSpec:
        import secrets

        return LaunchSpec(workspace=f"ws_{name}", allocation=f"al_{secrets.token_hex(6)}", argv=argv)

    # -- offers --------------------------------------------------------------------------------

    def test_provider_has_the_interface(self, provider: Any) -> None:
        assert isinstance(provider, Provider)
        assert isinstance(provider.name, str) and provider.name

    def test_offers_are_cheapest_first_and_fit(self, provider: Provider, launchable: Offer) -> None:
        offers = provider.offers(Requirements())
        assert offers, "a provider with a launchable offer offers something"
        assert offers == cheapest_first(offers)
        assert all(o.provider == provider.name for o in offers)
        assert launchable.name in {o.name for o in offers}
        if launchable.memory:
            req = Requirements(memory=launchable.memory)
            fitting = provider.offers(req)
            assert launchable.name in {o.name for o in fitting}
            assert all(o.fits(req) for o in fitting)
        too_big = Requirements(memory=1 << 60)
        assert provider.offers(too_big) == []
        assert provider.offers(Requirements(provider="no-such-provider")) == []

    # -- launch, status, terminate -------------------------------------------------------------

    def test_launch_runs_then_terminate_ends_it(self, provider: Provider, launchable: Offer,
                                                launched: list[Handle]) -> None:
        h = provider.launch(launchable, self.spec(self.sleep_argv(120)))
        launched.append(h)
        assert h.provider == provider.name and h.machine == launchable.name
        assert wait_status(provider, h, {"running"}, self.start_timeout) == "running"
        again = Handle.from_json(h.to_json())  # what another process reads from the record
        assert provider.status(again) == "running"
        provider.terminate(again)
        assert wait_status(provider, h, {"ended"}, self.end_timeout) == "ended"
        provider.terminate(h)  # a no-op once ended
        provider.terminate(again)
        assert provider.status(h) == "ended"

    def test_a_command_that_exits_is_ended(self, provider: Provider, launchable: Offer,
                                           launched: list[Handle]) -> None:
        h = provider.launch(launchable, self.spec(self.quick_argv()))
        launched.append(h)
        assert wait_status(provider, h, {"ended"}, self.start_timeout + self.end_timeout) == "ended"
        provider.terminate(h)
        assert provider.status(h) == "ended"

    def test_each_launch_is_its_own(self, provider: Provider, launchable: Offer, launched: list[Handle]) -> None:
        a = provider.launch(launchable, self.spec(self.sleep_argv(120)))
        launched.append(a)
        b = provider.launch(launchable, self.spec(self.sleep_argv(120)))
        launched.append(b)
        assert a.to_json() != b.to_json()
        assert wait_status(provider, a, {"running"}, self.start_timeout) == "running"
        assert wait_status(provider, b, {"running"}, self.start_timeout) == "running"
        provider.terminate(a)
        assert wait_status(provider, a, {"ended"}, self.end_timeout) == "ended"
        assert provider.status(b) == "running"
