"""A small training job: minibatch SGD on a two-layer numpy network, three epochs.

Unchanged by sojourn: run it with `python train.py` or `sojourn run train.py`.
"""

import sys
import time

import numpy as np

EPOCHS = int(sys.argv[1]) if len(sys.argv) > 1 else 3
rng = np.random.default_rng(0)
X = rng.normal(size=(2000, 20))
true_w = rng.normal(size=(20,))
y = (X @ true_w + 0.3 * rng.normal(size=2000) > 0).astype(np.float64)


class MLP:
    def __init__(self, n_in, n_hidden, seed):
        g = np.random.default_rng(seed)
        self.w1 = g.normal(scale=0.3, size=(n_in, n_hidden))
        self.w2 = g.normal(scale=0.3, size=(n_hidden,))

    def forward(self, xb):
        self.h = np.tanh(xb @ self.w1)
        return 1 / (1 + np.exp(-(self.h @ self.w2)))

    def step(self, xb, yb, lr):
        p = self.forward(xb)
        err = (p - yb) / len(yb)
        grad_w2 = self.h.T @ err
        grad_h = np.outer(err, self.w2) * (1 - self.h**2)
        self.w2 -= lr * grad_w2
        self.w1 -= lr * (xb.T @ grad_h)
        return float(-np.mean(yb * np.log(p + 1e-9) + (1 - yb) * np.log(1 - p + 1e-9)))


def train(model, epochs, batch=40, lr=0.5):
    for epoch in range(epochs):
        order = rng.permutation(len(X))
        losses = []
        for b, start in enumerate(range(0, len(X), batch)):
            idx = order[start : start + batch]
            losses.append(model.step(X[idx], y[idx], lr))
            time.sleep(0.01)  # stands for real work: a pause usually lands mid-epoch
            if b % 10 == 9:
                print(f"epoch {epoch} batch {b + 1:3d} loss {np.mean(losses[-10:]):.6f}", flush=True)
        lr *= 0.8


model = MLP(20, 16, seed=1)
train(model, EPOCHS)
acc = float(np.mean((model.forward(X) > 0.5) == y))
print(f"accuracy {acc:.4f} weights-checksum {float(np.sum(model.w1)) + float(np.sum(model.w2)):.12f}")
