"""Values whose bytes depend on the machine's byte order, made, restored and checked.

Copied next to the test's repository and run on both machines:
``python values_program.py capture REPO`` prints a capsule id;
``python values_program.py check REPO CAPSULE [again]`` restores it (the fingerprint check
runs), compares every value with one made here the same way, runs ``sojourn.verify``, and
with ``again`` captures the restored namespace, as a paused program would be captured
after its move. It prints one JSON line: failures, the verification, the new capsule.

The capsule is always first written on a little-endian machine: values that see bytes
(views reinterpreting memory, explicitly ordered dtypes) are made with explicit
little-endian strings where a little-endian machine's native type would give the same.
"""

from __future__ import annotations

import array
import copy
import json
import random
import sys
import warnings

import numpy as np


def _chars() -> array.array:
    with warnings.catch_warnings():  # 'u' is deprecated on 3.13 ('w' is new there)
        warnings.simplefilter("ignore", DeprecationWarning)
        return array.array("u", "hé")


def make() -> dict:
    a = np.arange(12, dtype=np.int32)
    rec = np.array([(1, 2.5, "ab"), (-3, 4.5, "cd")], dtype=[("x", "i2"), ("y", "f8"), ("s", "U3")])
    # A float64 root seen as bytes below: it stays as the writing machine had it, '<f8'.
    a64 = np.linspace(-1.0, 1.0, 5).astype("<f8")
    raw = np.arange(16, dtype=np.uint8)
    c = np.array([1.5, -2.25, 1e300])
    ro = np.arange(4.0)
    ro.flags.writeable = False
    rs = np.random.RandomState(5)
    rs.rand(3)
    mt = np.random.Generator(np.random.MT19937(3))
    mt.random(2)
    g = np.random.default_rng(7)
    g.random(4)
    ph = np.random.Generator(np.random.Philox(11))
    ph.integers(0, 10, 3)
    sfc = np.random.Generator(np.random.SFC64(13))
    sfc.normal(size=2)
    r = random.Random(11)
    r.random()
    ns = {
        "a": a, "view": a[2:9:2], "pair": [a, a], "rev": a[::-1].reshape(3, 4)[1:],
        "f64": np.linspace(0, 1, 7), "f32": np.arange(5, dtype=np.float32) / 3,
        "f16": np.array([0.5, -2.0], dtype=np.float16), "c64": np.array([1 + 2j, -3.5j], dtype=np.complex64),
        "u64": np.array([2**64 - 1, 7], dtype=np.uint64), "bools": np.array([True, False, True]),
        "u": np.array(["héllo", "wörld"]), "s": np.array([b"ab", b"c"]),
        "when": np.array(["2020-01-01", "2021-06-30"], dtype="datetime64[D]"),
        "delta": np.array([3, -4], dtype="timedelta64[ms]"),
        "fortran": np.asfortranarray(np.arange(6.0).reshape(2, 3)), "zero_d": np.array(3.25), "empty": np.zeros((0, 3)),
        "big": np.arange(6, dtype=">i4"), "big_view": np.arange(6, dtype=">i4")[1:4],
        "rec": rec, "rec_y": rec["y"], "record": rec[1],
        "mixed": np.array([(1, 0.5), (2, -1.5)], dtype=[("p", ">i4"), ("q", "f8")]),
        "objects": np.array([1, "two", (3.0,)], dtype=object),
        "ro": ro, "ro_view": ro[1:],
        "a64": a64, "a64_bytes": a64.view(np.uint8),
        "raw": raw, "raw_f32": raw.view("<f4"), "c": c, "c_bits": c.view(np.int64),
        "f32s": np.float32(1.5), "i64s": np.int64(-3), "c128s": np.complex128(1 + 2j), "u8s": np.uint8(200),
        "bs": np.bool_(True), "strs": np.str_("þorn"), "dts": np.datetime64("2022-02-02T10:00", "m"),
        "f16s": np.float16(0.25),
        "dtype": np.dtype("f8"), "bdtype": np.dtype(">f8"), "sdtype": rec.dtype, "ddtype": np.dtype("M8[ns]"),
        "ints": array.array("i", [1, -2, 3]), "doubles": array.array("d", [0.5, 1e-300]), "chars": _chars(),
        "matrix": np.matrix([[1.0, 2.0], [3.0, 4.0]]),
        "recarray": np.rec.array([(1, 2.0)], dtype=[("p", "i4"), ("q", "f8")]),
        "masked": np.ma.array([1.0, 2.0, 3.0], mask=[False, True, False], fill_value=-1.0),
        "rs": rs, "mt": mt, "g": g, "ph": ph, "sfc": sfc, "r": r,
        "py": [1.5, float("nan"), -0.0, 2**100, -(2**70), b"\x00\x01", "ünï"],
    }
    return ns


def seed_globals() -> None:
    np.random.seed(3)
    np.random.random(2)
    random.seed(4)
    random.random()


