"""Preemption notices (cloud metadata endpoints, Slurm, Kubernetes) turned into one pause request.

    w = notices.watch(on_notice)     # the sources configured here (SOJOURN_NOTICES, default auto)
    ...                              # on_notice(Notice) runs on the watcher's thread
    w.signal(signum)                 # from a signal handler: True when a source claims it
    w.stop()                         # and acknowledge (Azure) once the capsule is durable

One module per source: :mod:`aws` (spot instance-action, rebalance), :mod:`gcp`
(instance/preempted), :mod:`azure` (Scheduled Events ``Preempt``), :mod:`slurm`
(``--signal``), :mod:`kubernetes` (SIGTERM). See docs/notices.md.
"""

from sojourn.notices.base import Notice, PolledSource, SignalSource, Unreachable
from sojourn.notices.watcher import (
           NAMES,
           NoticeConfigError,
           Watcher,
           build,
           configured_names,
           detect,
           watch,
)

__all__ = ["NAMES", "Notice", "NoticeConfigError", "PolledSource", "SignalSource", "Unreachable", "Watcher",
           "build", "configured_names", "detect", "watch"]
