"""Which machine to run on, and when a move pays: a pure cost model and the policies on it."""
