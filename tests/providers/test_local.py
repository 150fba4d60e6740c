"""The local provider: the conformance suite, plus what only it does (scratch directories,
reused pids, process trees whose children left the group, machines as offers)."""

from __future__ import annotations

import os
import platform
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sojourn.providers.base import Handle, LaunchFailed, Offer, Requirements, get_provider
from sojourn.providers.local import LocalProvider
from sojourn.providers.machines import Machine, save_machines
from sojourn.repository.repo import Repository, open_repository
from sojourn.workspace.liveness import process_start
from tests.conftest import interpreters
from tests.providers.conformance import ProviderConformance, wait_status


@pytest.fixture
def local_repo(tmp_path: Path) -> Iterator[Repository]:
    r = open_repository(tmp_path / "repo", create=True)
    save_machines(r, {
        "small": Machine("small", memory=512 << 20, cpus=1, price_per_hour=0.10),
        "big": Machine("big", memory=8 << 30, price_per_hour=0.80),
        "free": Machine("free"),
    })
    yield r
    r.close()


class TestLocalConformance(ProviderConformance):
    @pytest.fixture
    def provider(self, local_repo: Repository) -> LocalProvider:
        p = get_provider("local", local_repo)
        assert isinstance(p, LocalProvider)
        p.terminate_grace = 5.0
        return p

    @pytest.fixture
    def launchable(self, provider: LocalProvider) -> Offer:
        return provider.offer("small")


def test_machines_are_offers_with_their_limits_and_prices(local_repo: Repository) -> None:
    p = LocalProvider(local_repo)
    offers = p.offers(Requirements())
    assert [o.name for o in offers] == ["free", "small", "big"]  # cheapest first
    small = p.offer("small")
    assert small.memory == 512 << 20 and small.cpus == 1 and small.price_per_hour == 0.10
    assert small.python == sys.executable and small.extra["python_version"] == platform.python_version()
    # "free" has no limit: its offer is the host's memory.
    assert [o.name for o in p.offers(Requirements(memory=1 << 30))] == ["free", "big"]
    assert [o.name for o in p.offers(Requirements(cpus=1, memory=256 << 20))][:2] == ["free", "small"]
    assert p.offers(Requirements(python="2.7")) == []
    with pytest.raises(Exception, match=r"no machine 'nope'.*machines set nope"):
        p.offer("nope")


def test_python_requirement_picks_the_machine_with_that_interpreter(local_repo: Repository) -> None:
    others = {v: py for v, py in interpreters().items() if v != f"{sys.version_info[0]}.{sys.version_info[1]}"}
    if not others:
        pytest.skip("no second Python (make crossvenvs creates .venv3.12/.venv3.13)")
    version, python = sorted(others.items())[0]
    save_machines(local_repo, {"other": Machine("other", python=python), "here": Machine("here")})
    offers = LocalProvider(local_repo).offers(Requirements(python=version))
    assert [o.name for o in offers] == ["other"] and offers[0].python == os.path.abspath(python)


def test_launch_runs_in_its_scratch_directory(local_repo: Repository) -> None:
    p = LocalProvider(local_repo)
    spec_h = p.launch(p.offer("free"), TestLocalConformance().spec(
        [sys.executable, "-c", "import os; open('here.txt', 'w').write(os.getcwd()); print('to the log')"]))
    assert wait_status(p, spec_h, {"ended"}, 30) == "ended"
    scratch = Path(spec_h.data["scratch"])
    home = Path(os.environ["SOJOURN_HOME"])
    assert scratch == home / "machines" / "free" / spec_h.allocation
    assert (scratch / "here.txt").read_text() == str(scratch)
    assert Path(spec_h.data["log"]).read_text() == "to the log\n"


def test_a_reused_pid_is_neither_running_nor_killed(local_repo: Repository) -> None:
    p = LocalProvider(local_repo)
    me = os.getpid()
    fake = Handle("local", "free", "al_x", {"host": os.uname().nodename, "pid": me,
                                            "pid_start": (process_start(me) or 0) + 1})
    assert p.status(fake) == "ended"
    p.terminate(fake, grace=0.1)  # must not signal this process
    assert p.status(Handle("local", "free", "al_x", {**fake.data, "pid_start": process_start(me)})) == "running"


def test_terminate_reaches_children_in_their_own_group(local_repo: Repository) -> None:
    """A sojourn supervisor starts its session in a new session: SIGTERM to the supervisor's
    group does not reach it, so terminate also kills what is left of the tree."""
    p = LocalProvider(local_repo)
    code = ("import subprocess, sys, time, signal\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "c = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
            "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)'], start_new_session=True)\n"
            "print(c.pid, flush=True)\n"
            "time.sleep(120)\n")
    h = p.launch(p.offer("free"), TestLocalConformance().spec([sys.executable, "-c", code]))
    log = Path(h.data["log"])
    deadline = time.monotonic() + 30
    while not log.read_text().strip() and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int(log.read_text().split()[0])
    child_start = process_start(child)
    assert child_start is not None and os.getpgid(child) != h.data["pid"]
    t0 = time.monotonic()
    p.terminate(h, grace=0.5)
    assert time.monotonic() - t0 < 10
    assert p.status(h) == "ended"
    time.sleep(0.2)
    assert process_start(child) != child_start  # gone (or a zombie reaped by init)


def test_a_launch_that_cannot_start_names_the_check(local_repo: Repository) -> None:
    p = LocalProvider(local_repo)
    with pytest.raises(LaunchFailed) as e:
        p.launch(p.offer("free"), TestLocalConformance().spec(["/no/such/program"]))
    assert e.value.check == "launch" and "/no/such/program" in str(e.value)
    other = Offer(provider="slurm", name="x")
    with pytest.raises(LaunchFailed) as e2:
        p.launch(other, TestLocalConformance().spec(["true"]))
    assert e2.value.check == "catalog"


def test_terminate_of_a_supervisor_like_process_lets_it_pause_first(local_repo: Repository, tmp_path: Path) -> None:
    """SIGTERM first (a sojourn supervisor forwards it and the session pauses), SIGKILL only
    after the grace."""
    p = LocalProvider(local_repo)
    marker = tmp_path / "got-term"
    code = ("import signal, sys, time\n"
            f"def on_term(*a):\n    open({str(marker)!r}, 'w').write('term'); sys.exit(0)\n"
            "signal.signal(signal.SIGTERM, on_term)\nprint('ready', flush=True)\ntime.sleep(120)\n")
    h = p.launch(p.offer("free"), TestLocalConformance().spec([sys.executable, "-c", code]))
    log = Path(h.data["log"])
    deadline = time.monotonic() + 30
    while "ready" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    p.terminate(h, grace=10)
    assert marker.read_text() == "term"
    assert p.status(h) == "ended"
