"""The ``sojourn`` command line: a thin layer over :mod:`sojourn.ops`."""
