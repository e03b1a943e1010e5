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

import numpy as np

from advisor.engine import Context
from advisor.metrics.epochs import EpochEnds, epoch_ends

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
