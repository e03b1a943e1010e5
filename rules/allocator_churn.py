"""The CUDA caching allocator keeps asking the driver for memory after warm-up.

## What it detects
`cudaMalloc`/`cudaFree` (and `hipMalloc`/`hipFree`) calls inside the steps after the first
`warmup_steps` (1 by default), other than those `empty-cache` explains (in a window of no
more steps than that, a single pass: the frees and the mallocs after the first free); and, when the trace
has memory events, reserved memory that still moves from step to step. It fires when the
calls cost at least `min_share` of the step (0.1% by default: after warm-up a steady loop
makes none).

## What it needs from the trace
Device activity and the host's runtime calls: the `cudaMalloc`/`cudaFree`
(`hipMalloc`/`hipFree`) calls inside the steps, with the ops around them. Reserved memory
moving from step to step needs `[memory]` events (`profile_memory=True`); without them the rule
judges the calls alone. A CPU-only run, or one with no allocator call after warm-up, gets
nothing from it. It is not run where the launches have no kernel records (the device's activity
is missing); where the host's operators are missing (a device-only trace): the report's warning
or note says why.

## Why it is slow
After the first steps the caching allocator should serve every allocation from memory it
already holds. A `cudaMalloc` after that means the cache did not fit the request — shapes
that change from step to step (variable sequence lengths, last batches), fragmentation, or
a cache that had to be freed because memory ran out (`cudaFree` inside an op is the
allocator releasing its cache to retry a failed allocation). Each call takes
milliseconds, `cudaFree` synchronizes the device, and the kernels behind them wait.

## Evidence used
- the `cudaMalloc`/`cudaFree` runtime calls in the host's steps after warm-up, the op that
  made them (inside an op: an allocation; a `cudaFree` inside an op: a retry near the limit);
- the device idle time during them and the idle gap after them that the host could have
  filled;
- reserved memory at the end of each step (`[memory]` events, `profile_memory=True`).

## Example
Before:
```python
for batch in loader:                       # each batch has a different length
    out = model(batch.to(device))
```
After:
```python
# pad to a few fixed lengths so shapes repeat, and let segments grow in place
os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"   # before CUDA starts
for batch in loader:
    out = model(pad_to_bucket(batch, sizes=(128, 256, 512)).to(device))
```
Or run one step with the largest shapes first, so the cache is sized for the worst case.

## How the saving is estimated
For each call after warm-up: the device idle time while the host was inside it, plus the
launch-starved idle gap after it, up to the device time that ran during the call. Summed
per step; calls during the warm-up steps are not counted.

Reference: https://pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from advisor.metrics.host_device import owned_allocator_calls

from advisor.engine import Context
from advisor.metrics.breakdown import text_of
from advisor.metrics.memory import device_memory_curve
from advisor.metrics.events import rank_events
from advisor.metrics.source import source_lines

ID = "allocator-churn"
TITLE = "GPU memory is allocated from the driver after warm-up"
GROUP = "memory"
TESTED_ON = ("nvidia", "amd", "cpu")  # vendors whose real traces the tests run it on (advisor/metrics/vendors.py)
DOCS = "https://pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf"
DEFAULTS = {"min_share": 0.001, "warmup_steps": 1}
FIX = "Keep shapes stable (pad to a few sizes), size the cache with one worst-case step first, and set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True."
AFTER = """os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"   # before CUDA starts
for batch in loader:
    out = model(pad_to_bucket(batch, sizes=(128, 256, 512)).to(device))
"""


def _reserved_moves(m, tl) -> list[float] | None:
    """Reserved bytes at the end of each step, when the trace records them."""
    curve = device_memory_curve(rank_events(m))
    curve = curve[np.isfinite(curve["reserved"].to_numpy(np.float64))]
    if len(curve) == 0:
        return None
    ts = curve["ts"].to_numpy(np.int64)
    at = np.searchsorted(ts, tl.step_e, side="right") - 1
    vals = np.where(at >= 0, curve["reserved"].to_numpy(np.float64)[np.clip(at, 0, None)], np.nan)
    return [round(float(v) / 2**20, 1) for v in vals]


def check(ctx: Context):
    m = ctx.metrics
    if not m.has_device or ctx.step_ms <= 0:
        return None
    owned = owned_allocator_calls(ctx.timeline, "allocator-churn", int(ctx.options["warmup_steps"]), ctx.options["min_share"])
    if owned is None:
        return None
    mine, tl, tree, saving = owned
    mallocs = mine[mine["call"] == "malloc"]
    frees = mine[mine["call"] == "free"]
    retry_frees = frees[frees["in_op"]]
    inner = tree.innermost(mine["ts"].to_numpy(np.int64), mine["tid"].to_numpy())
    ops = text_of(tree.ops["name"])
    made_by = pd.Series([ops[i] if i >= 0 else "(no op)" for i in inner]).value_counts().head(5).to_dict()
    after_warmup = len(m.steps) - int(ctx.options["warmup_steps"])
    single = after_warmup <= 0  # a window of one pass: the frees and the mallocs after them
    malloc_name = str(mallocs["name"].mode().iloc[0]) if len(mallocs) else "cudaMalloc"
    free_name = str(frees["name"].mode().iloc[0]) if len(frees) else malloc_name.replace("Malloc", "Free")
    evidence = {
        "mallocs_after_warmup": int(len(mallocs)),
        "frees_after_warmup": int(len(frees)),
        "frees_inside_ops": int(len(retry_frees)),
        "call_ms_after_warmup": round(float(mine["dur"].sum()) / 1e6, 3),
        "steps_after_warmup": after_warmup,
        "made_by_ops": made_by,
        "steps": tl.step_numbers(mine["ts"].to_numpy(np.int64)),
    }
    reserved = _reserved_moves(m, tl)
    if reserved is not None:
        evidence["reserved_mib_at_step_end"] = reserved
    lines = source_lines(ctx.events, tree.ops.iloc[inner[inner >= 0]]) if (inner >= 0).any() else []
    if lines:
        evidence["source"] = lines
    where = (
        f"in the window's {len(m.steps)} step(s), after the cache was first given back"
        if single
        else f"in {after_warmup} step(s) after warm-up"
    )
    message = (
        f"{len(mallocs)} {malloc_name} and {len(frees)} {free_name} calls {where} "
        f"({evidence['call_ms_after_warmup']:.1f} ms in the driver)"
        + (f", {len(retry_frees)} of the frees inside ops (the allocator emptying its cache to retry near the memory limit)" if len(retry_frees) else "")
        + "; stable shapes and a warmed cache take these calls out of the step."
    )
    return ctx.finding(message, saving, confidence="medium", evidence=evidence)
