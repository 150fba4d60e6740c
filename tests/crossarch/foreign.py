"""Running sojourn on another CPU: a Debian rootfs (``tools/foreign-rootfs``) under qemu-user.

The rootfs is built once per machine and cached outside the checkout, in
``${SOJOURN_ROOTFS_CACHE:-~/.cache/sojourn/rootfs}/<arch>-<suite>``. A test that needs one:

* uses it when it is built (``.sojourn-rootfs-ok`` in it);
* waits for it while a build runs (``.ci/run`` starts the s390x build in the background
  before the suite, so that it overlaps the other tests), by calling the build script,
  which waits on the build's lock and returns once the rootfs is there;
* builds it itself when the architecture is required (``SOJOURN_REQUIRE_CROSSARCH=s390x``,
  a comma-separated list: CI) and nobody builds it; otherwise it skips, saying how to build.

sojourn runs there from this tree (``src/`` bind-mounted read-only), with its dependencies
(pyproject's, at the versions this interpreter has) installed as wheels
for the target, downloaded by this interpreter's pip once per rootfs. numpy is Debian's
(Debian 13: Python 3.13, numpy 2.2), so a move there also crosses Python and numpy
versions. Each command runs in its own mount, PID and UTS namespace: a tmpfs on the
rootfs's ``/tmp`` and ``/mnt`` (nothing is written into the cached rootfs but the pyc
cache), the test's directories bind-mounted at the same paths as on the host, so paths in
capsules and scripts mean the same inside and out, and nothing is left mounted or running
when the command ends (``--kill-child``).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
BUILD = ROOT / "tools" / "foreign-rootfs"
SUITE = "stable"

def _dependencies() -> list[str]:
    """sojourn's own dependencies, by name, as pyproject.toml lists them."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        deps = tomllib.load(f)["project"]["dependencies"]
    return [re.split(r"[\s<>=!~\[;]", d, maxsplit=1)[0] for d in deps]


DEPENDENCIES = _dependencies()
# Target platform tags for pip: wheels of the manylinux2014 generation run on Debian 13.
PLATFORMS = {
    "s390x": ["manylinux_2_17_s390x", "manylinux2014_s390x"],
    "arm64": ["manylinux_2_17_aarch64", "manylinux2014_aarch64"],
}
# A build waited for or run by a test: generous, the machine is shared (10-20 min measured).
BUILD_TIMEOUT = float(os.environ.get("SOJOURN_ROOTFS_TIMEOUT", "3000"))


def cache_dir() -> Path:
    return Path(os.environ.get("SOJOURN_ROOTFS_CACHE", Path.home() / ".cache" / "sojourn" / "rootfs"))


def required(arch: str) -> bool:
    return arch in os.environ.get("SOJOURN_REQUIRE_CROSSARCH", "").replace(" ", "").split(",")


def _unavailable(arch: str, why: str) -> None:
    if required(arch):
        pytest.fail(f"{arch} rootfs required (SOJOURN_REQUIRE_CROSSARCH) but {why}")
    pytest.skip(why)


def _building(lock: Path) -> bool:
    if not lock.exists():
        return False
    with open(lock) as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
    return False


