"""A pytest plugin loaded into a run of cloudpickle's own test suite (never into ours).

It replaces the suite's two round-trip helpers, ``pickle_depickle`` and
``subprocess_pickle_echo``, so that every object the suite round-trips goes through sojourn
instead of cloudpickle. ``SOJOURN_CP_MODE`` says how:

``record``
    capture the object into a capsule of ``SOJOURN_CP_REPO``, restore it in this process
    (so the test goes on and reaches its next round trip), and note the capsule's id under
    the test's node id and the call's number;
``replay``
    capture nothing: hand the test the object restored from the capsule that a fresh
    interpreter of another Python version (``tests/conformance/echo.py``) restored from the
    recorded capsule and captured again, so the test's own assertions judge what went
    there and back.

A capture sojourn refuses (``CaptureError``) fails the test and is noted with its message:
the table (``tests/conformance/table.py``) says which refusals are by design.
``SOJOURN_CP_REPORT`` receives, per test, its outcome, its first error line, the capsules of
its round trips in order, and its refusals.
"""

from __future__ import annotations

import json
import os
import pickle as _real_pickle
import sys
from typing import Any

import pytest

_MODE = os.environ.get("SOJOURN_CP_MODE", "record")
_REPO = os.environ["SOJOURN_CP_REPO"]
_REPORT = os.environ["SOJOURN_CP_REPORT"]
# replay: {nodeid: [echoed capsule id or {"error": message}, ...]}
_ECHOED: dict[str, list[Any]] = {}
if _MODE == "replay":
    with open(os.environ["SOJOURN_CP_ECHOED"]) as f:
        _ECHOED = json.load(f)

_results: dict[str, dict[str, Any]] = {}
_current: dict[str, Any] = {"nodeid": None}


def _entry() -> dict[str, Any]:
    nodeid = _current["nodeid"]
    return _results.setdefault(nodeid, {"outcome": None, "error": None, "capsules": [], "refused": []})


class EchoFailed(AssertionError):
    """The fresh interpreter could not restore (or capture again) what was recorded."""


def _restore(capsule_id: str) -> Any:
    import sojourn

    return sojourn.restore(capsule_id, _REPO, files_to=os.environ.get("SOJOURN_CP_FILES", "."))["obj"]


def sojourn_round_trip(obj: Any, protocol: Any = None, **_: Any) -> Any:
    import sojourn

    entry = _entry()
    n = len(entry["capsules"])
    if _MODE == "record":
        try:
            ref = sojourn.capture({"obj": obj}, _REPO)
        except sojourn.CaptureError as e:
            entry["capsules"].append({"refused": str(e)})
            entry["refused"].append(str(e))
            raise
        entry["capsules"].append(ref.id)
        return _restore(ref.id)
    echoed = _ECHOED.get(entry_key(), [])
    entry["capsules"].append(echoed[n] if n < len(echoed) else None)
    if n >= len(echoed):
        raise EchoFailed(f"round trip {n} of this test was not recorded (the test took another path)")
    got = echoed[n]
    if isinstance(got, dict):
        raise EchoFailed(f"round trip {n}: {got.get('refused') or got.get('error')}")
    return _restore(got)


def entry_key() -> str:
    return str(_current["nodeid"])


# -- cloudpickle.dumps / pickle.loads, as the suite's tests call them directly ----------------
#
# Tests that call ``cloudpickle.dumps(obj)`` and then ``pickle.loads(data)`` (or
# ``cloudpickle.loads``) get a round trip too: ``dumps`` is the round trip, and returns a
# token naming its capsule; ``loads`` of a token restores that capsule. Only where the table
# says the test runs (a test that reads cloudpickle's bytes stays n/a).

TOKEN = b"\x80sojourn-capsule:"


_DIRECT: set[str] = set()
if os.environ.get("SOJOURN_CP_DIRECT"):
    with open(os.environ["SOJOURN_CP_DIRECT"]) as f:
        _DIRECT = set(json.load(f))


def _direct() -> bool:
    return _current["nodeid"] in _DIRECT


