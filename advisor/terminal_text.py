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
- `inert_lines(text)`: any text about to reach a terminal, a CI log or a JUnit file, line by
  line: a line whose first visible characters are `::` (a GitHub Actions workflow command;
  the runner trims leading blanks) and a `##[` anywhere in a line (the runner's older command
  form) get a WORD JOINER (U+2060) between their characters, which shows as nothing and no
  runner reads as a command. `one_line` and `multi_line` apply it to every string they
  return; the consoles apply it to each rendered line too, so that wrapping a long name
  (COLUMNS=40) never starts a line with `::` either.
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


WORD_JOINER = "\u2060"
# A workflow command: `::` first on a line (after blanks, and after any SGR colour codes a
# console puts there), or `##[` anywhere in it.
_LINE_COMMAND = re.compile(r"(?m)^((?:[ \t\f\v]|\x1b\[[0-9;]*m)*):(?=:)")
_OLD_COMMAND = re.compile(r"#(?=#\[)")


def inert_lines(text: str) -> str:
    """TEXT with no line a CI runner reads as a command (see the module doc)."""
    if ":" not in text and "##[" not in text:
        return text
    text = _LINE_COMMAND.sub(lambda m: m.group(1) + ":" + WORD_JOINER, text)
    return _OLD_COMMAND.sub("#" + WORD_JOINER, text) if "##[" in text else text


def one_line(value: Any) -> str:
    """VALUE as one line of plain printable text that no CI runner reads as a command (see the module doc)."""
    s = value if isinstance(value, str) else str(value)
    if s.isprintable():  # the common case: only the commands to neutralise
        return inert_lines(s)
    s = _ESCAPE_SEQUENCE.sub("", valid_unicode(s))
    s = _LINE_BREAKS.sub(" ", s)
    return inert_lines(_CONTROL.sub("", s))


def multi_line(value: Any) -> str:
    """VALUE as printable text whose only control character is `\\n`, no line of it a CI command."""
    s = value if isinstance(value, str) else str(value)
    s = _ESCAPE_SEQUENCE.sub("", valid_unicode(s)).replace("\r\n", "\n").replace("\t", "    ")
    s = re.sub(r"[\r\v\f\x85]", "\n", s)
    return inert_lines(_CONTROL_KEEP_NEWLINE.sub("", s))


_INERT_CONSOLE: Any = None


class OutputClosed(Exception):
    """stdout was closed by its reader (`advisor report RUN | head -1`): not a failure of the
    command. Not an OSError, so no layer on the way (the command line parser) turns it into
    an exit status of its own."""


def inert_console(**kwargs: Any) -> Any:
    """A rich Console whose every rendered line (printed or exported) passes through
    `inert_lines`: a table cell or a message wrapped at any width never starts a line with a
    CI command. rich is imported here, on first use."""
    global _INERT_CONSOLE
    if _INERT_CONSOLE is None:
        from rich.console import Console

        class InertConsole(Console):
            def _render_buffer(self, buffer: Any) -> str:
                return inert_lines(super()._render_buffer(buffer))

            def export_text(self, *, clear: bool = True, styles: bool = False) -> str:
                return inert_lines(super().export_text(clear=clear, styles=styles))

            def on_broken_pipe(self) -> None:
                # rich's own answer is exit status 1; a closed pipe is the reader's choice
                raise OutputClosed()

        _INERT_CONSOLE = InertConsole
    return _INERT_CONSOLE(**kwargs)


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


__all__ = ["BIDI_CONTROLS", "WORD_JOINER", "clean_strings", "inert_console", "inert_lines", "multi_line", "one_line", "path_text", "valid_unicode"]
