"""Reducers by family. Importing this package registers them all (no heavy imports)."""

from sojourn.capsule.reducers import (  # noqa: F401
    code,
    code_library,
    files,
    iterators,
    numpy,
    pandas,
    rng,
    stdlib,
    torch,
)
