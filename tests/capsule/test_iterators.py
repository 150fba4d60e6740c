"""Iterators mid-way: captured in one interpreter, resumed in a fresh one (also across 3.11-3.13).

Each case is advanced, captured, and then, in both processes, the same mutations are
applied to the objects the iterators read from, and every iterator is drained in the same
order. The remaining items (and errors) must match exactly; the mutations show that an
iterator reads the restored object itself, not a copy. ``sojourn.verify`` runs the restore
again in the target interpreter and checks every fingerprint.
"""

from __future__ import annotations

import io
import itertools
import math
import operator
import pickle
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

from sojourn.capsule.capture import pickle_namespace
from sojourn.capsule.context import RestoreContext, restoring
from sojourn.capsule.pickler import CapsulePickler, CaptureContext
from sojourn.capsule.reducers import iterators, iterators_hidden
from sojourn.capsule.registry import register
from sojourn.errors import CaptureError
from tests.conftest import last_json, needs_python, run_py

HERE = f"{sys.version_info[0]}.{sys.version_info[1]}"

CASES = r'''
import array, collections, itertools as it, operator, sys

def square(x): return x * x
def odd(x): return x % 2
def below3(x): return x < 3
def key3(x): return x // 3
def last_or_sum(a, b): return b if a is None else a + b

def build():
    c = {}
    def add(name, mk, adv=2):
        x = mk()
        for _ in range(adv):
            next(x, None)
        c[name] = x
    add("range", lambda: iter(range(10)))
    add("range_step", lambda: iter(range(0, 10, 3)), 1)
    add("range_rev", lambda: reversed(range(10)))
    add("range_big", lambda: iter(range(10**20, 10**20 + 10)))
    add("range_ex", lambda: iter(range(2)), 3)
    add("list", lambda: iter(list(range(10))))
    add("list_end", lambda: iter([1, 2]), 2)
    add("list_ex", lambda: iter([1]), 2)
    add("tuple", lambda: iter(tuple(range(10))))
    add("str", lambda: iter("abcdefghij"))
    add("str_nonascii", lambda: iter("abcdéfghij"))
    add("str_nonascii_ex", lambda: iter("é"), 3)
    add("bytes", lambda: iter(b"abcdefghij"))
    add("bytearray", lambda: iter(bytearray(b"abcdefghij")))
    add("array", lambda: iter(array.array("i", range(10))))
    add("dict_keys", lambda: iter({i: str(i) for i in range(10)}))
    add("dict_values", lambda: iter({i: str(i) for i in range(10)}.values()))
    add("dict_items", lambda: iter({i: str(i) for i in range(10)}.items()))
    add("dict_rev", lambda: reversed({i: str(i) for i in range(10)}))
    add("dict_revitems", lambda: reversed({i: str(i) for i in range(10)}.items()))
    add("dict_ex", lambda: iter({1: 2}), 3)
    add("set", lambda: iter({"alpha", "beta", "gamma", "delta", "eps"}))
    add("set_ex", lambda: iter({1}), 3)
    add("odict", lambda: iter(collections.OrderedDict((str(i), i) for i in range(6)).items()))
    add("reversed_list", lambda: reversed(list(range(10))))
    add("reversed_list_end", lambda: reversed([1, 2]), 2)
    add("reversed_list_ex", lambda: reversed([1, 2]), 3)
    add("reversed_tuple", lambda: reversed(tuple(range(10))))
    add("reversed_tuple_ex", lambda: reversed((1,)), 2)
    add("enumerate", lambda: enumerate(list(range(10)), 5))
    add("zip", lambda: zip(list(range(10)), range(10)))
    add("zip_strict", lambda: zip([1, 2, 3], "ab", strict=True))
    add("map", lambda: map(square, range(10)))
    add("map_lambda", lambda: map(lambda x: x + 1, range(10)))
    add("filter", lambda: filter(odd, range(10)))
    add("callable", lambda: iter(collections.deque(range(10)).popleft, 7))
    add("callable_ex", lambda: iter(collections.deque(range(10)).popleft, 1), 3)
    add("deque_rev", lambda: reversed(collections.deque(range(10))))
    add("count", lambda: it.count(3))
    add("count_step", lambda: it.count(3, 2))
    add("count_float", lambda: it.count(0.5, 0.25))
    add("count_big", lambda: it.count(2**70, 3))
    add("cycle", lambda: it.cycle([1, 2, 3]))
    add("cycle_pass2", lambda: it.cycle([1, 2, 3]), 4)
    add("cycle_iter_pass2", lambda: it.cycle(iter([1, 2, 3])), 7)
    add("cycle_empty", lambda: it.cycle([]), 1)
    add("cycle_end_of_pass1", lambda: it.cycle([1, 2, 3]), 3)
    add("repeat", lambda: it.repeat(7, 10))
    add("repeat_forever", lambda: it.repeat("x"))
    add("repeat_ex", lambda: it.repeat(7, 2), 3)
    add("islice", lambda: it.islice(range(100), 2, 40, 3))
    add("islice_nostop", lambda: it.islice(range(100), 2, None, 3))
    add("islice_near_stop", lambda: it.islice(range(100), 0, 5, 3), 2)
    add("islice_ex", lambda: it.islice([1, 2], 5), 3)
    add("chain", lambda: it.chain(range(3), [10, 11], range(20, 23)), 4)
    add("chain_fresh", lambda: it.chain(range(3), [10, 11]), 0)
    add("chain_from_iterable", lambda: it.chain.from_iterable([range(3), "ab"]), 1)
    add("chain_ex", lambda: it.chain([1]), 2)
    add("accumulate", lambda: it.accumulate(range(10)))
    add("accumulate_fresh", lambda: it.accumulate(range(10)), 0)
    add("accumulate_initial", lambda: it.accumulate(range(1, 10), operator.mul, initial=3), 0)
    add("accumulate_initial1", lambda: it.accumulate(range(1, 10), operator.mul, initial=3), 1)
    add("accumulate_total_none", lambda: it.accumulate([None, 1, 2, 3], last_or_sum), 1)
    add("starmap", lambda: it.starmap(operator.add, [(i, i) for i in range(10)]))
    add("takewhile", lambda: it.takewhile(odd, [1, 3, 5, 6, 7]))
    add("takewhile_stopped", lambda: it.takewhile(odd, [1, 3, 5, 6, 7]), 4)
    add("dropwhile", lambda: it.dropwhile(below3, range(10)), 0)
    add("dropwhile_done", lambda: it.dropwhile(lambda x: x < 3, [0, 1, 5, 0, 1, 7]), 1)
    add("filterfalse", lambda: it.filterfalse(odd, range(10)))
    add("compress", lambda: it.compress(range(10), [1, 0] * 5))
    add("zip_longest", lambda: it.zip_longest(range(5), range(8), fillvalue="-"), 6)
    add("product", lambda: it.product(range(3), "ab", repeat=2), 7)
    add("product_fresh", lambda: it.product(range(3), range(2)), 0)
    add("product_ex", lambda: it.product([1]), 2)
    add("product_of_nothing", lambda: it.product(), 1)
    add("permutations", lambda: it.permutations(range(5), 3), 17)
    add("permutations_r0", lambda: it.permutations("ab", 0), 1)
    add("permutations_r0_fresh", lambda: it.permutations("", 0), 0)
    add("combinations", lambda: it.combinations(range(6), 3), 9)
    add("combinations_ex", lambda: it.combinations("abc", 3), 2)
    add("cwr", lambda: it.combinations_with_replacement(range(4), 3), 11)
    add("groupby", lambda: it.groupby([1, 1, 2, 2, 2, 3, 4, 4]), 0)
    add("groupby_open", lambda: it.groupby([1, 1, 2, 2, 2, 3, 4, 4]), 1)
    add("groupby_key", lambda: it.groupby(range(12), key3), 2)
    add("pairwise", lambda: it.pairwise(range(10)))
    add("pairwise_fresh", lambda: it.pairwise(range(10)), 0)
    add("pairwise_ex", lambda: it.pairwise(range(2)), 2)
    if hasattr(it, "batched"):
        add("batched", lambda: it.batched(range(10), 3), 1)
        add("batched_ex", lambda: it.batched(range(2), 3), 2)
        if sys.version_info >= (3, 13):
            add("batched_strict", lambda: it.batched(range(10), 3, strict=True), 2)
    # What the iterators read from is in the namespace too: they must keep reading it.
    c["shared"] = shared = [1, 2, 3, 4, 5]
    c["over_shared"] = iter(shared); next(c["over_shared"])
    c["d"] = d = {"a": 1, "b": 2, "c": 3}
    c["over_d"] = iter(d.items()); next(c["over_d"])
    c["dq"] = dq = collections.deque(range(5))
    c["over_dq"] = iter(dq); next(c["over_dq"])
    c["src"] = src = iter(range(100))
    c["islice_src"] = it.islice(src, 3, None, 2); next(c["islice_src"])
    c["zip_src"] = zip(src, "abcdef")
    c["tee1"], c["tee2"], c["tee3"] = t1, t2, t3 = it.tee(range(200), 3)
    [next(t1) for _ in range(70)]; [next(t2) for _ in range(3)]
    c["tee_other"] = it.tee(iter(range(5)))[1]
    # groupby: the grouper took the look-ahead item (native pickling forgets the group key)
    c["g_tgt"] = g = it.groupby([1, 1, 1, 2, 2, 3]); _, c["g_tgt_group"] = next(g); next(c["g_tgt_group"])
    # groupby: an old group (stale) and the open one
    c["g2"] = g2 = it.groupby("aabbc"); _, c["g2_old"] = next(g2); _, c["g2_open"] = next(g2)
    # groupby: the open group is used up, the look-ahead is the next group's first item
    c["g3"] = g3 = it.groupby("aabbc"); _, c["g3_done"] = next(g3); list(c["g3_done"])
    return c

def mutate(ns):
    ns["shared"].append(6)
    ns["d"]["c"] = "changed"
    ns["dq"].append(99)
    next(ns["src"])

def norm(x):
    if isinstance(x, tuple) and len(x) == 2 and type(x[1]).__name__ == "_grouper":
        return (x[0], list(x[1]))
    return x

def rest(i, n=10):
    out = []
    for _ in range(n):
        try:
            out.append(norm(next(i)))
        except StopIteration:
            out.append("STOP"); break
        except Exception as e:
            out.append(f"{type(e).__name__}: {e}"); break
    return repr(out)

def drain(ns):
    mutate(ns)
    return {k: rest(v) for k, v in sorted(ns.items()) if hasattr(v, "__next__")}

def step(ns):
    for k, v in sorted(ns.items()):
        if hasattr(v, "__next__"):
            rest(v, 1)
'''

