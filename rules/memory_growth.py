"""Allocated device memory grows from step to step: something keeps every step's tensors alive.

## What it detects
Device memory allocated at the end of each step rises across the window: at least
`min_rising` (75%) of the step-to-step changes are increases, and the total rise is at least
`min_growth_mb` (16 MiB) over at least `min_steps` (3) steps. Only changes are used, so the
rule works on traces whose `[memory]` events carry only allocation sizes, too.

## What it needs from the trace
`[memory]` events (`profile_memory=True`) over at least `min_steps` steps. Without them it says
nothing. It is not run where the launches have no kernel records (the device's activity is
missing); where the host's operators are missing (a device-only trace): the report's warning or
note says why.

## Why it is slow
A training step should end with the memory it started with. When it does not, something
outside the step holds on to tensors of each step — most often `losses.append(loss)` or
`total += loss`, which keeps the loss *and the whole autograd graph behind it* (activations
included) alive. Memory creeps up until the allocator starts freeing and re-allocating and
finally runs out (`CUDA out of memory` after hours, not at step 1).

## Evidence used
- allocated device memory at the end of each step (`[memory]` events, `profile_memory=True`);
- the growth per step and, with the device's memory, the number of steps left at that rate.

## Example
Before:
```python
losses = []
for x, y in loader:
    loss = loss_fn(model(x), y)
    loss.backward(); optimizer.step(); optimizer.zero_grad()
    losses.append(loss)                  # keeps each step's graph alive
```
After:
```python
losses = []
for step, (x, y) in enumerate(loader):
    loss = loss_fn(model(x), y)
    loss.backward(); optimizer.step(); optimizer.zero_grad()
    losses.append(loss.detach())         # no graph; or loss.item() every 100 steps
```

## How the saving is estimated
No time figure: growth costs no time until memory runs out; the finding reports the
growth rate and how many steps remain before the device is full.

Reference: https://pytorch.org/docs/stable/notes/faq.html#my-model-reports-cuda-runtime-error-2-out-of-memory
"""

from __future__ import annotations

import numpy as np

from advisor.engine import Context
from advisor.metrics.memory_use import LOWER_BOUND, allocated_at_step_ends, memory_use

ID = "memory-growth"
TITLE = "Allocated memory grows every step"
GROUP = "memory"
TESTED_ON = ("nvidia", "amd", "cpu")  # vendors whose real traces the tests run it on (advisor/metrics/vendors.py)
DOCS = "https://pytorch.org/docs/stable/notes/faq.html#my-model-reports-cuda-runtime-error-2-out-of-memory"
DEFAULTS = {"min_steps": 3, "min_rising": 0.75, "min_growth_mb": 16}
FIX = "Do not keep tensors that require grad across steps: store loss.detach() or loss.item() (at a low rate), not the loss itself."
AFTER = """losses.append(loss.detach())      # or: if step % 100 == 0: log(loss.item())
"""
MB = 1024**2


def check(ctx: Context):
    m = ctx.metrics
    opts = ctx.options
    per_step, source = allocated_at_step_ends(m)
    values = per_step.dropna()
    if len(values) < opts["min_steps"]:
        return None
    v = values.to_numpy(np.float64)
    diffs = np.diff(v)
    rising = float((diffs > 0).mean())
    growth = float(v[-1] - v[0])
    if rising < opts["min_rising"] or growth < opts["min_growth_mb"] * MB:
        return None
    per_step_growth = growth / (len(v) - 1)
    mem = memory_use(m, ctx.recorded.device)
    steps_left = None
    if mem.device_bytes and source != LOWER_BOUND:
        steps_left = int(max(mem.device_bytes - float(v.max()), 0) // per_step_growth)
    elif mem.device_bytes and mem.peak is not None:
        steps_left = int(max(mem.device_bytes - mem.peak, 0) // per_step_growth)  # at most this many
    evidence = {
        "allocated_mb_at_step_end": [round(float(x) / MB, 2) for x in v],
        "growth_mb_per_step": round(per_step_growth / MB, 3),
        "rising_share": round(rising, 3),
        "memory_source": source,
        "steps_until_full": steps_left,
        "steps": values.index.tolist(),
    }
    message = (
        f"Allocated device memory grows by {per_step_growth / MB:.1f} MiB per step "
        f"({growth / MB:.0f} MiB over {len(v) - 1} steps, rising at {100 * rising:.0f}% of step ends): "
        "something keeps each step's tensors alive, e.g. losses.append(loss) holds the autograd graph."
    )
    if steps_left is not None:
        message += f" At this rate the device is full in {'at most ' if source == LOWER_BOUND else 'about '}{steps_left:,} steps."
    message += " Store loss.detach() or loss.item() at a low rate instead."
    return ctx.finding(message, None, confidence="medium", evidence=evidence, severity="high" if steps_left is not None and steps_left < 10_000 else "medium")
