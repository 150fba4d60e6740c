"""Reducers for pandas (to be written)."""
