"""Build the environment a capsule needs, with ``uv``, into a cache keyed by its hash.

``prepare`` decides: an interpreter that already has every library module the capsule needs
(and sojourn's own) is used as it is; otherwise, with building allowed, a virtual
environment is made for it (``uv venv`` on that interpreter, then ``uv pip install`` of every
recorded distribution at its recorded version, plus sojourn), cached under
``$SOJOURN_ENV_CACHE`` (default ``~/.cache/sojourn/envs``) by the environment's key, so the
next resume on this machine starts at once; without, the capsule is refused naming what is
missing. Progress goes to stderr, one line per step plus uv's own summary lines.

uv reads its own settings (``UV_INDEX_URL``, ``UV_FIND_LINKS``, ``UV_CACHE_DIR``, …); a
recorded torch build is installed with ``--torch-backend auto``: a CUDA build where the
machine has an NVIDIA driver, the CPU build elsewhere.
"""

from __future__ import annotations

import fcntl
import importlib.metadata as md
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sojourn.environment import plan
from sojourn.environment.probe import Probe, probe
from sojourn.errors import SojournError

Progress = Callable[[str], None]
MARKER = "sojourn-env.json"


class MissingLibrary(SojournError):
    """The target interpreter lacks what the capsule needs and building was not asked for."""


def stderr_progress(line: str) -> None:
    sys.stderr.write(f"sojourn env: {line}\n")
    sys.stderr.flush()


def find_uv() -> str:
    """``$SOJOURN_UV``, ``uv`` on PATH, beside this interpreter, or the ``uv`` package's."""
    cands = [os.environ.get("SOJOURN_UV"), shutil.which("uv"), str(Path(sys.executable).parent / "uv")]
    try:
        from uv import find_uv_bin  # type: ignore[import-not-found]

        cands.append(find_uv_bin())
    except Exception:
        pass
    for c in cands:
        if c and os.access(c, os.X_OK):
            return c
    raise SojournError("building an environment needs uv: `pip install 'sojourn[env]'` (or uv from its "
                       "installer), or set $SOJOURN_UV to its path")


def torch_backend() -> str | None:
    """uv's ``--torch-backend`` for a recorded torch: ``auto`` (a CUDA build where the machine
    has an NVIDIA driver, the CPU build elsewhere) unless ``$SOJOURN_TORCH_BACKEND`` names
    one (``cpu``, ``cu126``, …) or is ``none``: torch from the indexes uv is configured with
    (``UV_INDEX_URL``, ``UV_FIND_LINKS``), for a machine that cannot reach PyTorch's."""
    value = os.environ.get("SOJOURN_TORCH_BACKEND", os.environ.get("UV_TORCH_BACKEND", "auto")).strip()
    return None if value in ("", "none") else value


def cache_root() -> Path:
    return Path(os.environ.get("SOJOURN_ENV_CACHE") or Path.home() / ".cache" / "sojourn" / "envs")


def sojourn_origin() -> tuple[str, str]:
    """("checkout", its src directory) for a source checkout of sojourn (it is put on the new
    environment's path, as sojourn's children get it), else ("release", version)."""
    src = Path(__file__).resolve().parent.parent.parent
    if "site-packages" not in src.parts and "dist-packages" not in src.parts:
        return "checkout", str(src)
    return "release", md.version("sojourn")


# sojourn's own requirements when its metadata is not there (a checkout on PYTHONPATH only).
_SOJOURN_REQUIRES = ["blake3>=1.0", "zstandard>=0.22; python_version < '3.14'", "click>=8.1", "rich>=13"]


def sojourn_requirements() -> list[str]:
    try:
        reqs = md.requires("sojourn") or []
    except md.PackageNotFoundError:
        reqs = []
    reqs = [r for r in reqs if "extra" not in r.partition(";")[2]]
    return reqs or list(_SOJOURN_REQUIRES)


@dataclass
class Built:
    python: str  # the environment's interpreter
    key: str
    path: str
    reused: bool
    seconds: float
    requirements: list[str]