@dataclass
class Foreign:
    """A rootfs for ``arch`` and the way to run this tree's sojourn in it."""

    arch: str
    root: Path
    deps: str  # the dependencies' directory inside the rootfs

    def run(self, argv: list[str], *, cwd: Path, binds: list[Path], env: dict[str, str] | None = None,
            timeout: float = 900) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` in the rootfs, in ``cwd``, with ``binds`` (host directories) at their own paths."""
        r = shlex.quote(str(self.root))
        lines = ["set -e",
                 # A hostname of its own: liveness checks must not take a session there for one
                 # of the host's (under qemu a process reads its start time a tick off).
                 f"echo sojourn-{self.arch} > /proc/sys/kernel/hostname",
                 f"mount -t tmpfs sojourn-tmp {r}/tmp",
                 f"mount -t tmpfs sojourn-mnt {r}/mnt",
                 f"mkdir -p {r}/mnt/src",
                 f"mount --bind {shlex.quote(str(SRC))} {r}/mnt/src",
                 f"mount -o remount,bind,ro {r}/mnt/src"]
        for b in binds:
            q = shlex.quote(str(b))
            lines += [f"mkdir -p {r}{q}", f"mount --bind {q} {r}{q}"]
        full = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": "/root",
            "LANG": "C.UTF-8",
            "PYTHONPATH": f"/mnt/src:{self.deps}",
            # Bytecode goes to the rootfs's cache, never into the bind-mounted tree.
            "PYTHONPYCACHEPREFIX": "/var/cache/sojourn-pyc",
            **{k: v for k, v in os.environ.items() if k.startswith("SOJOURN_") and k not in ("SOJOURN_ROOTFS_CACHE",)},
            **(env or {}),
        }
        envs = " ".join(shlex.quote(f"{k}={v}") for k, v in full.items())
        cmd = " ".join(shlex.quote(a) for a in argv)
        lines.append(f"exec chroot {r} /usr/bin/env -i {envs} sh -c {shlex.quote(f'cd {shlex.quote(str(cwd))} && exec {cmd}')}")
        return subprocess.run(
            ["unshare", "--mount", "--uts", "--pid", "--fork", "--kill-child", f"--mount-proc={self.root}/proc",
             "sh", "-c", "\n".join(lines)],
            capture_output=True, text=True, timeout=timeout,
        )


def rootfs(arch: str) -> Path:
    """The built rootfs for ``arch``: used, waited for, built, or the test skips."""
    root = cache_dir() / f"{arch}-{SUITE}"
    if (root / ".sojourn-rootfs-ok").exists():
        return root
    if sys.platform != "linux" or os.geteuid() != 0:
        _unavailable(arch, "building or entering a rootfs needs root on Linux (debootstrap, chroot)")
    for tool in ("unshare", "chroot"):
        if shutil.which(tool) is None:
            _unavailable(arch, f"{tool} is not installed")
    lock = root.with_name(root.name + ".lock")
    if not required(arch) and not _building(lock):
        _unavailable(arch, f"no {arch} rootfs in {root}: build it once with `tools/foreign-rootfs {arch}` "
                           f"(10-20 min), or set SOJOURN_REQUIRE_CROSSARCH={arch} to let the tests build it")
    log = root.with_name(root.name + ".log")
    started = time.monotonic()
    with open(log, "a") as out:
        proc = subprocess.run([str(BUILD), arch, str(root)], stdout=out, stderr=subprocess.STDOUT,
                              timeout=BUILD_TIMEOUT, env=dict(os.environ, SUITE=SUITE))
    if proc.returncode != 0 or not (root / ".sojourn-rootfs-ok").exists():
        tail = log.read_text(errors="replace")[-3000:]
        pytest.fail(f"building the {arch} rootfs failed after {time.monotonic() - started:.0f} s:\n{tail}")
    return root


def _target_python(root: Path) -> str:
    link = os.readlink(root / "usr" / "bin" / "python3")  # "python3.13"
    return link.rsplit("python", 1)[1]


def dependencies(arch: str, root: Path) -> str:
    """sojourn's dependencies in the rootfs, at this interpreter's versions (installed once)."""
    version = _target_python(root)
    pins = [f"{name}=={metadata.version(name)}" for name in DEPENDENCIES]
    tag = hashlib.sha256(json.dumps([version, pins]).encode()).hexdigest()[:12]
    inside = f"/opt/sojourn-deps/{tag}"
    target = root / inside.lstrip("/")
    if (target / ".ok").exists():
        return inside
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / ".ok").exists():
            return inside
        partial = target.with_name(target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile",
               "--target", str(partial), "--only-binary=:all:", "--implementation", "cp",
               "--python-version", version, "--abi", "cp" + version.replace(".", ""),
               *[a for p in PLATFORMS[arch] for a in ("--platform", p)], *pins]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            _unavailable(arch, f"could not download sojourn's dependencies for {arch}: {proc.stderr[-2000:]}")
        shutil.rmtree(target, ignore_errors=True)
        partial.rename(target)
        (target / ".ok").write_text(" ".join(pins))
    return inside


def foreign(arch: str) -> Foreign:
    root = rootfs(arch)
    return Foreign(arch, root, dependencies(arch, root))
