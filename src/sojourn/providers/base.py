"""The provider interface: every place machines come from (local, slurm, ssh, skypilot)
implements these four calls, and one conformance suite (tests/providers/conformance.py)
runs against each.

A provider knows nothing about capsules or moves. It is asked for offers that fit a
requirement, launches a command (a sojourn supervisor) on one offer with a hard stop, tells
whether what it launched still runs, and terminates it. Everything it launches is named by a
:class:`Handle`, plain JSON data that goes into the allocation record so that any other
process (on any host) can ask ``status`` or ``terminate`` later.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from sojourn.errors import SojournError

Status = Literal["pending", "running", "ended", "unknown"]


class ProviderError(SojournError):
    """A provider could not do what was asked; the message says which check failed and why."""


class LaunchFailed(ProviderError):
    """Nothing runs: the launch failed at one of the four checks (catalog, permission,
    capacity, launch). ``check`` names it so the workspace event can record it."""

    def __init__(self, message: str, check: str):
        super().__init__(message)
        self.check = check


@dataclass(frozen=True)
class Requirements:
    """What a session needs. ``None`` means "no requirement"."""

    memory: int | None = None  # bytes
    cpus: int | None = None
    gpus: int = 0
    gpu: str | None = None  # model name, e.g. "A100"; case-insensitive prefix match
    arch: str | None = None  # "x86_64", "arm64"
    spot: bool | None = None  # True: spot only; False: on-demand only
    provider: str | None = None
    python: str | None = None  # "3.12": a minor version the machine must offer


@dataclass(frozen=True)
class Offer:
    """A machine that can be had. For ``local`` it is a named machine from the repository's
    machines config; for clouds, a catalog row (instance type in a region)."""

    provider: str
    name: str  # unique within the provider: "small", "p4d.24xlarge@us-east-1"
    cpus: int | None = None
    memory: int | None = None  # bytes
    gpus: int = 0
    gpu: str | None = None
    gpu_memory: int | None = None  # bytes per GPU
    arch: str = "x86_64"
    region: str | None = None
    price_per_hour: float = 0.0  # on-demand, USD
    spot_price_per_hour: float | None = None
    spot: bool = False  # this offer is the spot variant
    notice_s: float | None = None  # preemption notice for spot offers
    python: str | None = None  # interpreter on the machine (path or command)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def price(self) -> float:
        """What an hour costs on this offer as launched (spot price for a spot offer)."""
        if self.spot and self.spot_price_per_hour is not None:
            return self.spot_price_per_hour
        return self.price_per_hour

    def fits(self, req: Requirements) -> bool:
        if req.provider and req.provider != self.provider:
            return False
        if req.memory is not None and (self.memory is None or self.memory < req.memory):
            return False
        if req.cpus is not None and (self.cpus is None or self.cpus < req.cpus):
            return False
        if req.gpus and self.gpus < req.gpus:
            return False
        if req.gpu and not (self.gpu and self.gpu.lower().startswith(req.gpu.lower())):
            return False
        if req.arch and _arch(req.arch) != _arch(self.arch):
            return False
        return req.spot is None or req.spot == self.spot

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _arch(a: str) -> str:
    a = a.lower()
    return {"amd64": "x86_64", "aarch64": "arm64"}.get(a, a)


@dataclass
class LaunchSpec:
    """What to start on the machine: ``argv`` (a sojourn supervisor command line) with
    ``env`` added, for the workspace allocation ``allocation``. ``hard_stop``: seconds after
    which the allocation must end; the provider enforces it with its own mechanism where one
    exists (Slurm ``--time``), otherwise the supervisor's watchdog does (it suspends)."""

    workspace: str
    allocation: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    hard_stop: float | None = None
    cwd: str | None = None  # a directory on the machine; None: the provider's scratch directory


@dataclass
class Handle:
    """Names what a launch started, as JSON data (recorded in the allocation)."""

    provider: str
    machine: str
    allocation: str
    data: dict[str, Any] = field(default_factory=dict)  # pid/boot id, job id, host, scratch dir...

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Handle:
        return cls(d["provider"], d["machine"], d["allocation"], dict(d.get("data") or {}))


@runtime_checkable
class Provider(Protocol):
    name: str

    def offers(self, req: Requirements) -> list[Offer]:
        """Offers that fit ``req``, cheapest first."""
        ...

    def launch(self, offer: Offer, spec: LaunchSpec) -> Handle:
        """Start ``spec`` on ``offer``; raise :class:`LaunchFailed` naming the failed check."""
        ...

    def status(self, handle: Handle) -> Status:
        ...

    def terminate(self, handle: Handle) -> None:
        """Stop what ``handle`` names and release the machine; a no-op if it already ended."""
        ...


ProviderFactory = Callable[[Any], Provider]
_FACTORIES: dict[str, str] = {
    # name -> "module:attribute"; imported on first use so that `sojourn` starts fast and a
    # provider's library (SkyPilot...) is only needed by those who use it.
    "local": "sojourn.providers.local:LocalProvider",
    "slurm": "sojourn.providers.slurm:SlurmProvider",
    "ssh": "sojourn.providers.ssh:SshProvider",
    "skypilot": "sojourn.providers.skypilot:SkyPilotProvider",
}


def register_provider(name: str, target: str) -> None:
    _FACTORIES[name] = target


def provider_names() -> list[str]:
    return sorted(_FACTORIES)


def get_provider(name: str, repo: Any) -> Provider:
    """The provider called ``name``, configured from repository ``repo``."""
    import importlib

    target = _FACTORIES.get(name)
    if target is None:
        raise ProviderError(f"no provider {name!r}; known: {', '.join(provider_names())}")
    module, attr = target.split(":")
    factory = getattr(importlib.import_module(module), attr)
    return factory(repo)  # type: ignore[no-any-return]


def cheapest_first(offers: list[Offer]) -> list[Offer]:
    return sorted(offers, key=lambda o: (o.price if o.price == o.price else math.inf, o.provider, o.name))
