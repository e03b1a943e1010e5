"""The GPU sits idle for a large part of each step.

## What it detects
The share of each step with no kernel, copy or memset running on the device is above
`1 - max_utilization` (GPU utilisation below 60% by default). This is a symptom: it says the
device waits, not why; the rules that explain the wait (the DataLoader, pageable or oversized
copies, host synchronisation, launch overhead, `zero_grad` memsets, a batch too small for the
device) name the fix. When they fire, this finding keeps only what their fixes, replayed
together, leave (and is dropped when that is under 1% of the step), and points at them.

## Why it is slow
Whatever the GPU does not do while it is idle has to be done later: idle time is step time
that no faster kernel can win back. It comes from the host — loading data, copying from
pageable memory, waiting on `.item()`/`.cpu()`, launching many small kernels, Python work
between steps — running while nothing is queued on the device.

## Evidence used
- the device's busy intervals (kernels, copies, memsets, merged over streams) and the idle
  intervals they leave inside each step;
- the host ops and annotations that were running during the idle time (by overlap), and the
  longest idle gaps;

## Example
Before:
```python
for x, y in DataLoader(ds, batch_size=32):          # loads in the training process
    x, y = x.cuda(), y.cuda()                         # pageable, blocking copy
    loss = loss_fn(model(x), y)
    print(loss.item())                                # waits for the GPU every step
```
After:
```python
for x, y in DataLoader(ds, batch_size=32, num_workers=8, pin_memory=True, persistent_workers=True):
    x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
    loss = loss_fn(model(x), y)
    if step % 100 == 0:
        print(loss.item())
```

## How the saving is estimated
Replayed: the host time spent while the device was idle is taken off the host's path and
the step graph is replayed on top of every other finding's fix; the saving is how much
shorter that makes the replayed step. The rule's
own estimate (evidence `estimate_ms`) is the mean idle time per step, step duration minus the
time with any device activity: the most the step can shrink by keeping the device fed.

Reference: https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html
"""

from __future__ import annotations

from advisor.whatif import Change

import numpy as np
import pandas as pd

from advisor.engine import Context
from advisor.metrics.breakdown import STEP_NAME, _matches
from advisor.metrics.compute import step_kernels
from advisor.metrics.intervals import covers, merge, overlap_with, sorted_unique

ID = "gpu-idle"
TITLE = "The GPU is idle for much of each step"
DOCS = "https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html"
DEFAULTS = {"max_utilization": 0.60, "min_kernels_per_step": 10}
SYMPTOM = True  # its saving is what the other findings' fixes leave (see the engine)
FIX = "Keep work queued on the device: load data in workers, copy from pinned memory with non_blocking=True, avoid per-step syncs, fuse small kernels."
AFTER = """loader = DataLoader(ds, batch_size=32, num_workers=8, pin_memory=True, persistent_workers=True)
for x, y in loader:
    x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
    ...
"""


def idle_intervals(frames, steps: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(start, end, step index) of every stretch inside a step with no device activity."""
    dev = frames.device
    ds, de = merge(dev["ts"].to_numpy(np.int64), dev["end"].to_numpy(np.int64))
    ss, se = steps["start"].to_numpy(np.int64), steps["end"].to_numpy(np.int64)
    b = sorted_unique(np.concatenate([ss, se, ds, de]))
    if len(b) < 2:
        return b[:0], b[:0], b[:0]
    lo, hi = b[:-1], b[1:]
    in_step = covers(ss, se, lo)
    idle = in_step & ~covers(ds, de, lo)
    s, e = merge(lo[idle], hi[idle])
    step_idx = np.searchsorted(ss, s, side="right") - 1
    return s, e, step_idx


def host_during(frames, s: np.ndarray, e: np.ndarray, n_steps: int, limit: int = 5) -> list[dict]:
    """Host ops and annotations that ran during the given intervals, by overlapping time."""
    host = frames.host
    rows = host[(host["kind"] != "python").to_numpy() & ~_matches(host["name"], STEP_NAME)]
    if len(rows) == 0 or len(s) == 0:
        return []
    ov = overlap_with(s, e, rows["ts"].to_numpy(np.int64), rows["end"].to_numpy(np.int64))
    hit = ov > 0
    if not hit.any():
        return []
    g = pd.Series(ov[hit], index=rows["name"].astype(str).to_numpy()[hit]).groupby(level=0).sum()
    g = g.sort_values(ascending=False).head(limit)
    return [{"name": str(n)[:110], "idle_ms_per_step": round(float(v) / 1e6 / max(n_steps, 1), 3)} for n, v in g.items()]


def check(ctx: Context):
    m = ctx.metrics
    util = m.gpu_utilization
    step_ms = ctx.step_ms
    if util is None or step_ms <= 0 or not len(m.kernels):
        return None
    if util >= ctx.options["max_utilization"]:
        return None
    steps = m.steps
    if len(step_kernels(m)) / max(len(steps), 1) < ctx.options["min_kernels_per_step"]:
        return None  # too little device work to speak of a training step's utilisation
    s, e, step_idx = idle_intervals(ctx.frames, steps)
    n = max(len(steps), 1)
    idle_ms = float((e - s).sum()) / 1e6 / n
    if idle_ms <= 0:
        return None
    gaps = np.argsort(s - e)[:3]  # longest first
    evidence = {
        "gpu_utilization": round(util, 4),
        "idle_ms_per_step": round(idle_ms, 3),
        "per_step_utilization": [round(float(v), 4) for v in m.utilization.to_numpy()],
        "host_during_idle": host_during(ctx.frames, s, e, n),
        "longest_idle_gaps": [
            {"step": int(steps["step"].iloc[step_idx[i]]), "ms": round(float(e[i] - s[i]) / 1e6, 3)} for i in gaps if step_idx[i] >= 0
        ],
        "steps": steps["step"].tolist(),
    }
    marked = len(ctx.frames.steps) > 0
    top = evidence["host_during_idle"][:3]
    during = ": meanwhile the host is in " + ", ".join(f"{h['name']} ({h['idle_ms_per_step']:.1f} ms)" for h in top) if top else ""
    message = (
        f"The GPU is idle {100 * (1 - util):.0f}% of each {step_ms:.1f} ms step ({idle_ms:.1f} ms){during}. "
        "Overlap that host work with device work (DataLoader workers, pinned non_blocking copies, no per-step syncs, fewer and larger kernels)."
    )
    if not marked:
        message += " The trace has no ProfilerStep markers, so the whole window counts as one step (setup included)."
    # The fix, replayed: the host work that ran while the device idled is taken off the host's
    # path (done in workers, overlapped, or issued ahead), so the device is fed as soon as it
    # can be; what the device itself waits for (its own dependencies) stays.
    change = Change(host_remove=[(s, e, 1.0)])
    return ctx.finding(message, idle_ms, confidence="high" if marked else "low", evidence=evidence, change=change)
