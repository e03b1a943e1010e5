"""Every epoch end restarts the DataLoader workers, and runs a short last batch.

## What it detects
From the facts file of `advisor profile` (every step's time and wait for its batch, the
DataLoader's settings and the step at which each epoch began), the epoch boundaries that the
run crossed after its first step, and what each cost beyond a typical step:
- **worker restarts**: with `num_workers > 0` and `persistent_workers=False`, each new epoch
  shuts the worker processes down and starts new ones, which must import, build the dataset
  and fill the prefetch queue before the first batch arrives. A loop that builds a new
  DataLoader every epoch does the same: the facts file then holds one loader per epoch, each
  begun once, and loaders with the same dataset and settings are read as one. Measured as the
  wait for the first batches of the epoch above the typical wait. The old iterator's teardown
  and the new one's start (forking the workers in `iter()`) are in the step, not in the wait,
  but under the profiler they cost several times what they do unprofiled, so the step's own
  excess is not taken (it promised 63–74% on `loader_per_epoch`, measured 12–29%).
- **a short last batch**: with `drop_last=False` and a dataset that the batch size does not
  divide, the last step of each epoch has a different shape, which makes a compiled model
  recompile (the first time) and cuDNN autotune again. Measured as that step's time above a
  typical step.

It fires when the cost, spread over all the steps the run made, is at least `min_share` (2%)
of the window's step. Traces alone cannot show this (a profiling window rarely holds an epoch
end): without a facts file the rule is silent.

## What it needs from the trace
The facts file of `advisor profile`: every step's time and wait for its batch, the DataLoader's
settings and where each epoch began. The trace holds one window of steps and no epoch boundary:
without the facts file it says nothing. It is not run where the launches have no kernel records
(the device's activity is missing); where the host's operators are missing (a device-only
trace): the report's warning or note says why.

## Why it is slow
Worker start-up is paid once per epoch by every rank, and the device waits through all of
it: hundreds of milliseconds to seconds with a large dataset object, heavy imports, or
`spawn`. A recompilation of a compiled model costs seconds. On short epochs (small datasets,
large batches, many ranks) these stalls add up to a large share of the run.

## Evidence used
- `step_times_ms` and `loader_wait_ms` of every step (inside the window and out);
- each DataLoader's `num_workers`, `persistent_workers`, `drop_last`, `batch_size`,
  `dataset_len` and `epoch_starts` (or `batches_per_epoch` / the dataset length over the batch
  size for facts recorded before `epoch_starts` existed);
- the typical step and wait: medians over the steps after the first, leaving out the profiled
  window and the step after it (the trace is written then); a boundary inside the profiled
  window is set against the window's own steps of no boundary, one outside against the
  unprofiled ones, so that the profiler's cost is not counted as the epoch end's.

## Example
Before:
```python
loader = DataLoader(train_set, batch_size=512, shuffle=True, num_workers=8)
```
After:
```python
loader = DataLoader(train_set, batch_size=512, shuffle=True, num_workers=8,
                    persistent_workers=True,   # workers live across epochs
                    drop_last=True)            # every batch has the same shape
```

## How the saving is estimated
Per epoch: (a) the mean extra wait of each epoch's first steps over the typical wait (a
boundary in the window against the window's, one outside against the unprofiled steps'),
until the wait is back to typical (at most `max_restart_steps`, 5, and never the epoch's
last step), when workers are restarted, boundaries at the profiler's start or stop left out
where another one is measured, plus (b) the extra time
of the epoch's last step when that batch is short. A recompilation on the first short batch
happens once per run: it is reported, not counted, when later epochs show the steady cost or
when it is the only one seen. The first epoch's start is left out (workers start once anyway).
Divided by the steps per epoch, that is the cost each step carries on average; its share of
such an average step (typical step plus that cost) is applied to the window's step, as for
every other saving (an example from a recorded run is in
`benchmarks/results/rule_constants.md`). Confidence is high when the facts file says which step each
epoch began at, medium when the boundaries are computed from the dataset length.

Before (AdvisorBench's `loader_per_epoch`: 96 samples in batches of 32, one worker, a new
DataLoader each epoch): the wait alone gave 15.9% where the pair measured 29.4%, the workers'
start and the teardown being outside the wait; after: one DataLoader with
`persistent_workers=True`. The window (9 steps) holds two epoch ends, one next to the
profiler's start, so the figure moves from one profile to the next.

Reference: https://pytorch.org/docs/stable/data.html#torch.utils.data.DataLoader
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import msgspec
import numpy as np

from advisor.engine import Context
from advisor.facts import DataLoaderFacts, FactsFile

ID = "epoch-end"
TITLE = "Epoch ends restart the DataLoader workers and run a short batch"
GROUP = "input"
TESTED_ON = ("nvidia", "cpu")  # vendors whose real traces the tests run it on (advisor/metrics/vendors.py)
DOCS = "https://pytorch.org/docs/stable/data.html#torch.utils.data.DataLoader"
DEFAULTS = {"min_share": 0.02, "max_restart_steps": 5}
AFTER = """loader = DataLoader(train_set, batch_size=BATCH, shuffle=True, num_workers=WORKERS,
                    persistent_workers=True,   # workers live across epochs
                    drop_last=True)            # every batch has the same shape
