"""The machines config: named machines with limits and prices, stored in the repository.

The config is the object ``machines.toml`` of the repository's ``config`` kind, so every
host that uses the repository sees the same machines::

    [machines.small]
    memory = "2GiB"
    cpus = 1
    python = "python3.11"
    price_per_hour = 0.10
    max_duration = "2h"

    [machines.big]
    memory = "16GiB"
    python = "/opt/python3.13/bin/python3"
    price_per_hour = 0.80

Every key is optional: ``provider`` (default ``local``), ``memory`` (a size: the session's
RLIMIT_DATA; none: no limit), ``cpus`` (the session runs on that many CPUs), ``python`` (a
command on PATH or a path; none: the interpreter running sojourn), ``price_per_hour`` (USD,
for the spend), ``max_duration`` (the default hard stop). Without a config, one machine
exists: ``local``, this host with no limit, this Python, price 0.
"""

from __future__ import annotations

import math
import os
import platform
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import asdict, dataclass, field
from typing import Any

from sojourn.errors import ObjectNotFound, SojournError
from sojourn.providers.base import ProviderError
from sojourn.repository.repo import Repository
from sojourn.workspace.machine import MachineSpec, format_duration, parse_duration
from sojourn.workspace.sessions import parse_size
from sojourn.workspace.signing import SIGNATURE_LINE, RecordKey, config_signed, sign_config

CONFIG_KIND = "config"
CONFIG_NAME = "machines.toml"
DEFAULT = "local"
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
KEYS = ("provider", "memory", "cpus", "python", "price_per_hour", "max_duration")


class MachineError(ProviderError):
    """The machines config is wrong or names something that is not there."""


@dataclass
class Machine:
    """One configured machine, as written in the config (``python`` not resolved yet)."""

    name: str
    provider: str = "local"
    memory: int | None = None  # bytes
    cpus: int | None = None
    python: str | None = None  # a command or a path; None: this interpreter
    price_per_hour: float = 0.0
    max_duration: float | None = None  # seconds
    # Whether the config it came from is signed with the repository key: an unsigned one
    # (edited by hand, by an older sojourn, or by someone without the key) names no
    # interpreter that sojourn runs (docs/threat-model.md).
    trusted: bool = field(default=True, compare=False)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("trusted")
        return d


@dataclass
class Interpreter:
    path: str | None
    version: str | None
    error: str | None = None


def check_name(name: str) -> None:
    if not NAME_RE.match(name):
        raise MachineError(f"invalid machine name {name!r}: use 1-64 letters, digits, '_' or '-', starting with a "
                           "letter or digit")


# -- reading and writing the config -------------------------------------------------------------


def _machine(name: str, doc: Any) -> Machine:
    if not isinstance(doc, dict):
        raise MachineError(f"{CONFIG_NAME}: [machines.{name}] is not a table")
    unknown = sorted(set(doc) - set(KEYS))
    if unknown:
        raise MachineError(f"{CONFIG_NAME}: [machines.{name}] has unknown key(s) {', '.join(unknown)}; "
                           f"known: {', '.join(KEYS)}")
    try:
        cpus = doc.get("cpus")
        if cpus is not None and (not isinstance(cpus, int) or cpus < 1):
            raise ValueError(f"cpus must be a whole number >= 1, not {cpus!r}")
        price = float(doc.get("price_per_hour", 0.0))
        if price < 0 or math.isnan(price):
            raise ValueError(f"price_per_hour must be >= 0, not {price!r}")
        python = doc.get("python")
        if python is not None and not isinstance(python, str):
            raise ValueError(f"python must be a command or a path, not {python!r}")
        return Machine(name=name, provider=str(doc.get("provider", "local")), memory=parse_size(doc.get("memory")),
                       cpus=cpus, python=python or None, price_per_hour=price,
                       max_duration=parse_duration(doc.get("max_duration")))
    except (ValueError, TypeError, SojournError) as e:  # parse_size/parse_duration: WorkspaceError
        raise MachineError(f"{CONFIG_NAME}: [machines.{name}]: {e}") from None


def parse_config(text: str) -> dict[str, Machine]:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise MachineError(f"{CONFIG_NAME} is not valid TOML ({e}); fix it or rewrite it with "
                           "`sojourn machines set`") from None
    table = doc.get("machines", {})
    if not isinstance(table, dict):
        raise MachineError(f"{CONFIG_NAME}: `machines` must be a table of [machines.NAME] tables")
    out = {}
    for name, body in table.items():
        check_name(name)
        out[name] = _machine(name, body)
    return out


