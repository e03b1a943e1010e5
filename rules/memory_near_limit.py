"""Device memory peaks close to the device's capacity: one larger batch or sequence from OOM.

## What it detects
Peak allocated device memory (reserved when allocated is unknown) above `min_share` (90%)
of the device's memory. A trace whose `[memory]` events carry only allocation sizes gives a
lower bound of the peak; a lower bound above the threshold is enough.

## What it needs from the trace
A peak: the facts file's, or the trace's `[memory]` events (`profile_memory=True`); and the
device's memory (the trace's device properties or the facts file). Without either it says
nothing. The `[memory]` events are the allocator's, recorded on the host side: the rule runs
where the device's kernel records are missing too (a capture phase, a profiler stopped with
work queued).

## Why it is slow
Near the limit PyTorch's caching allocator cannot find free blocks: it frees its cache
(`cudaFree`, which synchronises the device) and allocates again (`cudaMalloc`), step after
step, and fragmentation makes it worse; one longer sequence or larger batch ends in
`CUDA out of memory`. Until then there may be no time cost at all — then it is a risk, not a
slowdown, and the finding has no time figure.

## Evidence used
- peak memory: facts file (`max_memory_allocated/reserved` over the whole run) when present,
  else the trace's `[memory]` events (totals, or the running sum of sizes as a lower bound);
- the device's memory (trace device properties or facts);
- `cudaMalloc`/`cudaFree` calls inside the steps: the allocator's retries, when visible.

## Example
Before:
```python
out = model(x)                                   # every activation kept for backward
```
After:
```python
from torch.utils.checkpoint import checkpoint
with torch.autocast("cuda", dtype=torch.bfloat16):            # half-size activations
    h = checkpoint(model.block1, x, use_reentrant=False)       # recompute instead of keeping
    out = model.head(checkpoint(model.block2, h, use_reentrant=False))
```
Or a smaller micro-batch with gradient accumulation; `optimizer.zero_grad(set_to_none=True)`;
`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` when reserved is far above allocated
(fragmentation).

## How the saving is estimated
When allocator calls (`cudaMalloc`/`cudaFree`) run inside the steps, their time per step —
what headroom would remove. Without them the finding is a risk with no time figure
(`saving_ms` is null) and ranks after the findings that save time.

Reference: https://pytorch.org/docs/stable/notes/cuda.html#memory-management
"""

from __future__ import annotations

import re

import numpy as np

from advisor.engine import Context
from advisor.metrics.breakdown import name_matches
from advisor.metrics.memory_use import FACTS, LOWER_BOUND, memory_use
from advisor.metrics.steps import step_of

ID = "memory-near-limit"
TITLE = "Device memory peaks close to capacity"
GROUP = "memory"
TESTED_ON = ("nvidia",)  # vendors whose real traces the tests run it on (advisor/metrics/vendors.py)
DOCS = "https://pytorch.org/docs/stable/notes/cuda.html#memory-management"
DEFAULTS = {"min_share": 0.90}
FIX = "Make room: activation checkpointing (torch.utils.checkpoint), mixed precision, or a smaller micro-batch with gradient accumulation."
AFTER = """from torch.utils.checkpoint import checkpoint
with torch.autocast("cuda", dtype=torch.bfloat16):
    h = checkpoint(model.block1, x, use_reentrant=False)
"""
ALLOCATOR_CALL = re.compile(r"^cuda(Malloc|Free)(Async)?$|^hip(Malloc|Free)$")


def check(ctx: Context):
    m = ctx.metrics
    mem = memory_use(m, ctx.recorded.device)
    peak = mem.peak_allocated if mem.peak_allocated is not None else mem.peak_reserved
    share = mem.share(peak)
    if share is None or share < ctx.options["min_share"]:
        return None
    rt = ctx.events.runtime
    calls = rt[name_matches(rt["name"], ALLOCATOR_CALL)]
    steps = m.steps
    inside = step_of(steps["start"].to_numpy(np.int64), steps["end"].to_numpy(np.int64), calls["ts"].to_numpy(np.int64)) >= 0
    calls = calls[inside]
    n_steps = max(len(steps), 1)
    alloc_ms = float(calls["dur"].sum()) / 1e6 / n_steps
    gb = 1024**3
    which = "allocated" if mem.peak_allocated is not None else "reserved"
    bound = mem.source == LOWER_BOUND
    message = (
        f"Peak {which} device memory is {'at least ' if bound else ''}{peak / gb:.2f} GiB of {mem.device_bytes / gb:.1f} GiB "
        f"({100 * share:.0f}%{', whole run' if mem.source == FACTS else ', profiled window'}): "
    )
    if len(calls):
        message += (
            f"the allocator already frees and re-allocates inside the steps ({len(calls) / n_steps:.0f} cudaMalloc/cudaFree calls, "
            f"{alloc_ms:.1f} ms per step). "
        )
        saving_ms: float | None = alloc_ms
    else:
        message += "no allocator retries are visible yet, but a larger input will run out of memory. "
        saving_ms = None
    message += "Free memory with activation checkpointing or mixed precision, or use a smaller micro-batch with gradient accumulation."
    evidence = {
        **mem.evidence(share),
        "allocator_calls_per_step": round(len(calls) / n_steps, 1),
        "allocator_ms_per_step": round(alloc_ms, 3),
        "steps": steps["step"].tolist(),
    }
    big_cost = saving_ms is not None and ctx.step_ms > 0 and saving_ms / ctx.step_ms >= 0.10
    severity = "high" if share >= 0.97 or big_cost else "medium"
    return ctx.finding(message, saving_ms, confidence="high" if mem.source != "none" else "low", evidence=evidence, severity=severity)
