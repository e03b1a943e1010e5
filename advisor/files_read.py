"""The files this command has read: none of them is ever an output.

A command's outputs (`-o`, `--json`, `--junit`) must never replace a file it read: a trace,
a facts file, the configuration, a baseline, a budget file. Each reader names the file here
as it reads it (`remember`), and the writers refuse any output that is the same file as one
of them (advisor.render.output.refuse_overwriting_inputs), whatever name it is given.

Like errors.py, this module imports nothing: every stage may use it.
"""

from __future__ import annotations

import os
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


__all__ = ["files_read", "forget_all", "remember", "remember_all"]