# What each variable's dtype must look like on whatever machine restores it.
EXPLICIT = {"big": ">i4", "big_view": ">i4", "a64": "<f8", "raw_f32": "<f4", "bdtype": ">f8"}


def _same(x: object, y: object) -> bool:
    if isinstance(x, np.ma.MaskedArray):
        return (type(x) is type(y) and x.tolist() == y.tolist() and x.fill_value == y.fill_value
                and bool(np.all(x.mask == y.mask)))
    if isinstance(x, np.ndarray):
        # Values only: byte orders are checked on their own (EXPLICIT).
        if type(x) is not type(y) or x.shape != y.shape or x.dtype.newbyteorder("=") != y.dtype.newbyteorder("="):
            return False
        if x.dtype.kind in "fc":
            return bool(np.array_equal(x, y, equal_nan=True))
        return x.tolist() == y.tolist()
    if isinstance(x, (np.random.Generator, np.random.RandomState, random.Random)):
        draw = {np.random.Generator: lambda o: o.random(3).tolist(), np.random.RandomState: lambda o: o.rand(3).tolist(),
                random.Random: lambda o: [o.random() for _ in range(3)]}[type(x)]
        return draw(copy.deepcopy(x)) == draw(copy.deepcopy(y))
    if isinstance(x, list):
        return len(x) == len(y) and all(_same(i, j) for i, j in zip(x, y, strict=True))
    if isinstance(x, float) and x != x:
        return y != y
    return type(x) is type(y) and repr(x) == repr(y)


def check(ns: dict, process_globals: bool = True) -> list[str]:
    want = make()
    bad = [f"{k}: {ns.get(k)!r} != {v!r}" for k, v in want.items() if not _same(ns.get(k), v)]
    for k, v in ns.items():
        dt = v if isinstance(v, np.dtype) else getattr(v, "dtype", None)
        if not isinstance(dt, np.dtype) or isinstance(v, np.generic) or dt.names or dt.kind in "OSVb?":
            continue
        expected = EXPLICIT.get(k)
        if expected is not None and dt.str != expected:
            bad.append(f"{k}: dtype {dt.str}, expected the program's {expected}")
        if expected is None and not dt.isnative:
            bad.append(f"{k}: dtype {dt.str} is not native")
    if not ns["rec"].dtype.isnative or not ns["sdtype"].isnative:
        bad.append("structured dtype not native")
    fields = ns["mixed"].dtype.fields
    if fields["p"][0].str != ">i4" or not fields["q"][0].isnative:
        bad.append(f"mixed: fields {fields['p'][0].str}, {fields['q'][0].str}: expected the program's >i4 and native")
    identity = {
        "view.base is a": ns["view"].base is ns["a"], "pair": ns["pair"][0] is ns["a"] is ns["pair"][1],
        "rec_y.base is rec": ns["rec_y"].base is ns["rec"], "a64_bytes.base is a64": ns["a64_bytes"].base is ns["a64"],
        "raw_f32.base is raw": ns["raw_f32"].base is ns["raw"], "c_bits.base is c": ns["c_bits"].base is ns["c"],
        "ro read-only": not ns["ro"].flags.writeable and not ns["ro_view"].flags.writeable,
        "ro_view.base is ro": ns["ro_view"].base is ns["ro"], "fortran": ns["fortran"].flags.f_contiguous,
        "big_view.base": ns["big_view"].base is not None,
    }
    bad += [f"identity: {k}" for k, ok in identity.items() if not ok]
    ns["a"][0] = 99  # shared memory is shared
    if ns["view"].base is ns["a"] and ns["pair"][1][0] != 99:
        bad.append("identity: a and pair do not share memory")
    ns["a"][0] = 0
    if process_globals:
        state, rstate = np.random.get_state(), random.getstate()
        drawn = [np.random.random(), random.random()]
        np.random.set_state(state)
        random.setstate(rstate)
        seed_globals()
        if drawn != [np.random.random(), random.random()]:
            bad.append("the global random states did not travel")
        np.random.set_state(state)
        random.setstate(rstate)
    return bad


def main() -> None:
    import sojourn

    cmd, repo = sys.argv[1], sys.argv[2]
    if cmd == "capture":
        ns = make()
        seed_globals()
        print(sojourn.capture(ns, repo).id)
        return
    out: dict = {"machine": __import__("platform").machine(), "byteorder": sys.byteorder,
                 "python": sys.version.split()[0], "numpy": np.__version__}
    try:
        restored = dict(sojourn.restore(sys.argv[3], repo))
    except Exception as e:
        out["failures"] = [f"restore refused: {type(e).__name__}: {e}"]
        print(json.dumps(out))
        return
    out["failures"] = check(restored)
    report = sojourn.verify(sys.argv[3], repo)
    out["verify"] = [report.ok, report.error]
    if len(sys.argv) > 4:
        out["capsule"] = sojourn.capture(restored, repo).id
    print(json.dumps(out))


if __name__ == "__main__":
    main()
