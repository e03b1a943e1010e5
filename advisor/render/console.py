"""Consoles for what the advisor prints: the full width of a terminal, plain lines in pipes.

rich falls back to 80 columns when stdout is not a terminal, which squeezes tables and cuts
code mid-line in CI logs and files. Output to a pipe is laid out as wide as its lines are
(`COLUMNS` still sets a width when given), and each line ends where its text ends: rich pads
table cells and panels to the console's width, which in a pipe would be trailing blanks.
A terminal gets its own width.
"""

from __future__ import annotations

import os
import sys
from typing import IO

from rich.console import Console

from advisor.terminal_text import inert_console

# Wide enough that no line of a report wraps; tables and panels are sized to their content.
UNWRAPPED_WIDTH = 1000


def output_width(stream: IO[str] | None = None) -> int | None:
    """None (let rich measure) for a terminal or when COLUMNS is set; else no wrapping."""
    stream = stream or sys.stdout
    if os.environ.get("COLUMNS", "").strip().isdigit():
        return None
    try:
        if stream.isatty():
            return None
    except (AttributeError, ValueError):
        pass
    return UNWRAPPED_WIDTH


class LineEndTrimmer:
    """A text stream that writes whole lines without their trailing blanks."""

    def __init__(self, stream: IO[str]):
        self.stream = stream
        self.pending = ""

    def write(self, text: str) -> int:
        self.pending += text
        if "\n" in self.pending:
            done, _, self.pending = self.pending.rpartition("\n")
            self.stream.write("\n".join(line.rstrip(" ") for line in done.split("\n")) + "\n")
        return len(text)

    def flush(self) -> None:
        if self.pending:
            self.stream.write(self.pending.rstrip(" "))
            self.pending = ""
        self.stream.flush()

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self.stream.fileno()

    @property
    def encoding(self) -> str:
        return getattr(self.stream, "encoding", "utf-8")


def trim_lines(text: str) -> str:
    """Text recorded from a console, each line without its trailing blanks."""
    return "\n".join(line.rstrip(" ") for line in text.split("\n"))


def is_unwrapped(console: Console) -> bool:
    """Whether this console writes to a pipe or file laid out without wrapping (plain lines)."""
    return console.width >= UNWRAPPED_WIDTH


def output_console(stderr: bool = False, soft_wrap: bool = False) -> Console:
    """The console a command prints its report or table on."""
    stream = sys.stderr if stderr else sys.stdout
    if _is_terminal(stream):
        return inert_console(stderr=stderr, highlight=False, soft_wrap=soft_wrap)
    # a pipe or file: its lines end where their text ends, at any width (COLUMNS=100 too)
    return inert_console(file=LineEndTrimmer(stream), highlight=False, soft_wrap=soft_wrap, width=output_width(stream))


def _is_terminal(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
