"""Where a rendered report goes: stdout, or a file (with a note on stderr).

Files are written atomically (`write_atomically`) and never over a file the command read
(`refuse_overwriting_inputs`): `advisor report t.json -o t.json` is refused, exit 2.
"""

from __future__ import annotations

import math
import os
import stat
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterable, Optional

import orjson

from advisor.errors import InputError
from advisor.terminal_text import path_text, valid_unicode


def write_output(text: str, output: Optional[Path], inputs: Iterable[Path] = ()) -> None:
    """TEXT to stdout, or to the file OUTPUT (atomically), never over one of INPUTS."""
    if output is None:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        return
    refuse_overwriting_inputs(output, inputs)
    write_atomically(output, text)
    from rich.console import Console  # only here: writing stdout needs no rich
    from rich.text import Text

    Console(stderr=True, highlight=False).print(Text(f"wrote {path_text(output)}"), soft_wrap=True)


def refuse_overwriting_inputs(output: Path, inputs: Iterable[Path]) -> None:
    """An output that is one of the files read (`advisor report t.json -o t.json`) is refused."""
    try:
        os.stat(output)
    except OSError:  # nothing there yet: it cannot be an input
        return
    for p in inputs:
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
    keeps its own; a symbolic link is written through, not replaced.
    """
    path = Path(path)
    if path.is_symlink():
        path = Path(os.path.realpath(path))
    if path.is_dir():
        raise InputError(path, "is a directory; give the output a file name")
    payload = data.encode("utf-8") if isinstance(data, str) else data
    tmp: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".advisor-", suffix=".tmp", dir=path.parent)
        try:
            view = memoryview(payload)
            while view:
                view = view[os.write(fd, view) :]
            try:
                mode = stat.S_IMODE(os.stat(path).st_mode)
            except FileNotFoundError:
                mode = 0o666 & ~_umask()
            os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
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