def _run(cmd: list[str], progress: Progress, what: str) -> None:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            stdin=subprocess.DEVNULL, env={**os.environ, "NO_COLOR": "1"})
    tail: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip()
        if not line:
            continue
        tail = [*tail[-20:], line]
        # uv's summary lines ("Resolved 12 packages in 1.2s", "Installed …", " + numpy==2.4.6")
        progress(f"  {line.strip()}")
    if proc.wait() != 0:
        last = next((ln for ln in reversed(tail) if "error" in ln.lower()), tail[-1] if tail else "")
        raise SojournError(f"{what} failed (uv exit code {proc.returncode}): {last.strip()}")


def build(packages: dict[str, dict[str, Any]], python: str, *, mode: str = "exact", cache: Path | None = None,
          progress: Progress = stderr_progress, target: Probe | None = None) -> Built:
    """A virtual environment on ``python`` holding ``packages`` (as ``record_packages`` wrote
    them) and sojourn; made once per key, then reused."""
    if mode not in plan.MODES:
        raise SojournError(f"environment mode must be one of {', '.join(plan.MODES)}, not {mode!r}")
    t0 = time.perf_counter()
    target = target or probe(python)
    if not target.supported:
        raise SojournError(target.unsupported_message())
    origin = sojourn_origin()
    key = plan.key(asdict(target), packages, mode, ":".join(origin))
    root = cache or cache_root()
    root.mkdir(parents=True, exist_ok=True)
    env = root / key
    env_python = str(env / "bin" / "python")
    reqs = sorted(plan.requirement(n, p, mode) for n, p in packages.items())
    with open(root / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two resumes on one machine build it once
        if (env / MARKER).exists() and os.access(env_python, os.X_OK):
            progress(f"environment {key} for Python {target.version} is cached ({len(reqs)} packages): {env}")
            return Built(env_python, key, str(env), True, time.perf_counter() - t0, reqs)
        # A directory without the marker is a build that was cut short: start again. (Built in
        # place, not renamed: a venv's scripts name their own directory.)
        shutil.rmtree(env, ignore_errors=True)
        uv = find_uv()
        progress(f"[1/3] creating environment {key} on Python {target.version} ({target.python})")
        _run([uv, "venv", "--quiet", "--python", python, str(env)], progress, "creating the environment")
        extra = list(sojourn_requirements())
        if origin[0] == "release":
            extra.append(f"sojourn=={origin[1]}")
        progress(f"[2/3] installing {len(reqs)} recorded package(s) and sojourn's {len(extra)} with uv")
        cmd = [uv, "pip", "install", "--python", env_python, *reqs, *extra]
        backend = torch_backend()
        if backend and any(plan.canonical(n) == "torch" for n in packages):
            cmd += ["--torch-backend", backend]
        _run(cmd, progress, "installing the capsule's packages")
        if origin[0] == "checkout":
            # uv's venv layout (no probe of the new interpreter needed): lib/pythonX.Y/site-packages
            major, minor = target.version_info[:2]
            purelib = env / "lib" / f"python{major}.{minor}" / "site-packages"
            if not purelib.is_dir():
                purelib = Path(probe(env_python).purelib or purelib)
            (purelib / "sojourn-checkout.pth").write_text(origin[1] + "\n")
            # The checkout's bytecode for this Python, now: a destination that compiles sojourn's
            # modules on its first start under load can outlast a live move's lease (10 s).
            subprocess.run([env_python, "-m", "compileall", "-q", str(Path(origin[1]) / "sojourn")],
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           timeout=300, check=False)
        seconds = time.perf_counter() - t0
        (env / MARKER).write_text(json.dumps({
            "key": key, "mode": mode, "python": asdict(target), "requirements": reqs, "sojourn": list(origin),
            "seconds": round(seconds, 3), "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }, indent=1))
        progress(f"[3/3] environment {key} ready in {seconds:.1f} s: {env_python}")
        return Built(env_python, key, str(env), False, seconds, reqs)


def prepare(capsule: str, packages: dict[str, dict[str, Any]], needs: dict[str, dict[str, Any]], python: str, *,
            build_env: bool = False, mode: str = "exact", env: dict[str, str] | None = None,
            progress: Progress = stderr_progress, cache: Path | None = None) -> str:
    """The interpreter to resume ``capsule`` with: ``python`` when it has what the capsule
    needs (its sojourn children's ``env``), else a built environment (``build_env``), else
    a one-line refusal. With ``build_env`` in ``exact`` mode, an interpreter whose versions
    differ from the recorded ones gets a built environment too."""
    target = probe(python, list(needs), env=env, distributions=build_env)
    if not target.supported:
        raise SojournError(target.unsupported_message())
    missing = plan.missing_in(needs, target.modules)
    own = target.sojourn_missing()
    differs = plan.differences(packages, target.distributions, mode) if build_env else []
    if not missing and not own and not differs:
        return python
    if not build_env:
        if missing:
            raise MissingLibrary(plan.refusal(capsule, missing, python))
        raise MissingLibrary(
            f"{python} lacks sojourn's own modules {', '.join(own)}: install them "
            f"(`uv pip install --python {python} {' '.join(_quoted(sojourn_requirements()))}`) "
            "or add --build-env to build an environment for the capsule")
    if differs:
        progress(f"{python}: " + "; ".join(differs[:5]) + ("; …" if len(differs) > 5 else ""))
    return build(packages, python, mode=mode, progress=progress, cache=cache, target=target).python


def _quoted(reqs: list[str]) -> list[str]:
    return [f"'{r}'" if any(c in r for c in " ;<>") else r for r in reqs]


def setup_script(packages: dict[str, dict[str, Any]], python: str, *, mode: str = "exact",
                 sojourn: str = "sojourn", machine: str = "", root: str = "$HOME/.cache/sojourn/envs") -> tuple[str, str]:
    """The same build as a shell script, for a machine sojourn is not on yet (a SkyPilot
    VM's ``setup``): uv (installed with pip if absent) makes the environment on Python
    ``python`` (``3.12``: uv finds or downloads it) unless its marker is there, and installs
    ``packages`` and ``sojourn`` (a requirement: ``sojourn==0.1.0``, a wheel URL, a path).
    Returns the script and the environment's interpreter (for the run command)."""
    import shlex

    reqs = sorted(plan.requirement(n, p, mode) for n, p in packages.items())
    key = plan.key({"version": python, "implementation": "cpython", "platform": "linux", "machine": machine},
                   packages, mode, sojourn)
    env = f"{root}/{key}"
    torch = " --torch-backend auto" if any(plan.canonical(n) == "torch" for n in packages) else ""
    install = " ".join(shlex.quote(r) for r in [*reqs, sojourn])
    script = "\n".join([
        "set -euo pipefail",
        'export PATH="$HOME/.local/bin:$PATH"',
        "command -v uv >/dev/null || python3 -m pip install --quiet --user uv",
        f'ENV="{env}"',
        'if [ ! -f "$ENV/' + MARKER + '" ]; then',
        f'  echo "sojourn env: [1/3] creating environment {key} on Python {python}" >&2',
        '  rm -rf "$ENV"',
        f'  uv venv --quiet --python {shlex.quote(python)} "$ENV"',
        f'  echo "sojourn env: [2/3] installing {len(reqs)} recorded package(s) and sojourn with uv" >&2',
        f'  uv pip install --python "$ENV/bin/python"{torch} {install}',
        f"  echo '{json.dumps({'key': key, 'mode': mode, 'requirements': reqs, 'sojourn': sojourn})}'"
        f' > "$ENV/{MARKER}"',
        "fi",
        f'echo "sojourn env: [3/3] environment {key} ready: $ENV/bin/python" >&2',
    ])
    return script, f"{env}/bin/python"