CAPTURE = """
import json, sys, sojourn, itcases
from sojourn.capsule.capture import pickle_namespace
from sojourn.capsule.context import RestoreContext, restoring
from sojourn.capsule.pickler import CapsulePickler, CaptureContext
ns = itcases.build()
stream = pickle_namespace(ns).stream
ref = sojourn.capture(ns, sys.argv[1])
report = sojourn.verify(ref.id, sys.argv[1], python=sys.argv[2])
print(json.dumps({"id": ref.id, "itertools_in_stream": b"itertools" in stream,
                  "verify": [report.ok, report.error, report.python], "expected": itcases.drain(ns)}))
"""

RESTORE = """
import json, sys, warnings, sojourn, itcases
# Nothing may lean on itertools pickling (3.12-3.13 warn, 3.14 has none).
warnings.filterwarnings("error", "Pickle, copy, and deepcopy support", DeprecationWarning)
ns = sojourn.restore(sys.argv[2], sys.argv[1])
print(json.dumps({"got": itcases.drain(ns)}))
"""

PAIRS = [(HERE, HERE), ("3.11", "3.12"), ("3.11", "3.13"), ("3.12", "3.11"), ("3.13", "3.11"),
         ("3.12", "3.13"), ("3.13", "3.12")]


def _python(version: str) -> str:
    return sys.executable if version == HERE else needs_python(version)