def _size_text(n: int) -> str:
    for unit, power in (("TiB", 4), ("GiB", 3), ("MiB", 2), ("KiB", 1)):
        if n % (1024**power) == 0:
            return f"{n // 1024**power}{unit}"
    return str(n)


def _key_values(m: Machine) -> dict[str, Any]:
    """The config keys of ``m`` as TOML values (None: the key is left out)."""
    return {
        "provider": m.provider if m.provider != "local" else None,
        "memory": _size_text(m.memory) if m.memory is not None else None,
        "cpus": m.cpus,
        "python": m.python,
        "price_per_hour": float(m.price_per_hour),
        "max_duration": format_duration(m.max_duration) if m.max_duration is not None else None,
    }


def _unsigned_body(text: str) -> str:
    lines = text.rstrip("\n").split("\n")
    if lines and lines[-1].startswith(SIGNATURE_LINE):
        lines.pop()
    return "\n".join(lines) + "\n"


def render_config(machines: dict[str, Machine], base: str | None = None) -> str:
    """The config text for ``machines``. With ``base`` (the config as it is now) only what
    differs is edited, in place: other tables ([slurm], [ssh.*]), comments, key order and the
    spelling of unchanged values stay as the owner wrote them."""
    import tomlkit

    if base is None:
        doc = tomlkit.document()
        doc.add(tomlkit.comment("sojourn machines (`sojourn machines set NAME ...` writes this file)"))
    else:
        doc = tomlkit.parse(_unsigned_body(base))
    if "machines" not in doc:
        doc.add("machines", tomlkit.table(is_super_table=True))
    table = doc["machines"]
    old = {n: _machine(n, t.unwrap() if hasattr(t, "unwrap") else t) for n, t in table.items()}
    for name in [n for n in table if n not in machines]:
        del table[name]
    for name in sorted(machines):
        new, before = _key_values(machines[name]), (_key_values(old[name]) if name in old else None)
        if name not in table:
            table.add(name, tomlkit.table())
        t = table[name]
        for key in KEYS:
            value = new[key]
            if before is not None and before[key] == value and (key in t or value is None
                                                                or key == "price_per_hour"):
                continue  # unchanged: keep what is written (or that it is not written)
            if value is None:
                if key in t:
                    del t[key]
            else:
                t[key] = value
    return tomlkit.dumps(doc)


def default_machines() -> dict[str, Machine]:
    return {DEFAULT: Machine(DEFAULT)}


def load_machines(repo: Repository) -> dict[str, Machine]:
    """The configured machines; without a config, the default ``local`` one. Machines of a
    config that is not signed with the repository key are marked untrusted."""
    try:
        raw = repo.backend.load(CONFIG_KIND, CONFIG_NAME)
    except ObjectNotFound:
        return default_machines()
    text = raw.decode("utf-8", errors="replace")
    found = parse_config(text)
    if not config_signed(RecordKey(repo.key, repo.id), CONFIG_NAME, text):
        for m in found.values():
            m.trusted = False
    return found


def has_config(repo: Repository) -> bool:
    return repo.backend.stat(CONFIG_KIND, CONFIG_NAME) is not None


def save_machines(repo: Repository, machines: dict[str, Machine]) -> list[str]:
    """Write the config, signed with the repository key, editing the one there in place (see
    :func:`render_config`). The interpreter of a machine read from an unsigned config is left
    out (signing it would vouch for what someone without the key may have written): the names
    of those machines are returned, to be said. For the same reason an unsigned config that
    holds other tables ([slurm], [ssh.*]) is not rewritten: the owner checks and signs it first."""
    try:
        base: str | None = bytes(repo.backend.load(CONFIG_KIND, CONFIG_NAME)).decode("utf-8")
    except ObjectNotFound:
        base = None
    if base is not None and not config_signed(RecordKey(repo.key, repo.id), CONFIG_NAME, base):
        others = sorted(k for k in tomllib.loads(_unsigned_body(base)) if k != "machines")
        if others:
            raise MachineError(
                f"{CONFIG_NAME} is not signed with the repository key and holds hand-written "
                f"{', '.join('[' + k + ']' for k in others)}; signing it now would vouch for them unchecked. Check the "
                "file, run `sojourn machines sign`, then repeat this command")
    dropped = [n for n, m in sorted(machines.items()) if not m.trusted and m.python is not None]
    clean = {n: (Machine(**{**m.to_json(), "python": None}) if n in dropped else m) for n, m in machines.items()}
    text = sign_config(RecordKey(repo.key, repo.id), CONFIG_NAME, render_config(clean, base))
    parse_config(text)  # what we write must read back
    repo.backend.save(CONFIG_KIND, CONFIG_NAME, text.encode())
    repo.backend.flush()
    return dropped


