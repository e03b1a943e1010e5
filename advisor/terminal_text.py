"""Strings from traces, facts files and file names, made safe to print.

A kernel name, a device name, a Python stack frame or a file name is data the user did not
write and may not trust: a trace can hold escape sequences that move the cursor, set the
window title or draw an OSC 8 hyperlink, and a newline in a finding's message can start a
line that a CI runner reads as a command (`::set-output ...`, `##[error]...`). Everything
the advisor prints or writes as text passes through one of these functions:

- `one_line(s)`: for a table cell, a message, a note, an error line. Escape sequences
  (CSI, OSC, and the others) are removed whole, the remaining control characters are
  removed, line breaks of any kind become spaces, and bidirectional controls (U+202E and
  the like, which reorder what follows them) are removed.
- `multi_line(s)`: the same, but `\\n` is kept (code snippets).
- `path_text(p)`: a file name as one line the user can still recognise: control
  characters are shown as `\\n`, `\\x1b`..., and bytes that are not UTF-8 (a Linux file
  name can hold any) as `\\xff`, so the text can be written to a UTF-8 stream at all.

This module imports nothing heavy: the loaders, the capture and the CLI's error path use it.
"""

from __future__ import annotations

import os
import re
from typing import Any

# ESC followed by: CSI `[` params final; OSC `]` ... BEL or ST; DCS/SOS/PM/APC ... ST; or one
# more character (two-character sequences such as ESC c, ESC 7). The 8-bit C1 forms too.
_ESCAPE_SEQUENCE = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?"
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
    r"|\x1b[ -~]?"
)
_LINE_BREAKS = re.compile(r"[\n\r\t\v\f\x1c-\x1e\x85\u2028\u2029]")
# C0 and C1 controls (tab and line breaks are handled above) and the bidirectional controls.
_CONTROL = re.compile("[\x00-\x08\x0e-\x1b\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_CONTROL_KEEP_NEWLINE = re.compile("[\x00-\x08\x0b-\x1b\x1c-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")
_SURROGATE = re.compile("[\ud800-\udfff]")
# Bidirectional controls only (HTML keeps line breaks and tabs in its own way).
BIDI_CONTROLS = re.compile("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def valid_unicode(s: str) -> str:
    """Lone surrogates (file names that are not UTF-8, decoded with surrogateescape) as `\\xNN`."""
    if not _SURROGATE.search(s):
        return s
    return _SURROGATE.sub(_escaped_surrogate, s)


def _escaped_surrogate(m: re.Match[str]) -> str:
    code = ord(m.group(0))
    return f"\\x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"\\u{code:04x}"


def one_line(value: Any) -> str:
    """VALUE as one line of plain printable text (see the module doc)."""
    s = value if isinstance(value, str) else str(value)
    if s.isprintable():  # the common case: nothing to do
        return s
    s = _ESCAPE_SEQUENCE.sub("", valid_unicode(s))
    s = _LINE_BREAKS.sub(" ", s)
    return _CONTROL.sub("", s)


def multi_line(value: Any) -> str:
    """VALUE as printable text whose only control character is `\\n`."""
    s = value if isinstance(value, str) else str(value)
    s = _ESCAPE_SEQUENCE.sub("", valid_unicode(s)).replace("\r\n", "\n").replace("\t", "    ")
    s = re.sub(r"[\r\v\f\x85]", "\n", s)
    return _CONTROL_KEEP_NEWLINE.sub("", s)


def _visible(m: re.Match[str]) -> str:
    c = m.group(0)
    named = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
    if c in named:
        return named[c]
    code = ord(c)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


_SHOWN_ESCAPED = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")


def path_text(path: Any) -> str:
    """A file name (str, Path or bytes) as one recognisable line: controls shown escaped."""
    if isinstance(path, bytes):
        s = path.decode("utf-8", "backslashreplace")
    else:
        s = valid_unicode(os.fspath(path) if isinstance(path, os.PathLike) else str(path))
    return _SHOWN_ESCAPED.sub(_visible, s)


def clean_strings(obj: Any) -> Any:
    """A JSON-like value with every string valid Unicode (for orjson, which refuses surrogates)."""
    if isinstance(obj, str):
        return valid_unicode(obj)
    if isinstance(obj, dict):
        return {clean_strings(k) if isinstance(k, str) else k: clean_strings(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean_strings(v) for v in obj]
    return obj


__all__ = ["BIDI_CONTROLS", "clean_strings", "multi_line", "one_line", "path_text", "valid_unicode"]
