"""torch ``DataLoader`` iterators and ``tqdm`` bars across a pause.

**DataLoader iterators** cannot be pickled (``__getstate__`` raises), and their position is
more than a count: with ``shuffle=True`` the order comes from random draws made lazily. The
``for`` hook (:mod:`iterhooks`) therefore records, just before ``iter(loader)``, the random
states the iterator is about to draw from: ``random``, numpy's and torch's global generators
and every ``torch.Generator`` of the loader and its samplers. A paused iterator travels as
``(loader, those states, batches yielded)``. On resume it is rebuilt *in place* (the restored
object is the one the program and the loader refer to) by replaying: the recorded states are
set, ``__init__`` runs again with the loader's index sampler wrapped so that it skips the
batches already yielded (indices only, no data is loaded), and the states the program paused
with are set back. The replay keeps the original order of the draws, which is the trap the
prototype found: the iterator draws its worker base seed (``_base_seed``) in ``__init__``,
and ``RandomSampler`` draws its own seed lazily, on the first batch; with workers the first
batch is asked for at once (prefetch), without them only at the first ``next``, which the
replay then forces when batches had been yielded. Worker processes start again from the
first batch not yet yielded; what they had prefetched is dropped. A ``persistent_workers``
iterator is rebuilt as it was made (its base seed from the states of its first pass), then
reset from the states of the current pass.

A loader with ``state_dict()`` / ``load_state_dict()`` (torchdata's ``StatefulDataLoader``)
travels as ``(loader, loader.state_dict())`` and is rebuilt by ``load_state_dict`` and
``iter(loader)``: its own state covers workers and iterable datasets.

Not carried: an iterator made without the hook (``it = iter(loader)``; ``for`` loops over the
loader, over ``enumerate(loader)`` and ``zip(loader, ...)`` and over a tqdm bar of the loader
are hooked), and one over an ``IterableDataset`` without a stateful loader: both refuse the
pause, with a reason. The random state inside worker processes is not carried (it restarts
from the base seed): augmentations drawn in workers differ after a resume unless they are
seeded per sample.

**tqdm bars** travel as their settings, count and elapsed time, and are rebuilt with
``tqdm(initial=n, ...)`` and the elapsed time set back, so count, total, description, rate and
ETA carry on; a closed (or disabled) bar comes back closed. ``for x in tqdm(it)`` iterates
through :class:`TqdmIter`, an object that does what tqdm's own iterator (a library
generator, which cannot travel) does.
"""

from __future__ import annotations

import io
import itertools
import sys
import weakref
from dataclasses import dataclass
from typing import Any

from sojourn.capsule.registry import register
from sojourn.execution.contexts import register_context
from sojourn.execution.iterhooks import _iter_with_hooks, register_iter_hook, watch

DATALOADER = "torch.utils.data.dataloader.DataLoader"
LOADER_ITER = "torch.utils.data.dataloader._BaseDataLoaderIter"
TQDM = "tqdm.std.tqdm"
TQDM_CONTEXTS = ("tqdm.std.tqdm", "tqdm.asyncio.tqdm_asyncio", "tqdm.auto.tqdm")


# -- random states ------------------------------------------------------------------------------


def _generators(loader: Any) -> list[Any]:
    """The torch generators a pass over ``loader`` may draw from, in a fixed order."""
    torch = sys.modules["torch"]
    found: list[Any] = []
    batch_sampler = getattr(loader, "batch_sampler", None)
    for g in (getattr(loader, "generator", None), getattr(getattr(loader, "sampler", None), "generator", None),
              getattr(getattr(batch_sampler, "sampler", None), "generator", None)):
        if isinstance(g, torch.Generator) and all(g is not h for h in found):
            found.append(g)
    return found


def _snapshot(loader: Any) -> dict[str, Any]:
    from sojourn.capsule.reducers.rng import capture_process_state

    return {"process": capture_process_state(),
            "generators": [g.get_state().numpy().tobytes() for g in _generators(loader)]}


def _apply(snap: dict[str, Any], loader: Any) -> None:
    from sojourn.capsule.reducers.rng import apply_process_state

    torch = sys.modules["torch"]
    apply_process_state(snap["process"])
    for g, state in zip(_generators(loader), snap["generators"], strict=False):
        g.set_state(torch.frombuffer(bytearray(state), dtype=torch.uint8))


# -- DataLoader iterators -------------------------------------------------------------------------


