"""The run's epoch boundaries and what each cost, from the facts file's step times and waits.

Read by `epoch-end` (what the boundaries cost) and `dataloader-stall` (which leaves the wait
of a restart to it: more workers make a restart longer, `persistent_workers` removes it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import msgspec
import numpy as np

from advisor.facts import DataLoaderFacts, FactsFile


@dataclass
class EpochEnds:
    """What the run's epoch boundaries cost, in ms over the whole run (detection, no saving)."""

    loader: DataLoaderFacts
    starts: list[int]  # step index of each epoch's first step, after the first epoch
    boundaries_recorded: bool  # from the facts' epoch_starts, not computed
    typical_step_ms: float
    typical_wait_ms: float
    restart_ms: list[float] = field(default_factory=list)  # per boundary, when workers restart
    short_batch_ms: list[float] = field(default_factory=list)  # per boundary, when the last batch is short
    short_batch_size: int | None = None
    run_steps: int = 0
    # the steps (facts indices) whose wait for their batch is a restart's, at every boundary
    # where workers restart (those at the profiler's edges too)
    restart_steps: list[int] = field(default_factory=list)

    @property
    def steps_per_epoch(self) -> int:
        gaps = np.diff(self.starts)
        return int(np.median(gaps)) if len(gaps) else self.starts[0]

    @property
    def steady_short_batch_ms(self) -> float:
        """What a short last batch costs every epoch. The first one may recompile a compiled
        model: that happens once per run, so it is left out when later epochs show the
        steady cost, or when it is a recompilation (over 10 typical steps) seen only once."""
        if not self.short_batch_ms:
            return 0.0
        if len(self.short_batch_ms) > 1:
            return float(np.median(self.short_batch_ms[1:]))
        first = self.short_batch_ms[0]
        return 0.0 if first > 10 * self.typical_step_ms else first

    @property
    def one_time_ms(self) -> float:
        return float(sum(self.short_batch_ms)) - self.steady_short_batch_ms * len(self.short_batch_ms)

    @property
    def per_epoch_ms(self) -> float:
        restart = float(np.mean(self.restart_ms)) if self.restart_ms else 0.0
        return restart + self.steady_short_batch_ms

    @property
    def per_step_ms(self) -> float:
        return self.per_epoch_ms / max(self.steps_per_epoch, 1)


def _signature(d: DataLoaderFacts) -> tuple:
    return (d.dataset_class, d.dataset_len, d.batch_size, d.num_workers, d.persistent_workers, d.drop_last)


def _driver_loader(loaders: list[DataLoaderFacts]) -> DataLoaderFacts | None:
    """The DataLoader the loop iterates (the one with the most epochs begun, else the first).
    A loop that builds a new DataLoader every epoch records one loader per epoch, each begun
    once: loaders with the same dataset and settings are one loader, their epochs together
    (each new one starts its workers as a non-persistent loader's new epoch does)."""
    if not loaders:
        return None
    merged: dict[tuple, DataLoaderFacts] = {}
    for d in loaders:
        key = _signature(d)
        if key in merged and d.epoch_starts is not None:
            starts = sorted(set(merged[key].epoch_starts or []) | set(d.epoch_starts))
            merged[key] = msgspec.structs.replace(merged[key], epoch_starts=starts, persistent_workers=False if len(starts) > 1 and merged[key].persistent_workers is not True else merged[key].persistent_workers)
        elif key not in merged:
            merged[key] = d
    return max(merged.values(), key=lambda d: len(d.epoch_starts or []))


def _epoch_starts(loader: DataLoaderFacts, n_steps: int) -> tuple[list[int], bool] | None:
    if loader.epoch_starts:
        return [s for s in loader.epoch_starts if 0 < s < n_steps], True
    per_epoch = loader.batches_per_epoch
    if per_epoch is None:
        size, bs = loader.dataset_len, loader.batch_size
        if size is None or bs is None:
            return None
        per_epoch = size // bs if loader.drop_last else math.ceil(size / bs)
    if per_epoch <= 0:
        return None
    return list(range(per_epoch, n_steps, per_epoch)), False


