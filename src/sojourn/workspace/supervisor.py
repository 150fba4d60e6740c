"""The supervisor of one allocation: it starts the session process, keeps its output, serves
pause requests, and records how the allocation ended.

It runs outside the program (in the ``sojourn run`` / ``sojourn resume`` process), so it
survives the program: a crash, an out-of-memory error, ``kill -9`` of the session, all end in
a ``stopped`` event that says what happened. Threads:

* the pump tails the session's stdout and stderr, which are files on this machine (so that
  no output is lost when the supervisor dies, see logs.py), and reads its status pipe: output
  goes to the terminal (``on_output``) and, byte for byte, to the workspace log; status
  messages become events;
* the watcher polls the repository for pause requests (``request.<ws>.<epoch>.<n>``, written
  by ``sojourn suspend`` from any host), hands them to the session over the control pipe,
  reports what a pending pause waits for, writes log pieces, and checks that this allocation
  still holds the authority (if not, another holder runs the workspace and this copy stops);
* the main thread waits for the session and forwards signals to it (supsignals.py): SIGTERM
  and SIGUSR1 as they are, SIGHUP as SIGTERM (a closed terminal pauses the program), Ctrl-C
  as a pause (twice within 3 s: ``KeyboardInterrupt`` in the program).
"""

from __future__ import annotations

import json
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from sojourn import notices, threads
from sojourn.workspace import events as E
from sojourn.workspace import records as R
from sojourn.workspace.capsules import capsule_facts, child_env, verify_capsule
from sojourn.workspace.files import files_event_of
from sojourn.workspace.liveness import process_start
from sojourn.workspace.logs import LogWriter, output_base
from sojourn.workspace.machine import spend
from sojourn.workspace.output import OutputCallback, OutputFiles
from sojourn.workspace.store import WorkspaceStore
from sojourn.workspace.supsignals import FORWARDED, SignalForwarding

__all__ = ["FORWARDED", "Outcome", "SessionSpec", "Supervisor"]

EXIT_PAUSED = 75  # the program paused and its capsule passed the write check
EXIT_PAUSE_FAILED = 76  # a pause was taken but its capsule failed the check, or none could be taken
EXIT_OOM = 77  # the program ran out of memory (`sojourn show` says whether a capsule was taken)

# How often the pump reads the output files when the status pipe is quiet: every 25 ms while
# the program writes, backing off to 100 ms while it does not (an idle session costs little).
TAIL_INTERVAL, TAIL_IDLE = 0.025, 0.1


@dataclass
class SessionSpec:
    workspace: str
    allocation: str
    epoch: int
    python: str
    cwd: str
    script: str | None = None
    argv: list[str] = field(default_factory=list)
    capsule: str | None = None  # resume from it
    memory: int | None = None
    scan_interval: float = 600.0
    # Issue 4, machines (workspace/machine.py): CPUs the session may use, the hard stop in
    # seconds after the start (the watchdog suspends the session), the price for the spend,
    # and whether capsules carry the files of ``cwd`` (a machine's scratch directory).
    cpus: int | None = None
    hard_stop: float | None = None
    price_per_hour: float = 0.0
    files: bool = False
    incoming: bool = False  # the destination of a move: the session waits for its capsule (migrate.py)
    preload: list[str] = field(default_factory=list)  # modules the incoming session imports while it waits


@dataclass
class Outcome:
    reason: str  # a stop reason (records.STOP_REASONS)
    state: str
    exit_code: int  # what `sojourn run`/`resume` exits with
    program_exit_code: int | None
    detail: str
    capsule: R.CapsuleEntry | None = None
    ran: bool = True
    max_rss: int | None = None
    refusals: list[dict[str, Any]] = field(default_factory=list)


oom_reason = E.oom_reason


