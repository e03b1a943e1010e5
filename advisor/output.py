"""Where a rendered report goes: stdout, or a file (with a note on stderr).

Files are written atomically (`advisor.files.write_atomically`) and never over a file the command read
(`refuse_overwriting_inputs`): `advisor report t.json -o t.json` is refused, exit 2.
"""

from __future__ import annotations

import math
import os
import stat
import sys
from pathlib import Path
from typing import Any, Iterable, Optional

import orjson

from advisor.errors import InputError
from advisor.files import refuse_missing_folder, write_atomically
from advisor.terminal_text import inert_lines, path_text, valid_unicode


def write_output(text: str, output: Optional[Path], inputs: Iterable[Path] = (), note: bool = True) -> None:
    """TEXT to stdout, or to the file OUTPUT (atomically), never over one of INPUTS; an OUTPUT
    of `-` is stdout, as with most command-line tools. A file written is named on stderr
    (unless not `note`: the caller names it itself)."""
    if output is None or str(output) == "-":
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        return
    refuse_overwriting_inputs(output, inputs)
    write_atomically(output, text)
    if not note:
        return
    # One plain line, as a console prints it unwrapped (path_text leaves no control character
    # in it); written as it is, without importing rich for one line.
    sys.stderr.write(inert_lines(f"wrote {path_text(output)}") + "\n")
    sys.stderr.flush()


# The suffixes a report file may have (each names a format: advisor.cli.FORMAT_BY_SUFFIX);
# `-o out.pdf` would be plain text under a name that promises something else.
REPORT_SUFFIXES = (".txt", ".json", ".md", ".markdown", ".html", ".htm")
HTML_SUFFIXES = (".html", ".htm")
# ... and a table's (`report --ops -f csv|parquet`).
TABLE_SUFFIXES = (".csv", ".parquet")


def check_report_file(output: Optional[Path], tables: bool = False, html_only: bool = False) -> None:
    """An `-o` report file is refused before any work when its suffix names no format (for
    `view`, no HTML) or its folder does not exist (`-` is stdout; a character device or FIFO is
    written into)."""
    if output is None or str(output) == "-":
        return
    try:
        st = os.stat(output)
    except OSError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode) and not stat.S_ISDIR(st.st_mode):
        return  # /dev/stdout, a pipe: the bytes go where the name leads (advisor.files.write_atomically)
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise InputError(output, "is a directory; give the output a file name")
    if html_only and output.suffix.lower() not in HTML_SUFFIXES:
        shown = f"suffix {output.suffix!r}" if output.suffix else "no suffix"
        raise InputError(output, f"{shown}: `advisor view` writes an HTML report (name it .html)")
    allowed = (*REPORT_SUFFIXES, *TABLE_SUFFIXES) if tables else REPORT_SUFFIXES
    if output.suffix.lower() not in allowed:
        shown = f"suffix {output.suffix!r}" if output.suffix else "no suffix"
        named = f"{', '.join(REPORT_SUFFIXES[:4])}, .html" + (", .csv, .parquet" if tables else "")
        raise InputError(output, f"{shown}: a report file is named for its format ({named})")
    refuse_missing_folder(output)


def refuse_terminal_for_html(what: str = "report") -> None:
    """HTML without -o goes to stdout; a terminal is refused (a page of markup is no use there)."""
    if sys.stdout.isatty():
        raise InputError(None, f"an HTML {what} is not for a terminal: name a file with -o {what}.html, or redirect stdout (> {what}.html)")


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


def rounded(obj: Any, digits: int = 7) -> Any:
    """Plain JSON values with each float to DIGITS significant digits (78.59808, not
    78.59807833333333: more than a trace's clock measures), and never fewer than its whole
    part (byte counts stay whole)."""
    if isinstance(obj, float):
        if obj == 0 or not math.isfinite(obj):
            return obj
        return round(obj, max(0, digits - 1 - math.floor(math.log10(abs(obj)))))
    if isinstance(obj, dict):
        return {k: rounded(v, digits) for k, v in obj.items()}
    if isinstance(obj, list):
        return [rounded(v, digits) for v in obj]
    return obj


def to_json_text(obj: Any) -> str:
    return orjson.dumps(jsonable(obj), option=orjson.OPT_INDENT_2).decode()
