"""The watcher: the configured sources, each polled in its own thread or claimed from a
signal, turned into one callback per notice on one dispatch thread.

Which sources run (``SOJOURN_NOTICES``):

* ``auto`` (default): what is cheap to know without the network. Slurm when
  ``SLURM_JOB_ID`` is set, Kubernetes when ``KUBERNETES_SERVICE_HOST`` is set and this is the
  container's PID 1, a cloud when
  the machine's DMI data names it (``/sys/class/dmi/id``: "Amazon EC2", "Google Compute
  Engine", Azure's chassis tag) or its endpoint was set explicitly (``SOJOURN_IMDS_ENDPOINT``,
  ``SOJOURN_GCE_METADATA_ENDPOINT``, ``SOJOURN_AZURE_IMDS_ENDPOINT``). On a laptop: nothing.
* ``none``: nothing.
* a comma-separated list of ``aws``, ``aws-rebalance``, ``gcp``, ``azure``, ``slurm``,
  ``kubernetes``.

Nothing here blocks the caller: sources are built without I/O, the first request to a
metadata endpoint is made in the source's thread, and an endpoint that does not answer is
retried with a growing pause (up to a minute) and reported once.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from sojourn.errors import SojournError
from sojourn.notices import aws, azure, gcp, kubernetes, slurm
from sojourn.notices.base import Notice, PolledSource, SignalSource, Unreachable

NAMES = ("aws", "aws-rebalance", "gcp", "azure", "slurm", "kubernetes")
AZURE_ASSET_TAG = "7783-7084-3265-9085-8269-3286-77"
MAX_BACKOFF = 60.0

NoticeCallback = Callable[[Notice], None]
LogCallback = Callable[[str], None]


class NoticeConfigError(SojournError, ValueError):
    """``SOJOURN_NOTICES`` names something that is not a notice source."""


def _dmi(name: str, root: str = "/sys/class/dmi/id") -> str:
    try:
        return (Path(root) / name).read_text(errors="replace").strip()
    except OSError:
        return ""


def detect(env: dict[str, str] | None = None, dmi_root: str = "/sys/class/dmi/id", pid: int | None = None) -> list[str]:
    """The sources ``auto`` turns on here (no network; a few small file reads)."""
    env = dict(os.environ) if env is None else env
    found: list[str] = []
    vendor = " ".join(_dmi(n, dmi_root) for n in ("sys_vendor", "board_vendor", "product_name", "bios_vendor"))
    if "Amazon EC2" in vendor or env.get("SOJOURN_IMDS_ENDPOINT"):
        found += ["aws", "aws-rebalance"]
    if "Google" in vendor or env.get("SOJOURN_GCE_METADATA_ENDPOINT"):
        found.append("gcp")
    if _dmi("chassis_asset_tag", dmi_root) == AZURE_ASSET_TAG or env.get("SOJOURN_AZURE_IMDS_ENDPOINT"):
        found.append("azure")
    if slurm.in_job(env):
        found.append("slurm")
    if kubernetes.in_pod(env, pid):
        found.append("kubernetes")
    return found


def configured_names(env: dict[str, str] | None = None, dmi_root: str = "/sys/class/dmi/id") -> list[str]:
    env = dict(os.environ) if env is None else env
    text = env.get("SOJOURN_NOTICES", "auto").strip().lower() or "auto"
    if text == "none":
        return []
    if text == "auto":
        return detect(env, dmi_root)
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in NAMES]
    if bad:
        raise NoticeConfigError(f"SOJOURN_NOTICES names unknown sources {', '.join(bad)}; known: "
                                f"{', '.join(NAMES)} (or auto, none)")
    return list(dict.fromkeys(names))


def build(names: list[str], env: dict[str, str] | None = None) -> list[PolledSource | SignalSource]:
    """Sources for ``names`` (no I/O)."""
    env = dict(os.environ) if env is None else env
    interval = float(env.get("SOJOURN_NOTICE_POLL_S", 5.0))
    out: list[PolledSource | SignalSource] = []
    imds: aws.Imds | None = None
    for n in names:
        if n in ("aws", "aws-rebalance"):
            imds = imds or aws.Imds(env.get("SOJOURN_IMDS_ENDPOINT") or aws.DEFAULT_ENDPOINT)
            cls = aws.SpotInstanceAction if n == "aws" else aws.RebalanceRecommendation
            out.append(cls(imds, interval=interval))
        elif n == "gcp":
            out.append(gcp.Preempted(env.get("SOJOURN_GCE_METADATA_ENDPOINT") or gcp.endpoint()))
        elif n == "azure":
            out.append(azure.ScheduledEvents(env.get("SOJOURN_AZURE_IMDS_ENDPOINT") or azure.DEFAULT_ENDPOINT,
                                             interval=interval))
        elif n == "slurm":
            out.append(slurm.source(env))
        elif n == "kubernetes":
            out.append(kubernetes.source(env))
    return out


class Watcher:
    """Runs ``sources`` and calls ``on_notice`` (on one thread of its own, one notice at a
    time, in the order they came) for each notice. A source delivers at most one notice."""

    def __init__(self, sources: list[PolledSource | SignalSource], on_notice: NoticeCallback, *,
                 log: LogCallback | None = None):
        self.sources = sources
        self.on_notice = on_notice
        self.log = log or _stderr
        self.notices: list[Notice] = []
        self._fired: set[str] = set()
        self._queue: queue.SimpleQueue[Notice | None] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._delivered: list[tuple[PolledSource | SignalSource, Notice]] = []

    @property
    def polled(self) -> list[PolledSource]:
        return [s for s in self.sources if isinstance(s, PolledSource)]

    def start(self) -> Watcher:
        t = threading.Thread(target=self._dispatch, name="sojourn-notices", daemon=True)
        t.start()
        self._threads.append(t)
        for s in self.polled:
            t = threading.Thread(target=self._poll_loop, args=(s,), name=f"sojourn-notice-{s.name}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def claims(self, signum: int) -> bool:
        """Whether a configured source turns ``signum`` into a notice (then the caller must not
        treat the signal any other way)."""
        return any(isinstance(s, SignalSource) and s.signum == signum for s in self.sources)

    def signal(self, signum: int) -> bool:
        """Hand a received signal over (safe in a signal handler: it only queues). True when a
        source claimed it; a second one of the same source is claimed and dropped."""
        claimed = False
        for s in self.sources:
            if isinstance(s, SignalSource) and s.signum == signum:
                claimed = True
                if s.name not in self._fired:
                    self._fired.add(s.name)
                    n = s.notice()
                    self._delivered.append((s, n))
                    self._queue.put(n)
        return claimed

    def stop(self, acknowledge: bool = True) -> None:
        """Stop watching; acknowledge the notices that were handled where the platform wants
        to hear it (Azure). Poll threads are daemons blocked at most one request: not joined."""
        self._stop.set()
        self._queue.put(None)
        if not acknowledge:
            return
        for src, n in list(self._delivered):
            if isinstance(src, PolledSource):
                try:
                    src.acknowledge(n)
                except Exception as e:
                    self.log(f"could not acknowledge the {n.source} notice: {e}")

    # -- threads ---------------------------------------------------------------------------

    def _poll_loop(self, src: PolledSource) -> None:
        backoff = 0.0
        reported = False
        while not self._stop.is_set():
            try:
                n = src.poll()
            except Unreachable as e:
                if not reported:
                    reported = True
                    self.log(f"notices: {src.describe()} cannot be read ({e}); retrying in the background")
                backoff = min(MAX_BACKOFF, max(src.interval, backoff * 2 or src.interval))
                self._stop.wait(backoff)
                continue
            except Exception as e:  # a bug in a source must not take the supervisor with it
                self.log(f"notices: {src.describe()} failed: {e!r}")
                self._stop.wait(MAX_BACKOFF)
                continue
            if reported:
                reported = False
                self.log(f"notices: {src.describe()} answers again")
            backoff = 0.0
            if n is not None and not self._stop.is_set():
                with self._lock:
                    self._fired.add(src.name)
                    self._delivered.append((src, n))
                self._queue.put(n)
                return
            self._stop.wait(src.interval)

    def _dispatch(self) -> None:
        while True:
            n = self._queue.get()
            if n is None:
                return
            self.notices.append(n)
            try:
                self.on_notice(n)
            except Exception as e:
                self.log(f"notices: handling the {n.source} notice failed: {e!r}")


def _stderr(message: str) -> None:
    print(f"sojourn: {message}", file=sys.stderr, flush=True)


def watch(on_notice: NoticeCallback, *, env: dict[str, str] | None = None, log: LogCallback | None = None,
          dmi_root: str = "/sys/class/dmi/id") -> Watcher | None:
    """Start the sources configured here (``SOJOURN_NOTICES``, default ``auto``); ``None``
    when there are none. A bad configuration is reported through ``log`` and watches nothing
    rather than stopping the program."""
    try:
        sources = build(configured_names(env, dmi_root), env)
    except (NoticeConfigError, ValueError) as e:
        (log or _stderr)(f"notices are off: {e}")
        return None
    if not sources:
        return None
    return Watcher(sources, on_notice, log=log).start()


def describe(w: Watcher | None) -> str:
    if w is None:
        return "no notice sources"
    return ", ".join(s.describe() for s in w.sources)


def wait_notice(w: Watcher, timeout: float) -> Notice | None:
    """For tests and tools: the first notice within ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if w.notices:
            return w.notices[0]
        time.sleep(0.02)
    return None

