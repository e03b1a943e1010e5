"""Errors the user can act on.

Every problem with the user's input is raised as :class:`InputError`; the CLI turns it into
one line naming the file and what is wrong, and exit code 2, never a traceback.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

EXIT_BAD_INPUT = 2


class InputError(Exception):
    """A problem with something the user gave us (a path, a trace, a config file)."""

    def __init__(self, path: str | Path | None, problem: str):
        self.path = str(path) if path is not None else None
        self.problem = problem
        super().__init__(self.line())

    def __reduce__(self):  # crosses process boundaries when ranks load in parallel
        return (type(self), (self.path, self.problem))

    def line(self) -> str:
        """One line whatever the file name holds (newlines, escape sequences, non-UTF-8 bytes)."""
        from advisor.terminal_text import one_line, path_text

        problem = one_line(self.problem)
        return f"{path_text(self.path)}: {problem}" if self.path else problem


def did_you_mean(word: str, names: Iterable[str]) -> str:
    """' (did you mean 'x'?)' for the closest of the names (rule ids, groups, config keys:
    all lower case), or ''."""
    import difflib  # only for a message

    close = difflib.get_close_matches(word.lower(), list(names), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


# The exit status when stdout closes before the output is written: 0, or a verdict already
# reached (a gate that failed stays failed; `set_status_if_output_closes`).
_STATUS_IF_OUTPUT_CLOSES = [0]


def set_status_if_output_closes(code: int) -> None:
    """The command's result is known before its output is written: a closed pipe keeps it."""
    _STATUS_IF_OUTPUT_CLOSES[0] = int(code)


def status_if_output_closes() -> int:
    return _STATUS_IF_OUTPUT_CLOSES[0]
