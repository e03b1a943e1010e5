"""torch.cuda.empty_cache() runs inside the training loop.

## What it detects
`cudaFree` calls inside the profiler steps (a trace without `ProfilerStep` markers has no
loop to speak of and is not checked) that no aten op made (or that a Python `empty_cache`
frame encloses, when the trace has stacks): the training loop hands the caching
allocator's free blocks back to the driver. The `cudaMalloc` calls that follow in the same
and the next step — getting the memory back — are counted with it.

## What it needs from the trace
`ProfilerStep` marks (a trace without them has no loop to judge) and the host's runtime calls:
`cudaFree`/`cudaMalloc` inside the steps that no aten op made, on a run with device activity.
Without marks, or on a CPU-only run, it says nothing. It is not run where the launches have no
kernel records (the device's activity is missing); where the host's operators are missing (a
device-only trace): the report's warning or note says why.

## Why it is slow
PyTorch keeps freed GPU memory in its cache so the next step can reuse it without asking
the driver. `empty_cache()` gives the cached blocks back: `cudaFree` synchronizes the whole
device, and the next step has to `cudaMalloc` everything again, which is slow and also
synchronizing. It does not give the program more memory — tensors still alive keep theirs —
and it only helps other processes on the same GPU.

## Evidence used
- `cudaFree`/`cudaMalloc` runtime calls inside the host's steps, whether an aten op encloses
  them (inside an op a `cudaFree` is the allocator's own retry after a failed allocation,
  left to `allocator-churn`), and the Python frames around them when recorded;
- the device idle time during those calls and the idle gap after them that the host could
  have filled.

## Example
Before:
```python
for x, y in loader:
    train_step(x, y)
    torch.cuda.empty_cache()
```
After:
```python
for x, y in loader:
    train_step(x, y)
# call empty_cache() only when handing the GPU to something else, e.g. after training
```
If memory runs out without it, the cause is fragmentation or a leak: try
`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`, and see `memory-growth`.

## Fix: `advisor fix` (safe)
The call is removed where it stands alone inside a loop (or at the finding's line); a call
outside the loop is left alone:
```diff
     optimizer.step()
-    torch.cuda.empty_cache()
```

## How the saving is estimated
The fix is replayed on the run's own step graph (`advisor.whatif`): those `cudaFree` and
`cudaMalloc` calls are gone, and with them the host's wait in each `cudaFree` for the device
to finish everything queued before it. The host keeps the lead it had on the device, so the
device no longer idles after the free while the host catches up, and the step is as long as
its work without that synchronisation. The rule's own estimate (`estimate_ms` in the
evidence, the figure a trace that cannot be replayed gets): for each call, the device idle
time while the host was inside it, plus the launch-starved idle gap after it, up to the
device time that ran during the call (the host would have been that far ahead), summed per
step.

Reference: https://pytorch.org/docs/stable/notes/cuda.html#memory-management
"""

from __future__ import annotations

import numpy as np
from advisor.metrics.host_device import owned_allocator_calls, per_step
from advisor.whatif import Change

from advisor.engine import Context

ID = "empty-cache"
TITLE = "The loop empties the CUDA memory cache"
GROUP = "memory"
TESTED_ON = ("nvidia", "amd")  # vendors whose real traces the tests run it on (advisor/metrics/vendors.py)
DOCS = "https://pytorch.org/docs/stable/notes/cuda.html#memory-management"
DEFAULTS = {"min_share": 0.0}
FIX = "Remove torch.cuda.empty_cache() from the training loop; the caching allocator reuses freed memory."
AFTER = """for x, y in loader:
    train_step(x, y)          # no torch.cuda.empty_cache() here
"""


def check(ctx: Context):
    m = ctx.metrics
    if not m.has_device or ctx.step_ms <= 0 or len(ctx.events.steps) == 0:  # no step markers: no loop to judge
        return None
    owned = owned_allocator_calls(ctx.timeline, "empty-cache", 1, ctx.options["min_share"])
    if owned is None:
        return None
    mine, tl, tree, saving = owned
    frees = mine[mine["call"] == "free"]
    mallocs = mine[mine["call"] == "malloc"]
    evidence = {
        "frees_outside_ops_per_step": round(len(frees) / tl.n_steps, 2),
        "free_ms_per_step": round(per_step(frees["dur"].sum(), tl), 3),
        "mallocs_after_it_per_step": round(len(mallocs) / tl.n_steps, 2),
        "malloc_ms_per_step": round(per_step(mallocs["dur"].sum(), tl), 3),
        "device_idle_during_ms_per_step": round(per_step(mine["idle_during"].sum(), tl), 3),
        "steps": tl.step_numbers(frees["ts"].to_numpy(np.int64)),
    }
    message = (
        f"{evidence['frees_outside_ops_per_step']:g} cudaFree/step outside any op (empty_cache() in the loop, "
        f"{evidence['free_ms_per_step']:.2f} ms), then {evidence['mallocs_after_it_per_step']:g} cudaMalloc/step "
        f"({evidence['malloc_ms_per_step']:.2f} ms) to get the memory back; removing it takes both out of the step."
    )
    # The fix, replayed: the calls go, and so does the host's wait in each cudaFree.
    rows = {int(r) for r in mine["row"].to_numpy(np.int64) if r >= 0}
    change = Change(call_scale=dict.fromkeys(rows, 0.0), unwait=rows) if rows else None
    return ctx.finding(message, saving, confidence="high" if len(mallocs) else "medium", evidence=evidence, change=change)
