"""The issue's training run: a shuffled torch DataLoader (0 and 2 workers), tqdm bars and dropout,
paused twice by real SIGTERMs sent from outside at random points and resumed each time in a new
process, ends with a model whose state_dict is bit-for-bit the one of a run that never paused,
after printing exactly the same per-step log (batches, losses, random draws, the bars' counts,
totals, descriptions, elapsed times that never go back, closed bars)."""

from __future__ import annotations

import random

import pytest

from tests.execution.conftest import EXIT_PAUSED, Runner

pytest.importorskip("torch")
pytest.importorskip("tqdm")

TRAIN = """
import hashlib, os, sys, time
import torch
from torch.utils.data import DataLoader, TensorDataset
from tqdm import tqdm

NW = int(os.environ["NW"])
MODE = os.environ["MODE"]

def make_data():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(80, 6, generator=g)
    y = X @ torch.randn(6, generator=g) + 0.1 * torch.randn(80, generator=g)
    return TensorDataset(X, y)

def step(model, opt, xb, yb):
    opt.zero_grad()
    loss = ((model(xb).squeeze(-1) - yb) ** 2).mean()
    loss.backward()
    opt.step()
    return loss

def log(n, epoch, loss, xb, bar, elapsed):
    now = bar.format_dict["elapsed"]
    print(f"step {n} ep {epoch} loss {loss.item():.8f} xsum {xb.sum().item():+.6f} "
          f"noise {torch.rand(1).item():.6f} bar {bar.n}/{bar.total} {bar.desc!r} "
          f"elapsed {'ok' if now >= elapsed else 'WENT BACK'}", flush=True)
    time.sleep(0.02)
    return now

def train(model, loader, opt, epochs):
    n, bars = 0, []
    for epoch in range(epochs):
        elapsed = 0.0
        if MODE == "iter":
            bar = tqdm(loader, desc=f"epoch {epoch}", file=sys.stderr, mininterval=0)
            bars.append(bar)
            for xb, yb in bar:
                loss = step(model, opt, xb, yb)
                elapsed = log(n, epoch, loss, xb, bar, elapsed)
                n += 1
        else:
            with tqdm(total=len(loader), desc=f"epoch {epoch}", file=sys.stderr, mininterval=0) as bar:
                bars.append(bar)
                for i, (xb, yb) in enumerate(loader):
                    loss = step(model, opt, xb, yb)
                    bar.update(1)
                    bar.set_postfix(loss=f"{loss.item():.4f}")
                    elapsed = log(n, epoch, loss, xb, bar, elapsed)
                    n += 1
    print("bars", [(b.n, b.total, b.desc, b.disable) for b in bars])
    return n

torch.manual_seed(1234)
loader = DataLoader(make_data(), batch_size=8, shuffle=True, num_workers=NW,
                    persistent_workers=NW > 0 and MODE == "with")
model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.5)
steps = train(model, loader, opt, 3)
digest = hashlib.sha256()
for name, value in model.state_dict().items():
    digest.update(name.encode())
    digest.update(value.numpy().tobytes())
print("final", steps, digest.hexdigest())
"""


@pytest.mark.parametrize("nw,mode", [(0, "iter"), (2, "iter"), (2, "with")],
                         ids=["0-workers-tqdm-iter", "2-workers-tqdm-iter", "2-persistent-workers-enumerate-with-bar"])
def test_training_paused_twice_at_random_points_ends_bit_for_bit_identical(runner: Runner, nw: int, mode: str) -> None:
    script = runner.write("train.py", TRAIN, prelude=False)
    env = {"NW": str(nw), "MODE": mode}
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    # 30 steps (3 epochs of 10 batches): the signals land at a random step of the first or a
    # later epoch, wherever the program is then (a forward pass, the loader, tqdm, a print).
    after = [rng.randint(2, 14), rng.randint(2, 12)]
    chain = runner.external(script, after_lines=after, env=env)
    where = f"(seed {seed}, signals after {after} lines)\n" + chain.describe()
    assert [s.returncode for s in chain.segments] == [EXIT_PAUSED, EXIT_PAUSED, 0], where
    runner.same_as_plain(script, chain, env=env)
    assert "WENT BACK" not in chain.stdout
    assert chain.stdout.count("final 30 ") == 1
    assert "bars [(10, 10, 'epoch 0', True), (10, 10, 'epoch 1', True), (10, 10, 'epoch 2', True)]" in chain.stdout, where


STATEFUL = """
import torch
from torch.utils.data import DataLoader, TensorDataset

class ResumableLoader(DataLoader):
    # The protocol of torchdata's StatefulDataLoader, in a few lines: state_dict() tells where
    # the newest iterator is, load_state_dict() makes the next one start there.
    def __iter__(self):
        it = super().__iter__()
        skip = getattr(self, "_skip", 0)
        for _ in range(skip):
            next(it._sampler_iter)
        it._num_yielded = skip
        self._skip, self._newest = 0, it
        return it

    def state_dict(self):
        return {"yielded": self._newest._num_yielded, "resumes": getattr(self, "resumes", 0)}

    def load_state_dict(self, state):
        self._skip = state["yielded"]
        self.resumes = state["resumes"] + 1

data = TensorDataset(torch.arange(24, dtype=torch.float32))
loader = ResumableLoader(data, batch_size=4)
for epoch in range(2):
    for i, (xb,) in enumerate(loader):
        kill_here(f"{epoch}-{i}")
        print(epoch, i, xb.tolist(), flush=True)
print("resumes", getattr(loader, "resumes", 0))
"""


def test_a_loader_with_state_dict_travels_by_its_own_state(runner: Runner) -> None:
    script = runner.write("stateful.py", STATEFUL)
    chain = runner.chain(script, kills="0-2,0-4,1-3")
    assert [s.returncode for s in chain.segments] == [EXIT_PAUSED, EXIT_PAUSED, EXIT_PAUSED, 0], chain.describe()
    lines = chain.stdout.splitlines()
    assert lines[:-1] == runner.plain(script).stdout.splitlines()[:-1]
    assert lines[-1] == "resumes 3"  # each resume went through load_state_dict