@pytest.mark.parametrize(("src", "dst"), PAIRS, ids=[f"{a}-to-{b}" for a, b in PAIRS])
def test_iterators_resume_where_they_were(tmp_path: Path, repo: str, src: str, dst: str) -> None:
    capture_py, restore_py = _python(src), _python(dst)
    (tmp_path / "itcases.py").write_text(CASES)
    cap = last_json(run_py(CAPTURE, repo, restore_py, cwd=tmp_path, python=capture_py))
    assert isinstance(cap, dict)
    assert cap["verify"][0], f"verify on {dst} failed: {cap['verify'][1]}"
    assert cap["verify"][2].startswith(dst)
    assert not cap["itertools_in_stream"], "an itertools object was pickled natively"
    res = last_json(run_py(RESTORE, repo, cap["id"], cwd=tmp_path, python=restore_py))
    assert isinstance(res, dict)
    expected, got = cap["expected"], res["got"]
    assert sorted(got) == sorted(expected)
    wrong = {k: (expected[k], got[k]) for k in expected if expected[k] != got[k]}
    assert not wrong, wrong
    # The mutations reached the iterators: they read the restored objects themselves.
    assert got["over_shared"].endswith("5, 6, 'STOP']")
    assert "('c', 'changed')" in got["over_d"]
    assert "deque mutated during iteration" in got["over_dq"]
    assert got["g_tgt"].startswith("[(2, [2, 2])")  # not a replay of the rest of group 1


