"""Reducers that pandas, scipy and scikit-learn objects need beyond their own pickling
(pandas' blocks and copy-on-write references: pandas_internals.py).

pandas DataFrames and Series (categoricals, tz-aware datetimes, MultiIndex, extension
arrays), scipy sparse matrices and fitted scikit-learn estimators pickle through their own
``__reduce__``; their arrays go through the numpy reducer (out of band, views kept). What
they need here is only what makes a restore compare equal to its capture:

* numpy dtypes. ``np.dtype('float64')`` is one object for the whole process, shared by every
  array and scalar that uses it, but numpy pickles a dtype as ``np.dtype('f8', copy=True)``:
  a restore gets a fresh copy at each place, so objects that shared the dtype at capture
  (a fitted estimator's ``n_samples_seen_`` scalar and a DataFrame's column dtype) no longer
  share it, and the fingerprint check rightly refuses the restore. A builtin dtype that is
  the process-wide one travels as "the process-wide dtype of this type string" instead.
"""

from __future__ import annotations

from typing import Any

from sojourn.capsule.reducers import numpy_order
from sojourn.capsule.registry import register


def _shared_dtype(type_str: str) -> Any:
    return numpy_order.shared_dtype(type_str)


@register("numpy.dtype", subclasses=True)
def _dtype_reduce(obj: Any, pickler: Any) -> Any:
    # Structured, datetime, explicitly ordered...: numpy's own pickling, with the byte
    # order written as a little-endian machine writes it (numpy_order).
    return numpy_order.reduce_dtype(obj, pickler, _shared_dtype)


# -- scikit-learn's Bunch -------------------------------------------------------------------
#
# A dict subclass with attribute access whose ``__setstate__`` ignores its state on purpose
# (old pickles had a stale ``__dict__``): pickled, a Bunch comes back without the
# ``_deprecated_key_to_warnings`` its ``__init__`` put in ``__dict__``, so even
# ``Bunch(a=1, b=[1, 2])`` failed its fingerprint check. It travels as its items and its
# ``__dict__``, set back without its ``__setstate__`` or ``__setattr__`` (which writes items).


def _bunch_new(cls: Any) -> Any:
    return dict.__new__(cls)


def _bunch_setstate(obj: Any, state: dict[str, Any]) -> None:
    obj.__dict__.update(state)


@register("sklearn.utils._bunch.Bunch")
def _bunch_reduce(obj: Any, pickler: Any) -> Any:
    pickler.note_module("sklearn")
    return (_bunch_new, (type(obj),), dict(obj.__dict__), None, iter(dict.items(obj)), _bunch_setstate)
