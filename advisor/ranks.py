"""Spread the ranks of a run over worker processes: analyse each rank where its file is read,
or load every rank's frames.

Two ways to spread the ranks of a job over workers:

* `load_frames(paths)` returns every rank's frames to the caller, for a caller that needs
  them all in one process (memory grows with the rank count). Workers are processes (the
  decode holds the GIL); each parses its file, or reads the cached frames, and sends them back.
* `map_ranks(fn, items)` runs `fn(item)` for each rank on the workers and yields only what
  `fn` returns, as ranks finish, so the caller holds one small result per rank and memory is
  bounded by the number of workers, not ranks. `advisor.analysis.analyze_rank` is that
  function for every report: frames -> metrics -> rank rules, where the trace is read.

Both take any `concurrent.futures.Executor`. The default is a local process pool; a cluster
executor runs the same (module-level, picklable) functions where the files are, e.g. Dask's
`distributed.Client.get_executor()` (see `advisor.cluster`). We ship no distribution
layer of our own.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from advisor.errors import InputError
from advisor.load.trace import TraceFrames, load_trace

if TYPE_CHECKING:  # the pool's modules are imported where a pool is made: a run of one rank needs none
    from concurrent.futures import Executor, Future, ProcessPoolExecutor

T = TypeVar("T")
Progress = Callable[[Path], None]

# Below this much trace data (bytes on disk) process start-up costs more than it saves...
PARALLEL_MIN_BYTES = 8 * 2**20
# ...unless there are more ranks than this: each rank costs its metrics and rules however few
# events it holds (tens of ms), and 3,000 one-event files ran one after the other.
SERIAL_MAX_RANKS = 16


def _few_and_small(paths: list[Path]) -> bool:
    return len(paths) <= SERIAL_MAX_RANKS and _total_bytes(paths) < PARALLEL_MIN_BYTES


def default_workers(n_tasks: int) -> int:
    """One process per core (as the OS lets us use them), never more than there are ranks."""
    env = os.environ.get("ADVISOR_WORKERS")
    if env and env.isdigit() and int(env) > 0:
        cores = int(env)
    else:
        try:
            cores = len(os.sched_getaffinity(0))
        except AttributeError:  # not on Linux
            cores = os.cpu_count() or 1
    return max(1, min(cores, n_tasks))


def process_pool(workers: int) -> ProcessPoolExecutor:
    """A local pool whose workers start from a clean interpreter that imports the loader once.

    forkserver, not fork: the caller may be running threads (the progress bar) and forking a
    threaded process can deadlock the child; spawn would re-import pandas in every worker.
    """
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
    if ctx.get_start_method() == "forkserver":
        ctx.set_forkserver_preload(["advisor.ranks", "advisor.analysis"])
    return ProcessPoolExecutor(max_workers=workers, mp_context=ctx)


@dataclass
class Loaded:
    """One rank's outcome: frames, or what is wrong with its file (sent as plain strings:
    they cross a process boundary)."""

    path: Path
    frames: TraceFrames | None = None
    error_path: str | None = None
    problem: str | None = None

    @property
    def error(self) -> InputError | None:
        return InputError(self.error_path, self.problem) if self.problem is not None else None


def _load_one(path: Path, load: Callable[[Path], TraceFrames] | None) -> Loaded:
    try:
        return Loaded(path, frames=(load or load_trace)(path))
    except InputError as exc:
        return Loaded(path, error_path=exc.path, problem=exc.problem)


def _total_bytes(paths: list[Path]) -> int:
    total = 0
    for p in paths:
        try:
            total += p.stat().st_size
        except OSError:
            pass
    return total


def load_frames(
    paths: Iterable[str | Path],
    workers: int | None = None,
    progress: Progress | None = None,
    load: Callable[[Path], TraceFrames] | None = None,
    executor: Executor | None = None,
) -> list[Loaded]:
    """Every rank's frames (or error), in the order of `paths`; progress(path) as each finishes.

    `load` reads one file (default: `load_trace`; `advisor.cache.load_cached` reads the frames
    cache first: the caller chooses, so loading does not depend on the cache above it; it must
    be a module-level function, to reach the workers). workers=None picks one process per
    core, or none at all for a few small files.
    """
    paths = [Path(p) for p in paths]
    n = default_workers(len(paths)) if workers is None else max(1, min(workers, len(paths)))
    small = workers is None and _few_and_small(paths)
    if executor is None and (n == 1 or small):
        out = []
        for p in paths:
            out.append(_load_one(p, load))
            if progress:
                progress(p)
        return out
    results = dict(_run(_load_one, paths, n, progress, executor, load))
    return [results[p] for p in paths]


def map_ranks(
    fn: Callable[[Any], T],
    items: Iterable[Any],
    workers: int | None = None,
    progress: Progress | None = None,
    executor: Executor | None = None,
) -> Iterator[tuple[Any, T]]:
    """(item, fn(item)) for each rank, as ranks finish; fn runs on the executor's workers.

    An item is a trace path or a task with a `path` (what progress is told). Only fn's result
    crosses back, so a job whose traces do not fit in one machine's memory can be analysed
    rank by rank. Without an executor: a local process pool, or the calling process when
    workers=None and the files are few and small (process start-up would cost more).
    """
    items = list(items)
    paths = [_path_of(i) for i in items]
    n = default_workers(len(items)) if workers is None else max(1, min(workers, len(items)))
    small = workers is None and _few_and_small(paths)
    if executor is None and (n == 1 or small):
        for item, p in zip(items, paths, strict=True):
            result = fn(item)
            if progress:
                progress(p)
            yield item, result
        return
    yield from _run_items(fn, items, n, progress, executor)


def _path_of(item: Any) -> Path:
    return Path(getattr(item, "path", item))


def _run_items(fn: Callable[[Any], T], items: list[Any], workers: int, progress: Progress | None, executor: Executor | None) -> Iterator[tuple[Any, T]]:
    """Submit every item, yield results as they finish; a finished future is let go at once
    (a cluster frees its copy of the result)."""
    from concurrent.futures import as_completed

    own = executor is None
    pool = process_pool(workers) if own else executor
    try:
        futures: dict[Future, Any] = {pool.submit(fn, item): item for item in items}
        for fut in as_completed(list(futures)):
            item = futures.pop(fut)
            result = fut.result()
            del fut
            if progress:
                progress(_path_of(item))
            yield item, result
    finally:
        if own:
            pool.shutdown(wait=True, cancel_futures=True)


def _run(fn: Callable[..., T], paths: list[Path], workers: int, progress: Progress | None, executor: Executor | None, *args: Any) -> Iterator[tuple[Path, T]]:
    from concurrent.futures import as_completed

    own = executor is None
    pool = process_pool(workers) if own else executor
    try:
        futures: dict[Future, Path] = {pool.submit(fn, p, *args): p for p in paths}
        for fut in as_completed(futures):
            path = futures[fut]
            result = fut.result()
            if progress:
                progress(path)
            yield path, result
    finally:
        if own:
            pool.shutdown(wait=True, cancel_futures=True)
