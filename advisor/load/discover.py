"""Find the trace files behind a path the user gave: one file, a run dir, or a dir of runs.

A directory whose files are traces is one run (its files are ranks or workers); a directory
whose sub-directories each hold traces is several runs (`log/<run>/...`), of which the newest
is reported unless one is named: newest by the time torch.profiler's
`tensorboard_trace_handler` writes into each trace's name (`<worker>.<time>.pt.trace.json`),
which a copy or a clone keeps; never by the files' modification times, which a clone sets
to the time of the checkout. Where a run's traces carry no such time, the command asks
which run, listing them (`--run NAME`). Whether a folder's traces really are one job's ranks is
decided once they are loaded (advisor.analysis groups them by device, distributed settings
and time); `--run` also takes a trace file's name, to report one of them alone.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from advisor.errors import InputError

CACHE_DIR_NAME = ".advisor-cache"  # where advisor.cache keeps its entries with ADVISOR_CACHE=beside
TRACE_SUFFIXES = (".pt.trace.json", ".pt.trace.json.gz", ".json", ".json.gz")
# Files that sit beside traces but are not traces: our own outputs and caches.
NOT_TRACES = re.compile(r"^(advisor[_.-].*|.*\.advisor\..*|baseline.*\.json)$")


@dataclass
class RunFiles:
    """The trace files of one run, in a stable order, and what was picked and why."""

    name: str
    directory: Path
    files: list[Path]
    other_runs: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def is_trace_name(path: Path) -> bool:
    name = path.name
    return name.endswith(TRACE_SUFFIXES) and not NOT_TRACES.match(name)


def _natural_key(path: Path) -> list[Any]:
    """rank-2 before rank-10: digit runs compare as numbers."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path.as_posix())]


# A log dir holds a few folders per run (TensorBoard's plugins/profile/<run>/ at most): a walk
# that meets more folders than this was given something else (`/`, a home folder), and says so.
MAX_FOLDERS = 5_000


def _trace_files(root: Path) -> Iterator[Path]:
    """Trace files under root, recursively, never inside the frames cache (.advisor-cache);
    InputError past MAX_FOLDERS folders (`--baseline /` must not walk the file system)."""
    def unreadable(exc: OSError) -> None:
        # The folder the user named must be readable; a sub-folder that vanishes or is
        # locked while we walk is skipped, not fatal.
        if Path(exc.filename or "") == root:
            raise exc

    seen = 0
    for folder, dirs, files in os.walk(root, onerror=unreadable):
        seen += 1
        if seen > MAX_FOLDERS:
            raise InputError(root, f"holds more than {MAX_FOLDERS:,} folders: not a torch.profiler log dir; give the run's own folder or trace file")
        dirs[:] = [d for d in dirs if d != CACHE_DIR_NAME]
        for name in files:
            p = Path(folder) / name
            if is_trace_name(p) and p.is_file():
                yield p


# `<worker>.<time>.pt.trace.json[.gz]`: tensorboard_trace_handler's time, in ns (torch >= 2.0)
# or in ms (older releases)
_RECORDED_AT = re.compile(r"\.(\d{13}|\d{19})\.pt\.trace\.json(?:\.gz)?$")


def recorded_ns(paths: list[Path]) -> int | None:
    """When the run was recorded, from its trace files' names (the latest); None when a name
    carries no time."""
    times = []
    for p in paths:
        m = _RECORDED_AT.search(p.name)
        if m is None:
            return None
        t = int(m.group(1))
        times.append(t * 1_000_000 if len(m.group(1)) == 13 else t)
    return max(times) if times else None


def find_run(path: str | Path, run: str | None = None) -> RunFiles:
    """Resolve PATH (file or directory) to the trace files of one run."""
    path = Path(path)
    try:
        path.stat()
    except FileNotFoundError:
        raise InputError(path, "no such file or directory") from None
    except OSError as exc:  # a folder on the way that cannot be searched, a loop of links, ...
        raise InputError(path, f"cannot read: {exc.strerror or exc}") from None
    if path.is_file():
        return RunFiles(name=path.name, directory=path.parent, files=[path])
    if not path.is_dir():
        raise InputError(path, "not a file or directory")

    by_dir: dict[Path, list[Path]] = {}
    try:
        for p in sorted(_trace_files(path), key=_natural_key):
            by_dir.setdefault(p.parent, []).append(p)
    except OSError as exc:
        raise InputError(path, f"cannot read directory: {exc.strerror or exc}") from None
    if not by_dir:
        try:
            empty = not any(path.iterdir())
        except OSError as exc:
            raise InputError(path, f"cannot read directory: {exc.strerror or exc}") from None
        if empty:
            raise InputError(path, "directory is empty")
        raise InputError(path, "no trace files (*.pt.trace.json[.gz], *.json[.gz]) in this directory")

    runs = {(d.relative_to(path).as_posix() or "."): files for d, files in by_dir.items()}
    if run is not None:
        if run not in runs:
            # A trace file's name: one of a folder's traces that are not one job's ranks.
            named = [p for files in runs.values() for p in files if p.name == run]
            if len(named) == 1:
                return RunFiles(name=run, directory=named[0].parent, files=named)
            names = ", ".join(p.name for files in runs.values() for p in files[:20])
            raise InputError(path, f"no run named {run!r}; runs here: {', '.join(sorted(runs))}; trace files: {names}")
        chosen = run
    elif len(runs) == 1:
        chosen = next(iter(runs))
    else:
        when = {r: recorded_ns(files) for r, files in runs.items()}
        if any(t is None for t in when.values()):
            listed = ", ".join(sorted(runs)[:30]) + (", ..." if len(runs) > 30 else "")
            raise InputError(
                path,
                f"holds {len(runs)} runs and their trace names do not say when each was recorded: "
                f"choose one with --run NAME (or give its folder): {listed}",
            )
        chosen = max(runs, key=lambda r: (when[r], r))
    files = runs[chosen]
    others = sorted(r for r in runs if r != chosen)
    directory = path / chosen if chosen != "." else path
    name = path.name if chosen == "." else chosen
    notes = []
    if others:
        how = "as asked" if run is not None else "the newest, by the time in its trace file names"
        notes.append(f"{len(runs)} runs under {path}; reporting {chosen!r} ({how}); choose with --run NAME")
    return RunFiles(name=name, directory=directory, files=files, other_runs=others, notes=notes)
