"""Out of memory inside a loop does not kill the job: under a real memory limit
(``resource.setrlimit(RLIMIT_DATA)``, set in the child before it starts), the error becomes a
capsule positioned before the failing statement, the process says so and exits with 77, and a
resume with more memory (no limit) completes with exactly the output of a run that never ran
out. What the program handles itself, and a statement outside any loop, are left alone."""

from __future__ import annotations

import re
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from tests.execution.conftest import Runner, Segment

EXIT_OOM = 77
MiB = 1 << 20


def limited(runner: Runner, args: list[str], limit: int) -> Segment:
    """A segment whose process can map at most ``limit`` bytes of data (heap and anonymous
    mappings: numpy's and torch's buffers)."""

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_DATA, (limit, resource.getrlimit(resource.RLIMIT_DATA)[1]))

    p = subprocess.run(runner.cmd(sys.executable, *args), cwd=runner.dir, env=runner.env, capture_output=True,
                       text=True, timeout=300, preexec_fn=cap)
    m = re.search(r"capsule (cap_[0-9a-f]+)", p.stderr)
    return Segment(sys.executable, p.returncode, p.stdout, p.stderr, m.group(1) if m else None)


def baseline(runner: Runner, imports: str) -> int:
    """What a program that imported ``imports`` maps once it runs under sojourn."""
    probe = runner.write("probe.py", f"""
        {imports}
        print(int(open("/proc/self/status").read().split("VmData:")[1].split()[0]) * 1024)
    """, prelude=False)
    seg = runner.segment(sys.executable, ["run", str(probe)])
    assert seg.returncode == 0, seg.stderr
    return int(seg.stdout.split()[-1])


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmData from /proc")
def test_numpy_loop_out_of_memory_captures_and_resumes_with_more_memory(runner: Runner) -> None:
    pytest.importorskip("numpy")
    script = runner.write("grow.py", """
        import numpy as np
        hoard = []
        total = 0.0

        def chunk(i):
            return np.full(4 * 2**20 // 8, float(i))  # 4 MiB

        for i in range(100):
            block = chunk(i)
            hoard.append(block)
            total += float(block[::1024].sum())
            print(i, len(hoard), total, flush=True)
        print("done", total, sum(float(b[0]) for b in hoard))
    """, prelude=False)
    limit = baseline(runner, "import numpy") + 150 * MiB  # room for about 35 of the 100 chunks
    first = limited(runner, ["run", str(script)], limit)
    assert first.returncode == EXIT_OOM, first.stderr
    assert first.capsule, first.stderr
    # The capsule is positioned at a statement the error escaped from, inside the loop. It is
    # nearly always the innermost one: the 4 MiB array inside chunk() (line 7). Two full-suite
    # runs under load (of about five) named the loop's own statement instead (line 10, the same
    # "Unable to allocate 4.00 MiB"): the innermost guard declined and the caller's took the
    # capsule. That was never reproduced in 80 isolated runs at the same limit, with or without
    # load; it is open in the closing note. Both positions resume correctly, which the rest of
    # this test checks. When the limit leaves less room than an interpreter arena, a small
    # allocation of the loop body can fail first: a bare MemoryError at one of its statements.
    m = re.search(r"out of memory at \S*grow.py:(\d+) in (\S+) \((MemoryError[^)]*)\)", first.stderr)
    assert m, first.stderr
    where = (m.group(1), m.group(2))
    if "Unable to allocate 4.00 MiB" in m.group(3):
        assert where in {("7", "chunk"), ("10", "<module>")}, first.stderr
    else:
        assert where in {("7", "chunk"), ("10", "<module>"), ("11", "<module>"), ("12", "<module>"),
                         ("13", "<module>")}, first.stderr
    assert "positioned before that statement, which runs again on resume" in first.stderr
    assert "resume it with more memory" in first.stderr
    assert 10 < len(first.stdout.splitlines()) < 60
    second = runner.segment(sys.executable, ["resume", first.capsule])
    assert second.returncode == 0, second.stderr
    ref = runner.plain(script)
    assert ref.returncode == 0
    assert first.stdout + second.stdout == ref.stdout


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmData from /proc")
def test_torch_out_of_memory_in_a_forward_pass_reruns_the_call_into_the_library(runner: Runner) -> None:
    pytest.importorskip("torch")
    script = runner.write("train.py", """
        import torch

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = torch.nn.Linear(4, 1)

            def forward(self, x, step):
                # A step whose batch needs a big scratch buffer (100 M floats at step 3).
                scratch = torch.ones(100_000_000 if step == 3 else 10)
                return self.lin(x) + scratch.sum() * 0

        torch.manual_seed(0)
        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x, y = torch.randn(16, 4), torch.randn(16, 1)

        def train(steps):
            for step in range(steps):
                opt.zero_grad()
                out = model(x, step)
                loss = ((out - y) ** 2).mean()
                loss.backward()
                opt.step()
                print(step, f"{loss.item():.8f}", flush=True)

        train(6)
        print("params", [p.detach().numpy().tobytes().hex() for p in model.parameters()])
    """, prelude=False)
    limit = baseline(runner, "import torch") + 200 * MiB  # the 400 MB scratch buffer does not fit
    first = limited(runner, ["run", str(script)], limit)
    assert first.returncode == EXIT_OOM, first.stderr
    # forward() is called by torch's Module.__call__ (library code): the statement that called
    # into the library runs again, i.e. the whole forward pass of step 3.
    assert re.search(r"out of memory at \S*train.py:22 in train \(RuntimeError: .*can't allocate memory", first.stderr)
    assert first.stdout.splitlines() == runner.plain(script).stdout.splitlines()[:3]
    second = runner.segment(sys.executable, ["resume", first.capsule or ""])
    assert second.returncode == 0, second.stderr
    assert first.stdout + second.stdout == runner.plain(script).stdout


