"""The autograd trap: a pause requested between a forward pass and backward() waits for
backward(), so no graph is lost, and training resumed in new processes ends with parameters
bit-for-bit identical to a run that never paused."""

from __future__ import annotations

import pytest

from tests.execution.conftest import EXIT_PAUSED, Runner

pytest.importorskip("torch")

TRAIN = """
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
x = torch.randn(32, 4)
y = torch.randn(32, 1)

def settle(tag):
    for i in range(3):  # pause checks: the request arrives here, mid-step
        kill_here(f"{tag}-{i}")

def train_step(i):
    opt.zero_grad()
    out = model(x)
    loss = ((out - y) ** 2).mean()
    settle(f"fwd{i}")  # between forward and backward: the graph is live
    loss.backward()
    settle(f"bwd{i}")  # after backward: the graph is consumed
    opt.step()
    return loss

for epoch in range(6):
    kill_here(f"top{epoch}")
    loss = train_step(epoch)  # stays bound at the top of the next iteration
    print(epoch, f"{loss.item():.8f}", flush=True)
print("params", [p.detach().numpy().tobytes().hex() for p in model.parameters()])
"""


def test_pause_between_forward_and_backward_waits_for_backward(runner: Runner) -> None:
    script = runner.write("train.py", TRAIN)
    chain = runner.chain(script, kills="fwd1-0,fwd3-1")
    runner.same_as_plain(script, chain)
    assert [s.returncode for s in chain.segments] == [EXIT_PAUSED, EXIT_PAUSED, 0]
    first = chain.segments[0].stderr
    assert "autograd graph that backward() has not used yet" in first
    assert ".loss" in first and ".out" in first
    # It landed after backward(), inside the second settle() of the same step.
    assert "in train_step -> " in first and "in settle" in first


def test_consumed_graph_does_not_hold_the_pause(runner: Runner) -> None:
    script = runner.write("train.py", TRAIN)
    chain = runner.chain(script, kills="bwd0-0,top2,top4")
    runner.same_as_plain(script, chain)
    assert [s.returncode for s in chain.segments] == [EXIT_PAUSED] * 3 + [0]
    assert "deferred" not in chain.stderr
