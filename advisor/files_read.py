"""The files this command has read: none of them is ever an output.

A command's outputs (`-o`, `--json`, `--junit`) must never replace a file it read: a trace,
a facts file, the configuration, a baseline, a budget file. Each reader names the file here
as it reads it (`remember`), and the writers refuse any output that is the same file as one
of them (advisor.output.refuse_overwriting_inputs), whatever name it is given.

It also reads the small files the advisor did not make itself (facts files, baselines, the
cache's seals and secret) without trusting what they are: `read_regular` never blocks on a
FIFO, never reads a device (a link to /dev/zero), and refuses a file larger than its cap
before reading it.

Like errors.py, this module imports nothing from the advisor: every stage may use it.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Iterable

_READ: dict[str, Path] = {}


def remember(path: str | os.PathLike[str] | Path) -> None:
    """PATH was read (or is about to be) by this command."""
    p = Path(path)
    _READ.setdefault(os.path.abspath(p), p)


def remember_all(paths: Iterable[str | os.PathLike[str] | Path]) -> None:
    for p in paths:
        remember(p)


def files_read() -> list[Path]:
    """Every file remembered so far, in the order first read."""
    return list(_READ.values())


def forget_all() -> None:
    """A fresh list (a long-lived process that runs several commands, such as the tests)."""
    _READ.clear()


class UnreadableFile(OSError):
    """A path that is not a regular file, or one too large to read: str() says which."""

    def __str__(self) -> str:
        return str(self.strerror)


def _kind(mode: int) -> str:
    for test, word in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory")):
        if test(mode):
            return word
    return "not a plain file"


def open_regular(path: str | os.PathLike[str], follow: bool = True):
    """PATH opened for reading (unbuffered binary) when it is a regular file: opened without
    blocking (a FIFO with no writer would wait for ever), then checked with fstat, so a link
    to /dev/zero, a FIFO or a socket is UnreadableFile and nothing is read from it. `follow`
    False: a symbolic link is refused too (O_NOFOLLOW)."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    if not follow:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow:
            raise UnreadableFile(errno.ELOOP, "a symbolic link, not read") from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise UnreadableFile(errno.EINVAL, f"{_kind(mode)}, not a regular file")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb", buffering=0)
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | os.PathLike[str], limit: int, follow: bool = True) -> bytes:
    """The bytes of PATH, a regular file of at most LIMIT bytes (open_regular); a larger file is
    UnreadableFile before anything is read, and no more than LIMIT + 1 bytes are ever read."""
    with open_regular(path, follow) as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise UnreadableFile(errno.EFBIG, f"too large ({size:,} bytes; at most {limit:,} are read)")
        chunks, total = [], 0
        while total <= limit:
            chunk = f.read(limit + 1 - total)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > limit:  # it grew while being read
            raise UnreadableFile(errno.EFBIG, f"too large (more than {limit:,} bytes)")
        return b"".join(chunks)


__all__ = ["UnreadableFile", "files_read", "forget_all", "open_regular", "read_regular", "remember", "remember_all"]