GEN1 = """
import json, sys, sojourn, itcases
ns = itcases.build()
ref = sojourn.capture(ns, sys.argv[1])
itcases.step(ns)
print(json.dumps({"id": ref.id, "expected": itcases.drain(ns)}))
"""

GEN2 = """
import json, sys, sojourn, itcases
ns = sojourn.restore(sys.argv[2], sys.argv[1])
itcases.step(ns)
ref = sojourn.capture(ns, sys.argv[1])
report = sojourn.verify(ref.id, sys.argv[1], python=sys.argv[3])
print(json.dumps({"id": ref.id, "verify": [report.ok, report.error]}))
"""

GENERATIONS = [(HERE, HERE, HERE), ("3.13", "3.11", "3.12")]


@pytest.mark.parametrize("pythons", GENERATIONS, ids=["-".join(g) for g in GENERATIONS])
def test_resumed_iterators_pause_and_resume_again(tmp_path: Path, repo: str, pythons: tuple[str, str, str]) -> None:
    # Rebuilt objects hold sojourn's wrappers; captured again they must still be exact.
    first, second, third = (_python(v) for v in pythons)
    (tmp_path / "itcases.py").write_text(CASES)
    gen1 = last_json(run_py(GEN1, repo, cwd=tmp_path, python=first))
    assert isinstance(gen1, dict)
    gen2 = last_json(run_py(GEN2, repo, gen1["id"], third, cwd=tmp_path, python=second))
    assert isinstance(gen2, dict)
    assert gen2["verify"][0], gen2["verify"][1]
    res = last_json(run_py(RESTORE, repo, gen2["id"], cwd=tmp_path, python=third))
    assert isinstance(res, dict)
    wrong = {k: (v, res["got"].get(k)) for k, v in gen1["expected"].items() if res["got"].get(k) != v}
    assert not wrong, wrong


