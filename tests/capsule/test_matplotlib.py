"""matplotlib figures travel: a drawn figure restores in a fresh interpreter, passes its
fingerprint check and ``sojourn.verify``, draws the same pixels, and pyplot's figures come
back under their numbers with the same current figure, also figures no variable holds."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

import sojourn
from tests.conftest import last_json, run_py

pytest.importorskip("matplotlib")

ENV = {"MPLBACKEND": "Agg"}

SETUP = """
    import hashlib, sys, json
    import numpy as np
    import matplotlib.pyplot as plt
    import sojourn

    fig, ax = plt.subplots(figsize=(4, 3))
    ax.plot(np.arange(10), np.arange(10) ** 2, label="squares")
    ax.scatter([1, 2, 3], [4, 5, 6], c=[1, 2, 3])
    ax.set_title("growth")
    ax.legend()
    fig.colorbar(ax.collections[0])
    twin = ax.twinx()
    twin.plot([0, 9], [1, 0], "r--")
    fig.canvas.draw()                      # a notebook's inline backend draws every figure it shows
    other = plt.figure(7)
    other.add_subplot().bar(["a", "b"], [3, 1])
    unheld = plt.figure(3)                 # held by pyplot only once the name goes
    unheld.add_subplot().plot([1, 2, 1])
    del unheld
    plt.figure(fig.number)                 # the current figure: not the last one made
    lines = ax.get_lines()                 # artists held apart from their figure
    everything = {"fig": fig, "line": lines[0], "axes": ax}
"""

CHECKS = """
    from matplotlib._pylab_helpers import Gcf   # reads pyplot's figures without changing the current one

    def pixels(f):
        f.canvas.draw()
        return hashlib.sha256(np.asarray(f.canvas.buffer_rgba()).tobytes()).hexdigest()
    out = {
        "nums": plt.get_fignums(),
        "current_is_fig": plt.gcf() is fig,
        "numbers": [fig.number, other.number],
        "pixels": [pixels(Gcf.figs[n].canvas.figure) for n in plt.get_fignums()],
        "unheld": Gcf.figs[3].canvas.figure.axes[0].get_lines()[0].get_ydata().tolist(),
        "aliases": [everything["fig"] is fig, everything["line"] is lines[0], lines[0].figure is fig,
                    everything["axes"] is ax, ax.figure is fig, twin.figure is fig],
        "title": ax.get_title(),
        "ylim": list(ax.get_ylim()),
    }
"""


@pytest.mark.slow
def test_a_drawn_figure_and_pyplots_figures_come_back(tmp_path: Path, repo: str) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    cap = run_py("import sys\n" + textwrap.dedent(SETUP) + textwrap.dedent(CHECKS)
                 + "\nref = sojourn.capture(globals(), sys.argv[1])\nprint(ref.id)\nprint(json.dumps(out))\n",
                 repo, cwd=src, env=ENV)
    capsule = cap.stdout.splitlines()[-2].strip()
    before = json.loads(cap.stdout.splitlines()[-1])
    assert before["nums"] == [1, 3, 7] and before["current_is_fig"] and before["unheld"] == [1, 2, 1]
    report = sojourn.verify(capsule, repo)  # the write check: a fresh interpreter, every fingerprint
    assert report.ok, report.error
    res = run_py(
        "import sys, json, hashlib\nimport numpy as np\nimport sojourn\n"
        "ns = sojourn.restore(sys.argv[2], sys.argv[1], into=globals())\n"
        "import matplotlib.pyplot as plt\n" + textwrap.dedent(CHECKS)
        + "\nout['notes'] = ns.notes\nprint(json.dumps(out))\n",
        repo, capsule, cwd=dst, env=ENV)
    after = last_json(res)
    assert isinstance(after, dict)
    assert after.pop("notes") == []
    assert after == before


def test_figure_numbers_taken_on_the_destination_are_said(tmp_path: Path, repo: str) -> None:
    """Restoring into a process that already has a figure 1: the restored figure 1 gets the
    next number, and the restore says so (nothing is replaced silently)."""
    cap = run_py("import sys, sojourn\nimport matplotlib.pyplot as plt\nfig = plt.figure(1)\n"
                 "fig.add_subplot().plot([3, 2, 1])\nprint(sojourn.capture(globals(), sys.argv[1]).id)\n",
                 repo, cwd=tmp_path, env=ENV)
    capsule = cap.stdout.split()[-1]
    res = run_py(
        "import sys, json, sojourn\nimport matplotlib.pyplot as plt\nmine = plt.figure(1)\n"
        "ns = sojourn.restore(sys.argv[2], sys.argv[1])\n"
        "print(json.dumps([plt.get_fignums(), ns['fig'].number, plt.figure(1) is mine, ns.notes]))\n",
        repo, capsule, cwd=tmp_path, env=ENV)
    nums, number, mine_kept, notes = last_json(res)  # type: ignore[misc]
    assert nums == [1, 2] and number == 2 and mine_kept
    assert notes == ["pyplot figure 1 came back as figure 2: this process already had a figure 1"]