@dataclass(eq=False)
class _Origin:
    loader: Any
    first: dict[str, Any] | None  # states when the iterator was made (its worker base seed)
    epoch: dict[str, Any] | None  # states when the current pass began (the sampler's draws)
    kind: str = "replay"  # or "stateful"
    pending: int | None = None  # batches yielded, while the iterator waits to be rebuilt


_ORIGINS: weakref.WeakKeyDictionary[Any, _Origin] = weakref.WeakKeyDictionary()
_LATEST: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()  # stateful loader -> its iterator
_PENDING: list[Any] = []


def _stateful(loader: Any) -> bool:
    return callable(getattr(loader, "state_dict", None)) and callable(getattr(loader, "load_state_dict", None))


def _loader_iter(loader: Any) -> Any:
    """The ``for`` hook for DataLoaders: ``iter(loader)``, with what a replay needs."""
    if _stateful(loader):
        it = iter(loader)
        _ORIGINS[it] = _Origin(loader, None, None, "stateful")
        _LATEST[loader] = it
        return it
    snap = _snapshot(loader)
    it = iter(loader)
    prev = _ORIGINS.get(it)  # a persistent_workers loader hands out the same iterator again
    first = prev.first if prev is not None and prev.loader is loader and prev.kind == "replay" else snap
    _ORIGINS[it] = _Origin(loader, first, snap)
    return it


def _iterable_dataset(loader: Any) -> bool:
    mod = sys.modules.get("torch.utils.data.dataloader")
    kind = getattr(mod, "_DatasetKind", None)
    return kind is not None and getattr(loader, "_dataset_kind", None) == kind.Iterable


@register(LOADER_ITER, subclasses=True)
def _loader_iter_reduce(it: Any, pickler: Any) -> Any:
    origin = _ORIGINS.get(it)
    if origin is None:
        return pickler.problem(it, "this DataLoader iterator was not made by a `for` loop over the DataLoader "
                                   "(nor over enumerate()/zip() of it or a tqdm bar of it, written in the `for` "
                                   "statement itself), so sojourn did not record the random state its order comes "
                                   "from; loop over the DataLoader itself, or use torchdata's StatefulDataLoader")
    loader = origin.loader
    if origin.kind == "stateful":
        if _LATEST.get(loader) is not it:
            return pickler.problem(it, "an older iterator of a stateful DataLoader: its state_dict() describes "
                                       "only the newest one")
        return (_make_stateful, (loader, loader.state_dict()))
    if _iterable_dataset(loader):
        return pickler.problem(it, "a DataLoader over an IterableDataset: its position is inside the dataset's "
                                   "own iterator, which cannot be carried; use a map-style Dataset, or "
                                   "torchdata's StatefulDataLoader with a stateful dataset")
    n = origin.pending if origin.pending is not None else it._num_yielded
    return (_new_loader_iter, (type(it),), (loader, origin.first, origin.epoch, n), None, None, _set_loader_iter)


def _new_loader_iter(cls: Any) -> Any:
    it = cls.__new__(cls)
    it._shutdown = True  # nothing to shut down until it is rebuilt (a worker iterator's __del__ reads it)
    return it


def _set_loader_iter(it: Any, state: tuple[Any, Any, Any, int]) -> None:
    loader, first, epoch, n = state
    _ORIGINS[it] = _Origin(loader, first, epoch, pending=n)
    _PENDING.append(it)


class _SkipIter:
    """An index-sampler iterator that first drops ``n`` batches (indices only). Lazy, because
    the sampler draws its seed when its first batch is asked for."""

    def __init__(self, inner: Any, n: int):
        self.inner, self.n = inner, n
        self.it: Any = None

    def prime(self) -> None:
        if self.it is None:
            self.it = iter(self.inner)
            next(itertools.islice(self.it, self.n, self.n), None)

    def __iter__(self) -> _SkipIter:
        return self

    def __next__(self) -> Any:
        self.prime()
        return next(self.it)


class _SkipBatches:
    def __init__(self, inner: Any, n: int):
        self.inner, self.n = inner, n

    def __iter__(self) -> _SkipIter:
        return _SkipIter(self.inner, self.n)

    def __len__(self) -> int:
        return len(self.inner)


class _NoBatches(_SkipBatches):
    def __iter__(self) -> Any:  # type: ignore[override]
        return iter(())


