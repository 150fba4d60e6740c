"""What notebooks hold travels like a script's: matplotlib figures (also those only `Out`
holds, drawn by the inline backend) and generators defined in cells, checked by moving the
kernel's process (a fresh interpreter restores and checks every fingerprint)."""

from __future__ import annotations

import pytest

from tests.notebook.kernels import Kernel

# The figure's pixels, drawn by Agg whatever canvas the figure has (savefig puts it back).
PIXELS = ("(lambda f, b=__import__('io').BytesIO(): (f.savefig(b, format='rgba'), "
          "__import__('hashlib').sha256(b.getvalue()).hexdigest())[1])")


@pytest.mark.slow
def test_figures_travel_also_when_only_out_holds_them(jupyter) -> None:
    pytest.importorskip("matplotlib")
    k = Kernel(jupyter)
    try:
        k.out("import matplotlib.pyplot as plt\nimport numpy as np\n"
              "fig, ax = plt.subplots()\nax.plot(np.arange(5), np.arange(5) ** 2)\nax.scatter([1, 2], [3, 4], c=[1, 2])")
        k.run("fig")                                   # Out[2]: shown (drawn) by the inline backend
        k.run("plt.figure(figsize=(2, 2)).add_subplot().bar(['a', 'b'], [2, 1])[0].figure")  # only Out[3] holds it
        before = k.out(f"print({PIXELS}(fig), {PIXELS}(Out[3]), Out[2] is fig)")
        pid = k.pid
        out, err, _ = k.run("%sojourn move --to local")
        assert "moved to local" in out, out + err
        assert k.pid != pid
        assert k.out(f"print({PIXELS}(fig), {PIXELS}(Out[3]), Out[2] is fig)") == before
        assert k.out("print(type(Out[3]).__name__, Out[3].axes[0].patches[0].get_height())") == "Figure 2"
    finally:
        k.close()


GENERATORS = '''
def countdown(n, step=1):
    total = 0
    while n > 0:
        total += n
        yield n, total
        n -= step

def pipeline(source):
    for item in source:
        yield item[0] * 10
'''


@pytest.mark.slow
def test_generators_defined_in_cells_resume_from_their_source(jupyter) -> None:
    k = Kernel(jupyter)
    try:
        k.out(GENERATORS)
        k.out("c = countdown(5)\nfirst = [next(c), next(c)]\nfresh = countdown(2)\n"
              "p = pipeline(countdown(9, 3))\nhead = next(p)\nsame = {'c': c}")
        assert k.out("print(first, head)") == "[(5, 5), (4, 9)] 90"
        assert "cannot travel: nothing" in k.out("%sojourn status")  # sojourn.scan agrees
        # The write check of a suspend: restored in a fresh interpreter, every fingerprint.
        assert "verified in a fresh interpreter" in k.out("%sojourn checkpoint --verify")
        pid = k.pid
        out, err, _ = k.run("%sojourn move --to local")
        assert "moved to local" in out, out + err
        assert k.pid != pid
        # Each carries on where it stood, with its locals; aliasing and unstarted ones too.
        assert k.out("print(list(c), list(fresh), list(p), same['c'] is c)") == (
            "[(3, 12), (2, 14), (1, 15)] [(2, 2), (1, 3)] [60, 30] True")
        # A generator function defined after the move is adopted too, and a finished one travels.
        k.out("def again():\n    yield 1\n    yield 2\ng2 = again()\nnext(g2)")
        out, err, _ = k.run("%sojourn move --to local")
        assert "moved to local" in out, out + err
        assert k.out("print(list(g2), list(c), list(countdown(2)))") == "[2] [] [(2, 2), (1, 3)]"
        # %reset empties user_ns, runtime names too; the same cell run again is adopted again.
        k.out("%reset -f")
        k.out(GENERATORS)
        k.out("g3 = pipeline([(1,), (2,), (3,)])\nnext(g3)")
        out, err, _ = k.run("%sojourn move --to local")
        assert "moved to local" in out, out + err
        assert k.out("print(list(g3))") == "[20, 30]"
    finally:
        k.close()


def test_generators_that_cannot_resume_say_what_to_do_in_a_notebook(jupyter) -> None:
    k = Kernel(jupyter)
    try:
        k.out("squares = (i * i for i in range(10))\nnext(squares)")
        _, err, _ = k.run("%sojourn checkpoint")
        assert "squares" in err and "generator expression" in err and "top level of a cell" in err, err
        assert "sojourn run" not in err, err
        k.out("del squares\nclass Box:\n    def __iter__(self):\n        yield 1\nit = iter(Box())\nnext(it)")
        _, err, _ = k.run("%sojourn checkpoint")
        assert "Box.__iter__" in err and "plain def at the top level of a cell" in err, err
        assert "sojourn run" not in err, err
    finally:
        k.close()
