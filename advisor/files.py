"""Writing a file whole or not at all: a temp file beside it, then a rename over it.

Every file the advisor writes goes through here: the cache's entries, seals and digests, the
facts file, and the outputs a user asks for (reports, baselines, gate results, a fixed
script). `replace_file` is the one temp-file-and-rename; `write_atomically` adds what an
output the user named needs (a character device or a FIFO is written into, never replaced;
errors as one line naming the file).

Like errors.py and files_read.py, this module imports no stage: every stage may use it.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import sys
import tempfile
from pathlib import Path

from advisor.errors import InputError

TEMP_PREFIX = ".advisor-"  # a half-written file is hidden, and never taken for a trace or an entry


class NoLongerAFile(OSError):
    """The target stopped being a regular file while its replacement was being written."""


def replace_file(path: str | os.PathLike[str], data: str | bytes, *, sync: bool = True, mode: int | None = None) -> None:
    """Write DATA (text as UTF-8) to PATH through a temp file in the same folder and one rename.

    A reader sees the old file or the new one, whole; a full disk or a killed process leaves
    the old one as it was and no temp file. The file keeps the mode of the one it replaces (a
    new one gets 0666 less the umask) unless MODE is given. `sync=False` skips the fsync, for
    files that are only a cache. A PATH that is no longer a regular file when the rename comes
    (a directory, a FIFO) is not replaced: NoLongerAFile. Raises OSError."""
    path = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=TEMP_PREFIX, suffix=".tmp", dir=path.parent)
    try:
        try:
            _write_all(fd, payload)
            if mode is None:
                try:
                    mode = stat.S_IMODE(os.stat(path).st_mode)
                except FileNotFoundError:
                    mode = 0o666 & ~_umask()
            os.fchmod(fd, mode)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        if os.path.lexists(path) and not os.path.isfile(path):
            raise NoLongerAFile(errno.EEXIST, "is no longer a regular file; not replaced", str(path))
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_atomically(path: Path, data: str | bytes, *, make_parents: bool = False) -> None:
    """An output the user named, whole or nothing (`replace_file`); InputError when it cannot be.

    A folder that does not exist is not made (`-o /nonexistent/dir/r.html` is a typo more often
    than a wish): one line names it, unless `make_parents` (a default path such as
    perf/baseline.json, whose folder the user never typed).

    A new file gets the usual permissions (0666 less the umask); a replaced one keeps its own;
    a symbolic link is written through, not replaced. What is not a regular file is never
    renamed over: a character device (`/dev/null`, a terminal) or a FIFO, and `/dev/stdout` or
    `/dev/fd/N` whatever they lead to, are written into directly; a block device or a socket
    is refused.
    """
    path = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    try:
        st = os.stat(path)
    except OSError:
        st = None
    stream = _stream_alias(path)
    if st is not None and stream is not None and not stat.S_ISDIR(st.st_mode):
        _write_to_stream(path, stream, payload)
        return
    if st is not None and not stat.S_ISREG(st.st_mode):
        if stat.S_ISDIR(st.st_mode):
            raise InputError(path, "is a directory; give the output a file name")
        if stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode):
            _write_in_place(path, payload)
            return
        kind = "a block device" if stat.S_ISBLK(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode) else "not a regular file"
        raise InputError(path, f"is {kind}; the advisor writes only files, character devices and pipes")
    if path.is_symlink():
        path = Path(os.path.realpath(path))
    if not make_parents:
        refuse_missing_folder(path)
    try:
        if make_parents:
            path.parent.mkdir(parents=True, exist_ok=True)
        replace_file(path, payload)
    except NoLongerAFile:  # became a device or FIFO meanwhile
        raise InputError(path, "is no longer a regular file; not replaced") from None
    except OSError as exc:
        raise InputError(path, f"cannot write output: {exc.strerror or exc}") from None


def refuse_missing_folder(path: Path) -> None:
    """InputError when the folder an output file would go in does not exist (or is not a folder)."""
    from advisor.terminal_text import path_text

    parent = Path(path).parent
    if not parent.is_dir():
        what = "is not a folder" if os.path.lexists(parent) else "does not exist"
        raise InputError(path, f"cannot write output: the folder {path_text(parent)} {what} (the advisor makes no folder you did not name; create it first)")


_STREAM_ALIAS = re.compile(r"^/(?:dev/(?:std(?P<std>out|err)|fd/(?P<fd>\d+))|proc/(?:self|thread-self)/fd/(?P<pfd>\d+))$")


def _stream_alias(path: Path) -> int | None:
    """`/dev/stdout`, `/dev/stderr`, `/dev/fd/N`, `/proc/self/fd/N`: the open descriptor they name."""
    m = _STREAM_ALIAS.match(os.path.abspath(path))
    if m is None:
        return None
    if m.group("std"):
        return 1 if m.group("std") == "out" else 2
    return int(m.group("fd") or m.group("pfd"))


def _write_to_stream(path: Path, fd: int, payload: bytes) -> None:
    """Onto the process's own open stream (a pipe, a terminal, a file the shell opened, in
    append mode or not): written where the stream stands, never truncated or replaced."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    try:
        _write_all(fd, payload)
    except OSError as exc:
        raise InputError(path, f"cannot write output: {exc.strerror or exc}") from None


def _write_in_place(path: Path, payload: bytes) -> None:
    """Into a character device, a FIFO or an open stream: opened for writing, never created or
    replaced. A FIFO nobody reads is refused rather than waited on."""
    flags = os.O_WRONLY | os.O_NOCTTY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            raise InputError(path, "is a FIFO with no reader; start the reader first") from None
        raise InputError(path, f"cannot write output: {exc.strerror or exc}") from None
    try:
        os.set_blocking(fd, True)
        _write_all(fd, payload)
    except OSError as exc:
        raise InputError(path, f"cannot write output: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def _write_all(fd: int, payload: bytes) -> None:
    view = memoryview(payload)
    while view:
        view = view[os.write(fd, view) :]


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