def test_out_of_memory_the_program_handles_or_outside_any_loop_is_left_alone(runner: Runner) -> None:
    # A petabyte: a real allocation that fails at once, with no limit needed.
    script = runner.write("handled.py", """
        def attempt(n):
            return bytearray(n)

        got = []
        for i in range(3):
            try:
                got.append(len(attempt(1 << 50 if i == 1 else 10)))
            except MemoryError:
                got.append("handled")
        print(got, flush=True)
        data = attempt(1 << 50)
        print("not reached")
    """, prelude=False)
    seg = runner.segment(sys.executable, ["run", str(script)])
    assert seg.returncode == 1
    assert seg.stdout == "[10, 'handled', 10]\n"
    assert seg.capsule is None and "capsule cap_" not in seg.stderr
    assert "sojourn: out of memory (MemoryError); no capsule was written: the failing statement" in seg.stderr
    assert "is not inside a loop" in seg.stderr
    assert seg.stderr.rstrip().endswith("MemoryError")


def test_other_errors_pass_through_the_guards_unchanged(runner: Runner) -> None:
    script = runner.write("boom.py", """
        def inner(i):
            if i == 2:
                raise RuntimeError(f"boom at {i}")
            return i

        def outer(n):
            total = 0
            for i in range(n):
                total += inner(i)
            return total

        print(outer(5))
    """, prelude=False)
    seg = runner.segment(sys.executable, ["run", str(script)])
    ref = runner.plain(script)
    assert seg.returncode == ref.returncode == 1
    def frames(err: str) -> list[str]:
        return [ln.strip() for ln in err.splitlines() if ln.strip().startswith(("File", "RuntimeError"))]

    assert frames(seg.stderr) == frames(ref.stderr)
    assert "out of memory" not in seg.stderr


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmData from /proc")
def test_out_of_memory_in_a_dataloader_next_refetches_the_same_batch(runner: Runner) -> None:
    pytest.importorskip("torch")
    script = runner.write("loader.py", """
        import torch
        from torch.utils.data import DataLoader, TensorDataset

        def collate(items):
            xs = torch.stack([x for x, in items])
            # The batch that holds sample 13 needs a big buffer (400 MB): the loop's own
            # next() runs out of memory, inside the library, between two steps.
            pad = torch.ones(100_000_000 if bool((xs[:, 0] == 13).any()) else 1)
            return xs + pad.sum() * 0

        torch.manual_seed(0)
        data = TensorDataset(torch.arange(40, dtype=torch.float32).repeat(3, 1).T.contiguous())
        loader = DataLoader(data, batch_size=4, shuffle=True, collate_fn=collate)
        seen = []
        for batch in loader:
            seen.append(batch[:, 0].tolist())
            print(len(seen), seen[-1], flush=True)
        print("done", sorted(v for b in seen for v in b) == list(range(40)))
    """, prelude=False)
    limit = baseline(runner, "import torch") + 200 * MiB
    first = limited(runner, ["run", str(script)], limit)
    assert first.returncode == EXIT_OOM, first.stderr
    assert re.search(r"out of memory at \S*loader.py:16 in <module>", first.stderr)  # the `for` statement
    second = runner.segment(sys.executable, ["resume", first.capsule or ""])
    assert second.returncode == 0, second.stderr
    ref = runner.plain(script)
    assert first.stdout + second.stdout == ref.stdout
    assert ref.stdout.endswith("done True\n")