def _replay(it: Any, origin: _Origin) -> None:
    loader, n = origin.loader, origin.pending or 0
    now = _snapshot(loader)  # the states the program paused with, set back afterwards
    attr = "batch_sampler" if loader._auto_collation else "sampler"
    real = getattr(loader, attr)
    persistent = bool(loader.persistent_workers and loader.num_workers > 0)
    later_pass = persistent and origin.epoch is not origin.first
    try:
        assert origin.first is not None and origin.epoch is not None
        _apply(origin.first if later_pass else origin.epoch, loader)
        # DataLoader refuses to have its samplers set; the original is back right after.
        object.__setattr__(loader, attr, _NoBatches(real, 0) if later_pass else _SkipBatches(real, n))
        try:
            type(it).__init__(it, loader)
        finally:
            object.__setattr__(loader, attr, real)
        if later_pass:
            it._index_sampler = _SkipBatches(real, n)
            _apply(origin.epoch, loader)
            it._reset(loader)
        if n > 0 and isinstance(it._sampler_iter, _SkipIter):
            it._sampler_iter.prime()  # the original had drawn the sampler's seed by its first batch
        it._index_sampler = loader._index_sampler  # len() and later passes use the real one
        it._num_yielded = n
    finally:
        _apply(now, loader)
    origin.pending = None


class _StatefulIter:
    """A stateful loader's iterator until ``materialize`` rebuilds it (``load_state_dict`` then
    ``iter``); then a thin stand-in for it (the program's loop holds this object)."""

    __slots__ = ("__weakref__", "it", "loader", "n0", "state")

    def __init__(self, loader: Any, state: Any):
        self.loader, self.state, self.it, self.n0 = loader, state, None, None

    def real(self) -> Any:
        if self.it is None:
            # A loader has one live iterator (an older one is refused at the capture): every
            # stand-in of this loader's restored capsule shares the one rebuilt here.
            it = _RESTORED.get(self.loader)
            if it is None:
                self.loader.load_state_dict(self.state)
                it = iter(self.loader)
                _ORIGINS[it] = _Origin(self.loader, None, None, "stateful")
                _LATEST[self.loader] = it
                _RESTORED[self.loader] = it
            self.it = it
            self.n0 = getattr(it, "_num_yielded", None)
        return self.it

    def __iter__(self) -> _StatefulIter:
        return self

    def __next__(self) -> Any:
        return next(self.real())

    def __len__(self) -> int:
        return len(self.real())

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real(), name)

    def __reduce__(self) -> Any:
        moved = self.it is not None and getattr(self.it, "_num_yielded", None) != self.n0
        return (_make_stateful, (self.loader, self.loader.state_dict() if moved else self.state))


_RESTORED: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()  # loader -> iterator rebuilt


def _make_stateful(loader: Any, state: Any) -> _StatefulIter:
    it = _StatefulIter(loader, state)
    _PENDING.append(it)
    return it


def materialize() -> None:
    """Rebuild the DataLoader iterators of a restored capsule (after everything is restored and
    the program's random states are set: each replay puts them back as it found them)."""
    pending = list(_PENDING)
    _PENDING.clear()
    _RESTORED.clear()
    for it in pending:
        if isinstance(it, _StatefulIter):
            it.real()
            continue
        origin = _ORIGINS.get(it)
        if origin is not None and origin.pending is not None:
            _replay(it, origin)


def _shutdown_workers() -> None:
    """Stop DataLoader worker processes before the process exits with a capsule: os._exit
    skips their cleanup, and orphans would hold the session's output pipes open."""
    for it in list(_ORIGINS.keys()):
        if getattr(it, "_shutdown", True) is False and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()


# -- tqdm -----------------------------------------------------------------------------------------


class TqdmIter:
    """What ``for x in tqdm(it)`` iterates over under sojourn: tqdm's own ``__iter__`` is a
    library generator, which cannot travel. It does what that generator does: an item is
    counted when the next one is asked for, the bar's ``n`` moves only when it is redrawn
    (every ``miniters`` items, ``mininterval`` seconds apart), and the bar is closed when the
    iterable is exhausted."""

    __slots__ = ("bar", "count", "inner", "pending")

    def __init__(self, bar: Any, inner: Any, pending: bool = False, count: float | None = None):
        self.bar, self.inner, self.pending = bar, inner, pending
        self.count = bar.n if count is None else count

    def __iter__(self) -> TqdmIter:
        return self

    def __next__(self) -> Any:
        bar = self.bar
        if self.pending:
            self.pending = False
            if not bar.disable:
                self.count += 1
                if self.count - bar.last_print_n >= bar.miniters:
                    now = bar._time()
                    if now - bar.last_print_t >= bar.mininterval and now >= bar.start_t + bar.delay:
                        bar.update(self.count - bar.last_print_n)
        try:
            item = next(self.inner)
        except StopIteration:
            if not bar.disable:
                bar.n = self.count
            bar.close()
            raise
        self.pending = True
        return item

    def __reduce__(self) -> Any:
        return (TqdmIter, (self.bar, self.inner, self.pending, self.count))

    def __del__(self) -> None:
        # tqdm's generator, dropped after a `break`, runs its `finally`: count, then close.
        bar = getattr(self, "bar", None)
        try:
            if bar is not None and not bar.disable:
                bar.n = self.count
                bar.close()
        except Exception:  # a bar half torn down at interpreter exit has nothing left to close
            pass