class Supervisor(SignalForwarding):
    def __init__(self, store: WorkspaceStore, spec: SessionSpec, *, on_output: OutputCallback | None = None,
                 log_interval: float = 2.0, poll_interval: float | None = None):
        self.store = store
        self.spec = spec
        self.on_output = on_output
        self.repo_url = store.repo.url
        self.log = LogWriter(store.backend, spec.workspace, spec.allocation, interval=log_interval, ends=(0, 0))
        remote = type(store.backend).__name__ == "S3Backend"
        self.poll_interval = poll_interval if poll_interval is not None else (1.0 if remote else 0.1)
        self.proc: subprocess.Popen[bytes] | None = None
        self._ctl_w: int | None = None
        self._status_r: int | None = None
        self.output = OutputFiles(spec.workspace, spec.allocation)  # read as they grow
        self._done = threading.Event()
        self._lock = threading.Lock()
        self.capsule_msg: dict[str, Any] | None = None
        self.exit_msg: dict[str, Any] | None = None
        self.status_msg: dict[str, Any] | None = None
        self.refusals: list[dict[str, Any]] = []
        self.pending: dict[str, Any] | None = None
        self.lost_authority: str | None = None
        self.started = False
        self.t0 = time.time()  # for the spend
        self.hard_stopped: str | None = None  # what the watchdog did, once it fired
        self.notices: notices.Watcher | None = None  # issue 6: preemption notices (see _on_notice)
        # Moves (migrate.py): the session's messages for the protocol, the move being served,
        # how it ended here; an incoming allocation records nothing until it commits.
        self.inbox: queue.Queue[dict[str, Any]] = queue.Queue()
        self.moving: str | None = None
        self.moved: Any = None
        self.discarded: str | None = None
        self.incoming: Any = None
        self.committed = not spec.incoming
        self.held_started: dict[str, Any] | None = None
        self.background: list[threading.Thread] = []  # write checks of checkpoints (checkpoints.py)
        self._interrupted: float | None = None  # when the last Ctrl-C asked for a pause (monotonic)
        self._pump_errors = 0
        self._append_lock = threading.Lock()
        self._backlog: list[dict[str, Any]] = []  # events an outage kept from the repository

    # -- events ----------------------------------------------------------------------------

    def append(self, *events: dict[str, Any], raise_errors: bool | None = None) -> None:
        """Append events; events the repository could not take (an outage) are kept and
        written, first and in order, by the next append. Only the main thread hears the error
        (or a caller that retries itself: ``raise_errors``): the output pump and the watcher
        must outlive a store that does not answer for a while (issue 12: a dead pump never
        read the capsule the session wrote next)."""
        from sojourn.errors import RepositoryError

        with self._append_lock:
            kept = len(self._backlog)
            todo = [*self._backlog, *events]
            try:
                self.store.append(self.spec.workspace, self.spec.epoch, self.spec.allocation, *todo)
                self._backlog = []
            except RepositoryError as e:
                written = int(getattr(e, "appended", 0))
                if raise_errors or (raise_errors is None and threading.current_thread() is threading.main_thread()):
                    # The caller hears it and keeps its own events: only what was kept before stays here.
                    self._backlog = todo[min(written, kept):kept]
                    raise
                self._backlog = todo[written:]
                print(f"sojourn: the repository did not take {len(self._backlog)} event(s) ({e}); they are kept and "
                      "written once it answers", file=sys.stderr)

    # -- the whole life of the allocation --------------------------------------------------

    def run(self) -> Outcome:
        try:
            self._spawn()
        except OSError as e:
            return self._finish_without_session(f"the session could not start with {self.spec.python}: {e}")
        assert self.proc is not None
        self.notices = notices.watch(self._on_notice)  # issue 6: None where no source is configured
        old = self._install_signals()
        pump = threading.Thread(target=self._pump, name="sojourn-pump", daemon=True)
        watch = threading.Thread(target=self._watch, name="sojourn-watch", daemon=True)
        for t in (pump, watch):  # at start: a small stack where the default one is refused
            if threads.start(t) is None:
                raise RuntimeError(f"{t.name}: can't start new thread")
        if self.committed:  # a move's destination starts it once it holds the workspace
            self.start_watchdog()
        try:
            _, status, usage = os.wait4(self.proc.pid, 0)
        finally:
            self._restore_signals(old)
        rc = os.waitstatus_to_exitcode(status)
        self.proc.returncode = rc
        max_rss = int(usage.ru_maxrss * (1 if sys.platform == "darwin" else 1024))
        self._done.set()
        pump.join(timeout=30.0)  # bounded: the status pipe is given 2 s, then the files are read to their end
        watch.join(timeout=5.0)
        while watch.is_alive() and (self.moving is not None or (not self.committed and self.discarded is None)):
            watch.join(timeout=0.5)  # a move settles its verdict even when the session is gone
        self._close_fds()
        for t in self.background:  # a checkpoint's event comes before the stop
            t.join()
        if self.discarded is None and self.committed:
            self.log.flush()
        # Logged (or, for a move's destination that never held the workspace, not to be).
        self.output.remove()
        outcome = self._finish(rc, max_rss)
        if self.notices is not None:  # issue 6: acknowledged (Azure) once the capsule is durable
            self.notices.stop()
        return outcome

    def _spawn(self) -> None:
        s = self.spec
        ctl_r, ctl_w = os.pipe()
        st_r, st_w = os.pipe()
        fds = [ctl_r, ctl_w, st_r, st_w]
        try:
            out_w, err_w = self.output.create()
        except OSError:
            for fd in fds:
                os.close(fd)
            raise
        fds += [out_w, err_w]
        cmd = [s.python, "-m", "sojourn.workspace.session", "--repo", self.repo_url, "--workspace", s.workspace,
               "--allocation", s.allocation, "--epoch", str(s.epoch), "--status-fd", str(st_w),
               "--control-fd", str(ctl_r), "--scan-interval", str(s.scan_interval)]
        if s.memory:
            cmd += ["--memory", str(s.memory)]
        if s.cpus:
            cmd += ["--cpus", str(s.cpus)]
        if s.files:
            cmd += ["--files", s.cwd]
        if s.incoming:
            cmd += ["incoming", "--preload", ",".join(s.preload)]
        elif s.capsule:
            cmd += ["resume", s.capsule]
        else:
            assert s.script is not None
            cmd += ["run", s.script, *s.argv]
        try:
            # Its own session: the terminal's Ctrl-C and hang-up reach the supervisor, which
            # forwards them once, and the program does not die with the terminal. Its stdout
            # and stderr are files (opened for appending): what it writes is kept whether or
            # not anyone reads it, so its writes never fail and nothing is lost when the
            # supervisor dies.
            self.proc = subprocess.Popen(cmd, cwd=s.cwd, env=child_env(), stdout=out_w, stderr=err_w,
                                         pass_fds=(st_w, ctl_r), start_new_session=True)
        except OSError:
            for fd in fds:
                os.close(fd)
            self.output.close()
            self.output.remove()
            raise
        for fd in (ctl_r, st_w, out_w, err_w):
            os.close(fd)
        self._ctl_w, self._status_r = ctl_w, st_r

    def _close_fds(self) -> None:
        for fd in (self._ctl_w, self._status_r):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._ctl_w = self._status_r = None
        self.output.close()

    # -- the pump: output and status -------------------------------------------------------

    def _pump(self) -> None:
        """Tail the output files (stdout, then stderr, to their end) and wait on the status
        pipe for at most :data:`TAIL_INTERVAL` (:data:`TAIL_IDLE`) between rounds, until the
        session has exited, its status pipe ended (or 2 s passed), and the files were read
        once more."""
        status_fd = self._status_r
        assert status_fd is not None
        status_buf = b""
        status_open = True
        deadline: float | None = None
        wait = TAIL_INTERVAL
        while True:
            if self._done.is_set() and deadline is None:
                deadline = time.monotonic() + 2.0
            wait = TAIL_INTERVAL if self._tail() else min(TAIL_IDLE, wait * 2)
            if deadline is not None and (not status_open or time.monotonic() > deadline):
                break
            if not status_open:
                self._done.wait(wait)
                continue
            try:
                ready, _, _ = select.select([status_fd], [], [], wait)
                data = os.read(status_fd, 1 << 16) if ready else None
            except (OSError, ValueError):  # closed under us
                data = b""
            if data is None:
                continue
            if not data:
                status_open = False
                continue
            status_buf += data
            while b"\n" in status_buf:
                line, status_buf = status_buf.split(b"\n", 1)
                try:
                    self._status(line)
                except Exception as e:  # an event that could not be recorded must not stop the pump
                    self._pump_error(e)
        self._tail()  # what the session wrote last, before its status pipe ended

    def _tail(self) -> int:
        try:
            got, echoing = self.output.read(self.log, self.on_output)
        except Exception as e:  # the repository hiccuped: keep pumping (the files keep the output)
            self._pump_error(e)
            return 0
        if not echoing:
            self.on_output = None
        return got

    def _pump_error(self, e: Exception) -> None:
        self._pump_errors += 1
        if self._pump_errors % 50 == 1:
            print(f"sojourn: supervisor of {self.spec.workspace}: {type(e).__name__}: {e}", file=sys.stderr)

    def _status(self, line: bytes) -> None:
        try:
            msg = json.loads(line)
        except ValueError:
            return
        kind = msg.get("event")
        if kind in ("warm", "restored", "running", "exit") or (kind == "capsule" and msg.get("move")) or (
                kind == "refusal" and self.moving):
            self.inbox.put(msg)  # for the move protocol (migrate.py)
            if kind != "exit" and kind != "refusal":
                return
        output = output_base(self.spec.workspace, self.spec.allocation)
        if kind == "started" and not self.committed:
            self.started = True
            self.held_started = {**msg, "output": output}  # recorded by the move's commit
        elif kind == "started":
            self.started = True
            self.append({"type": "started", "allocation": self.spec.allocation, "session_pid": msg.get("pid"),
                         "session_pid_start": msg.get("pid_start"), "python_version": msg.get("python_version"),
                         "python": msg.get("python_version"), "arch": msg.get("arch"),
                         "platform": msg.get("platform"), "output": output})
        elif kind == "capsule":
            if msg.get("action") == "exit":
                self.capsule_msg = msg
            elif self.pending is not None and self.pending.get("kind") == "checkpoint":
                from sojourn.workspace.checkpoints import record_checkpoint

                with self._lock:
                    n, self.pending = self.pending.get("n"), None
                record_checkpoint(self, msg, n)
            else:
                self.append({"type": "note", "message": f"checkpoint {msg.get('capsule')} at {msg.get('where')}"})
        elif kind == "refusal":
            self.refusals.append(msg)
            with self._lock:
                self.pending = None
            if msg.get("capsule"):  # written, failed its write check in the session: marked failed
                entry = R.CapsuleEntry(id=str(msg["capsule"]), parent=None, reason=str(msg.get("reason")),
                                       where="", size=0, time=R.now(), allocation=self.spec.allocation,
                                       verified=False, error=str(msg.get("error") or msg.get("message")))
                self.append({"type": "capsule", "capsule": entry.__dict__})
            self.append({"type": "refused", "reason": msg.get("reason"), "message": msg.get("message"),
                         "problems": msg.get("problems", [])})
            if self.hard_stopped is not None and msg.get("reason") == "hard-stop":
                self._end_hard_stop("the session was stopped")  # refused: no use waiting for the grace
        elif kind == "edited":
            self.append({"type": "edited", "capsule": msg.get("capsule"), "files": msg.get("files", [])})
        elif kind == "status":
            self.status_msg = msg
        elif kind == "exit":
            self.exit_msg = msg

    # -- the watcher: requests, waiting, log pieces, authority -----------------------------

    def _watch(self) -> None:
        if self.incoming is not None and not self.incoming.run():
            return  # the move's destination was discarded
        ws, epoch = self.spec.workspace, self.spec.epoch
        next_request = 1
        last_status_ask = 0.0
        last_waiting: tuple[str, float] | None = None
        last_authority_check = time.monotonic()
        ticks = 0
        while not self._done.wait(self.poll_interval):
            ticks += 1
            if self.spec.epoch != epoch:  # an aborted move took the next epoch for this allocation
                epoch, next_request = self.spec.epoch, 1
            try:
                if self._backlog:  # events an outage kept back: written as soon as the store answers
                    self.append()
                if self.log.due():
                    self.log.flush()
                req = self.store.poll_request(ws, epoch, next_request)
                if req is not None and req.get("kind") == "planted":  # written without the key: skipped
                    next_request += 1
                    print(f"sojourn: ignored request {req.get('n')} of {ws}: not written with the repository key "
                          "(planted); the program keeps running", file=sys.stderr)
                elif req is not None:
                    next_request += 1
                    self._serve(req)
                    if self.moved is not None:
                        return  # moved away: the session is exiting, the destination holds the workspace
                    if self.spec.epoch != epoch:  # the move aborted: this allocation took the next epoch
                        epoch, next_request = self.spec.epoch, 1  # (checked below against the new one)
                with self._lock:
                    pending = self.pending
                # A pause normally lands within milliseconds; one still pending after 0.3 s is
                # waiting for something, and the session says what.
                if (pending is not None and time.monotonic() - pending["t"] >= 0.3
                        and time.monotonic() - last_status_ask >= 1.0):
                    last_status_ask = time.monotonic()
                    self._control({"op": "status"})
                    st = self.status_msg
                    if st and st.get("pending"):
                        why = str(st.get("waiting_for", ""))
                        if last_waiting is None or last_waiting[0] != why or time.monotonic() - last_waiting[1] > 10:
                            last_waiting = (why, time.monotonic())
                            self.append({"type": "waiting", "why": why, "seconds": round(float(st.get("seconds", 0)), 1)})
                if time.monotonic() - last_authority_check >= 2.0:
                    last_authority_check = time.monotonic()
                    if not self.store.holds(ws, epoch):
                        self._lose_authority()
                        return
            except Exception as e:  # the repository hiccuped: keep supervising, say so once a while
                if ticks % 50 == 1:
                    print(f"sojourn: supervisor of {ws}: {e}", file=sys.stderr)

    def _serve(self, req: dict[str, Any]) -> None:
        kind = str(req.get("kind", "suspend"))
        if kind == "move":
            from sojourn.workspace import migrate

            self.append({"type": "request", "n": req.get("n"), "kind": kind, "move": req.get("move"),
                         "destination": req.get("allocation"), "requested_by": f"{req.get('host')}:{req.get('pid')}"})
            migrate.serve_move(self, req)
            return
        with self._lock:
            self.pending = {"n": req.get("n"), "kind": kind, "t": time.monotonic()}
        self.status_msg = None
        self.append({"type": "request", "n": req.get("n"), "kind": kind,
                     "requested_by": f"{req.get('host')}:{req.get('pid')}"})
        # A checkpoint is a pause whose program carries on (workspace/checkpoints.py).
        self._control({"op": "pause", "reason": kind, "deadline": req.get("deadline"),
                       "action": "continue" if kind == "checkpoint" else "exit", "on_timeout": "continue"})

    # -- the hard stop (issue 4, machines) ----------------------------------------------

    def start_watchdog(self) -> None:
        if self.spec.hard_stop and not threads.start_or_skip(self._watchdog, name="sojourn-watchdog"):
            print("sojourn: warning: no thread for the hard stop could be started; it is not enforced",
                  file=sys.stderr, flush=True)

    def _watchdog(self) -> None:
        """At the hard stop, ask the session to pause (it ends suspended); if no pause could
        be taken within the grace (the engine then exits 76 on its own) and the process still
        runs after the grace again, kill it: the allocation must end."""
        s = self.spec
        assert s.hard_stop is not None
        if self._done.wait(max(0.0, s.hard_stop - (time.time() - self.t0))):
            return
        grace = hard_stop_grace()
        self.hard_stopped = f"hard stop after {_seconds(s.hard_stop)} (--max-duration)"
        with self._lock:
            self.pending = {"n": None, "kind": "hard-stop", "t": time.monotonic()}
        try:
            self.append({"type": "request", "n": None, "kind": "hard-stop", "requested_by": "watchdog"})
        except Exception as e:  # the repository hiccuped: the stop itself must still happen
            print(f"sojourn: supervisor of {s.workspace}: {e}", file=sys.stderr)
        self._control({"op": "pause", "reason": "hard-stop", "deadline": grace, "action": "exit",
                       "on_timeout": "exit"})
        if self._done.wait(2 * grace + 5.0):
            return
        self._end_hard_stop(f"no pause could be taken within {grace:g} s, so the session was killed")

    def _end_hard_stop(self, why: str) -> None:
        """The allocation's time is up and the program cannot pause: end it (the workspace
        keeps its last good capsule, which the stop's detail names)."""
        with self._lock:
            if self.hard_stopped is None or "the session was" in self.hard_stopped:
                return
            self.hard_stopped += f"; {why}"
        p = self.proc
        if p is not None and p.returncode is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    # -- preemption notices (issue 6, notices) -----------------------------------------------

    def _on_notice(self, notice: notices.Notice) -> None:
        """A preemption notice is a pause request with reason ``preempted`` (the stop reason
        follows from the capsule's), due before the machine goes away."""
        left = notice.remaining()
        print(f"sojourn: preemption notice: {notice.detail}"
              f"{f' ({left:.0f} s left)' if left is not None else ''}; pausing", file=sys.stderr, flush=True)
        with self._lock:
            self.pending = {"n": None, "kind": "preempted", "t": time.monotonic()}
        self.status_msg = None
        self._control({"op": "pause", "reason": "preempted", "deadline": notice.pause_deadline(),
                       "action": "exit", "on_timeout": "continue"})
        self.append({"type": "request", "n": None, "kind": "preempted", "requested_by": notice.source,
                     "notice": notice.to_json()})

    def _control(self, msg: dict[str, Any]) -> None:
        fd = self._ctl_w
        if fd is None:
            return
        try:
            os.write(fd, (json.dumps(msg) + "\n").encode())
        except OSError:
            pass

    def _lose_authority(self) -> None:
        current, doc = self.store.epoch(self.spec.workspace, self.spec.epoch)
        who = (doc or {}).get("holder")
        self.lost_authority = f"the workspace was taken over by {who} (epoch {current}); this copy was stopped"
        print(f"sojourn: {self.lost_authority}", file=sys.stderr)
        p = self.proc
        if p is not None and p.returncode is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    # -- the end ---------------------------------------------------------------------------

    def _finish(self, rc: int, max_rss: int) -> Outcome:
        s = self.spec
        if self.discarded is not None or not self.committed:  # a move's destination that never held it
            return Outcome("failed", "discarded", 1, rc, self.discarded or "discarded", ran=False)
        if self.moved is not None:
            from sojourn.workspace import migrate

            return migrate.finish_moved(self, rc, max_rss)
        events: list[dict[str, Any]] = []
        cap_entry: R.CapsuleEntry | None = None
        extra: dict[str, Any] = {}
        ran = bool(self.exit_msg.get("ran", True)) if self.exit_msg else True
        if self.capsule_msg is not None:
            m = self.capsule_msg
            # Checked by the session before it exited (while the program waited, so that a
            # failure let it carry on), or not: when the deadline left no time, or an OOM.
            error = None if m.get("checked") else verify_capsule(self.repo_url, m["capsule"], python=s.python,
                                                                 cwd=s.cwd)
            cap_entry = R.CapsuleEntry(id=m["capsule"], parent=m.get("parent"), reason=str(m.get("reason")),
                                       where=str(m.get("where", "")), size=int(m.get("size", 0)), time=R.now(),
                                       allocation=s.allocation, verified=error is None, error=error)
            if error is None:
                extra = capsule_facts(self.store.repo, cap_entry.id)
            events.append({"type": "capsule", "capsule": cap_entry.__dict__,
                           "distributions": extra.get("distributions"), "arch": extra.get("arch")})
            if error is None and s.files:  # the scratch directory's files travel in it
                files_ev = files_event_of(self.store.repo, cap_entry.id, s.allocation, s.cwd)
                if files_ev is not None:
                    events.append(files_ev)
        if not self.started:
            ran = False
        reason, detail, code = self._classify(rc, cap_entry)
        produced = cap_entry.id if cap_entry is not None and cap_entry.verified else None
        # What the workspace stands on now: this stop's capsule, else the one a failed resume
        # started from, else the last good one before.
        standing = produced or (s.capsule if not ran else None) or self._last_good()
        stopped = E.stop(s.allocation, reason, detail, produced=produced, standing=standing, ran=ran, exit_code=rc,
                         max_rss=max_rss, spend=spend(s.price_per_hour, time.time() - self.t0),
                         log_bytes=self.log.bytes_written)
        state = stopped.state
        events.append(stopped.to_json())
        if self.lost_authority is None:
            self.append(*events)
            self.store.record(s.workspace)
        return Outcome(reason, state, code, None if self.capsule_msg else rc, detail,
                       cap_entry, ran, max_rss, list(self.refusals))

    def _standing_note(self) -> str:
        """Where the program cannot go on: what the workspace stays on."""
        good = self._last_good() or (self.spec.capsule if not self.started else None)
        if good:
            return f"; the workspace keeps its last good capsule {good} (`sojourn resume` carries on from it)"
        return "; there is no earlier capsule to resume from"

    def _last_good(self) -> str | None:
        rec = self.store.record(self.spec.workspace, save=False)
        return rec.last_capsule.id if rec.last_capsule else None

    def _classify(self, rc: int, cap: R.CapsuleEntry | None) -> tuple[str, str, int]:
        """(stop reason, detail, exit code of the command) from how the session ended."""
        limit = f" (limit {self.spec.memory / 2**20:.0f} MiB)" if self.spec.memory else ""
        if self.lost_authority is not None:
            return "failed", self.lost_authority, 1
        if self.hard_stopped is not None and not (cap is None and rc == 0):  # (it may have just finished)
            if cap is not None and cap.verified:
                return "hard-stop", f"{self.hard_stopped}: paused at {cap.where}", EXIT_PAUSED
            why = f"capsule {cap.id} failed its write check: {cap.error}" if cap is not None else "no capsule"
            if cap is None and self.refusals:
                why += f" (the pause was refused: {_refusal_line(self.refusals[-1])})"
            return "hard-stop", f"{self.hard_stopped}; {why}{self._standing_note()}", EXIT_PAUSE_FAILED
        if cap is None and not self.started:
            tail = self.output.stderr_tail.decode(errors="replace").strip().splitlines()
            last = f": {tail[-1]}" if tail else ""
            if rc < 0:  # killed before it started: exit as a shell would (128+n), not as the raw -n & 255
                return "failed", (f"the session was killed by {_signal_name(-rc)} before it started under {self.spec.python}"
                                  f"{last}"), 128 - rc
            return "failed", f"the session did not start under {self.spec.python} (exit code {rc}){last}", rc
        # The rest is how any session ends, decided in one place (an orphan asks the same);
        # where the program cannot go on, the detail says what the workspace stays on.
        reason, detail = E.exit_reason(rc, self.exit_msg, cap, limit)
        if (cap is not None and not cap.verified) or (cap is None and rc == EXIT_PAUSE_FAILED):
            detail += self._standing_note()
        return reason, detail, E.command_code(reason, rc, cap)

    def _finish_without_session(self, why: str) -> Outcome:
        s = self.spec
        stopped = E.stop(s.allocation, "failed", why, standing=s.capsule or self._last_good(), ran=False)
        self.append(stopped.to_json())
        self.store.record(s.workspace)
        return Outcome("failed", stopped.state, 2, None, why, None, False)


def _refusal_line(msg: dict[str, Any]) -> str:
    """A refusal in one line: its message's first line and, when that only announces a list,
    the first object's path and reason."""
    lines = str(msg.get("message", "")).splitlines()
    line = lines[0] if lines else "refused"
    problems = msg.get("problems") or []
    if problems and (line.endswith(":") or len(lines) == 1):
        p = problems[0]
        more = f" and {len(problems) - 1} more" if len(problems) > 1 else ""
        line = f"{line.rstrip(':')}: {p.get('path')} ({p.get('reason')}){more}"
    return line


def hard_stop_grace() -> float:
    """Seconds a hard-stopped session gets to pause (``SOJOURN_HARD_STOP_GRACE``, default 60)."""
    try:
        return max(0.1, float(os.environ.get("SOJOURN_HARD_STOP_GRACE", "60")))
    except ValueError:
        return 60.0


def _signal_name(n: int) -> str:
    return signal.Signals(n).name if n in signal.Signals._value2member_map_ else str(n)


def _seconds(s: float) -> str:
    return f"{s:g} s" if s < 120 else f"{s / 60:g} min"


def supervisor_identity() -> tuple[int, int | None]:
    return os.getpid(), process_start(os.getpid())
