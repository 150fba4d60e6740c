"""torch tensors: each is its storage handle (see :mod:`sojourn.capsule.reducers.torch`),
dtype, offset, size and stride, plus what autograd and subclasses hang on it.

* **Supported**: every dtype (bytes are copied as bytes), strided and non-contiguous tensors,
  conj/neg views, ``requires_grad``, ``.grad``, tensor hooks and ``__dict__``, subclasses
  (``nn.Parameter`` keeps its type; user subclasses via ``_make_subclass``), sparse COO and
  compressed layouts, per-tensor/per-channel quantized tensors, meta tensors (no bytes).
* **Refused, with the reason**: tensors with a ``grad_fn`` (they would silently become
  leaves), nested and mkldnn tensors, ``__torch_dispatch__`` wrapper subclasses (FakeTensor,
  DTensor, functorch wrappers), lazy modules' uninitialized parameters, storage-less devices.
* Not restored: autograd view links (``._base``; storage sharing is kept) and inference-mode
  flags. Restored hook ids move ``RemovableHandle.next_id`` past them, so a new hook cannot
  replace an old one.
"""

from __future__ import annotations

import contextlib
import copyreg
import sys
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

from sojourn.capsule.reducers.torch import _dtype_name, _handle, _torch
from sojourn.capsule.registry import register

_COMPRESSED = ("sparse_csr", "sparse_csc", "sparse_bsr", "sparse_bsc")


def _refusal(t: Any, torch: Any) -> str | None:
    cls = type(t)
    if getattr(cls, "__torch_dispatch__", None) is not torch.Tensor.__torch_dispatch__:
        return (
            f"{cls.__qualname__} is a tensor subclass with its own __torch_dispatch__ (a wrapper "
            "such as FakeTensor, DTensor or FunctionalTensor holds no storage of its own); "
            "convert it to a plain tensor before capture"
        )
    if isinstance(t, torch.nn.parameter.UninitializedTensorMixin):
        return (
            "it is an uninitialized parameter of a lazy module (LazyLinear, ...); run one "
            "forward pass so that it gets its shape, then capture"
        )
    functorch = getattr(torch._C, "_functorch", None)
    if functorch is not None and functorch.is_functorch_wrapped_tensor(t):
        return "it is a tensor inside a vmap/grad transform; capture outside the transform"
    if t.grad_fn is not None:
        return (
            f"it is part of an autograd graph (grad_fn={type(t.grad_fn).__name__}) and would "
            "silently come back as a leaf cut off from that graph; capture t.detach() instead, "
            "or capture after backward() when the graph is no longer needed"
        )
    if t.is_nested:
        return "nested tensors are not supported; capture t.unbind() (a tuple of tensors) instead"
    layout = str(t.layout).removeprefix("torch.")
    if layout not in ("strided", "sparse_coo", *_COMPRESSED):
        return f"tensors with layout {layout} are not supported; capture t.to_dense() instead"
    if layout != "strided" and cls is not torch.Tensor:
        return f"sparse tensor subclasses ({cls.__qualname__}) are not supported"
    if layout == "strided" and t.device.type not in ("cpu", "meta") and not torch._C._has_storage(t):
        return f"tensors on {t.device} have no storage that can be read; move it with t.cpu() first"
    if t.is_quantized and _dtype_name(t.qscheme()) not in _QSCHEMES:
        return f"quantized tensors with scheme {t.qscheme()} are not supported; capture t.dequantize()"
    return None


_QSCHEMES = ("per_tensor_affine", "per_channel_affine", "per_channel_affine_float_qparams")


def _extra(t: Any, torch: Any) -> dict[str, Any] | None:
    # conj/neg bits: lazily conjugated or negated views share their base's memory.
    extra: dict[str, Any] = dict(torch._C._get_tensor_metadata(t))
    if t.is_quantized:
        scheme = _dtype_name(t.qscheme())
        if scheme == "per_tensor_affine":
            extra["q"] = (scheme, t.q_scale(), t.q_zero_point())
        else:
            extra["q"] = (scheme, t.q_per_channel_scales(), t.q_per_channel_zero_points(), t.q_per_channel_axis())
    return extra or None


def _tensor_state(t: Any, cls: Any, torch: Any) -> dict[str, Any] | None:
    state: dict[str, Any] = {}
    if t.grad is not None:
        state["grad"] = t.grad
    if t._backward_hooks:
        state["hooks"] = t._backward_hooks
    post = getattr(t, "_post_accumulate_grad_hooks", None)
    if post:
        state["post_hooks"] = post
    if t.__dict__:
        state["dict"] = t.__dict__
    if cls is not torch.Tensor:
        slots = {n: getattr(t, n) for n in copyreg._slotnames(cls) if hasattr(t, n)}  # type: ignore[attr-defined]
        if slots:
            state["slots"] = slots
    return state or None