def _tqdm_iter(bar: Any) -> Any:
    if getattr(bar, "iterable", None) is None:
        return iter(bar)  # tqdm's own error
    return TqdmIter(bar, _iter_with_hooks(bar.iterable))


_TQDM_KEYS = ("desc", "total", "leave", "ncols", "mininterval", "maxinterval", "ascii", "unit", "unit_scale",
              "smoothing", "bar_format", "unit_divisor", "colour", "delay")

# Bars rebuilt here that have not moved since reduce to what they were rebuilt from (elapsed
# time goes on, so a fresh reading would never be a fixpoint for the fingerprint check).
_REBUILT_BARS: weakref.WeakKeyDictionary[Any, tuple[Any, tuple[Any, Any]]] = weakref.WeakKeyDictionary()


def _stream(fp: Any) -> Any:
    w = getattr(fp, "_wrapped", fp)  # tqdm wraps its stream (DisableOnWriteError)
    if w is sys.stdout or w is sys.__stdout__:
        return "stdout"
    if w is sys.stderr or w is sys.__stderr__:
        return None
    return w  # a file of the program travels as itself


@register(TQDM, subclasses=True)
def _tqdm_reduce(bar: Any, pickler: Any) -> Any:
    done = _REBUILT_BARS.get(bar)
    if done is not None and done[1] == (bar.n, bar.disable):
        return done[0]
    iterable = getattr(bar, "iterable", None)
    if not hasattr(bar, "fp"):  # disabled from the start: tqdm kept little
        kw: dict[str, Any] = {"total": bar.total, "leave": getattr(bar, "leave", True), "disable": True}
        return (_make_tqdm, (type(bar), iterable, kw, bar.n, 0.0, None, False))
    kw = {k: getattr(bar, k) for k in _TQDM_KEYS if hasattr(bar, k)}
    kw["miniters"] = None if bar.dynamic_miniters else bar.miniters
    kw["dynamic_ncols"] = bool(bar.dynamic_ncols)
    if kw["dynamic_ncols"]:
        kw["ncols"] = None
    kw["file"] = _stream(bar.fp)
    elapsed = bar._time() - bar.start_t
    return (_make_tqdm, (type(bar), iterable, kw, bar.n, elapsed, bar.postfix, bool(bar.disable)))


def _make_tqdm(cls: type, iterable: Any, kw: dict[str, Any], n: float, elapsed: float, postfix: Any,
               closed: bool) -> Any:
    args = dict(kw)
    if closed:
        args["file"] = io.StringIO()  # made whole, then closed: nothing is drawn
    elif args.get("file") == "stdout":
        args["file"] = sys.stdout
    delay = args.get("delay", 0.0) or 0.0
    args["delay"] = float("inf")  # not drawn before its elapsed time is set back
    bar = cls(iterable, initial=n, **args)
    if hasattr(bar, "start_t"):
        bar.delay = delay
        bar.start_t = bar._time() - elapsed
        if postfix:
            bar.postfix = postfix
        if closed:
            bar.close()
        elif bar.start_t + delay <= bar._time():
            bar.refresh()
    _REBUILT_BARS[bar] = ((_make_tqdm, (cls, iterable, kw, n, elapsed, postfix, closed)), (bar.n, bar.disable))
    return bar


# -- installation ---------------------------------------------------------------------------------

_installed = False


def install() -> None:
    """Register the hooks (nothing is imported: they apply once torch or tqdm is)."""
    global _installed
    if not _installed:
        from sojourn.execution.pause import before_exit

        register_iter_hook(DATALOADER, _loader_iter)
        register_iter_hook(TQDM, _tqdm_iter)
        for name in TQDM_CONTEXTS:  # __enter__ returns the bar; the bar travels as itself
            register_context(name, None)
        before_exit(_shutdown_workers)
        _installed = True
    watch()
