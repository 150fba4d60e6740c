"""Preemption notices (cloud metadata endpoints, Slurm, Kubernetes) turned into one pause request."""
