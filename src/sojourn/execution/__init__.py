"""Execution: pausing a running script between two statements and resuming it (see docs/design.md)."""
