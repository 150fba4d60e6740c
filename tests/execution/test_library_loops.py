"""Loops over library iterators (a module's parameters and submodules, pandas groupby,
iterrows, itertuples, chunked readers, csv.reader on an open file, dict views): a pause inside lands, the
capsule passes its write check in a fresh interpreter, and the resumed program prints what
a run that never paused prints. A hash object held across a loop is refused by name, with
advice that works."""

from __future__ import annotations

import re

import pytest

from tests.execution.conftest import EXIT_PAUSED, Runner


def _checked(runner: Runner, capsules: list[str]) -> None:
    """The write check a session gives each capsule: restore in a fresh interpreter, compare."""
    import sys

    for cap in capsules:
        seg = runner.segment(sys.executable, ["check", cap])
        assert seg.returncode == 0 and '"ok": true' in seg.stdout, seg.stdout + seg.stderr


@pytest.mark.slow
def test_torch_module_iterators_and_the_lr_scheduler_wrapper(runner: Runner) -> None:
    pytest.importorskip("torch")
    script = runner.write("train.py", """
        import warnings
        import torch
        warnings.simplefilter("always")
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        x = torch.randn(8, 3)
        for i, p in enumerate(model.parameters()):
            kill_here(f"param{i}")
            print("param", i, tuple(p.shape), flush=True)
        for name, m in model.named_modules():
            kill_here(f"mod{name}")
            print("module", repr(name), type(m).__name__, flush=True)
        for n, (name, p) in enumerate(model.named_parameters()):
            kill_here(f"named{n}")
            print("named", name, round(p.sum().item(), 6), flush=True)
        for child in model.children():
            print("child", type(child).__name__, flush=True)
        params = model.parameters()              # the generator held by the program too
        for i, p in enumerate(params):
            kill_here(f"held{i}")
            print("held", i, tuple(p.shape), flush=True)
        print("rest", list(params), flush=True)
        for epoch in range(2):
            opt.zero_grad()
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            kill_here(f"between{epoch}")   # between opt.step() and the scheduler's first step()
            sched.step()
            print("epoch", epoch, round(loss.item(), 6), sched.get_last_lr(), flush=True)
    """)
    chain = runner.chain(script, kills="param1,mod1,named2,held2,between0")
    runner.same_as_plain(script, chain)
    assert [s.returncode for s in chain.segments] == [EXIT_PAUSED] * 5 + [0], chain.describe()
    assert "has been overridden" not in chain.stderr and "before `optimizer.step()`" not in chain.stderr
    _checked(runner, chain.capsules)


@pytest.mark.slow
def test_pandas_groupby_rows_and_chunked_readers(runner: Runner) -> None:
    pytest.importorskip("pandas")
    (runner.dir / "rows.csv").write_text("a,b\n" + "".join(f"{i},{i * i}\n" for i in range(10)))
    (runner.dir / "rows.jsonl").write_text("".join(f'{{"a": {i}, "b": "x{i}"}}\n' for i in range(10)))
    script = runner.write("frames.py", """
        import pandas as pd
        df = pd.DataFrame({"k": list("abcab"), "v": range(5), "w": [0.5, 1.5, 2.5, 3.5, 4.5]})
        for k, g in df.groupby("k"):
            kill_here(f"group{k}")
            df.loc[2, "v"] = 50                  # a row of a group ahead: groupby iterates a snapshot
            print("group", k, g["v"].tolist(), flush=True)
        for i, row in df.iterrows():
            kill_here(f"row{i}")
            df.loc[i, "w"] = row["w"] * 2        # the common pattern: write the row just read
            df.loc[4, "v"] = 100 + i             # and a row ahead: iterrows reads a snapshot
            print("row", i, row["k"], row["v"], flush=True)
        print(df["w"].tolist(), flush=True)
        for row in df.itertuples(name=None):     # zips iterators over the index and columns
            kill_here(f"tuple{row[0]}")
            print("tuple", row, flush=True)
        for row in df.itertuples():              # rows of pandas' own namedtuple class
            kill_here(f"named{row.Index}")
            print("named", row, flush=True)
        for label, value in df["k"].items():
            kill_here(f"item{label}")
            print("item", label, value, flush=True)
        for n, chunk in enumerate(pd.read_csv("rows.csv", chunksize=3)):
            kill_here(f"csv{n}")
            print("csv", n, chunk["b"].tolist(), flush=True)
        reader = pd.read_json("rows.jsonl", lines=True, chunksize=4)
        for n, chunk in enumerate(reader):
            kill_here(f"json{n}")
            print("json", n, chunk["b"].tolist(), flush=True)
    """)
    chain = runner.chain(script, kills="groupb,row2,tuple3,named1,item1,csv1,json1")
    runner.same_as_plain(script, chain)
    assert [s.returncode for s in chain.segments] == [EXIT_PAUSED] * 7 + [0], chain.describe()
    _checked(runner, chain.capsules)


