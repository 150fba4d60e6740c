"""Process-wide random state: ``random``, numpy's global state, torch CPU and CUDA.

Generators that live in the namespace (``random.Random``, ``numpy.random.Generator``,
``torch.Generator``) travel as objects through their own reducers; the module-level
generators are not in any namespace, so the capsule carries them in its process segment
and restore puts them back, so that the next number drawn is the one the source would
have drawn. Nothing is imported to read a library's state: a library that the capturing
process never imported has no state to carry.
"""

from __future__ import annotations

import random
import sys
from typing import Any

from sojourn.capsule.registry import register


def capture_process_state() -> dict[str, Any]:
    state: dict[str, Any] = {"random": random.getstate()}
    np = sys.modules.get("numpy")
    if np is not None:
        state["numpy"] = np.random.get_state(legacy=False)
    torch = sys.modules.get("torch")
    if torch is not None:
        # torch's generator states are its C structs' bytes, in this machine's byte order.
        state["torch"] = torch.get_rng_state().numpy().tobytes()
        if sys.byteorder != "little":
            state["torch_byteorder"] = sys.byteorder
        try:
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                state["torch_cuda"] = [s.numpy().tobytes() for s in torch.cuda.get_rng_state_all()]
        except Exception:  # CUDA present but unusable: nothing to carry
            pass
    return state


def apply_process_state(state: dict[str, Any]) -> None:
    if "random" in state:
        random.setstate(state["random"])
    if "numpy" in state:
        import numpy as np

        np.random.set_state(state["numpy"])
    if "torch" in state:
        if state.get("torch_byteorder", "little") != sys.byteorder:
            from sojourn.errors import RestoreError

            raise RestoreError(
                f"torch's random state was written on a {state.get('torch_byteorder', 'little')}-endian "
                f"machine and this one is {sys.byteorder}-endian: sojourn cannot carry it across byte "
                "orders. Restore on a machine of the writer's byte order."
            )
        import torch

        torch.set_rng_state(torch.frombuffer(bytearray(state["torch"]), dtype=torch.uint8))
        cuda = state.get("torch_cuda")
        if cuda and torch.cuda.is_available():
            n = min(len(cuda), torch.cuda.device_count())
            for i in range(n):
                torch.cuda.set_rng_state(torch.frombuffer(bytearray(cuda[i]), dtype=torch.uint8), i)


# ``random.Random`` pickles its state natively; ``SystemRandom`` has no state to carry.
def _system_random() -> Any:
    return random.SystemRandom()


@register("random.SystemRandom")
def _system_random_reduce(obj: Any, pickler: Any) -> Any:
    return (_system_random, ())
