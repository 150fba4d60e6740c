"""torch objects that are not tensors: ``torch.device``, ``torch.Generator``, modules and
optimizers.

* A ``torch.device`` and a generator travel as an index into the device table (see
  :mod:`sojourn.capsule.reducers.torch`) and are mapped under the restore's device policy.
  A generator's stream continues where it was; the default generators are process state,
  which the capsule's process segment carries.
* Modules and optimizers use their own pickling. Optimizer hooks travel (torch's
  ``__getstate__`` drops them), and restored hook ids move ``RemovableHandle.next_id`` past
  them, so a new hook cannot replace an old one. The wrapper an LR scheduler puts on
  ``optimizer.step`` (to warn about call order) is put back, and whether it saw a call.
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any

from sojourn.capsule.context import current
from sojourn.capsule.pickler import PROTOCOL
from sojourn.capsule.reducers.torch import (
    _object_slot,
    _remember,
    _restore_state,
    _state,
    _target,
    _torch,
)
from sojourn.capsule.reducers.torch_tensors import _bump_hook_ids
from sojourn.capsule.registry import register

# -- torch.device and torch.Generator ----------------------------------------------------------


@register("torch.device")
def _device_reduce(dev: Any, pickler: Any) -> Any:
    pickler.note_module("torch")
    return (_make_device, (_object_slot(pickler, dev, str(dev)),))


def _make_device(slot: int) -> Any:
    dev = _torch().device(_target(slot))
    _remember(dev, slot)
    return dev


def _default_generators(torch: Any) -> list[tuple[str, Any]]:
    found = [("cpu", torch.default_generator)]
    cuda = sys.modules.get("torch.cuda")
    if cuda is not None and cuda.is_initialized():
        found += [(f"cuda:{i}", g) for i, g in enumerate(cuda.default_generators)]
    return found


@register("torch._C.Generator")
def _generator_reduce(g: Any, pickler: Any) -> Any:
    torch = sys.modules["torch"]
    pickler.note_module("torch")
    st = _state(pickler)
    if st.restore is not None and id(g) in st.restore.canonical:
        return st.restore.canonical[id(g)]
    for device, default in _default_generators(torch):
        if g is default:
            # Its state is process state: the capsule's process segment carries it.
            return (_default_generator, (_object_slot(pickler, g, device),))
    state = g.get_state()
    raw = ctypes.string_at(state.data_ptr(), state.numel())
    return (_make_generator, (_object_slot(pickler, g, str(g.device)), raw, g.initial_seed()))


def _default_generator(slot: int) -> Any:
    torch = _torch()
    dev = torch.device(_target(slot))
    if dev.type == "cuda":
        torch.cuda.init()  # default_generators is empty until CUDA is initialised
        g = torch.cuda.default_generators[dev.index or 0]
    else:
        g = torch.default_generator
    _remember(g, slot)
    return g


def _make_generator(slot: int, state: bytes, seed: int) -> Any:
    torch = _torch()
    rctx = current()
    target = torch.device(_target(slot))
    g = torch.Generator(device=target)
    if target.type == torch.device(rctx.devices[slot]).type:
        g.set_state(torch.frombuffer(bytearray(state), dtype=torch.uint8))
    else:
        # CPU and GPU generators are different algorithms: the stream cannot continue.
        g.manual_seed(seed)
        rctx.warnings.append(
            f"a torch.Generator from {rctx.devices[slot]} now lives on {target}; another kind "
            f"of device draws other numbers, so it was re-seeded with its initial seed {seed}"
        )
        st = _restore_state()
        assert st is not None
        st.canonical[id(g)] = (_make_generator, (slot, state, seed))
    _remember(g, slot)
    return g


# -- modules and optimizers: their own pickling, plus hooks and hook ids ------------------------


_LR_SCHED = "_sj_lr_sched"  # in an optimizer's travelling state: an LR scheduler wrapped its step


def _setstate_with_hooks(obj: Any, state: dict[str, Any]) -> None:
    sched = state.pop(_LR_SCHED, None) if type(state) is dict else None
    obj.__setstate__(state)
    _bump_hook_ids(v for k, v in state.items() if k.endswith("hooks") and isinstance(v, dict))
    if sched is not None:
        _wrap_step(obj, sched)


def _wrap_step(opt: Any, called: bool) -> None:
    """What an LR scheduler's ``__init__`` does to its optimizer (torch.optim.lr_scheduler,
    ``patch_track_step_called``): ``step`` notes that it was called, which the scheduler's
    first ``step()`` checks. Without it torch warns that ``optimizer.step()`` was overridden."""
    import functools
    import weakref

    func = type(opt).step
    opt_ref = weakref.ref(opt)

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        o = opt_ref()
        o._opt_called = True  # type: ignore[union-attr]
        return func.__get__(o, o.__class__)(*args, **kwargs)

    wrapper._wrapped_by_lr_sched = True  # type: ignore[attr-defined]
    opt.step = wrapper
    if called:
        opt._opt_called = True


@register("torch.nn.modules.module.Module", "torch.optim.optimizer.Optimizer", subclasses=True)
def _hooked_reduce(obj: Any, pickler: Any) -> Any:
    pickler.note_module(type(obj).__module__)
    try:
        rv = obj.__reduce_ex__(PROTOCOL)
    except Exception as e:
        return pickler.problem(obj, f"its own pickling fails: {str(e) or type(e).__name__}")
    if not (isinstance(rv, tuple) and len(rv) in (3, 4, 5) and isinstance(rv[2], dict)):
        return rv
    if not hasattr(obj, "__setstate__"):
        return rv
    # Keys as the instance dict holds them: __setstate__ stores the stream's strings there,
    # so a restored object pickles again with the very string objects it was rebuilt from
    # (a fresh literal key would break the stream's sharing of that string; see pickler.py).
    keys = {k: k for k in vars(obj)}
    state = {keys.get(k, k): v for k, v in rv[2].items()}
    torch = sys.modules["torch"]
    if isinstance(obj, torch.optim.Optimizer):
        # Optimizer.__getstate__ keeps only defaults, state and param_groups.
        hooks = {k: v for k, v in vars(obj).items() if k.startswith("_optimizer_") and k.endswith("hooks") and v}
        state = {**state, **hooks}
        step = vars(obj).get("step")
        if getattr(step, "_wrapped_by_lr_sched", False):
            state[_LR_SCHED] = bool(vars(obj).get("_opt_called", False))
    rest = (*rv[3:], None, None)[:2]
    return (rv[0], rv[1], state, *rest, _setstate_with_hooks)