def epoch_ends(recorded: FactsFile, max_restart_steps: int = 5) -> EpochEnds | None:
    """The epoch boundaries the run crossed and each one's extra cost (None when not measurable)."""
    times, waits = recorded.step_times_ms, recorded.loader_wait_ms
    loader = _driver_loader(recorded.dataloaders or [])
    if loader is None or times is None or len(times) < 3:
        return None
    step_ms = np.asarray(times, dtype=np.float64)
    wait_ms = np.asarray(waits, dtype=np.float64) if waits is not None and len(waits) == len(times) else None
    found = _epoch_starts(loader, len(step_ms))
    if found is None or not found[0]:
        return None
    starts, boundaries_recorded = found
    ordinary = np.ones(len(step_ms), dtype=bool)
    ordinary[0] = False
    profiled = [i for i in recorded.profiled_steps or [] if i < len(step_ms)]
    if profiled:
        ordinary[profiled] = False
        ordinary[min(max(profiled) + 1, len(step_ms) - 1)] = False
    size, bs = loader.dataset_len, loader.batch_size
    short = not loader.drop_last and size is not None and bs is not None and size % bs != 0
    per_epoch = int(np.median(np.diff([0, *starts]))) if starts else len(step_ms)
    # The boundaries themselves are what is measured: an epoch's first steps (at most all but
    # its last), and its previous step where that batch is short.
    after = max(min(max_restart_steps, per_epoch - 1), 1)
    for s in starts:
        ordinary[max(s - 1, 0) if short else s: s + after] = False
    in_window = np.zeros(len(step_ms), dtype=bool)
    in_window[profiled] = True
    # Beside the window, the typical step: the steps of no boundary, profiled or not where the
    # window and its next step leave too few out of it.
    apart = np.ones(len(step_ms), dtype=bool)
    apart[0] = False
    for s in starts:
        apart[max(s - 1, 0) if short else s: s + after] = False
    if ordinary.sum() < 3:
        if apart.sum() < 3:
            return None
        ordinary = apart
    # A profiled boundary step is set against the profiled steps, an unprofiled one against
    # the unprofiled steps: the profiler's own cost is not an epoch end's.
    pool = {False: apart & ~in_window, True: apart & in_window}
    typical_of = {k: (float(np.median(step_ms[v])), float(np.median(wait_ms[v])) if wait_ms is not None else 0.0) if v.sum() >= 2 else None for k, v in pool.items()}
    ends = EpochEnds(
        loader=loader,
        starts=starts,
        boundaries_recorded=boundaries_recorded,
        typical_step_ms=float(np.median(step_ms[ordinary])),
        typical_wait_ms=float(np.median(wait_ms[ordinary])) if wait_ms is not None else 0.0,
        run_steps=len(step_ms) - 1,
    )
    # A boundary at the profiler's start or stop (the step before the window, its first, the
    # step after it) holds the profiler's own work: measured only where no other boundary is.
    edges = {min(profiled) - 1, min(profiled), max(profiled) + 1} if profiled else set()
    measured = [s for s in starts if s not in edges] or starts
    if loader.num_workers and not loader.persistent_workers and wait_ms is not None:
        for s in starts:
            # What a restart costs: the wait of the epoch's first steps for their batches over
            # the typical wait, until it is back to typical. The step's time over a typical
            # step would hold the workers' start and the old ones' teardown too, but under the
            # profiler forking a worker costs several times what it does unprofiled
            # (AdvisorBench's loader_per_epoch: ~90 ms more per boundary step in the window,
            # ~12 ms per epoch measured unprofiled), so the wait is the figure kept.
            tolerance = 2 * (typical_of[bool(in_window[s])] or (0.0, ends.typical_wait_ms))[1] + 1.0
            extra = 0.0
            for i in range(s, min(s + after, len(wait_ms))):
                if i > s and wait_ms[i] <= tolerance:
                    break
                typ_wait = (typical_of[bool(in_window[i])] or (0.0, ends.typical_wait_ms))[1]
                extra += max(wait_ms[i] - typ_wait, 0.0)
                ends.restart_steps.append(i)
            if s in measured:
                ends.restart_ms.append(float(extra))
    if short:
        ends.short_batch_size = size % bs
        ends.short_batch_ms = [max(float(step_ms[s - 1]) - ends.typical_step_ms, 0.0) for s in starts]
    return ends
