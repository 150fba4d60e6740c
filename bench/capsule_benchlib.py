"""The benchmark's state, its file-system helpers and its fresh-process children.

Imported by ``bench_capsule.py``, which puts the sojourn source tree on ``sys.path`` first;
nothing here imports sojourn.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

try:
    import torch
except ImportError:  # the benchmark still runs; the torch rows say so
    torch = None

MiB = 1 << 20
GiB = 1 << 30


# -- the state ----------------------------------------------------------------------------


def small_objects(n: int, user_class: type | None) -> list[Any]:
    out: list[Any] = []
    for i in range(n):
        r = i % 4
        if r == 0:
            out.append((i, f"item-{i}"))
        elif r == 1:
            out.append({"id": i, "name": f"n{i % 997}", "score": i * 0.25})
        elif r == 2:
            cls = user_class or types.SimpleNamespace
            out.append(cls(id=i, tag=f"t{i % 31}", score=i / 7.0, links=[i, i + 1]))
        else:
            out.append([i, float(i), str(i)])
    return out


def torch_state(nbytes: int) -> dict[str, Any]:
    """A model whose parameters plus AdamW moments take about ``nbytes``."""
    assert torch is not None
    torch.manual_seed(0)
    width = 1024
    layers = max(1, round(nbytes / 12 / (width * width + width)))  # params + 2 moments, fp32
    mods: list[Any] = []
    for _ in range(layers):
        mods += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*mods[:-1])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss = model(torch.randn(8, width)).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return {"model": model, "optimizer": opt}


def build_state(gib: float, n_small: int, *, with_torch: bool, user_class: type | None) -> tuple[dict[str, Any], dict[str, Any]]:
    total = int(gib * GiB)
    rng = np.random.default_rng(0)
    with_torch = with_torch and torch is not None
    torch_bytes = int(total * 0.35) if with_torch else 0
    array_bytes = total - torch_bytes - 16 * MiB  # the small objects take ~10-15 MiB
    # 100 arrays of varied size and dtype, so "1% of the arrays" is one array.
    sizes = rng.uniform(0.5, 1.5, 100)
    sizes = (sizes / sizes.sum() * array_bytes).astype(np.int64) // 256 * 256
    arrays = []
    for i, sz in enumerate(sizes):
        if i % 3 == 0:
            arrays.append(rng.standard_normal(int(sz) // 8))
        elif i % 3 == 1:
            arrays.append(rng.standard_normal(int(sz) // 4, dtype=np.float32).reshape(-1, 64)[:, :])
        else:
            arrays.append(rng.integers(0, 1 << 40, int(sz) // 8))
    ns: dict[str, Any] = {"arrays": arrays, "config": {"lr": 1e-3, "epochs": 10, "name": "bench"}}
    ns["small"] = small_objects(n_small, user_class)
    kinds = "a dataclass defined in __main__" if user_class else "SimpleNamespace"
    info = {
        "arrays": f"{len(arrays)} numpy arrays, {sum(a.nbytes for a in arrays) / MiB:.0f} MiB",
        "small": f"{n_small} small objects (tuples, dicts, lists, {kinds} instances)",
    }
    if with_torch:
        ts = torch_state(torch_bytes)
        ns.update(ts)
        n_params = sum(p.numel() for p in ts["model"].parameters())
        info["torch"] = (
            f"torch model {n_params / 1e6:.1f}M params + AdamW state, "
            f"{3 * n_params * 4 / MiB:.0f} MiB"
        )
    else:
        info["torch"] = "no torch model in the state (" + ("--no-torch" if torch else "torch not installed") + ")"
    return ns, info


def _tensor_bytes(t: Any) -> memoryview:
    # Not via .numpy(): that marks the tensor's storage as not resizable for good, which
    # changes how sojourn's torch reducer treats it; the benchmark must not alter the state.
    s = t.untyped_storage()
    return memoryview((ctypes.c_char * s.nbytes()).from_address(s.data_ptr())).cast("B")


def state_bytes(ns: dict[str, Any]) -> list[memoryview]:
    """The raw bytes of the state's big buffers (for the dd source file)."""
    views = [memoryview(a).cast("B") for a in ns["arrays"]]
    if torch is not None and "model" in ns:
        for p in ns["model"].parameters():
            views.append(_tensor_bytes(p))
        for st in ns["optimizer"].state.values():
            for v in st.values():
                if isinstance(v, torch.Tensor) and v.numel() > 1:
                    views.append(_tensor_bytes(v))
    return views


# -- helpers ------------------------------------------------------------------------------


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def files_under(path: Path) -> Iterator[Path]:
    if path.is_file():
        yield path
        return
    for dirpath, _dirs, names in os.walk(path):
        for n in names:
            yield Path(dirpath) / n


def evict(paths: list[Path]) -> str:
    """Drop ``paths`` from the page cache; return how."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return "drop_caches"
    except OSError:
        pass
    for p in paths:
        for fp in files_under(p):
            fd = os.open(fp, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
    return "fadvise(DONTNEED)"


def warm(paths: list[Path]) -> None:
    buf = bytearray(4 * MiB)
    for p in paths:
        for fp in files_under(p):
            with open(fp, "rb", buffering=0) as f:
                while f.readinto(buf):
                    pass


def rmtree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def settle() -> None:
    # Write back what earlier steps left dirty so it does not slow the next measurement.
    gc.collect()
    os.sync()


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def fmt_s(x: float) -> str:
    return f"{x:.3f} s"


def fmt_rate(nbytes: int, s: float) -> str:
    return f"{nbytes / MiB / s:.0f} MiB/s"


# -- fresh-process children -----------------------------------------------------------------

CHILD_RESTORE = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import numpy
try:
    import torch
except ImportError:
    pass
from sojourn.capsule.restore import restore_capsule
from sojourn.repository.repo import open_repository
repo = open_repository(sys.argv[2])
t = time.perf_counter()
out = restore_capsule(repo, sys.argv[3], check=sys.argv[4] == "1")
seconds = time.perf_counter() - t
repo.close()
print(json.dumps({"seconds": seconds, "timings": out.timings, "n": len(out)}))
"""

CHILD_READ = r"""
import json, sys, time
import numpy as np
path, size = sys.argv[1], int(sys.argv[2])
t = time.perf_counter()
buf = np.empty(size, dtype=np.uint8)
with open(path, "rb", buffering=0) as f:
    got = 0
    view = memoryview(buf)
    while got < size:
        n = f.readinto(view[got:])
        if not n:
            break
        got += n
seconds = time.perf_counter() - t
assert got == size, (got, size)
print(json.dumps({"seconds": seconds}))
"""


def child(code: str, *args: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"child failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])
