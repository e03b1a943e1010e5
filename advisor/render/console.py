"""Consoles for what the advisor prints: the full width of a terminal, no wrapping in pipes.

rich falls back to 80 columns when stdout is not a terminal, which squeezes tables and cuts
code mid-line in CI logs and files. Output to a pipe is laid out as wide as its lines are
(`COLUMNS` still sets a width when given); a terminal gets its own width.
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


def output_console(stderr: bool = False, soft_wrap: bool = False) -> Console:
    """The console a command prints its report or table on."""
    stream = sys.stderr if stderr else sys.stdout
    return inert_console(stderr=stderr, highlight=False, soft_wrap=soft_wrap, width=output_width(stream))
