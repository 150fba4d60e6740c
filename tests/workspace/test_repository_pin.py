"""A session never creates a repository: the one it started in, or nothing (issue 12).

The repository is moved away (deleted or unmounted, as the session sees it) while the
program runs, then the program is asked to pause: it used to create a brand-new repository
(new id, new key) at the empty path and pause into it, so that once the real one was back
nothing of the pause was in it."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from sojourn.errors import RepositoryChanged
from sojourn.repository.repo import open_repository, pin
from tests.workspace.conftest import Shell, finish

SLOW = """
import time
for i in range(400):
    print(i, flush=True)
    time.sleep(0.05)
"""


@pytest.mark.slow
def test_a_repository_gone_mid_run_is_not_created_again_by_the_pause(sh: Shell) -> None:
    sh.write("slow.py", SLOW)
    run = sh.start("run", "slow.py")
    sh.read_lines(run, 3)
    repo = Path(sh.repo)
    moved = repo.with_name("repo.unmounted")
    repo.rename(moved)
    try:
        run.send_signal(signal.SIGTERM)  # forwarded to the session: pause
        code, _, err = finish(run)
        assert code != 75, err
        assert not (repo / "config" / "config.json").exists(), "a new repository was created at the path"
        assert "is gone" in err, err
    finally:
        if repo.exists():
            import shutil

            shutil.rmtree(repo)
        moved.rename(repo)


def test_a_pinned_url_refuses_another_repository_in_its_place(tmp_path: Path) -> None:
    url = str(tmp_path / "repo")
    with open_repository(url, create=True) as first:
        pin(first)
    os.rename(url, url + ".old")
    try:
        try:
            open_repository(url, create=True)
        except RepositoryChanged as e:
            assert f"the repository {first.id} is gone from" in str(e)
        else:
            raise AssertionError("a pinned URL made a new repository")
        assert not os.path.exists(os.path.join(url, "config", "config.json"))
        # A child process of this one (a session) inherits the pin.
        import subprocess

        from sojourn.workspace.capsules import child_env

        p = subprocess.run([sys.executable, "-c", f"from sojourn.repository.repo import open_repository as o; o({url!r}, "
                            "create=True)"], env=child_env(), capture_output=True, text=True, timeout=60)
        assert p.returncode != 0 and "is gone from" in p.stderr, p.stderr
        assert not os.path.exists(os.path.join(url, "config", "config.json"))
    finally:
        os.rename(url + ".old", url)
