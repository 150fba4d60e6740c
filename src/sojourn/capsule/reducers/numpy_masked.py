"""numpy masked arrays: data and mask as arrays (out of band, views kept), every attribute kept.

numpy pickles a masked array as the raw bytes of its data and mask next to its fill value,
and rebuilds it through ``__setstate__``, which (a) turns a fill value that was never set
(``None``) into the dtype's default, so the restored array pickles differently and failed
its fingerprint check (scikit-learn's ``GridSearchCV.cv_results_`` holds such arrays), and
(b) drops ``hard_mask`` and the memory the array shared with the array it masks.

Here a masked array travels as ``(class, data, attributes)``: ``data`` is a plain ndarray
over the same memory, which goes through the numpy reducer (out of band, a view of its
root), and the attributes are the instance ``__dict__`` (mask, fill value, hard mask,
base class...) set back as they were. On restore it is ``data.view(class)``, so its
``.base`` is the restored data array:

* a masked array whose base is a plain array that it covers exactly (``masked_array(x)``)
  travels with that very array (``x``: shared memory stays shared);
* any other one with a base travels with a plain view of its memory;
* one that owns its memory (``m.copy()``) travels with a plain array standing for its
  memory, the same object for the array and for every view whose base chain ends at it
  (:func:`owned_root`), so that after a restore, where the array is a view of that root,
  everything pickles again to the same stream.
"""

from __future__ import annotations

import sys
from typing import Any

from sojourn.capsule.registry import register


def _np() -> Any:
    return sys.modules["numpy"]


def is_masked(arr: Any) -> bool:
    ma = sys.modules.get("numpy.ma.core")
    return ma is not None and type(arr) is ma.MaskedArray


def owned_root(m: Any, pickler: Any) -> Any:
    """The plain array that stands for the memory of ``m``, a masked array owning it.

    The same object for the whole capture (the numpy reducer memoizes it once)."""
    roots = getattr(pickler, "_sj_masked_roots", None)
    if roots is None:
        roots = pickler._sj_masked_roots = {}
    hit = roots.get(id(m))
    if hit is None:
        hit = roots[id(m)] = m.view(_np().ndarray)
        pickler.keepalive(hit)
    return hit


def _covers(base: Any, m: Any) -> bool:
    np = _np()
    return (type(base) is np.ndarray and base.shape == m.shape and base.strides == m.strides
            and base.dtype == m.dtype
            and base.__array_interface__["data"][0] == m.__array_interface__["data"][0])


def _masked(cls: Any, data: Any) -> Any:
    return data.view(cls)


def _masked_setstate(obj: Any, state: dict[str, Any]) -> None:
    # Straight into __dict__: the mask and fill-value setters copy and convert.
    obj.__dict__.update(state)


@register("numpy.ma.MaskedArray", "numpy.ma.core.MaskedArray")
def _masked_reduce(m: Any, pickler: Any) -> Any:
    pickler.note_module("numpy")
    base = m.base
    if base is None:
        data = owned_root(m, pickler)
    elif _covers(base, m):
        data = base
    else:
        data = m.view(_np().ndarray)
    return (_masked, (type(m), data), dict(m.__dict__), None, None, _masked_setstate)
