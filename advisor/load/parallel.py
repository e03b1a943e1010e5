"""Load the ranks of a run in parallel processes, or summarise each rank where its file is.

Two ways to spread the ranks of a job over workers:

* `load_frames(paths)` returns every rank's frames to the caller (what `advisor report`
  needs: rules read frames). Workers are processes (the decode holds the GIL); each worker
  parses its file, or reads the cached frames, and sends the frames back.
* `map_ranks(fn, paths)` runs `fn(path)` for each rank on the workers and yields only what
  `fn` returns, as ranks finish, so the caller holds one small summary per rank and memory is
  bounded by the number of workers, not ranks. `rank_summary` is such a function.

Both take any `concurrent.futures.Executor`. The default is a local process pool; a cluster
executor runs the same (module-level, picklable) functions where the files are, e.g. Dask's
`distributed.Client.get_executor()`, or for Ray an Executor whose `submit` starts a
`ray.remote` task and returns its `ObjectRef.future()`. We ship no distribution layer.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future, ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from advisor.errors import InputError
from advisor.load.cache import load_cached
from advisor.load.trace import TraceFrames

T = TypeVar("T")
Progress = Callable[[Path], None]

# Below this much trace data (bytes on disk) process start-up costs more than it saves.
PARALLEL_MIN_BYTES = 8 * 2**20


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
    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
    if ctx.get_start_method() == "forkserver":
        ctx.set_forkserver_preload(["advisor.load.parallel"])
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


def _load_one(path: Path, cache: bool) -> Loaded:
    try:
        return Loaded(path, frames=load_cached(path, cache=cache))
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
    cache: bool = True,
    executor: Executor | None = None,
) -> list[Loaded]:
    """Every rank's frames (or error), in the order of `paths`; progress(path) as each finishes.

    workers=None picks one process per core, or none at all for a few small files.
    """
    paths = [Path(p) for p in paths]
    n = default_workers(len(paths)) if workers is None else max(1, min(workers, len(paths)))
    small = workers is None and _total_bytes(paths) < PARALLEL_MIN_BYTES
    if executor is None and (n == 1 or small):
        out = []
        for p in paths:
            out.append(_load_one(p, cache))
            if progress:
                progress(p)
        return out
    results = dict(_run(_load_one, paths, n, progress, executor, cache))
    return [results[p] for p in paths]


def map_ranks(
    fn: Callable[[Path], T],
    paths: Iterable[str | Path],
    workers: int | None = None,
    progress: Progress | None = None,
    executor: Executor | None = None,
) -> Iterator[tuple[Path, T]]:
    """(path, fn(path)) for each rank, as ranks finish; fn runs on the executor's workers.

    Only fn's result crosses back, so a job whose traces do not fit in one machine's memory
    can be summarised rank by rank.
    """
    paths = [Path(p) for p in paths]
    n = default_workers(len(paths)) if workers is None else max(1, min(workers, len(paths)))
    if executor is None and n == 1:
        for p in paths:
            result = fn(p)
            if progress:
                progress(p)
            yield p, result
        return
    yield from _run(fn, paths, n, progress, executor)


def _run(fn: Callable[..., T], paths: list[Path], workers: int, progress: Progress | None, executor: Executor | None, *args: Any) -> Iterator[tuple[Path, T]]:
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


# --- per-rank summaries (what a cluster worker sends back) ----------------------------------
@dataclass
class RankSummary:
    """What the report needs of one rank, without its frames: a few kB instead of MBs."""

    path: str
    rank: int | None
    steps: int = 0
    step_ns: list[int] = field(default_factory=list)
    breakdown_ms: dict[str, float] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


def rank_summary(path: Path) -> RankSummary:
    """Load one rank (through the cache) and measure it; the frames stay on the worker."""
    from advisor.metrics.summary import compute_metrics

    try:
        frames = load_cached(path)
    except InputError as exc:
        return RankSummary(path=str(path), rank=None, error=exc.line())
    metrics = compute_metrics(frames, frames.rank if frames.rank is not None else 0)
    return RankSummary(
        path=str(path),
        rank=frames.rank,
        steps=len(metrics.steps),
        step_ns=[int(d) for d in metrics.steps["duration"].to_numpy()],
        breakdown_ms=metrics.breakdown_mean_ms,
        summary=metrics.summary(),
    )
