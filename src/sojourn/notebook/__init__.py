"""Jupyter front end: the IPython extension (%sojourn) and the kernel provisioner."""