def sign_machines(repo: Repository) -> str:
    """Sign the config as it is now (after the owner checked a hand edit): every table is kept
    verbatim, an old signature line is replaced. Returns the text signed."""
    try:
        text = bytes(repo.backend.load(CONFIG_KIND, CONFIG_NAME)).decode("utf-8")
    except ObjectNotFound:
        raise MachineError(f"{repo.url} has no {CONFIG_NAME} to sign") from None
    lines = text.rstrip("\n").split("\n")
    if lines and lines[-1].startswith(SIGNATURE_LINE):
        lines.pop()
    body = "\n".join(lines) + "\n"
    tomllib.loads(body)  # what we sign must read (TOMLDecodeError otherwise)
    repo.backend.save(CONFIG_KIND, CONFIG_NAME, sign_config(RecordKey(repo.key, repo.id), CONFIG_NAME, body).encode())
    repo.backend.flush()
    return body


def get_machine(repo: Repository, name: str) -> Machine:
    machines = load_machines(repo)
    m = machines.get(name)
    if m is None:
        known = ", ".join(sorted(machines)) or "none"
        raise MachineError(f"no machine {name!r} in {repo.url} (machines: {known}); add it with "
                           f"`sojourn machines set {name} --memory 2GiB --cpus 1 --price 0.10`")
    return m


# -- interpreters -------------------------------------------------------------------------------


def resolve_python(python: str | None) -> Interpreter:
    """The interpreter a machine names, as an absolute path, and its version (by running it)."""
    if python is None:
        return Interpreter(sys.executable, platform.python_version())
    path = python if os.sep in python else shutil.which(python)
    if not path or not os.path.isfile(path) or not os.access(path, os.X_OK):
        return Interpreter(None, None, f"no Python interpreter {python!r} on this host (give a command on PATH "
                                       "or a path)")
    path = os.path.abspath(path)
    try:
        out = subprocess.run([path, "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"],
                             capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        return Interpreter(path, None, f"{path} does not run: {e}")
    if out.returncode != 0 or not out.stdout.strip():
        return Interpreter(path, None, f"{path} is not a working Python interpreter (exit code {out.returncode})")
    return Interpreter(path, out.stdout.strip())


def machine_interpreter(m: Machine) -> Interpreter:
    """:func:`resolve_python` of the machine's interpreter, unless the config that names it is
    not signed: then it is neither run nor used (it may be anyone's script)."""
    if not m.trusted and m.python is not None:
        return Interpreter(None, None, (
            f"the interpreter {m.python!r} comes from the repository's {CONFIG_NAME}, which is not signed with the "
            "repository key (edited by hand, written by an older sojourn, or by someone without the key): it was not "
            "run. Check it, then `sojourn machines set NAME --python PATH` signs the config"))
    return resolve_python(m.python)


def machine_spec(m: Machine, *, max_duration: float | None = None, offer: dict[str, Any] | None = None) -> MachineSpec:
    """What the workspace layer needs to run a session on ``m`` (its Python resolved);
    ``max_duration`` overrides the machine's default hard stop."""
    interp = machine_interpreter(m)
    if interp.path is None or interp.error:
        raise MachineError(f"machine {m.name!r}: {interp.error}; fix it with `sojourn machines set {m.name} "
                           "--python PATH`")
    return MachineSpec(name=m.name, python=interp.path, provider=m.provider, memory=m.memory, cpus=m.cpus,
                       price_per_hour=m.price_per_hour,
                       max_duration=max_duration if max_duration is not None else m.max_duration,
                       offer=offer or {"provider": m.provider, "name": m.name, "price_per_hour": m.price_per_hour,
                                       "memory": m.memory, "cpus": m.cpus, "python": interp.version})
