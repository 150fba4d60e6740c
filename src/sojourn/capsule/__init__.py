"""Capsules: capture a live namespace into portable, verified chunks and restore it anywhere."""