def test_csv_readers_dict_views_and_a_refused_hash(runner: Runner) -> None:
    (runner.dir / "rows.csv").write_text('a,b\n1,"x\ny"\n2,z\n3,w\n4,v\n')
    script = runner.write("plain.py", """
        import csv, hashlib
        with open("rows.csv", newline="") as f:
            for row in csv.reader(f):
                kill_here(f"csv{row[0]}")
                print("csv", row, flush=True)
        d = {"a": 1, "b": 2, "c": 3}
        for k, v in d.items():
            kill_here(f"items{k}")
            print("item", k, v, flush=True)
        keys = d.keys()
        for k in keys:
            kill_here(f"keys{k}")
            print("key", k, len(keys), flush=True)
        reader = csv.reader(open("rows.csv", newline=""))
        print("header", next(reader), reader.line_num, flush=True)
        for row in reader:
            kill_here(f"again{row[0]}")
            print("again", row, reader.line_num, flush=True)
        digest = hashlib.sha256()
        for i in range(3):
            kill_here(f"hash{i}")
            digest.update(str(i).encode())
        print(digest.hexdigest(), flush=True)
    """)
    chain = runner.chain(script, kills="csv2,itemsb,keysa,again3,hash1")
    runner.same_as_plain(script, chain)
    codes = [s.returncode for s in chain.segments]
    assert codes == [EXIT_PAUSED] * 4 + [0], chain.describe()
    _checked(runner, chain.capsules)
    err = chain.segments[-1].stderr
    assert "pause refused" in err
    # The hash is named by the program's own variable, with advice that works.
    assert re.search(r"- digest \(_hashlib\.HASH\): .*hash the data again after resume", err), err
    assert "_sj_" not in err and "<ref" not in err


def test_a_refused_library_loop_is_named_in_the_programs_words(runner: Runner) -> None:
    # os.walk is a library generator sojourn does not know to be pure (it reads the disk):
    # refused, and the refusal names the loop as written, in the function it runs in.
    for d in ("tree/a", "tree/b", "tree/c"):
        (runner.dir / d).mkdir(parents=True)
    script = runner.write("walk.py", """
        import os
        def count(top):
            n = 0
            for root, dirs, files in os.walk(top):
                kill_here(f"walk{n}")
                n += 1
            return n
        print(count("tree"), flush=True)
    """)
    chain = runner.chain(script, kills="walk1")
    runner.same_as_plain(script, chain)
    err = chain.segments[-1].stderr
    assert "pause refused" in err
    assert "- the loop `for root, dirs, files in os.walk(top)` (walk.py:" in err, err
    assert "_sj_" not in err and "<ref" not in err and "<process>" not in err


def test_a_write_check_failure_names_the_frame_local(runner: Runner) -> None:
    script = runner.write("lossy.py", """
        class Lossy:
            def __init__(self):
                self.kept = 1
                self.dropped = [1, 2]
            def __setstate__(self, state):
                self.kept = state["kept"]
        def work():
            box = {"thing": Lossy()}
            for i in range(3):
                kill_here(i)
                print(i, flush=True)
        work()
    """)
    import sys

    first = runner.segment(sys.executable, ["run", str(script)], {"KILLS": "1"})
    assert first.returncode == EXIT_PAUSED and first.capsule, first.stderr
    check = runner.segment(sys.executable, ["check", first.capsule])
    assert '"ok": false' in check.stdout
    assert "the frame it called, its local 'box'['thing'].dropped" in check.stdout, check.stdout
    assert "'<process>'" not in check.stdout


def test_the_periodic_scan_warns_of_what_the_write_check_would_refuse(runner: Runner) -> None:
    import sys

    script = runner.write("later.py", """
        import time
        class Lossy:
            def __init__(self):
                self.kept = 1
                self.dropped = [1, 2]
            def __setstate__(self, state):
                self.kept = state["kept"]
        def work():
            box = {"thing": Lossy()}
            for i in range(40):
                time.sleep(0.02)
            print("done", flush=True)
        work()
    """)
    seg = runner.segment(sys.executable, ["run", str(script)], opts=("--scan-interval", "0.2"))
    assert seg.returncode == 0 and seg.stdout == "done\n", seg.stderr
    assert "warning: a pause now would be refused" in seg.stderr, seg.stderr
    assert "in work>.box['thing'].dropped" in seg.stderr and "write check would refuse" in seg.stderr, seg.stderr
