"""The engine's API as the CLI uses it: run_script with callbacks, request_pause from a watcher
thread (a notice, a suspend command), checkpoints that let the program go on, and checking a
capsule in a fresh process without running it."""

from __future__ import annotations

import json
import sys

from tests.execution.conftest import EXIT_PAUSED, Runner

DRIVER = """
import json, sys, threading, time
from sojourn.execution import request_pause, pause_status, run_script

mode, script, repo = sys.argv[1], sys.argv[2], sys.argv[3]
events = []

def on_capsule(event):
    events.append(event)
    print("EVENT", json.dumps({"capsule": event.capsule, "parent": event.parent, "reason": event.reason,
                               "where": event.where, "action": event.action,
                               "to_pause_ms": event.seconds_to_pause * 1e3}), file=sys.stderr, flush=True)

def on_refusal(refusal):
    print("REFUSED", refusal.reason, file=sys.stderr, flush=True)

def watcher():
    time.sleep(0.3)
    if mode == "notice":
        request_pause("spot notice", deadline=5, action="exit", on_timeout="exit")
    else:
        request_pause("checkpoint", action="continue")
        # The checkpoint lands while the program runs (a first capture takes ~0.3 s; more
        # on a loaded machine): its status must go back to "nothing pending".
        deadline = time.monotonic() + 20
        while pause_status().get("pending") and time.monotonic() < deadline:
            time.sleep(0.05)
        print("STATUS", json.dumps(pause_status()), file=sys.stderr, flush=True)

threading.Thread(target=watcher, daemon=True).start()
code = run_script(script, ["a1"], repo=repo, on_capsule=on_capsule, on_refusal=on_refusal, scan_interval=None)
print("RUN_SCRIPT_RETURNED", code, len(events), file=sys.stderr, flush=True)
"""

WORK = """
import sys, time
total = 0
for i in range(30):
    total += i
    print(i, total, sys.argv[1:], flush=True)
    time.sleep(0.06)
print("done", total)
"""


def _events(stderr: str) -> list[dict[str, object]]:
    return [json.loads(line.split(" ", 1)[1]) for line in stderr.splitlines() if line.startswith("EVENT ")]


def test_request_pause_from_a_watcher_thread_with_a_deadline(runner: Runner) -> None:
    driver = runner.write("driver.py", DRIVER, prelude=False)
    script = runner.write("work.py", WORK, prelude=False)
    p = runner.plain(driver, "notice", str(script), runner.repo)
    assert p.returncode == EXIT_PAUSED, p.stderr
    (event,) = _events(p.stderr)
    assert event["reason"] == "spot notice" and event["action"] == "exit" and event["parent"] is None
    assert "work.py" in str(event["where"]) and float(event["to_pause_ms"]) < 50  # type: ignore[arg-type]
    assert "RUN_SCRIPT_RETURNED" not in p.stderr  # the process ended with the pause
    rest = runner.segment(sys.executable, ["resume", str(event["capsule"])])
    assert rest.returncode == 0, rest.stderr
    ref = runner.plain(script, "a1")
    assert p.stdout + rest.stdout == ref.stdout


def test_checkpoint_lets_the_program_go_on_and_can_be_resumed_later(runner: Runner) -> None:
    driver = runner.write("driver.py", DRIVER, prelude=False)
    script = runner.write("work.py", WORK, prelude=False)
    p = runner.plain(driver, "checkpoint", str(script), runner.repo)
    assert p.returncode == 0, p.stderr
    ref = runner.plain(script, "a1")
    assert p.stdout == ref.stdout  # the checkpoint did not disturb the run
    (event,) = _events(p.stderr)
    assert event["action"] == "continue"
    assert "RUN_SCRIPT_RETURNED 0 1" in p.stderr
    assert 'STATUS {"pending": false}' in p.stderr
    # The checkpoint is a fork point: resuming it prints the rest of the run again.
    again = runner.segment(sys.executable, ["resume", str(event["capsule"])])
    assert again.returncode == 0, again.stderr
    assert ref.stdout.endswith(again.stdout) and 0 < len(again.stdout) < len(ref.stdout)


def test_check_restores_in_a_fresh_process_without_running(runner: Runner) -> None:
    script = runner.write("loop.py", """
        log = []
        for i in range(6):
            kill_here(i)
            log.append(i)
            print(i, flush=True)
    """)
    seg = runner.segment(sys.executable, ["run", str(script)], env={"KILLS": "2"})
    assert seg.capsule
    check = runner.segment(sys.executable, ["check", seg.capsule])
    assert check.returncode == 0, check.stderr
    report = json.loads(check.stdout.strip().splitlines()[-1])
    assert report["ok"] and report["capsule"] == seg.capsule and "loop.py" in report["where"]
    assert "3" not in check.stdout.splitlines()[:-1]  # nothing of the program ran


def test_resuming_a_plain_capsule_is_refused_clearly(runner: Runner) -> None:
    maker = runner.write("capture.py", f"""
        import sojourn
        print(sojourn.capture({{"x": 1}}, {runner.repo!r}).id)
    """, prelude=False)
    made = runner.plain(maker)
    assert made.returncode == 0, made.stderr
    cap = made.stdout.strip()
    seg = runner.segment(sys.executable, ["resume", cap])
    assert seg.returncode == 2
    assert "holds a namespace, not a paused program" in seg.stderr


def test_check_reports_a_failure_as_json(runner: Runner) -> None:
    script = runner.write("loop.py", """
        for i in range(4):
            kill_here(i)
            print(i, flush=True)
    """)
    seg = runner.segment(sys.executable, ["run", str(script)], env={"KILLS": "1"})
    assert seg.capsule
    script.write_text(script.read_text().replace("range(4)", "range(5)"))  # the loop the pause is in
    check = runner.segment(sys.executable, ["check", seg.capsule])
    assert check.returncode == 1
    report = json.loads(check.stdout.strip().splitlines()[-1])
    assert report["ok"] is False and "loop.py:" in report["error"] and "was edited inside the top-level code" in report["error"]
