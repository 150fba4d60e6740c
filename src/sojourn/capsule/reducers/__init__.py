"""Reducers by family. Importing this package registers them all (no heavy imports)."""

from sojourn.capsule.reducers import (  # noqa: F401
    code,
    code_library,
    files,
    iterators,
    matplotlib,
    numpy,
    numpy_masked,
    pandas,
    pandas_internals,
    pandas_io,
    rng,
    stdlib,
    stdlib_objects,
    torch,
)
