"""Kubernetes: a pod being evicted or preempted (a Spot node going away, a drain) gets
SIGTERM on its container's PID 1, then SIGKILL after ``terminationGracePeriodSeconds``
(30 s unless the pod says otherwise). Run ``sojourn run`` as the container's command (not
under a shell that swallows the signal) and set ``SOJOURN_K8S_GRACE_S`` to the pod's grace
period. ``auto`` turns this source on only for the container's PID 1 in a pod
(``KUBERNETES_SERVICE_HOST`` is set): a ``sojourn`` under an init process (tini, dumb-init),
or a test runner that happens to run in a pod, is not taken for one; set
``SOJOURN_NOTICES=kubernetes`` there. SIGTERM then ends the allocation as ``preempted``.
"""

from __future__ import annotations

import os
import signal

from sojourn.notices.base import SignalSource

DEFAULT_GRACE_S = 30.0


def source(env: dict[str, str] | None = None) -> SignalSource:
    env = dict(os.environ) if env is None else env
    return SignalSource("kubernetes", int(signal.SIGTERM), float(env.get("SOJOURN_K8S_GRACE_S", DEFAULT_GRACE_S)))


def in_pod(env: dict[str, str] | None = None, pid: int | None = None) -> bool:
    """Whether this process is a pod's container's PID 1 (what Kubernetes signals)."""
    env = dict(os.environ) if env is None else env
    return bool(env.get("KUBERNETES_SERVICE_HOST")) and (os.getpid() if pid is None else pid) == 1