def test_wrappers_do_not_pile_up_over_many_pauses() -> None:
    # In this process on purpose: two hundred interpreters would be slow, and the fresh-
    # interpreter tests above already resume rebuilt objects; this one watches the size.
    def dump(obj: Any) -> bytes:
        sink = io.BytesIO()
        CapsulePickler(sink, CaptureContext()).dump(obj)
        return sink.getvalue()

    def fresh() -> dict[str, Any]:
        t1, t2 = itertools.tee(iter(range(10**6)))
        return {"cycle": itertools.cycle(iter(range(10**6))), "pairwise": itertools.pairwise(iter(range(10**6))),
                "chain": itertools.chain.from_iterable(iter([range(3)] * 10**5)),
                "groupby": itertools.groupby(iter(range(10**6)), operator.neg), "t1": t1, "t2": t2}

    ns, twin, sizes = fresh(), fresh(), []
    for _ in range(200):  # pause and resume, again and again
        for k in ns:
            next(ns[k]), next(twin[k])
        data = dump(ns)
        sizes.append(len(data))
        with restoring(RestoreContext(namespace={}, files_to=Path("."))):
            ns = pickle.loads(data)
    # The cycle's saved items grow by one per pause; nothing else may grow.
    assert sizes[-1] - sizes[0] < 8 * 200, sizes[::50]
    for k in ("cycle", "pairwise", "chain", "t1", "t2"):
        assert [next(ns[k]) for _ in range(5)] == [next(twin[k]) for _ in range(5)], k


# -- random histories, through a fresh interpreter ------------------------------------------------

FUZZ = r'''
import io, pickle, random, itertools as it, operator, collections
from pathlib import Path
from sojourn.capsule.pickler import CapsulePickler, CaptureContext
from sojourn.capsule.context import RestoreContext, restoring
from sojourn.capsule.fingerprint import canonical_digests

def half(x): return x // 2
def none_on_zero(a, b): return None if b == 0 else b

def scenario(seed):
    rng = random.Random(seed)
    kinds = ["tee", "groupby", "cycle", "acc", "islice", "comb", "chain", "zl", "pw", "dict", "deque"]
    kind = rng.choice(kinds + (["batched"] if hasattr(it, "batched") else []))
    data = [rng.randrange(4) for _ in range(rng.randrange(0, 30))]
    if kind == "tee":
        src = iter(data if rng.random() < 0.5 else range(rng.randrange(0, 150)))
        objs = list(it.tee(src, rng.randrange(1, 4))) + [src]
        if rng.random() < 0.3:
            objs += [it.tee(objs[0], 1)[0], objs[0].__copy__()]
    elif kind == "groupby":
        g = it.groupby(data, half if rng.random() < 0.5 else None)
        objs = [g]
        for _ in range(rng.randrange(0, 6)):
            r = next(g, None)
            if r is None:
                break
            objs.append(r[1])
            for _ in range(rng.randrange(0, 3)):
                next(r[1], None)
    elif kind == "cycle":
        objs = [it.cycle(data if rng.random() < 0.5 else iter(data))]
    elif kind == "acc":
        f = rng.choice([None, operator.mul, max, none_on_zero])
        objs = [it.accumulate(data, f, initial=rng.choice([None, None, 5]))]
    elif kind == "islice":
        start, step = rng.randrange(0, 5), rng.randrange(1, 5)
        stop = rng.choice([None, rng.randrange(start, 40)])
        src = iter(range(50))
        objs = [it.islice(src, start, stop, step), src]
    elif kind == "comb":
        pool, r = list(range(rng.randrange(0, 6))), rng.randrange(0, 5)
        f = rng.choice([it.permutations, it.combinations, it.combinations_with_replacement, None])
        objs = [it.product(pool, repeat=r) if f is None else f(pool, r)]
    elif kind == "chain":
        objs = [it.chain.from_iterable([data[:i] for i in range(rng.randrange(0, 6))])]
    elif kind == "zl":
        objs = [it.zip_longest(data, range(rng.randrange(0, 20)), fillvalue=rng.choice([None, 0]))]
    elif kind == "pw":
        objs = [it.pairwise(data)]
    elif kind == "dict":
        d = {i: -i for i in range(rng.randrange(0, 12))}
        f = rng.choice([iter, reversed, lambda d: iter(d.values()), lambda d: reversed(d.items())])
        objs = [f(d), d]
    elif kind == "deque":
        d = collections.deque(data)
        objs = [rng.choice([iter, reversed])(d), d]
    else:
        objs = [it.batched(data, rng.randrange(1, 5))]
    movable = [o for o in objs if hasattr(o, "__next__")]
    for _ in range(rng.randrange(0, 40)):
        take(rng.choice(movable), 1)
    return kind, objs

def take(x, n):
    out = []
    for _ in range(n):
        try:
            v = next(x)
        except StopIteration:
            out.append("STOP"); break
        except Exception as e:
            out.append(repr(e)); break
        if isinstance(v, tuple) and len(v) == 2 and type(v[1]).__name__ == "_grouper":
            v = (v[0], "<group>")
        out.append(v)
    return repr(out)

def play(objs, seed):
    rng = random.Random(-seed)
    movable = [i for i, o in enumerate(objs) if hasattr(o, "__next__")]
    return [(i, take(objs[i], rng.randrange(1, 4))) for i in (rng.choice(movable) for _ in range(50))]

def dump(objs):
    ctx, sink = CaptureContext(), io.BytesIO()
    p = CapsulePickler(sink, ctx)
    segments = []
    for o in objs:
        start = sink.tell(); p.dump(o); segments.append((start, sink.tell()))
    assert not ctx.problems, ctx.problems
    return sink.getvalue(), segments

def capture(seeds):
    out = {}
    for seed in seeds:
        kind, objs = scenario(seed)
        stream, segments = dump(objs)
        out[seed] = (kind, stream, segments, play(scenario(seed)[1], seed))
    return out

def check(captured):
    failures = []
    for seed, (kind, stream, segments, expected) in captured.items():
        ctx = RestoreContext(namespace={}, files_to=Path("."))
        with restoring(ctx):
            up = pickle.Unpickler(io.BytesIO(stream))
            objs = [up.load() for _ in segments]
            again, segments2 = dump(objs)
        everything = set(range(len(segments)))
        if again != stream and canonical_digests(stream, segments, [], everything) != canonical_digests(again, segments2, [], everything):
            failures.append((seed, kind, "fingerprint"))
        elif play(objs, seed) != expected:
            failures.append((seed, kind, "items"))
    return failures
'''

