"""Reducers for files (to be written)."""
