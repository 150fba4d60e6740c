"""Reducers for torch (to be written)."""
