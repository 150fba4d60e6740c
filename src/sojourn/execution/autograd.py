"""The autograd trap: a pause between a forward pass and ``backward()`` must not lose the graph.

An autograd graph cannot be pickled: a tensor with a ``grad_fn`` travels as its value, and a
``backward()`` after the resume would silently send no gradient to the parameters. So a pause
waits while any reachable tensor still holds a *live* graph, one whose saved tensors have not
been released by a backward pass. A graph that ``backward()`` has consumed (the previous
step's ``loss``, still bound at the top of the next iteration) is harmless and does not hold
the pause. A graph with no saved tensors at all cannot be told apart and counts as live: the
pause waits, and its deadline message names the tensor (``del loss`` or ``.detach()`` it).
"""

from __future__ import annotations

import sys
import types
from collections import deque
from typing import Any

MAX_OBJECTS = 200_000
MAX_ITEMS = 10_000  # per container: a dataset list is not searched to its end
MAX_NODES = 20_000  # per graph


_SAVED_NAMES: dict[type, tuple[str, ...]] = {}


def _saved_names(node: Any) -> tuple[str, ...]:
    t = type(node)
    names = _SAVED_NAMES.get(t)
    if names is None:
        names = _SAVED_NAMES[t] = tuple(a for a in dir(node) if a.startswith("_saved_"))
    return names


def _graph_alive(node: Any) -> bool:
    """False once backward() has released the graph's saved tensors; True while they are there.

    backward() releases every node it went through, so the first node found that saves a
    tensor answers for the graph. A graph that saves no tensor at all cannot be told apart and
    is taken as live.
    """
    seen: set[int] = set()
    queue = deque([node])
    torch = sys.modules["torch"]
    while queue and len(seen) < MAX_NODES:
        n = queue.popleft()
        if n is None or id(n) in seen:
            continue
        seen.add(id(n))
        for attr in _saved_names(n):
            try:
                value = getattr(n, attr)
            except RuntimeError:
                return False  # "Trying to backward through the graph a second time..."
            if isinstance(value, torch.Tensor) or (
                isinstance(value, tuple | list) and any(isinstance(v, torch.Tensor) for v in value)
            ):
                return True
        try:
            queue.extend(f for f, _ in n.next_functions)
        except (AttributeError, RuntimeError):
            pass
    return True


def direct_live(scopes: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """The cheap check, at every attempt: variables bound directly to a tensor with a live graph."""
    torch = sys.modules.get("torch")
    if torch is None:
        return []
    found = []
    for prefix, scope in scopes:
        for name, value in scope.items():
            if isinstance(value, torch.Tensor) and value.grad_fn is not None and _graph_alive(value.grad_fn):
                found.append(f"{prefix}{name}")
    return found


def live_graphs(roots: dict[str, Any]) -> list[str]:
    """Paths (from ``roots``) of tensors whose autograd graph a pause would lose."""
    torch = sys.modules.get("torch")
    if torch is None:
        return []
    tensor = torch.Tensor
    found: list[str] = []
    seen: set[int] = set()
    checked: dict[int, bool] = {}
    queue: deque[tuple[str, Any]] = deque(roots.items())
    skip = (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType, str, bytes, int, float)
    while queue and len(seen) < MAX_OBJECTS:
        path, obj = queue.popleft()
        if id(obj) in seen or isinstance(obj, skip) or obj is None:
            continue
        seen.add(id(obj))
        if isinstance(obj, tensor):
            fn = obj.grad_fn
            if fn is not None:
                alive = checked.get(id(fn))
                if alive is None:
                    alive = checked[id(fn)] = _graph_alive(fn)
                if alive:
                    found.append(path)
            continue
        try:
            _children(path, obj, queue)
        except Exception:  # an object whose attributes cannot be listed holds no tensor we can see
            continue
    return found


def _children(path: str, obj: Any, queue: deque[tuple[str, Any]]) -> None:
    if isinstance(obj, dict):
        for i, (k, v) in enumerate(obj.items()):
            if i >= MAX_ITEMS:
                break
            queue.append((f"{path}[{k!r}]", v))
    elif isinstance(obj, list | tuple | set | frozenset | deque):
        for i, v in enumerate(obj):
            if i >= MAX_ITEMS:
                break
            queue.append((f"{path}[{i}]", v))
    elif isinstance(obj, types.GeneratorType):
        if obj.gi_frame is not None:
            for k, v in obj.gi_frame.f_locals.items():
                queue.append((f"{path}.<local {k}>", v))
    elif isinstance(obj, types.CellType):
        try:
            queue.append((path, obj.cell_contents))
        except ValueError:
            pass
    else:
        d = getattr(obj, "__dict__", None)
        if isinstance(d, dict):
            for k, v in d.items():
                queue.append((f"{path}.{k}", v))


def released_bindings(scopes: list[dict[str, Any]]) -> list[tuple[dict[str, Any], str, Any]]:
    """Variables bound directly to a tensor whose graph backward() has already consumed (the
    last step's ``loss`` at the top of the next iteration): ``(scope, name, detached)``.

    Such a tensor is only a value now; it travels detached (``requires_grad=False``, so a
    ``backward()`` on it after the resume fails loudly, as a second one would have here).
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return []
    out = []
    for scope in scopes:
        for name, value in scope.items():
            if isinstance(value, torch.Tensor) and value.grad_fn is not None and not _graph_alive(value.grad_fn):
                out.append((scope, name, value.detach()))
    return out
