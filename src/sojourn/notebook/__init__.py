"""Jupyter front end: the IPython extension (%sojourn) and the kernel provisioner.

Nothing heavy is imported here: ``%load_ext sojourn`` reaches :func:`load_ipython_extension`
through ``sojourn/__init__.py``, and IPython is already loaded by then.
"""

from __future__ import annotations

from typing import Any


def load_ipython_extension(shell: Any) -> None:
    from sojourn.notebook.magics import load_ipython_extension as load

    load(shell)


def unload_ipython_extension(shell: Any) -> None:
    from sojourn.notebook.magics import unload_ipython_extension as unload

    unload(shell)
