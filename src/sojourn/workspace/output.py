"""A session's stdout and stderr: two files on the machine that the supervisor tails.

The session writes to files opened for appending (``<SOJOURN_HOME>/output/<ws>.<al>.out``
and ``.err``, see :func:`logs.output_paths`), never to a pipe: what the program wrote is in
the file the moment its ``write`` returns, whether or not anyone reads it, so killing the
supervisor loses nothing. The supervisor reads each file to its end every round, hands the
bytes to the log with the offset they end at (whoever logs the rest after it is gone starts
from there: :func:`logs.log_rest`), and echoes them to the terminal.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from sojourn.workspace.faults import fault
from sojourn.workspace.logs import LogWriter, output_paths, remove_output

OutputCallback = Callable[[str, bytes], None]


class OutputFiles:
    """The two output files of one allocation, from the supervisor's side."""

    def __init__(self, ws: str, al: str):
        self.ws, self.al = ws, al
        self._read: dict[str, int | None] = {"stdout": None, "stderr": None}
        self._at = {"stdout": 0, "stderr": 0}
        self.stderr_tail = b""  # the last 2 KiB of stderr, for the stop's message

    def create(self) -> tuple[int, int]:
        """Create both files, empty; the session's stdout and stderr (the caller closes them
        once the session has them); the supervisor keeps its own read ends."""
        out_path, err_path = output_paths(self.ws, self.al)
        fds: list[int] = []
        try:
            out_path.parent.mkdir(parents=True, exist_ok=True)
            for path in (out_path, err_path):
                fds.append(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600))
            for path in (out_path, err_path):
                fds.append(os.open(path, os.O_RDONLY))
        except OSError:
            for fd in fds:
                os.close(fd)
            self.remove()
            raise
        self._read["stdout"], self._read["stderr"] = fds[2], fds[3]
        return fds[0], fds[1]

    def read(self, log: LogWriter, echo: OutputCallback | None) -> tuple[int, bool]:
        """Read each file to its current end, stdout first: into ``log`` (with the offset it
        ends at) and to ``echo``. The bytes read, and whether ``echo`` still works."""
        got = 0
        for stream in ("stdout", "stderr"):
            fd = self._read[stream]
            while fd is not None:
                try:
                    data = os.read(fd, 1 << 20)
                except OSError:
                    break
                if not data:
                    break
                got += len(data)
                self._at[stream] += len(data)
                log.write(stream, data, end=self._at[stream])
                if log.bytes_written:  # a test hook: killed holding output it has not logged
                    fault("supervisor.read-unlogged")
                if stream == "stderr":
                    self.stderr_tail = (self.stderr_tail + data)[-2048:]
                if echo is not None:
                    try:
                        echo(stream, data)
                    except Exception:
                        echo = None  # the terminal went away; the log keeps everything
        return got, echo is not None

    def close(self) -> None:
        for stream, fd in self._read.items():
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
                self._read[stream] = None

    def remove(self) -> None:
        remove_output(self.ws, self.al)