@register("torch.Tensor", subclasses=True)
def _tensor_reduce(t: Any, pickler: Any) -> Any:
    torch = sys.modules["torch"]
    pickler.note_module("torch")
    reason = _refusal(t, torch)
    if reason is not None:
        return pickler.problem(t, reason)
    cls = type(t)
    sub = None if cls is torch.Tensor else cls
    layout = str(t.layout).removeprefix("torch.")
    if layout == "strided":
        storage = _handle(pickler, t.untyped_storage())
        args: tuple[Any, ...] = (
            storage, _dtype_name(t.dtype), t.storage_offset(), tuple(t.shape), t.stride(),
            t.requires_grad, sub, _extra(t, torch),
        )
        rv: tuple[Any, ...] = (_make_tensor, args)
    elif layout == "sparse_coo":
        coo = (t._indices().detach(), t._values().detach(), tuple(t.shape), t.is_coalesced(), t.requires_grad)
        rv = (_make_sparse_coo, coo)
    else:
        if layout in ("sparse_csr", "sparse_bsr"):
            compressed, plain = t.crow_indices(), t.col_indices()
        else:
            compressed, plain = t.ccol_indices(), t.row_indices()
        parts = (compressed.detach(), plain.detach(), t.values().detach())
        rv = (_make_sparse_compressed, (layout, *parts, tuple(t.shape), t.requires_grad))
    state = _tensor_state(t, cls, torch)
    if state is None:
        return rv
    return (*rv, state, None, None, _tensor_setstate)


def _make_tensor(
    storage: Any,
    dtype: str,
    offset: int,
    size: tuple[int, ...],
    stride: tuple[int, ...],
    requires_grad: bool,
    cls: Any,
    extra: dict[str, Any] | None,
) -> Any:
    torch = _torch()
    dt = getattr(torch, dtype)
    extra = extra or {}
    q = extra.get("q")
    if q is None:
        t = torch.empty(0, dtype=dt, device=storage.device)
    else:
        with _quiet():  # torch's deprecation warning was shown when the user made it
            if q[0] == "per_tensor_affine":
                t = torch._empty_affine_quantized([0], scale=q[1], zero_point=q[2], dtype=dt, device=storage.device)
            else:
                t = torch._empty_per_channel_affine_quantized(
                    [0], scales=q[1], zero_points=q[2], axis=q[3], dtype=dt, device=storage.device
                )
    t.set_(storage, offset, size, stride)
    bits = {k: v for k, v in extra.items() if k != "q"}
    if bits:
        torch._C._set_tensor_metadata(t, bits)
    if cls is not None:
        return torch.Tensor._make_subclass(cls, t, requires_grad)
    return t.requires_grad_(requires_grad) if requires_grad else t


def _make_sparse_coo(indices: Any, values: Any, size: tuple[int, ...], coalesced: bool, requires_grad: bool) -> Any:
    t = _torch().sparse_coo_tensor(indices, values, size, is_coalesced=coalesced, check_invariants=False)
    return t.requires_grad_(requires_grad) if requires_grad else t


def _make_sparse_compressed(
    layout: str, compressed: Any, plain: Any, values: Any, size: tuple[int, ...], requires_grad: bool
) -> Any:
    torch = _torch()
    with _quiet():  # "sparse CSR support is in beta": shown when the user made it
        t = torch.sparse_compressed_tensor(
            compressed, plain, values, size, layout=getattr(torch, layout), check_invariants=False
        )
    return t.requires_grad_(requires_grad) if requires_grad else t


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        yield


def _tensor_setstate(t: Any, state: dict[str, Any]) -> None:
    if "grad" in state:
        t.grad = state["grad"]
    if "hooks" in state:
        t._backward_hooks = state["hooks"]
        _bump_hook_ids([state["hooks"]])
    if "post_hooks" in state:
        t._post_accumulate_grad_hooks = state["post_hooks"]
        _bump_hook_ids([state["post_hooks"]])
    if "dict" in state:
        t.__dict__.update(state["dict"])
    for name, value in state.get("slots", {}).items():
        setattr(t, name, value)


# -- hook ids ----------------------------------------------------------------------------------


def _bump_hook_ids(dicts: Iterable[Any]) -> None:
    # RemovableHandle ids restart at 0 in a new process: a hook registered after restore
    # would take a restored hook's id and silently replace it in the same dict.
    top = max((k for d in dicts for k in d if isinstance(k, int)), default=-1)
    if top >= 0:
        from torch.utils.hooks import RemovableHandle

        RemovableHandle.next_id = max(RemovableHandle.next_id, top + 1)
