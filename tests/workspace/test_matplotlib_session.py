"""A program drawing with matplotlib pauses and resumes (`sojourn run` / `suspend` /
`resume`): its figures pass the write check, come back under their numbers with the same
current figure, and the resumed output equals a plain run's, pixels included."""

from __future__ import annotations

import pytest

from tests.workspace.conftest import Shell, finish

pytest.importorskip("matplotlib")

PLOT = """
import hashlib, time
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

fig, ax = plt.subplots(figsize=(3, 2))
other = plt.figure(4)
plt.figure(fig.number)
for i in range(25):
    ax.plot([0, 1], [i, i + 1])
    ax.scatter([i], [i], c=[i])
    fig.canvas.draw()
    pixels = hashlib.sha256(np.asarray(fig.canvas.buffer_rgba()).tobytes()).hexdigest()[:12]
    print(i, len(ax.lines), plt.get_fignums(), plt.gcf() is fig, pixels, flush=True)
    time.sleep(0.05)
print("done", other.number)
"""


@pytest.mark.slow
def test_a_plotting_program_suspends_and_resumes(sh: Shell) -> None:
    sh.write("plot.py", PLOT)
    expected = sh.plain("plot.py")
    run = sh.start("run", "plot.py")
    ws = sh.workspace_of(run)
    got = sh.read_lines(run, 5)
    sus = sh.cli("suspend", ws)
    assert sus.returncode == 0, sus.stderr  # the write check passed: a capsule to resume from
    code, out, err = finish(run)
    assert code == 75, err
    res = sh.cli("resume", ws)
    assert res.returncode == 0, res.stderr
    assert "".join(got) + out + res.stdout == expected
