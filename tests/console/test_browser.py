"""The console in a real browser: Debian's Chromium driven by Playwright, against a real
`sojourn console` process. The move test clicks "Move to…" on a program that runs on machine
small and checks that it carried on, on big, every step once."""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("playwright")
pytest.importorskip("starlette")
CHROMIUM = "/usr/bin/chromium"
if not os.path.exists(CHROMIUM):
    pytest.skip("needs Debian's chromium (apt-get install chromium; .ci/run installs it)", allow_module_level=True)

from playwright.sync_api import Browser, Page, expect, sync_playwright  # noqa: E402

from tests.workspace.conftest import Shell, wait_for  # noqa: E402
from tests.workspace.test_move import Mover, holders_alive, machines_set, scratch_steps  # noqa: E402

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


@pytest.fixture
def mv(tmp_path: Path) -> Iterator[Mover]:
    sh = Shell(tmp_path)
    m = Mover(sh, tmp_path)
    yield m
    sh.kill_all()
    m.cleanup()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def console(mv: Mover) -> Iterator[str]:
    """A `sojourn console` process on the test's repository: its URL with the token."""
    port = free_port()
    p = mv.sh.start("console", "--no-browser", "--port", str(port), "--repo", mv.sh.repo)
    assert p.stderr is not None
    line = p.stderr.readline()
    m = re.search(r"(http://127\.0\.0\.1:\d+/\?token=\w+)", line)
    assert m, line + p.stderr.read()
    CONSOLE_PIDS[m.group(1)] = p.pid
    yield m.group(1)
    p.terminate()
    p.wait(10)


CONSOLE_PIDS: dict[str, int] = {}  # the console carries the test's tag too


def page_of(browser: Browser) -> Page:
    page = browser.new_context().new_page()
    page.set_default_timeout(60_000)
    return page


def test_the_page_without_the_token_is_refused_and_with_it_lists_workspaces(mv: Mover, console: str,
                                                                             browser: Browser) -> None:
    p = mv.sh.cli("run", "--name", "counted", "count.py", "5")
    assert p.returncode == 0, p.stderr
    page = page_of(browser)
    r = page.goto(console.split("?")[0])
    assert r is not None and r.status == 403 and "token" in page.content()
    page.goto(console)
    assert "token=" not in page.url  # the token went into a cookie
    row = page.locator("#workspaces tr[data-workspace]")
    expect(row).to_have_count(1)
    expect(row).to_contain_text("counted")
    expect(row).to_contain_text("finished")
    row.locator("a").first.click()
    expect(page.locator("#state")).to_have_text("finished")
    expect(page.locator("#log-state")).to_have_text("ended: finished")  # the log came over server-sent events
    expect(page.locator("#log")).to_contain_text("done 10")
    expect(page.locator("svg.chart").first).to_be_visible()


def test_move_to_clicked_in_the_page_carries_the_program_on_on_the_other_machine(
        mv: Mover, console: str, browser: Browser) -> None:
    sh = mv.sh
    mv.length(400)
    machines_set(sh, "small", "--memory", "300MiB", "--price", "0.10")
    machines_set(sh, "big", "--memory", "4GiB", "--price", "3600")
    p = sh.cli("run", "--on", "small", "--detach", "count.py", str(mv.n))
    assert p.returncode == 0, p.stderr
    ws = p.stdout.strip()
    small = sh.show(ws)["allocations"][0]
    wait_for(lambda: len(scratch_steps(small)) >= 5, 30, "the program to run on small")

    page = page_of(browser)
    page.goto(console)
    page.locator(f'tr[data-workspace="{ws}"] a').first.click()
    expect(page.locator("#state")).to_have_text("running")
    expect(page.locator("#machine")).to_have_text("local:small")
    expect(page.locator("#log")).to_contain_text("4 10")  # live output, as it comes
    page.locator('a[data-action="move"]').click()
    expect(page.locator("h1")).to_contain_text("Move to")
    page.select_option("#machine", "big")
    page.locator("#go").click()
    expect(page.locator("#done")).to_contain_text("moved to big", timeout=120_000)
    expect(page.locator("#machine")).to_have_text("local:big")

    def ended() -> dict[str, Any] | None:
        rec = sh.show(ws)
        return rec if rec["state"] != "running" else None

    rec = wait_for(ended, 90, "the program to finish on big")
    a, b = rec["allocations"]
    assert (a["machine"], a["stop_reason"], b["machine"], b["stop_reason"]) == ("small", "moved", "big", "finished")
    assert scratch_steps(b) == list(range(mv.n)), scratch_steps(b)  # every step once, across the move
    assert sh.cli("logs", ws, "--stream", "stdout").stdout == mv.expected
    page.reload()
    expect(page.locator("#state")).to_have_text("finished")
    expect(page.locator("#allocations")).to_contain_text("moved")
    expect(page.locator("#capsules")).to_contain_text("move")
    assert holders_alive(mv.tag) == [CONSOLE_PIDS[console]]  # the console alone: no session left behind


def test_checkpoints_compared_and_forked_from_the_page(mv: Mover, console: str, browser: Browser) -> None:
    """Two checkpoints of a running program, clicked; the diff shows the loop's counters
    changed and the 1 MiB blob unchanged; a fork clicked from the page is a new suspended
    workspace. A POST the page's form did not make (no CSRF token) is refused."""
    mv.n = 1500  # 45 s: it still runs when the fork is clicked (its unmoved output is not needed here)
    run, ws = mv.start()
    page = page_of(browser)
    page.goto(console)
    page.locator(f'tr[data-workspace="{ws}"] a').first.click()
    for _ in range(2):
        page.locator('a[data-action="checkpoint"]').click()
        page.locator("#go").click()
        expect(page.locator("#done")).to_contain_text("the program keeps running")
        expect(page.locator("#state")).to_have_text("running")
    expect(page.locator("#capsules tr")).to_have_count(3)  # a header and two capsules
    page.locator("#diff button").click()
    expect(page.locator("#counts")).to_contain_text("unchanged")
    expect(page.locator('#diff-variables tr[data-name="i"]')).to_contain_text("changed")
    expect(page.locator('#diff-variables tr[data-name="blob"]')).to_contain_text("same")
    status = page.evaluate(f"""fetch("/w/{ws}/do/suspend", {{method: "POST",
        headers: {{"content-type": "application/x-www-form-urlencoded"}}, body: "machine=big"}}).then(r => r.status)""")
    assert status == 403
    assert mv.record(ws)["state"] == "running"
    page.goto(console.split("?")[0] + f"w/{ws}")
    page.locator('a[data-action="fork"]').click()
    page.fill('input[name="name"]', "branch")
    page.locator("#go").click()
    expect(page.locator("#done")).to_contain_text("forked from")
    expect(page.locator("h1")).to_contain_text("branch")
    expect(page.locator("#state")).to_have_text("suspended")
    if mv.record(ws)["state"] == "running":
        assert mv.sh.cli("suspend", ws).returncode == 0
    run.wait(60)