def _dumps(obj: Any, protocol: Any = None, buffer_callback: Any = None) -> bytes:
    import sojourn

    if not _direct():
        return _REAL["dumps"](obj, protocol=protocol, buffer_callback=buffer_callback)  # type: ignore[no-any-return]
    entry = _entry()
    n = len(entry["capsules"])
    if _MODE == "record":
        try:
            ref = sojourn.capture({"obj": obj}, _REPO)
        except sojourn.CaptureError as e:
            entry["capsules"].append({"refused": str(e)})
            entry["refused"].append(str(e))
            raise
        entry["capsules"].append(ref.id)
        return TOKEN + ref.id.encode()
    echoed = _ECHOED.get(entry_key(), [])
    entry["capsules"].append(echoed[n] if n < len(echoed) else None)
    if n >= len(echoed):
        raise EchoFailed(f"round trip {n} of this test was not recorded (the test took another path)")
    got = echoed[n]
    if isinstance(got, dict):
        raise EchoFailed(f"round trip {n}: {got.get('refused') or got.get('error')}")
    return TOKEN + str(got).encode()


def _loads(data: Any, **kwargs: Any) -> Any:
    if isinstance(data, bytes | bytearray) and bytes(data).startswith(TOKEN):
        return _restore(bytes(data)[len(TOKEN):].decode())
    return _REAL["loads"](data, **kwargs)


def _dump(obj: Any, file: Any, protocol: Any = None, buffer_callback: Any = None) -> None:
    if not _direct():
        _REAL["dump"](obj, file, protocol=protocol, buffer_callback=buffer_callback)
        return
    file.write(_dumps(obj, protocol))


def _load(file: Any, **kwargs: Any) -> Any:
    if not _direct():
        return _REAL["load"](file, **kwargs)
    return _loads(file.read(), **kwargs)


_REAL: dict[str, Any] = {}


def _patch(cloudpickle: Any) -> None:
    """Send cloudpickle's dumps/dump and pickle's loads/load through sojourn for the tests
    the table names (others, and everything but a token, get the real ones)."""
    if _REAL:
        return
    _REAL.update(dumps=cloudpickle.dumps, dump=cloudpickle.dump, loads=_real_pickle.loads, load=_real_pickle.load)
    cloudpickle.dumps, cloudpickle.dump, cloudpickle.loads, cloudpickle.load = _dumps, _dump, _loads, _load
    _real_pickle.loads, _real_pickle.load = _loads, _load


_collected: list[str] = []


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    # Every test the suite has goes into the report (the table must know each); only those
    # named in SOJOURN_CP_SELECT run.
    _collected.extend(item.nodeid for item in items)
    select = os.environ.get("SOJOURN_CP_SELECT")
    if select:
        with open(select) as f:
            wanted = set(json.load(f))
        keep = [item for item in items if item.nodeid in wanted]
        config.hook.pytest_deselected(items=[item for item in items if item.nodeid not in wanted])
        items[:] = keep
    for mod in {item.module for item in items if getattr(item, "module", None) is not None}:
        if hasattr(mod, "pickle_depickle"):
            mod.pickle_depickle = sojourn_round_trip
        if hasattr(mod, "subprocess_pickle_echo"):
            mod.subprocess_pickle_echo = sojourn_round_trip
        if hasattr(mod, "cloudpickle") and getattr(mod, "pickle", None) is _real_pickle:
            _patch(mod.cloudpickle)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    _current["nodeid"] = item.nodeid
    _entry()
    yield
    _current["nodeid"] = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    outcome = yield
    rep = outcome.get_result()
    entry = _results.setdefault(item.nodeid, {"outcome": None, "error": None, "capsules": [], "refused": []})
    if rep.when == "call" or (rep.when == "setup" and rep.outcome != "passed"):
        entry["outcome"] = rep.outcome
        if rep.failed and call.excinfo is not None:
            text = str(call.excinfo.value).strip()
            entry["error"] = f"{call.excinfo.typename}: {text}"
            entry["at"] = _failing_statement(item, call.excinfo)
        elif rep.skipped:
            entry["error"] = str(rep.longrepr[-1]) if isinstance(rep.longrepr, tuple) else str(rep.longrepr)


def _failing_statement(item: pytest.Item, excinfo: Any) -> str | None:
    """The statement of the test's own file at which it failed, on one line."""
    path = str(getattr(item, "path", ""))
    for tb in reversed(excinfo.traceback):
        if str(tb.path) == path:
            try:
                return " ".join(str(tb.statement).split())
            except Exception:  # no source: say nothing rather than fail the report
                return None
    return None


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    with open(_REPORT, "w") as f:
        json.dump({"python": f"{sys.version_info[0]}.{sys.version_info[1]}", "mode": _MODE,
                   "collected": _collected, "tests": _results}, f,
                  indent=1, sort_keys=True)