"""


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
        for s in measured:
            # What a restart costs: the wait of the epoch's first steps for their batches over
            # the typical wait, until it is back to typical. The step's time over a typical
            # step would hold the workers' start and the old ones' teardown too, but under the
            # profiler forking a worker costs several times what it does unprofiled
            # (AdvisorBench's loader_per_epoch: ~90 ms more per boundary step in the window,
            # ~12 ms per epoch measured unprofiled), so the wait is the figure kept.
            typ_step, typ_wait = typical_of[bool(in_window[s])] or (ends.typical_step_ms, ends.typical_wait_ms)
            tolerance = 2 * typ_wait + 1.0
            extra = 0.0
            for i in range(s, min(s + after, len(wait_ms))):
                if i > s and wait_ms[i] <= tolerance:
                    break
                typ_step, typ_wait = typical_of[bool(in_window[i])] or (ends.typical_step_ms, ends.typical_wait_ms)
                extra += max(wait_ms[i] - typ_wait, 0.0)
            ends.restart_ms.append(float(extra))
    if short:
        ends.short_batch_size = size % bs
        ends.short_batch_ms = [max(float(step_ms[s - 1]) - ends.typical_step_ms, 0.0) for s in starts]
    return ends


def saving_ms(ends: EpochEnds, window_step_ms: float) -> float:
    """The share of an average step (typical step plus its part of the epoch-end cost) that
    the epoch ends take, applied to the window's step like every other saving."""
    share = ends.per_step_ms / (ends.typical_step_ms + ends.per_step_ms)
    return share * window_step_ms


def check(ctx: Context):
    ends = epoch_ends(ctx.recorded, int(ctx.options["max_restart_steps"]))
    if ends is None or ctx.step_ms <= 0 or ends.per_epoch_ms <= 0:
        return None
    saving = saving_ms(ends, ctx.step_ms)
    if saving / ctx.step_ms < ctx.options["min_share"]:
        return None
    d = ends.loader
    evidence = {
        "epoch_starts": ends.starts,
        "boundaries": "recorded" if ends.boundaries_recorded else "computed from dataset_len / batch_size",
        "typical_step_ms": round(ends.typical_step_ms, 3),
        "typical_wait_ms": round(ends.typical_wait_ms, 3),
        "worker_restart_ms": [round(x, 1) for x in ends.restart_ms],
        "short_last_batch": ends.short_batch_size,
        "short_batch_extra_ms": [round(x, 1) for x in ends.short_batch_ms],
        "steps_per_epoch": ends.steps_per_epoch,
        "per_epoch_ms": round(ends.per_epoch_ms, 1),
        "per_step_ms": round(ends.per_step_ms, 2),
        "one_time_ms": round(ends.one_time_ms, 1),
        "num_workers": d.num_workers,
        "persistent_workers": d.persistent_workers,
        "drop_last": d.drop_last,
        "batch_size": d.batch_size,
        "dataset_len": d.dataset_len,
    }
    parts, fixes = [], []
    if sum(ends.restart_ms) > 0:
        parts.append(f"restarting {d.num_workers} DataLoader workers cost {np.mean(ends.restart_ms):.0f} ms per epoch start")
        fixes.append("persistent_workers=True keeps the workers alive between epochs")
    if sum(ends.short_batch_ms) > 0:
        parts.append(f"the short last batch ({ends.short_batch_size} of {d.batch_size}) took {ends.short_batch_ms[-1]:.0f} ms over a typical step")
        fixes.append("drop_last=True gives every batch the same shape")
    if not parts:
        return None
    n = len(ends.starts)
    once = f" (and {ends.one_time_ms / 1e3:.1f} s once: the first short batch recompiled)" if ends.one_time_ms > 0 else ""
    message = (
        f"{n} epoch end{'s' if n != 1 else ''} in {ends.run_steps + 1} steps: " + "; ".join(parts) +
        f". {ends.per_epoch_ms:.0f} ms per epoch of {ends.steps_per_epoch} steps{once}: {ends.per_step_ms:.1f} ms per step "
        f"on top of a typical {ends.typical_step_ms:.1f} ms step."
    )
    fix = "; ".join(fixes) + "."
    snippet = AFTER.replace("BATCH", str(d.batch_size)).replace("WORKERS", str(d.num_workers or 8))
    if sum(ends.short_batch_ms) <= 0:
        snippet = snippet.replace(",   # workers live across epochs\n                    drop_last=True)            # every batch has the same shape", ")   # workers live across epochs")
    elif sum(ends.restart_ms) <= 0:
        snippet = snippet.replace("persistent_workers=True,   # workers live across epochs\n                    ", "")
    confidence = "high" if ends.boundaries_recorded else "medium"
    return ctx.finding(message, saving, confidence=confidence, evidence=evidence, fix=fix, snippet=snippet)
