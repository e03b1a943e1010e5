"""Ending the process as Python would end it, minus the interpreter's teardown.

A normal exit joins the threads, runs the atexit handlers, flushes the streams, then tears
the interpreter down: every module's objects freed one by one (tens of ms once pandas,
pyarrow and an analysis's tables exist; the OS takes the memory back anyway), and native
destructors run (a forked profiler's wait for threads that do not exist in the fork).
`leave` does the first three and exits at once.
"""

from __future__ import annotations

import os
import sys


def exit_status(code: object) -> int:
    """What `sys.exit(code)` makes the process exit with (a message is printed to stderr, as Python prints it)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF if code >= 0 else code % 256
    try:
        sys.stderr.write(f"{code}\n")
        sys.stderr.flush()
    except Exception:
        pass
    return 1


def flush_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass


def leave(status: int) -> None:
    """Join the non-daemon threads, run the atexit handlers (temporary folders are removed by
    them), flush stdout and stderr, and exit with `status` without the teardown."""
    import atexit
    import threading

    try:
        threading._shutdown()  # type: ignore[attr-defined]  # join non-daemon threads, as at exit
    except Exception:
        pass
    try:
        atexit._run_exitfuncs()
    except BaseException:
        pass
    flush_streams()
    os._exit(status)
