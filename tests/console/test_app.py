"""The console's pages and guards through Starlette's TestClient, over a real repository
with a workspace run by the real `sojourn run`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("httpx")

from starlette.testclient import TestClient

from sojourn.console import charts
from sojourn.console.app import create_app
from sojourn.console.security import host_of
from tests.conftest import SRC

HELLO = "import sys\nfor i in range(3):\n    print('line', i, flush=True)\nprint('oops', file=sys.stderr)\n"


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A repository with one finished workspace: (repo, workspace id)."""
    d = tmp_path_factory.mktemp("console")
    (d / "hello.py").write_text(HELLO)
    repo = str(d / "repo")
    env = dict(os.environ, PYTHONPATH=str(SRC), SOJOURN_HOME=str(d / "home"), SOJOURN_REPO=repo,
               SOJOURN_NOTICES="none")
    p = subprocess.run([sys.executable, "-m", "sojourn.cli.main", "run", "--name", "hello", "hello.py"], cwd=d,
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    p = subprocess.run([sys.executable, "-m", "sojourn.cli.main", "ps", "--json"], cwd=d, env=env,
                       capture_output=True, text=True, timeout=60)
    import json

    (row,) = json.loads(p.stdout)
    return repo, row["id"]


@pytest.fixture(autouse=True)
def _its_home(finished: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The repository's key lives in the home of the `sojourn run` that made it."""
    monkeypatch.setenv("SOJOURN_HOME", str(Path(finished[0]).parent / "home"))


def client(repo: str) -> tuple[TestClient, str, str]:
    app, console = create_app(repo)
    c = TestClient(app, base_url="http://127.0.0.1:8765")
    return c, console.token, console.csrf


def logged_in(repo: str) -> tuple[TestClient, str]:
    c, token, csrf = client(repo)
    r = c.get(f"/?token={token}", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/"
    assert "HttpOnly" in r.headers["set-cookie"] and "SameSite=Strict" in r.headers["set-cookie"]
    return c, csrf


def test_without_the_token_every_page_is_refused(finished: tuple[str, str]) -> None:
    repo, ws = finished
    c, token, _ = client(repo)
    for path in ("/", f"/w/{ws}", f"/w/{ws}/logs", "/offers"):
        r = c.get(path)
        assert r.status_code == 403 and "token" in r.text, path
    assert c.get("/?token=" + "0" * len(token)).status_code == 403
    assert c.post(f"/w/{ws}/do/fork", data={}).status_code == 403


def test_a_foreign_host_header_is_refused_even_with_the_token(finished: tuple[str, str]) -> None:
    """DNS rebinding: a page of evil.example whose name now points at 127.0.0.1."""
    repo, _ = finished
    c, token, _ = client(repo)
    r = c.get(f"/?token={token}", headers={"host": "evil.example:8765"})
    assert r.status_code == 403 and "Host" in r.text
    assert c.get(f"/?token={token}", headers={"host": "localhost:8765"}, follow_redirects=False).status_code == 303
    assert (host_of("[::1]:80"), host_of("127.0.0.1:9"), host_of("LOCALHOST")) == ("::1", "127.0.0.1", "localhost")


def test_the_workspaces_page_lists_state_machine_and_spend(finished: tuple[str, str]) -> None:
    repo, ws = finished
    c, _ = logged_in(repo)
    r = c.get("/")
    assert r.status_code == 200
    assert ws in r.text and "hello" in r.text and "finished" in r.text and "$0.0000" in r.text
    assert 'id="machines"' in r.text and "local" in r.text


def test_the_workspace_page_shows_allocations_events_and_no_running_actions(finished: tuple[str, str]) -> None:
    repo, ws = finished
    c, _ = logged_in(repo)
    r = c.get(f"/w/{ws}")
    assert r.status_code == 200
    assert "allocation timeline" in r.text and "<svg" in r.text and 'id="events"' in r.text
    assert "hello.py" in r.text and "finished" in r.text
    # A finished workspace cannot be suspended, moved or checkpointed: no such buttons.
    assert 'data-action="move"' not in r.text and 'data-action="suspend"' not in r.text
    assert c.get("/w/ws_nosuch").status_code == 404


def test_the_log_stream_replays_the_output_then_ends(finished: tuple[str, str]) -> None:
    repo, ws = finished
    c, _ = logged_in(repo)
    with c.stream("GET", f"/w/{ws}/logs") as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        body = "".join(r.iter_text())
    assert body.count("event: log") >= 2 and "line 2" in body and '"stream": "stderr"' in body
    assert body.rstrip().endswith('data: {"state": "finished"}')


def test_a_post_without_the_csrf_token_is_refused(finished: tuple[str, str]) -> None:
    repo, ws = finished
    c, csrf = logged_in(repo)
    for data in ({}, {"csrf": "x" * len(csrf)}):
        r = c.post(f"/w/{ws}/do/fork", data=data, follow_redirects=False)
        assert r.status_code == 403 and "CSRF" in r.text
    r = c.post(f"/w/{ws}/do/fork", data={"csrf": csrf}, headers={"origin": "http://evil.example"})
    assert r.status_code == 403 and "another site" in r.text
    assert c.get("/").text.count('data-workspace="') == 1  # nothing was forked


def test_an_action_ops_refuses_says_why(finished: tuple[str, str]) -> None:
    repo, ws = finished
    c, csrf = logged_in(repo)
    page = c.get(f"/w/{ws}/confirm/move")
    assert page.status_code == 200 and f'value="{csrf}"' in page.text and "pauses between two statements" in page.text
    r = c.post(f"/w/{ws}/do/move", data={"csrf": csrf, "machine": "local"})
    assert r.status_code == 409 and "is not running (finished)" in r.text


def test_charts_follow_the_data() -> None:
    a = [{"id": "al_1", "provider": "local", "machine": "small", "started": 0.0, "ended": 3600.0,
          "stop_reason": "moved", "price_per_hour": 1.0},
         {"id": "al_2", "provider": "local", "machine": "big", "started": 3600.0, "ended": 5400.0,
          "stop_reason": "finished", "price_per_hour": 4.0}]
    pts = charts.spend_points(a, now=6000.0)
    assert [(p.t, round(p.v, 6)) for p in pts] == [(0.0, 0.0), (3600.0, 1.0), (3600.0, 1.0), (5400.0, 3.0)]
    svg = charts.timeline(a, now=6000.0)
    assert svg.count("<rect") == 2 and "alloc-moved" in svg and "big" in svg
    assert "$3.0000" in charts.spend(a)
    assert charts.sizes([{"id": "c1", "size": 2048, "reason": "move"}]).count("2.0 KiB") == 2
    assert charts.size(5 << 20) == "5.0 MiB"


def test_the_console_command_prints_a_url_with_a_token(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from sojourn.cli.main import cli

    r = CliRunner().invoke(cli, ["console", "--help"])
    assert r.exit_code == 0 and "--no-browser" in r.output and "127.0.0.1" in r.output


def test_the_offers_and_plan_pages_show_what_ops_computes(finished: tuple[str, str]) -> None:
    from sojourn.ops import offers as offer_ops

    repo, ws = finished
    c, _ = logged_in(repo)
    r = c.get(f"/offers?workspace={ws}")  # no capsule yet: ops says why in one line
    assert r.status_code == 400 and "has no capsule yet" in r.text
    table = offer_ops.offers(repo=repo)
    r = c.get("/offers")
    assert r.status_code == 200 and 'id="offers"' in r.text
    assert r.text.count("<tr><td>") == len(table.rows) and table.rows
    to = table.rows[0].ref
    plan = offer_ops.plan(ws, to, repo=repo, remaining="2h")
    r = c.get(f"/plan?workspace={ws}&to={to}&remaining=2h")
    assert r.status_code == 200, r.text
    assert f"${plan.plan.usd:.4f}" in r.text and "2.0 h" in r.text
    r = c.get(f"/plan?workspace={ws}&to=nowhere:none")
    assert r.status_code == 400 and 'id="error"' in r.text
