"""Slurm: a job submitted with ``--signal=B:USR1@N`` gets SIGUSR1 in its batch shell about
N seconds before its time limit (Slurm may send it up to 60 s earlier), and, where the
cluster sets ``SlurmctldParameters=preempt_send_user_signal``, when it is preempted. The
provider's job script ``exec``s the sojourn supervisor, so the supervisor is that shell.

Configured by the job's environment (the Slurm provider writes it into the script):
``SOJOURN_SLURM_SIGNAL`` (default ``USR1``) and ``SOJOURN_SLURM_NOTICE_S`` (the N of
``--signal``). SIGTERM is left as it is: Slurm sends it for ``scancel`` and at the time
limit, and it pauses the program like anywhere else (stop reason ``suspended``).
"""

from __future__ import annotations

import os
import signal

from sojourn.notices.base import SignalSource

DEFAULT_NOTICE_S = 60.0


def signal_number(name: str) -> int:
    n = name.strip().upper()
    if n.isdigit():
        return int(n)
    if not n.startswith("SIG"):
        n = "SIG" + n
    try:
        return int(signal.Signals[n])
    except KeyError:
        raise ValueError(f"no signal {name!r}: write e.g. USR1, USR2 or 10") from None


def source(env: dict[str, str] | None = None) -> SignalSource:
    env = dict(os.environ) if env is None else env
    sig = signal_number(env.get("SOJOURN_SLURM_SIGNAL", "USR1"))
    notice_s = float(env.get("SOJOURN_SLURM_NOTICE_S", DEFAULT_NOTICE_S))
    return SignalSource("slurm", sig, notice_s)


def in_job(env: dict[str, str] | None = None) -> bool:
    env = dict(os.environ) if env is None else env
    return bool(env.get("SLURM_JOB_ID"))
