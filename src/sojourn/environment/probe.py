"""What a target interpreter has: asked in that interpreter, with its standard library only
(it may have no sojourn, no blake3, or be a Python sojourn does not support)."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from typing import Any

from sojourn.errors import SojournError

SUPPORTED = (3, 11)

# Runs on any Python 3 (no f-strings, no walrus): its answer is how a too-old one is named.
_SCRIPT = r"""
import json, os, platform, sys
try:
    import importlib.util as iu
except Exception:
    iu = None
out = {"version": platform.python_version(), "version_info": list(sys.version_info[:3]),
       "implementation": sys.implementation.name, "machine": platform.machine(),
       "platform": sys.platform, "executable": sys.executable, "prefix": sys.prefix,
       "base_prefix": getattr(sys, "base_prefix", sys.prefix), "distributions": {}, "modules": {}}
mods = sys.argv[1:]
listing = mods[:1] == ["--distributions"]
if listing:
    mods = mods[1:]
try:
    import importlib.metadata as md
    for d in (md.distributions() if listing else ()):
        name = d.metadata["Name"]
        if name:
            out["distributions"][name.lower().replace("_", "-").replace(".", "-")] = d.version
except Exception:
    pass
for mod in mods:
    try:
        found = iu is not None and iu.find_spec(mod) is not None
    except Exception:
        found = False
    out["modules"][mod] = found
try:
    import sysconfig
    out["purelib"] = sysconfig.get_paths()["purelib"]
except Exception:
    pass
sys.stdout.write(json.dumps(out) + "\n")
"""

# What sojourn itself needs in the target to restore anything (modules, by import name).
SOJOURN_MODULES = ("sojourn", "blake3", "click", "rich")
ZSTD_MODULES = ("zstandard", "compression.zstd", "backports.zstd")


@dataclass
class Probe:
    python: str
    version: str
    version_info: tuple[int, ...]
    implementation: str
    machine: str
    platform: str
    prefix: str
    distributions: dict[str, str] = field(default_factory=dict)  # canonical name -> version
    modules: dict[str, bool] = field(default_factory=dict)
    purelib: str | None = None

    @property
    def supported(self) -> bool:
        return self.implementation == "cpython" and tuple(self.version_info[:2]) >= SUPPORTED

    def has(self, module: str) -> bool:
        return bool(self.modules.get(module))

    def sojourn_missing(self) -> list[str]:
        """sojourn's own modules the interpreter lacks (with the PYTHONPATH its children get)."""
        missing = [m for m in SOJOURN_MODULES if not self.has(m)]
        if not any(self.has(m) for m in ZSTD_MODULES):
            missing.append("zstandard")
        return missing

    def unsupported_message(self) -> str:
        return (f"{self.python} is {self.implementation} {self.version}: sojourn needs CPython "
                f"{SUPPORTED[0]}.{SUPPORTED[1]} or newer; pass --python with a newer interpreter")


def probe(python: str, modules: list[str] | tuple[str, ...] = (), *, env: dict[str, str] | None = None,
          timeout: float = 60.0, distributions: bool = True) -> Probe:
    """Ask ``python`` what it is and which of ``modules`` (top-level names) it can import,
    and (``distributions``) every installed distribution's version: reading every
    distribution's metadata is most of the probe's time on a large environment.
    ``env`` is the environment its sojourn children get (a source checkout's PYTHONPATH)."""
    wanted = sorted(set(modules) | set(SOJOURN_MODULES) | set(ZSTD_MODULES))
    if distributions:
        wanted.insert(0, "--distributions")
    try:
        proc = subprocess.run([python, "-c", _SCRIPT, *wanted], capture_output=True, text=True,
                              timeout=timeout, env=env if env is not None else dict(os.environ),
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SojournError(f"the interpreter {python} could not be run ({e}); check --python") from None
    line = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith("{")), None)
    if proc.returncode != 0 or line is None:
        err = (proc.stderr.strip().splitlines() or ["no answer"])[-1]
        raise SojournError(f"{python} did not answer sojourn's probe ({err}); is it a Python 3 interpreter?")
    d: dict[str, Any] = json.loads(line)
    return Probe(python=python, version=d["version"], version_info=tuple(d["version_info"]),
                 implementation=d["implementation"], machine=d["machine"], platform=d["platform"],
                 prefix=d["prefix"], distributions=d["distributions"], modules=d["modules"],
                 purelib=d.get("purelib"))

