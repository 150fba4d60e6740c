"""pandas' internal blocks, placements and copy-on-write references.

A DataFrame pickles its BlockManager, which pickles its blocks as ``_unpickle_block(values,
placement.indexer, ndim)``. Two things go wrong when that comes back in one capsule:

* **Shared placements.** ``df.copy()``, ``groupby`` pieces and slices share the
  ``BlockPlacement`` objects (and their slices) of the frame they came from. pandas pickles
  a placement as its slice and makes a new placement, with a new slice, from it: what was
  one object at capture is two after a restore, and the restore fails its fingerprint
  check. Here a placement travels as an object of its own (memoized: shared stays shared),
  made of plain integers or its index array.
* **Copy-on-write.** sojourn keeps numpy views as views, so a restored ``s = df["a"]`` or
  ``pd.Index(df["b"])`` still shares ``df``'s memory, as it did. pandas knows such sharing
  through the ``BlockValuesRefs`` a block holds (weak references to every block and index
  over the same values) and copies before a write; its pickling drops them, so after a
  restore ``df.loc[0, "a"] = 9`` would write into ``s`` and into the index too: silently
  different from the program that never moved. Here the references object travels
  (memoized, empty: who refers to it is the content) and each block and index joins it again
  as it is rebuilt, so pandas copies before a write exactly as it did before the pause.
"""

from __future__ import annotations

import sys
from typing import Any

from sojourn.capsule.registry import register


def _internals() -> Any:
    return sys.modules["pandas._libs.internals"]


# -- placements ------------------------------------------------------------------------------


def _placement_slice(start: int, stop: int | None, step: int) -> Any:
    return _internals().BlockPlacement(slice(start, stop, step))


def _placement_array(arr: Any) -> Any:
    return _internals().BlockPlacement(arr)


@register("pandas._libs.internals.BlockPlacement")
def _placement_reduce(bp: Any, pickler: Any) -> Any:
    pickler.note_module("pandas")
    if bp.is_slice_like:
        s = bp.as_slice
        # Integers, not the slice object: the placement makes its own slice from them, and no
        # other object can share it (which would differ after a restore).
        return (_placement_slice, (s.start, s.stop, s.step))
    # The index array: the placement keeps the very array it is given (intp, writeable).
    return (_placement_array, (bp.as_array,))


# -- copy-on-write references -------------------------------------------------------------------


def _refs() -> Any:
    return _internals().BlockValuesRefs()


@register("pandas._libs.internals.BlockValuesRefs")
def _refs_reduce(refs: Any, pickler: Any) -> Any:
    # Empty: the blocks and indexes restored with it add themselves (weakly), as pandas does.
    return (_refs, ())


# -- blocks -------------------------------------------------------------------------------------


def _block(cls: Any, values: Any, placement: Any, ndim: int, refs: Any) -> Any:
    # The class's own constructor, as pandas' new_block calls it; with ``refs`` the block
    # joins the references of the values it shares.
    return cls(values, ndim=ndim, placement=placement, refs=refs)


@register("pandas._libs.internals.Block", subclasses=True)
def _block_reduce(blk: Any, pickler: Any) -> Any:
    pickler.note_module("pandas")
    return (_block, (type(blk), blk.values, blk.mgr_locs, blk.ndim, blk.refs))


# -- indexes: their references ------------------------------------------------------------------


def _index(fn: Any, args: tuple[Any, ...], refs: Any) -> Any:
    idx = fn(*args)
    # pandas made the index its own references object; it shared its values' at capture.
    idx._references = refs
    refs.add_index_reference(idx)
    return idx


@register("pandas.Index", subclasses=True)
def _index_reduce(idx: Any, pickler: Any) -> Any:
    pickler.note_module("pandas")
    try:
        rv = idx.__reduce_ex__(5)
    except Exception as e:
        return pickler.problem(idx, f"its own pickling fails: {e}")
    refs = idx.__dict__.get("_references") if hasattr(idx, "__dict__") else None
    if refs is None or not isinstance(rv, tuple) or len(rv) < 2:
        return rv
    return (_index, (rv[0], tuple(rv[1]), refs), *rv[2:])
