"""Writes the test notebooks of this folder (run it after editing the cells below).

Every cell's output is deterministic (seeded RNGs, no addresses, no timings), so a run with a
move between every cell can be compared with a plain run output for output.
"""

from __future__ import annotations

from pathlib import Path

import nbformat

NOTEBOOKS: dict[str, list[str]] = {
    "analysis.ipynb": [
        "import numpy as np\nimport pandas as pd\nfrom sklearn.linear_model import LogisticRegression\n"
        "from sklearn.model_selection import train_test_split\nrng = np.random.default_rng(0)",
        "df = pd.DataFrame({'a': rng.normal(size=500), 'b': rng.normal(size=500), 'c': rng.integers(0, 3, 500)})\n"
        "df['y'] = (df.a + 0.5 * df.b + rng.normal(scale=0.3, size=500) > 0).astype(int)\ndf.head().round(4)",
        "summary = df.groupby('c').agg({'a': 'mean', 'y': 'sum'}).round(4)\nsummary",
        "X_train, X_test, y_train, y_test = train_test_split(df[['a', 'b', 'c']], df.y, random_state=1)\n"
        "model = LogisticRegression().fit(X_train, y_train)\nprint(round(model.score(X_test, y_test), 4))",
        "df['p'] = model.predict_proba(df[['a', 'b', 'c']])[:, 1]\ndf.p.describe().round(4)",
        "print(model.coef_.round(4), round(rng.random(), 6))",
        "print(Out[3].shape, Out[3] is summary, len(In), _i4.splitlines()[0])",
    ],
    "training.ipynb": [
        "import numpy as np\nimport torch\nfrom torch.utils.data import DataLoader, TensorDataset\ntorch.manual_seed(0)\n"
        "torch.set_num_threads(1)",
        "X = torch.randn(256, 8)\nw_true = torch.randn(8, 1)\nY = X @ w_true + 0.1 * torch.randn(256, 1)\n"
        "loader = DataLoader(TensorDataset(X, Y), batch_size=32, shuffle=True)",
        "model = torch.nn.Linear(8, 1)\nopt = torch.optim.SGD(model.parameters(), lr=0.05)\nlosses = []",
        "def epoch():\n    for xb, yb in loader:\n        opt.zero_grad()\n"
        "        loss = torch.nn.functional.mse_loss(model(xb), yb)\n        loss.backward()\n        opt.step()\n"
        "    return loss.item()\n\nprint(round(epoch(), 6))",
        "for _ in range(3):\n    losses.append(epoch())\nprint([round(v, 6) for v in losses])",
        "xb, yb = next(iter(loader))  # shuffled: the order comes from torch's global RNG\nprint(xb[0, :3])",
        "xb2, _ = next(iter(loader))\nprint(xb2[0, :3], torch.rand(2))",
        "print(opt.param_groups[0]['params'][0] is model.weight, model.weight.detach().numpy().round(4))",
    ],
    "classes.ipynb": [
        "import functools\nimport random\nfrom dataclasses import dataclass\n\nimport numpy as np\n"
        "random.seed(7)\nnp.random.seed(7)\ng = np.random.default_rng(7)",
        "class Counter:\n    def __init__(self):\n        self.n = 0\n\n    def inc(self, k=1):\n        self.n += k\n"
        "        return self.n\n\n\ndef make_adder(k):\n    def add(x):\n        return x + k\n    return add",
        "c = Counter()\nadd3 = make_adder(3)\ncounter_ref = c\n"
        "print(c.inc(), add3(4), random.random(), np.random.rand(), g.random())",
        "@dataclass\nclass Point:\n    x: int\n    y: int\n\npts = [Point(i, i * i) for i in range(3)]\n"
        "sq = lambda p: p.x ** 2 + p.y\nprint([sq(p) for p in pts])",
        "a = np.arange(12.0).reshape(3, 4)\nv = a[1]\nv += 100\nprint(a.sum(), v.base is a, counter_ref is c)",
        "print(c.inc(5), isinstance(c, Counter), random.random(), np.random.rand(), g.random(), add3(10))",
        "twice = functools.lru_cache(maxsize=None)(lambda n: n * 2)\nprint(twice(4), type(pts[0]).__name__, pts[2])",
        "a.sum()",
        "print(Out[8] == _, _8 is Out[8], _i8, In[8])",
    ],
    "plots.ipynb": [  # a generator defined in a cell, paused between cells; figures, also in Out
        "import matplotlib.pyplot as plt\nimport numpy as np\nrng = np.random.default_rng(0)\n\n"
        "def batches(data, size):\n    for start in range(0, len(data), size):\n        yield start, data[start:start + size]",
        "data = rng.normal(size=40)\nstream = batches(data, 8)\nprint(next(stream)[0])",
        "fig, ax = plt.subplots(figsize=(3, 2))\nline, = ax.plot(data.cumsum())\nax.set_title('walk')\nfig",
        "for start, chunk in stream:\n    ax.axvline(start, color='gray')\n"
        "print(len(ax.lines), round(float(chunk.sum()), 4), plt.get_fignums())",
        "print(Out[3] is fig, line.figure is fig, round(float(line.get_ydata()[-1]), 4))",
        "fig",
        "plt.plot([1, 3, 2])\nprint(plt.get_fignums(), plt.gcf() is not fig)",
    ],
}


def main() -> None:
    here = Path(__file__).parent
    for name, cells in NOTEBOOKS.items():
        nb = nbformat.v4.new_notebook()
        nb.metadata["kernelspec"] = {"name": "sojourn", "display_name": "Python 3 (sojourn)", "language": "python"}
        nb.cells = [nbformat.v4.new_code_cell(src) for src in cells]
        nbformat.write(nb, here / name)


if __name__ == "__main__":
    main()
