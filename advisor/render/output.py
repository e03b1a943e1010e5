"""Where a rendered report goes: stdout, or a file (with a note on stderr).

Files are written atomically (`write_atomically`) and never over a file the command read
(`refuse_overwriting_inputs`): `advisor report t.json -o t.json` is refused, exit 2.
"""

from __future__ import annotations

import errno
import math
import os
import re
import stat
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterable, Optional

import orjson

from advisor.errors import InputError
from advisor.terminal_text import path_text, valid_unicode


def write_output(text: str, output: Optional[Path], inputs: Iterable[Path] = ()) -> None:
    """TEXT to stdout, or to the file OUTPUT (atomically), never over one of INPUTS; an OUTPUT
    of `-` is stdout, as with most command-line tools."""
    if output is None or str(output) == "-":
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        return
    refuse_overwriting_inputs(output, inputs)
    write_atomically(output, text)
    from rich.text import Text  # only here: writing stdout needs no rich

    from advisor.terminal_text import inert_console

    inert_console(stderr=True, highlight=False).print(Text(f"wrote {path_text(output)}"), soft_wrap=True)


def unused_default_name(name: str) -> Path:
    """A default output name in the working folder that replaces nothing: NAME when free,
    else NAME with -2, -3, ... before its suffix (the "wrote ..." note names the one used)."""
    first = Path(name)
    if not os.path.lexists(first):
        return first
    for n in range(2, 10_000):
        candidate = first.with_name(f"{first.stem}-{n}{first.suffix}")
        if not os.path.lexists(candidate):
            return candidate
    raise InputError(first, "exists, and so do 9,998 numbered versions of it; give the output a name with -o")


def refuse_overwriting_inputs(output: Path, inputs: Iterable[Path] = ()) -> None:
    """An output that is one of the files read (`advisor report t.json -o t.json`) is refused:
    one of INPUTS, or any file this command has read so far (advisor.files_read: traces,
    facts, the configuration, a baseline, a budget file)."""
    from advisor.files_read import files_read

    try:
        os.stat(output)
    except OSError:  # nothing there yet: it cannot be an input
        return
    for p in [*inputs, *files_read()]:
        try:
            same = os.path.samefile(output, p)
        except OSError:
            continue
        if same:
            raise InputError(output, "is one of the files this command reads; it is never overwritten: choose another output file")


def write_atomically(path: Path, data: str | bytes) -> None:
    """Write a whole file or nothing: a temp file beside it, then a rename over it.

    A full disk, a killed process or a bad path leaves the earlier file as it was (and no
    temp file). A new file gets the usual permissions (0666 less the umask); a replaced one
    keeps its own; a symbolic link is written through, not replaced. What is not a regular
    file is never renamed over: a character device (`/dev/null`, a terminal) or a FIFO, and
    `/dev/stdout` or `/dev/fd/N` whatever they lead to, are written into directly; a block
    device or a socket is refused.
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
    tmp: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".advisor-", suffix=".tmp", dir=path.parent)
        try:
            _write_all(fd, payload)
            try:
                mode = stat.S_IMODE(os.stat(path).st_mode)
            except FileNotFoundError:
                mode = 0o666 & ~_umask()
            os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
        if os.path.lexists(path) and not os.path.isfile(path):  # became a device or FIFO meanwhile
            raise InputError(path, "is no longer a regular file; not replaced")
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        raise InputError(path, f"cannot write output: {exc.strerror or exc}") from None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


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


def run_input_files(analysis: Any) -> list[Path]:
    """The files an analysis read: its traces and the facts files beside them."""
    run = analysis.run
    facts = sorted(Path(run.directory).glob("advisor_facts*.json")) if run.directory else []
    return [*run.files, *facts]


def jsonable(obj: Any) -> Any:
    """Plain JSON values: NaN/inf become null (a figure we cannot give), numpy scalars plain."""
    if isinstance(obj, float):  # numpy floats too (np.float64 subclasses float)
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, str):
        return valid_unicode(obj)  # a file name that is not UTF-8: its bytes as \xNN
    if isinstance(obj, bool) or obj is None:
        return obj
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, dict):
        return {valid_unicode(str(k)): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalars
        return jsonable(obj.item())
    return obj


def to_json_text(obj: Any) -> str:
    return orjson.dumps(jsonable(obj), option=orjson.OPT_INDENT_2).decode()