def test_on_oom_is_called_before_the_capture_and_the_capsule_says_oom(runner: Runner) -> None:
    driver = runner.write("driver.py", """
        import sys
        from sojourn.execution import run_script

        def on_oom(error):
            print("ON_OOM", type(error).__name__, file=sys.stderr, flush=True)

        def on_capsule(event):
            print("EVENT", event.reason, event.action, event.where.rsplit(" -> ", 1)[-1], file=sys.stderr, flush=True)

        run_script(sys.argv[1], [], repo=sys.argv[2], on_capsule=on_capsule, on_oom=on_oom, scan_interval=None)
    """, prelude=False)
    script = runner.write("alloc.py", """
        sizes = [8, 1 << 50, 8]
        for i, n in enumerate(sizes):
            buf = bytearray(n)
            print(i, len(buf), flush=True)
    """, prelude=False)
    p = runner.plain(driver, str(script), runner.repo)
    assert p.returncode == EXIT_OOM, p.stderr
    assert p.stdout == "0 8\n"
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith(("ON_OOM", "EVENT"))]
    assert lines[0] == "ON_OOM MemoryError"
    assert re.fullmatch(r"EVENT oom exit \S*alloc.py:4 in <module>", lines[1]), lines


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmData from /proc")
def test_out_of_memory_inside_a_generator_within_a_with_block(runner: Runner) -> None:
    script = runner.write("gen.py", """
        def produce(n):
            for i in range(n):
                yield bytearray((300 if i == 2 else 1) << 20)  # the generator's own statement fails

        with open("sizes.txt", "w") as fh:
            for block in produce(4):
                fh.write(f"{len(block) >> 20}\\n")
                print(len(block) >> 20, flush=True)
        print(open("sizes.txt").read().split())
    """, prelude=False)
    limit = baseline(runner, "") + 100 * MiB
    first = limited(runner, ["run", str(script)], limit)
    assert first.returncode == EXIT_OOM, first.stderr
    assert re.search(r"out of memory at \S*gen.py:4 in produce", first.stderr)
    second = runner.segment(sys.executable, ["resume", first.capsule or ""])
    assert second.returncode == 0, second.stderr
    ref = runner.plain(script)
    assert first.stdout + second.stdout == ref.stdout
    assert ref.stdout.endswith("['1', '1', '300', '1']\n")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmData from /proc")
def test_out_of_memory_in_backward_reruns_the_step_that_built_the_graph(runner: Runner) -> None:
    pytest.importorskip("torch")
    script = runner.write("step.py", """
        import torch

        class Wide(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, step):
                ctx.step = step
                return x * 2

            @staticmethod
            def backward(ctx, grad):
                scratch = torch.ones(100_000_000 if ctx.step == 3 else 1)  # 400 MB at step 3
                return grad * 2 + scratch.sum() * 0, None

        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        x, y = torch.randn(16, 4), torch.randn(16, 1)

        def train_step(step):
            opt.zero_grad()
            out = Wide.apply(model(x), step)
            loss = ((out - y) ** 2).mean()
            loss.backward()  # runs out of memory at step 3, with the graph live in this frame
            opt.step()
            return loss.item()

        for step in range(6):
            print(step, f"{train_step(step):.8f}", flush=True)
        print("params", [p.detach().numpy().tobytes().hex() for p in model.parameters()])
    """, prelude=False)
    limit = baseline(runner, "import torch") + 200 * MiB
    first = limited(runner, ["run", str(script)], limit)
    assert first.returncode == EXIT_OOM, first.stderr
    # Not at loss.backward() (the graph cannot travel), but at the call of the step in the loop.
    assert re.search(r"out of memory at \S*step.py:29 in <module>", first.stderr), first.stderr
    second = runner.segment(sys.executable, ["resume", first.capsule or ""])
    assert second.returncode == 0, second.stderr
    assert first.stdout + second.stdout == runner.plain(script).stdout
