"""matplotlib figures travel exactly, and pyplot's figures come back under their numbers.

matplotlib pickles figures itself (``Figure.__getstate__`` drops the canvas; ``__setstate__``
makes a new one), but a restored figure did not pickle as the captured one did, so the
fingerprint check refused it. What differed, and what is done here:

* ``CallbackRegistry.__getstate__`` (every artist, axis and figure has one) writes its keys
  in the order of the instance's ``__dict__``, which its ``__setstate__`` changes (``_cid_gen``
  comes last); it also takes an id from the registry's counter at each pickling. Here the
  state is written in a fixed order and the counter is only read.
* ``Figure.__setstate__`` and ``Axes.__setstate__`` mark the artist stale, which one drawn
  before the capture (every figure the inline backend showed) was not: the flag is put back.
* ``Figure.__setstate__`` sets its dpi transform again, which marks every transform built on
  it invalid; with the dpi it had, only those flags change, so it works on a stand-in.
* ``Figure.__setstate__`` registers a figure that pyplot managed under the next free number,
  not its own, and makes it the current one. Here an artist's state says nothing of pyplot
  (``_restore_to_pylab`` depends on the capturing process, not on the figure); pyplot's
  figures travel once, in the capsule's process segment: ``[(number, figure), ...]`` in
  pyplot's order, the current one last (:func:`pyplot_state`). The restore registers each
  under its number and in that order (:func:`apply_pyplot_state`), so ``plt.gcf()``,
  ``plt.figure(2)`` and ``plt.get_fignums()`` are what they were, also for figures that no
  variable holds.

matplotlib is imported only when a figure is pickled or restored, and pyplot's state is
read only when the program imported pyplot.
"""

from __future__ import annotations

import sys
from typing import Any

from sojourn.capsule.registry import register


def _count_value(counter: Any) -> int:
    """The next value of an ``itertools.count`` without taking it (``count(7)`` -> 7)."""
    text = repr(counter)
    if text.startswith("count(") and text.endswith(")") and "," not in text:
        return int(text[6:-1])
    value = next(counter)  # a count with a step: only its repr says more, and not portably
    return int(value)


def _new(cls: Any) -> Any:
    return cls.__new__(cls)  # what copyreg.__newobj__ does for pickle


@register("matplotlib.cbook.CallbackRegistry")
def _callback_registry_reduce(obj: Any, pickler: Any) -> Any:
    # What CallbackRegistry.__getstate__ writes, in a fixed order and without advancing the
    # id counter. Its __setstate__ (run on the destination) rebuilds proxies and the map.
    own = vars(obj)
    state = {k: own[k] for k in sorted(own) if k not in ("callbacks", "_func_cid_map", "_cid_gen")}
    pickled = own.get("_pickled_cids", set())
    state["callbacks"] = {s: {cid: proxy() for cid, proxy in sorted(d.items()) if cid in pickled}
                          for s, d in sorted(own.get("callbacks", {}).items(), key=lambda kv: repr(kv[0]))}
    state["_func_cid_map"] = None
    state["_cid_gen"] = _count_value(own["_cid_gen"]) if "_cid_gen" in own else 0
    return (_new, (type(obj),), state)



@register("matplotlib.artist.Artist", subclasses=True)
def _artist_reduce(artist: Any, pickler: Any) -> Any:
    t = type(artist)
    if t.__reduce_ex__ is not object.__reduce_ex__ or t.__reduce__ is not object.__reduce__:
        return NotImplemented  # an artist that says itself how it pickles
    state = artist.__getstate__()
    if not isinstance(state, dict):
        return NotImplemented
    state = dict(state)
    state.pop("_restore_to_pylab", None)  # a figure's: pyplot's figures travel in the process segment
    return (_new, (t,), state, None, None, _artist_setstate)


def _artist_setstate(artist: Any, state: dict[str, Any]) -> None:
    # Figure.__setstate__ and Axes.__setstate__ mark the artist stale, which one drawn
    # before the capture was not: the flag is part of its state, and of its fingerprint.
    stale = state.get("_stale")
    dpi_trans = _unchanged_dpi_transform(state)
    if dpi_trans is not None:
        # Figure.__setstate__ sets its dpi transform again (clear, scale), which marks every
        # transform built on it invalid; with the dpi it had, nothing changes but those
        # flags, which are state too. It works on a stand-in; the restored one is put back.
        from matplotlib.transforms import Affine2D

        state["dpi_scale_trans"] = Affine2D()
    setstate = getattr(type(artist), "__setstate__", None)
    if setstate is not None and setstate is not getattr(object, "__setstate__", None):
        setstate(artist, state)
    else:
        artist.__dict__.update(state)
    if dpi_trans is not None:
        artist.__dict__["dpi_scale_trans"] = dpi_trans
    if stale is not None:
        artist._stale = stale


def _unchanged_dpi_transform(state: dict[str, Any]) -> Any:
    """A figure's dpi transform when it already scales by the figure's dpi, else None."""
    trans = state.get("dpi_scale_trans")
    dpi = state.get("_dpi")
    if trans is None or dpi is None or "__mpl_version__" not in state:
        return None
    import numpy as np
    from matplotlib.transforms import Affine2D

    mtx = getattr(trans, "_mtx", None)  # get_matrix() would mark it valid
    return trans if mtx is not None and np.array_equal(mtx, Affine2D().scale(dpi).get_matrix()) else None


def pyplot_state() -> dict[str, Any]:
    """pyplot's figures, for the process segment: nothing when pyplot was never imported."""
    if "matplotlib.pyplot" not in sys.modules:
        return {}
    from matplotlib._pylab_helpers import Gcf

    figures = [(num, manager.canvas.figure) for num, manager in Gcf.figs.items()]
    return {"pyplot": figures} if figures else {}


def apply_pyplot_state(state: dict[str, Any]) -> list[str]:
    """Register the restored figures with pyplot, under their numbers and in their order
    (the last is the current figure). Returns notes for what could not be as it was."""
    figures = state.get("pyplot")
    if not figures:
        return []
    import matplotlib.pyplot as plt
    from matplotlib._pylab_helpers import Gcf

    notes = []
    backend = plt._get_backend_mod()
    for num, fig in figures:
        taken = Gcf.figs.get(num)
        if taken is not None and taken.canvas.figure is not fig:
            new = max(Gcf.figs) + 1
            notes.append(f"pyplot figure {num} came back as figure {new}: this process already had a figure {num}")
            num = new
        manager = backend.new_figure_manager_given_figure(num, fig)
        Gcf._set_new_active_manager(manager)  # appended last: the captured order, current one last
    return notes
