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