FUZZ_CAPTURE = """
import pickle, sys, itfuzz
pickle.dump(itfuzz.capture(range(int(sys.argv[1]))), open("captured.pkl", "wb"))
"""

FUZZ_RESTORE = """
import json, pickle, warnings, itfuzz
warnings.filterwarnings("error", "Pickle, copy, and deepcopy support", DeprecationWarning)
print(json.dumps(itfuzz.check(pickle.load(open("captured.pkl", "rb")))))
"""

FUZZ_PAIRS = [(HERE, HERE), ("3.12", "3.11"), ("3.13", "3.11"), ("3.11", "3.13")]


@pytest.mark.parametrize(("src", "dst"), FUZZ_PAIRS, ids=[f"{a}-to-{b}" for a, b in FUZZ_PAIRS])
def test_random_histories_resume(tmp_path: Path, src: str, dst: str) -> None:
    capture_py, restore_py = _python(src), _python(dst)
    (tmp_path / "itfuzz.py").write_text(FUZZ)
    run_py(FUZZ_CAPTURE, "400", cwd=tmp_path, python=capture_py)
    failures = last_json(run_py(FUZZ_RESTORE, cwd=tmp_path, python=restore_py))
    assert failures == [], failures


# -- the state readers, in this interpreter ----------------------------------------------------------


def _native(obj: Any) -> tuple[Any, ...]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return obj.__reduce__()  # type: ignore[no-any-return]


