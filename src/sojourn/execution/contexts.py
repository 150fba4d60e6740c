"""Open ``with`` blocks across a pause: which context managers can travel, and how a resumed
block is entered again without running its header.

A paused frame inside ``with open(p) as fh:`` keeps the manager in a local (``_sj_cmN``, see
:mod:`transform`), so the header (``open(p)``, which could truncate a file) never runs again:
the manager itself travels with the capsule, and the resumed block is entered through
:class:`WithReentry`, which calls the manager's ``__exit__`` when the block ends, exactly once.

Whether ``__enter__``'s effect must be set up again in the new process depends on the type:

* a file: nothing (the file object travels, reopened at its offset);
* ``torch.no_grad()`` and friends: grad mode is process state, so it is entered again;
* a context manager defined in the program's own code, or a ``@contextmanager`` generator of
  the program: nothing (its state is its objects, which travel);
* anything else is refused at the pause, with the type and where the block is, because its
  ``__enter__`` may have changed state that sojourn cannot see. :func:`register_context`
  declares another type safe.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Reenter = Callable[[Any], None]


def _enter_again(cm: Any) -> None:
    type(cm).__enter__(cm)


def _grad_enabled_again(cm: Any) -> None:
    import torch

    torch.set_grad_enabled(cm.mode)  # set_grad_enabled applies its mode when constructed


_POLICIES: dict[str, Reenter | None] = {
    "_io.TextIOWrapper": None,
    "_io.BufferedReader": None,
    "_io.BufferedWriter": None,
    "_io.BufferedRandom": None,
    "_io.FileIO": None,
    "contextlib.nullcontext": None,
    "contextlib.suppress": None,
    "torch.autograd.grad_mode.no_grad": _enter_again,
    "torch.autograd.grad_mode.enable_grad": _enter_again,
    "torch.autograd.grad_mode.set_grad_enabled": _grad_enabled_again,
}


def register_context(type_name: str, reenter: Reenter | None = None) -> None:
    """Declare that a ``with`` block on ``type_name`` (``module.qualname``) may be paused in;
    ``reenter(cm)`` re-establishes its effect in the resumed process (None: nothing to do)."""
    _POLICIES[type_name] = reenter


def _type_name(t: type) -> str:
    return f"{t.__module__}.{t.__qualname__}"


def _own_code(cm: Any) -> bool:
    from sojourn.execution.runtime import RUNTIME

    t = type(cm)
    if t.__module__ in RUNTIME.modules:
        return True
    gen = getattr(cm, "gen", None)  # contextlib._GeneratorContextManager
    code = getattr(gen, "gi_code", None)
    return _type_name(t) == "contextlib._GeneratorContextManager" and code is not None and RUNTIME.scope_of(code) is not None


def reentry_problem(cm: Any) -> str | None:
    """Why a paused ``with`` block on ``cm`` cannot be resumed, or None if it can."""
    name = _type_name(type(cm))
    if name in _POLICIES or _own_code(cm):
        return None
    return (
        f"a `with` block is open on a {name}, whose __enter__ may have set up state that "
        "cannot be carried to another process; end the block before pausing, or declare it "
        f"safe with sojourn.execution.register_context({name!r})"
    )


def reenter(cm: Any) -> None:
    policy = _POLICIES.get(_type_name(type(cm)))
    if policy is not None:
        policy(cm)


class WithReentry:
    """The header of a resumed ``with`` block: enters again (per policy), exits the manager."""

    __slots__ = ("cm",)

    def __init__(self, cm: Any):
        self.cm = cm

    def __enter__(self) -> None:
        reenter(self.cm)

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> Any:
        return type(self.cm).__exit__(self.cm, exc_type, exc, tb)
