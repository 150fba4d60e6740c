"""Running scripts under sojourn in real processes, pausing them with real signals.

A *chain* runs a script with ``python -m sojourn.execution run``; each segment that pauses
(exit code 75) is carried on with ``resume`` in a new process, possibly under another
interpreter, until the script ends. Its stdout, concatenated over the segments, is compared
with a plain ``python script.py`` run that never paused.

Signals are real: either the script sends itself SIGTERM/SIGUSR1 at points chosen through the
``KILLS`` environment variable (``kill_here(tag)`` in the script), or the test sends SIGTERM
from outside after reading a number of lines of the child's output.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import KILL_PRELUDE as PRELUDE
from tests.conftest import SRC, interpreters

EXIT_PAUSED = 75



def script_text(body: str) -> str:
    return PRELUDE + textwrap.dedent(body)


@dataclass
class Segment:
    python: str
    returncode: int
    stdout: str
    stderr: str
    capsule: str | None


@dataclass
class Chain:
    stdout: str = ""
    segments: list[Segment] = field(default_factory=list)

    @property
    def capsules(self) -> list[str]:
        return [s.capsule for s in self.segments if s.capsule]

    @property
    def stderr(self) -> str:
        return "".join(s.stderr for s in self.segments)

    def describe(self) -> str:
        return "\n".join(f"--- segment {i} ({s.python}, rc={s.returncode})\n{s.stderr}" for i, s in enumerate(self.segments))


class Runner:
    def __init__(self, tmp_path: Path):
        self.dir = tmp_path
        self.repo = str(tmp_path / "repo")
        self.env = dict(os.environ)
        self.env["PYTHONPATH"] = str(SRC) + (os.pathsep + self.env["PYTHONPATH"] if self.env.get("PYTHONPATH") else "")
        self.env["SOJOURN_CACHE"] = str(tmp_path / "cache")
        self.env.pop("KILLS", None)

    def write(self, name: str, body: str, prelude: bool = True) -> Path:
        path = self.dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(script_text(body) if prelude else textwrap.dedent(body))
        return path

    def plain(self, script: Path, *args: str, python: str | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        e = dict(self.env, **(env or {}))
        e.pop("KILLS", None)
        return subprocess.run([python or sys.executable, str(script), *args], cwd=self.dir, env=e,
                              capture_output=True, text=True, timeout=300)

    def cmd(self, python: str, *args: str, opts: tuple[str, ...] = ()) -> list[str]:
        return [python, "-m", "sojourn.execution", "--repo", self.repo, *opts, *args]

    def segment(self, python: str, args: list[str], env: dict[str, str] | None = None, timeout: float = 300,
                opts: tuple[str, ...] = ()) -> Segment:
        p = subprocess.run(self.cmd(python, *args, opts=opts), cwd=self.dir, env=dict(self.env, **(env or {})),
                           capture_output=True, text=True, timeout=timeout)
        m = re.search(r"capsule (cap_[0-9a-f]+)", p.stderr) if p.returncode == EXIT_PAUSED else None
        return Segment(python, p.returncode, p.stdout, p.stderr, m.group(1) if m else None)

    def chain(self, script: Path, *args: str, kills: str = "", pythons: list[str] | None = None,
              env: dict[str, str] | None = None, max_segments: int = 30, opts: tuple[str, ...] = ()) -> Chain:
        """Run, then resume after every pause (pythons cycle over the segments)."""
        pys = pythons or [sys.executable]
        out = Chain()
        e = dict(env or {}, KILLS=kills)
        capsule = None
        for i in range(max_segments):
            py = pys[i % len(pys)]
            seg = self.segment(py, ["run", str(script), *args] if capsule is None else ["resume", capsule], e, opts=opts)
            out.segments.append(seg)
            out.stdout += seg.stdout
            if seg.returncode != EXIT_PAUSED:
                return out
            assert seg.capsule, out.describe()
            capsule = seg.capsule
        raise AssertionError("the chain did not finish\n" + out.describe())

    def external(self, script: Path, *args: str, after_lines: list[int], pythons: list[str] | None = None,
                 sig: int = signal.SIGTERM, env: dict[str, str] | None = None) -> Chain:
        """Send a real signal from outside once the child printed ``after_lines[i]`` lines in
        segment ``i``; resume until the script ends."""
        pys = pythons or [sys.executable]
        out = Chain()
        capsule = None
        e = dict(self.env, **(env or {}))
        for i in range(len(after_lines) + 1):
            py = pys[i % len(pys)]
            args_ = ["run", str(script), *args] if capsule is None else ["resume", capsule]
            p = subprocess.Popen(self.cmd(py, *args_), cwd=self.dir, env=e, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
            lines: list[str] = []
            assert p.stdout is not None
            if i < len(after_lines):
                while len(lines) < after_lines[i]:
                    line = p.stdout.readline()
                    if not line:
                        break
                    lines.append(line)
                if p.poll() is None:
                    os.kill(p.pid, sig)
            # Read the rest through the same buffered file: communicate() would read the pipe
            # itself and drop what readline() had already buffered.
            errs: list[str] = []
            reader = threading.Thread(target=_read_into, args=(p.stderr, errs))
            reader.start()
            rest = p.stdout.read()
            reader.join(timeout=300)
            p.wait(timeout=300)
            err = "".join(errs)
            text = "".join(lines) + rest
            m = re.search(r"capsule (cap_[0-9a-f]+)", err) if p.returncode == EXIT_PAUSED else None
            out.segments.append(Segment(py, p.returncode, text, err, m.group(1) if m else None))
            out.stdout += text
            if p.returncode != EXIT_PAUSED:
                return out
            capsule = m.group(1) if m else None
            assert capsule, out.describe()
        raise AssertionError("the chain did not finish\n" + out.describe())

    def same_as_plain(self, script: Path, chain: Chain, *args: str, env: dict[str, str] | None = None) -> None:
        ref = self.plain(script, *args, env=env)
        assert ref.returncode == 0, ref.stderr
        assert chain.segments[-1].returncode == 0, chain.describe()
        assert chain.stdout == ref.stdout, chain.describe() + "\n--- expected\n" + ref.stdout + "\n--- got\n" + chain.stdout


def _read_into(stream: object, sink: list[str]) -> None:
    sink.append(stream.read())  # type: ignore[attr-defined]


@pytest.fixture
def runner(tmp_path: Path) -> Runner:
    return Runner(tmp_path)


def other_pythons() -> list[str]:
    """This interpreter plus every other minor version present (.venv3.12, .venv3.13)."""
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    found = interpreters()
    return [sys.executable] + [p for v, p in sorted(found.items()) if v != here]
