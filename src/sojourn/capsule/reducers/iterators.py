"""Reducers for iterators (to be written)."""
