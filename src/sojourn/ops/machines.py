"""The service layer for machines: list them, add or change one, remove one (the config is
``machines.toml`` in the repository; see docs/providers.md), and turn a machine name into what
a session needs (``machine_for``)."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from sojourn.repository.repo import open_repository

if TYPE_CHECKING:
    from sojourn.providers.base import Offer
    from sojourn.providers.machines import Machine
    from sojourn.repository.repo import Repository
    from sojourn.workspace.machine import MachineSpec

PathLike = str | os.PathLike[str]
UNSET = "none"  # `sojourn machines set NAME --memory none` removes the limit


@dataclass
class MachineInfo:
    """One row of ``sojourn machines``: the machine as configured and its interpreter as
    found on this host."""

    name: str
    provider: str
    cpus: int | None
    memory: int | None
    python: str | None  # as configured (None: sojourn's own interpreter)
    python_path: str | None  # resolved on this host
    python_version: str | None
    python_error: str | None
    price_per_hour: float
    max_duration: float | None
    configured: bool  # False: the default machine of a repository without a config

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _info(m: Machine, configured: bool) -> MachineInfo:
    from sojourn.providers.machines import machine_interpreter

    interp = machine_interpreter(m)
    return MachineInfo(m.name, m.provider, m.cpus, m.memory, m.python, interp.path, interp.version, interp.error,
                       m.price_per_hour, m.max_duration, configured)


def machines(repo: PathLike | None = None) -> list[MachineInfo]:
    """Every machine of the repository's config (without one: the default ``local``)."""
    from sojourn.providers.machines import default_machines, has_config, load_machines
    from sojourn.repository.repo import backend_for, resolve_url

    if not backend_for(resolve_url(repo)).exists():
        return [_info(m, False) for m in default_machines().values()]
    with open_repository(repo) as r:
        configured = has_config(r)
        found = load_machines(r)
    return [_info(found[name], configured) for name in sorted(found)]


def _optional(value: Any, parse: Any) -> Any:
    return None if isinstance(value, str) and value.strip().lower() == UNSET else parse(value)


def _say_dropped(names: list[str]) -> None:
    if names:
        import warnings

        from sojourn.errors import SojournWarning

        warnings.warn(SojournWarning(
            f"machines.toml was not signed with the repository key, so the interpreter of {', '.join(names)} was left "
            "out of the signed config; set it again with `sojourn machines set NAME --python PATH` if it is yours"),
            stacklevel=3)


def set_machine(
    name: str,
    *,
    repo: PathLike | None = None,
    provider: str | None = None,
    memory: str | int | None = None,
    cpus: int | str | None = None,
    python: str | None = None,
    price_per_hour: float | None = None,
    max_duration: str | float | None = None,
) -> MachineInfo:
    """Add machine ``name`` or change the keys given (``"none"`` clears memory, cpus, python
    or max_duration). A repository without a config starts from the default ``local`` one."""
    from sojourn.providers.machines import (
        Machine,
        MachineError,
        check_name,
        load_machines,
        save_machines,
    )
    from sojourn.workspace.machine import parse_duration
    from sojourn.workspace.sessions import parse_size

    check_name(name)
    with open_repository(repo, create=True) as r:
        found = load_machines(r)
        m = found.get(name) or Machine(name)
        if provider is not None:
            m.provider = provider
        if memory is not None:
            m.memory = _optional(memory, parse_size)
        if cpus is not None:
            n = _optional(cpus, int)
            if n is not None and n < 1:
                raise MachineError(f"--cpus must be 1 or more, not {n}")
            m.cpus = n
        if python is not None:
            m.python = _optional(python, str)
        if price_per_hour is not None:
            if price_per_hour < 0:
                raise MachineError(f"--price must be 0 or more, not {price_per_hour}")
            m.price_per_hour = float(price_per_hour)
        if max_duration is not None:
            m.max_duration = _optional(max_duration, parse_duration)
        if python is not None:
            m.trusted = True  # its interpreter is the one the owner (who holds the key) gave just now
        found[name] = m
        _say_dropped(save_machines(r, found))
    return _info(m, True)


def sign_machines(*, repo: PathLike | None = None) -> str:
    """Sign the repository's machines config as it is (after a hand edit the owner checked);
    returns the text signed."""
    from sojourn.providers.machines import MachineError
    from sojourn.providers.machines import sign_machines as _sign

    with open_repository(repo) as r:
        try:
            return _sign(r)
        except ValueError as e:  # tomllib.TOMLDecodeError
            raise MachineError(f"machines.toml is not valid TOML ({e}); fix it before signing") from None


def remove_machine(name: str, *, repo: PathLike | None = None) -> None:
    from sojourn.providers.machines import get_machine, load_machines, save_machines

    with open_repository(repo) as r:
        get_machine(r, name)  # a clear error for an unknown name
        found = load_machines(r)
        del found[name]
        _say_dropped(save_machines(r, found))


def machine_for(r: Repository, name: str, max_duration: float | None = None) -> tuple[MachineSpec, Offer]:
    """Machine ``name`` of repository ``r`` as its provider offers it, ready to run a session
    on (its interpreter resolved: a clear error when it is missing)."""
    from dataclasses import replace

    from sojourn.providers.base import Requirements, get_provider
    from sojourn.providers.machines import MachineError, get_machine, machine_spec

    m = get_machine(r, name)
    provider = get_provider(m.provider, r)
    offer = next((o for o in provider.offers(Requirements(provider=m.provider)) if o.name == name), None)
    if offer is None:
        raise MachineError(f"provider {m.provider!r} offers no machine {name!r} now")
    spec = machine_spec(m, max_duration=max_duration)
    return replace(spec, offer={k: v for k, v in offer.to_json().items() if v not in (None, {}, [])}), offer
