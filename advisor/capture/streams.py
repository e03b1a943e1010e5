"""The advisor's own stdout and stderr while a profiled script runs, apart from the script's.

The script may close its stdout or stderr (`sys.stdout.close()`, `os.close(2)`), replace
them, or reopen fds 1 and 2 as files of its own; none of that may change what happens to it
or to what the advisor says. Before the script starts, fds 1 and 2 are duplicated (the
duplicates are not inherited across exec) and the advisor's progress lines are written to
those; once the script has ended, its streams are flushed (their output comes first, as it
would) and `sys.stdout` / `sys.stderr` become the advisor's own for the summary, the report
and any error line. A stream with no file descriptor (an in-memory one) is used as it is.
"""

from __future__ import annotations

import io
import os
import sys
from typing import TextIO

_OWN: tuple[TextIO, TextIO] | None = None


def own_streams(fresh: bool = False) -> tuple[TextIO, TextIO]:
    """(stdout, stderr) of the advisor's own: taken before the script runs (`fresh`: again,
    from the streams as they are now, for a new capture in the same process)."""
    global _OWN
    if _OWN is None or fresh:
        _OWN = (_duplicate(sys.stdout), _duplicate(sys.stderr))
    return _OWN


def _duplicate(stream: TextIO) -> TextIO:
    try:
        stream.flush()
        fd = stream.fileno()
        copy = os.dup(fd)
    except (AttributeError, ValueError, OSError, io.UnsupportedOperation):
        return stream
    encoding = getattr(stream, "encoding", None) or "utf-8"
    return open(copy, "w", encoding=encoding, errors="backslashreplace", buffering=1)


def take_back_streams() -> None:
    """After the script: its streams flushed (as far as they still can be), and sys.stdout
    and sys.stderr the advisor's own from here on."""
    out, err = own_streams()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # closed, or its file descriptor is: what it held is the script's to lose
            pass
    sys.stdout, sys.stderr = out, err


__all__ = ["own_streams", "take_back_streams"]
