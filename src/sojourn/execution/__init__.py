"""Pausing a running script between two statements and carrying it on in a new process.

    from sojourn.execution import run_script, resume, request_pause
    run_script("train.py", ["--epochs", "3"], repo="~/.sojourn/repo")   # SIGTERM/SIGUSR1 pause it
    resume("cap_...", repo="~/.sojourn/repo")                            # in a new process

See ``docs/execution.md`` for what is saved, what runs again on resume, and what is refused.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "EXIT_OOM",
    "EXIT_PAUSED",
    "EXIT_PAUSE_FAILED",
    "PauseEvent",
    "PauseRefusal",
    "ResumeError",
    "pause_status",
    "register_context",
    "register_iter_hook",
    "request_pause",
    "resume",
    "run_script",
]

EXIT_PAUSED = 75  # a pause landed and its capsule is written
EXIT_PAUSE_FAILED = 76  # a SIGTERM pause could not land before its deadline
EXIT_OOM = 77  # out of memory in a loop: a capsule positioned before the failing statement is written


def __getattr__(name: str) -> Any:
    # Imported on first use: `import sojourn.execution` stays cheap for the CLI.
    if name in ("run_script", "resume", "ResumeError", "Resumed"):
        from sojourn.execution import runner

        return getattr(runner, name)
    if name in ("request_pause", "pause_status", "PauseEvent", "PauseRefusal"):
        from sojourn.execution import pause

        return getattr(pause, name)
    if name == "register_context":
        from sojourn.execution.contexts import register_context

        return register_context
    if name == "register_iter_hook":
        from sojourn.execution.iterhooks import register_iter_hook

        return register_iter_hook
    raise AttributeError(f"module 'sojourn.execution' has no attribute {name!r}")