@pytest.mark.skipif(sys.version_info >= (3, 14), reason="itertools pickling is gone")
@pytest.mark.parametrize("kind", ["product", "permutations", "combinations", "combinations_with_replacement"])
def test_rank_counts_the_tuples_already_produced(kind: str) -> None:
    for n in range(6):
        for r in range(5):
            if kind == "product":
                pools: Any = tuple(tuple(range(n)) for _ in range(r))
                obj = itertools.product(*pools)
                total = n**r
            else:
                obj = getattr(itertools, kind)(range(n), r)
                pools = tuple(range(n))
                total = sum(1 for _ in getattr(itertools, kind)(range(n), r))
            for produced in range(1, total + 1):
                next(obj)
                state = _native(obj)[2]
                assert iterators._rank(kind, pools, r, state) == produced - 1, (kind, n, r, produced)
    assert math.comb(5, 2) == 10  # the formulas rest on math.comb / math.perm


def test_count_and_repeat_fallbacks_read_what_reduce_reads() -> None:
    # Python 3.14 has no __reduce__: the fallbacks must agree with it where both exist.
    for c in (itertools.count(3), itertools.count(3, 2), itertools.count(0.5, 0.25),
              itertools.count(2**70), itertools.count(float("inf"), 1)):
        next(c)
        def start_step(args: tuple[Any, ...]) -> tuple[Any, ...]:
            return (*args, 1)[:2]  # count(n) means step 1

        assert start_step(iterators._count_fallback(c)) == start_step(_native(c)[1])
    for r in (itertools.repeat("x", 3), itertools.repeat(None)):
        next(r)
        assert iterators._repeat_fallback(r) == _native(r)[1]
    exhausted = itertools.repeat(1, 1)
    next(exhausted)
    assert iterators._repeat_fallback(exhausted) == (1, 0)


@pytest.mark.skipif(not hasattr(itertools, "batched"), reason="batched is 3.12+")
def test_batched_layout_is_found_on_probes() -> None:
    at_n, at_strict = iterators_hidden._batched_layout()
    assert at_n >= object.__basicsize__
    assert (at_strict is None) == (sys.version_info < (3, 13))
    b = itertools.batched(iter(range(10)), 4)  # type: ignore[attr-defined]
    next(b)
    desc = iterators_hidden._batched_reduce(b, None)
    assert desc[0] is iterators_hidden.make_batched and desc[1][1:] == (4, False)
    assert list(desc[1][0]) == list(range(4, 10))


def test_emulated_batched_matches_the_real_one() -> None:
    emulated = iterators_hidden._Batched(iter(range(7)), 3, False)
    assert list(emulated) == [(0, 1, 2), (3, 4, 5), (6,)]
    strict = iterators_hidden._Batched(iter(range(7)), 3, True)
    assert next(strict) == (0, 1, 2) and next(strict) == (3, 4, 5)
    with pytest.raises(ValueError, match="incomplete batch"):
        next(strict)
    assert list(strict) == []


# -- what cannot travel ------------------------------------------------------------------------------


def _problems(ns: dict[str, Any]) -> str:
    with pytest.raises(CaptureError) as info:
        pickle_namespace(ns)
    return str(info.value)


def test_dict_iterator_over_a_changed_dict_is_refused() -> None:
    d = {"a": 1, "b": 2}
    grown = iter(d)
    d["c"] = 3
    message = _problems({"d": d, "grown": grown})
    assert "grown" in message and "changed while it was part-way" in message


def test_dict_iterator_over_a_dict_with_replaced_keys_keeps_its_position() -> None:
    d = {"a": 1, "b": 2, "c": 3}
    it = iter(d)
    next(it)
    del d["b"]
    d["z"] = 26  # same size: the iterator goes on with c, z
    desc = iterators._dict_iter_reduce(it, None)
    rebuilt = iterators._dict_iter(*desc[1])
    assert list(rebuilt) == list(it) == ["c", "z"]


def test_internal_tee_data_is_refused() -> None:
    t = itertools.tee(range(3))[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        data = t.__reduce__()[2][0]
    assert "internal tee data" in _problems({"data": data})


def test_itertools_subclass_is_refused_not_pickled_natively() -> None:
    import inspect

    if "subclasses" not in inspect.signature(register).parameters:
        pytest.skip("this registry matches exact types only")

    class Counter(itertools.count):
        pass

    assert "subclass of an itertools type" in _problems({"c": Counter(5)})
