"""What a capsule needs from its environment, recorded at capture.

``needs``: per top-level module that the captured objects come from (their classes, functions,
reducers), the distribution that provides it and the variables whose pickles first refer to
it; restore checks these before unpickling anything. ``packages``: those distributions and,
transitively, the installed distributions they require, each with its version, where it came
from (PEP 610 ``direct_url.json``: an index, a wheel or archive, a local or editable
checkout, a VCS commit) and the build variant that matters (torch's CPU/CUDA build, numpy's
BLAS), so that a destination can rebuild it exactly.
"""

from __future__ import annotations

import functools
import importlib.metadata as md
import json
import re
import sys
from collections.abc import Collection
from typing import Any

# Modules that are the interpreter's or sojourn's own: no distribution to record.
_OWN = frozenset({"builtins", "__main__", "sojourn"})


@functools.lru_cache(maxsize=1)
def _top_levels() -> list[tuple[Any, frozenset[str]]]:
    """Every installed distribution with the top-level modules it provides."""
    # What packages_distributions() reads, minus its parsing of every distribution's
    # METADATA for its name (most of its cost, ~1 s on a large environment): only the
    # distributions of modules a capsule uses need a name.
    declared = getattr(md, "_top_level_declared", None)
    inferred = getattr(md, "_top_level_inferred", None)
    if declared is None or inferred is None:
        return []
    return [(d, frozenset(declared(d) or inferred(d))) for d in md.distributions()]


@functools.cache
def providers(mod: str) -> tuple[str, ...]:
    """Names of the distributions that provide top-level module ``mod`` (as
    ``importlib.metadata.packages_distributions()[mod]``, in the same order)."""
    try:
        tops = _top_levels()
        if not tops:
            return tuple(md.packages_distributions().get(mod, []))
        return tuple(d.metadata["Name"] for d, names in tops if mod in names)
    except Exception:
        return ()


def library_modules(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if m not in sys.stdlib_module_names and m not in _OWN)


def distributions_for(modules: set[str]) -> dict[str, str]:
    """Distribution name → version for the library modules in ``modules``."""
    out: dict[str, str] = {}
    for mod in library_modules(modules):
        for dist in providers(mod):
            try:
                out[dist] = md.version(dist)
            except md.PackageNotFoundError:
                continue
    return out


def record_needs(users: dict[str, list[str]], skip: Collection[str] = ()) -> dict[str, dict[str, Any]]:
    """``users``: top-level module → the variables that refer to it (in capture order).
    Workspace modules (``skip``) travel as source and are left out."""
    needs: dict[str, dict[str, Any]] = {}
    for mod in library_modules(set(users) - set(skip)):
        dists = providers(mod)
        if not dists and not _findable(mod):
            # A type's module that no import finds here either (Cython's ``_cython_3_1_2``, a
            # module made at run time): a restore never imports it by that name.
            continue
        dist = dists[0] if dists else None
        version = None
        if dist is not None:
            try:
                version = md.version(dist)
            except md.PackageNotFoundError:
                dist = None
        needs[mod] = {"distribution": dist, "version": version, "variables": list(users[mod])}
    return needs


def _findable(mod: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(mod) is not None
    except (ImportError, ValueError):
        return False


_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requires(dist: md.Distribution) -> list[str]:
    """The installed distributions ``dist`` requires (extras left out: an extra that was
    wanted shows up as its own requirement of whatever asked for it)."""
    out = []
    for req in dist.requires or []:
        if "extra" in req.partition(";")[2]:
            continue
        m = _NAME.match(req)
        if m:
            out.append(m.group(1))
    return out


def _source(dist: md.Distribution) -> dict[str, Any]:
    """Where the distribution came from (PEP 610); an index when nothing says otherwise."""
    try:
        text = dist.read_text("direct_url.json")
    except Exception:
        text = None
    if not text:
        return {"kind": "index"}
    try:
        du = json.loads(text)
    except ValueError:
        return {"kind": "index"}
    url = du.get("url", "")
    if "vcs_info" in du:
        vcs = du["vcs_info"]
        return {"kind": "vcs", "url": url, "vcs": vcs.get("vcs", "git"), "commit": vcs.get("commit_id")}
    if "dir_info" in du:
        editable = bool(du["dir_info"].get("editable"))
        return {"kind": "editable" if editable else "local", "url": url}
    if "archive_info" in du:
        kind = "wheel" if url.endswith(".whl") else "archive"
        out = {"kind": kind, "url": url}
        if du["archive_info"].get("hashes") or du["archive_info"].get("hash"):
            out["hash"] = du["archive_info"].get("hashes") or du["archive_info"].get("hash")
        return out
    return {"kind": "index"}


def _variant(name: str, version: str) -> dict[str, Any]:
    """Build variants that decide which wheel is the right one. Only modules already
    imported are asked (recording never imports a library)."""
    out: dict[str, Any] = {}
    local = version.partition("+")[2]
    if local:
        out["local"] = local  # torch 2.13.0+cpu, +cu124, +rocm6.2
    cname = canonical(name)
    if cname == "torch":
        torch = sys.modules.get("torch")
        cuda = getattr(getattr(torch, "version", None), "cuda", None)
        out["accelerator"] = f"cuda {cuda}" if cuda else ("cpu" if local in ("", "cpu") else local)
    elif cname == "numpy":
        np_config = sys.modules.get("numpy.__config__")
        try:
            blas = np_config.CONFIG["Build Dependencies"]["blas"]["name"]  # type: ignore[union-attr]
            out["blas"] = blas
        except Exception:
            pass
    return out


@functools.cache
def _package(name: str) -> tuple[str, dict[str, Any], tuple[str, ...]] | None:
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:
        return None
    real = dist.metadata["Name"] or name
    version = dist.version
    entry: dict[str, Any] = {"version": version, "source": _source(dist)}
    variant = _variant(real, version)
    if variant:
        entry["variant"] = variant
    requires = tuple(sorted({canonical(r) for r in _requires(dist)}))
    return real, entry, requires


def record_packages(needs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The needed distributions and every installed distribution they require, transitively."""
    out: dict[str, dict[str, Any]] = {}
    todo = sorted({n["distribution"] for n in needs.values() if n.get("distribution")})
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if canonical(name) in seen:
            continue
        seen.add(canonical(name))
        got = _package(name)
        if got is None:
            continue  # a requirement that is not installed (an optional one, or a marker's)
        real, entry, requires = got
        installed = [r for r in requires if _package(r) is not None]
        out[real] = {**entry, "requires": installed}
        todo.extend(r for r in installed if r not in seen)
    return dict(sorted(out.items()))
