"""Batches are copied to the GPU from pageable host memory.

## What it detects
Host→device copies inside the steps that the trace labels `Memcpy HtoD (Pageable -> Device)`:
the source tensor lives in ordinary (pageable) memory. Copies smaller than `min_bytes_per_step`
in all (1 MiB by default) are ignored, and the rule fires when the estimated saving is at
least `min_share` of the step (0.2% by default).

## What it needs from the trace
The device's copy records labelled `Memcpy HtoD (Pageable -> Device)`, with their bytes. Traces
whose copies carry no memory kind (older schemas) give it nothing to read, and it says nothing
there. It is not run where the launches have no kernel records (the device's activity is
missing); where the device's timeline lies outside the host's; where copy calls have no copy
records: the report's warning or note says why.

## Why it is slow
The GPU's copy engine can only read page-locked (pinned) memory. From pageable memory the
driver first copies the data into a pinned staging buffer, chunk by chunk, and the copy runs
at a fraction of the link's speed. Worse, the call does not return until the data has been
staged, so the host cannot queue the next kernels meanwhile, and `.to(device)` without
`non_blocking=True` then waits for the copy to finish: the device runs dry after the copy
until the host has launched the forward pass.

## Evidence used
- every pageable host→device copy in the steps: bytes, device time, measured bandwidth;
- the `cudaMemcpyAsync` launch call and the stream sync of the same `aten::to`/`aten::copy_`:
  how long the host was stuck, and the device idle time during and right after it;
- the trace's own large pinned copies (for the pinned bandwidth of this machine), else the
  GPU generation from the trace's device properties;
- from the facts file, when present: the DataLoader's `pin_memory` setting; whether the run
  has a DataLoader at all (its spans in the trace, or its settings in the facts): without
  one, the fix pins the tensors the loop copies itself, with no DataLoader in the snippet.
Copies of tensors the step makes on the CPU with a factory (`torch.zeros(...)` then `.to()`)
are left to `cpu-tensor-then-copy`, whose fix removes the copy altogether.

## Example
Before:
```python
loader = DataLoader(train_set, batch_size=64, num_workers=8)
for x, y in loader:
    x, y = x.to(device), y.to(device)
```
After:
```python
loader = DataLoader(train_set, batch_size=64, num_workers=8, pin_memory=True)
for x, y in loader:
    x = x.to(device, non_blocking=True)
    y = y.to(device, non_blocking=True)
```

## Fix: `advisor fix` (safe)
`pin_memory=True` on the DataLoader, and `non_blocking=True` on the loop's copies of its batch:
```diff
-loader = DataLoader(train_set, batch_size=64, num_workers=8)
+loader = DataLoader(train_set, batch_size=64, num_workers=8, pin_memory=True)
 for x, y in loader:
-    x = x.to(device)
+    x = x.to(device, non_blocking=True)
```
A `transformers` Trainer gets `TrainingArguments(dataloader_pin_memory=True)`; Lightning copies
pinned batches non-blocking itself.

## How the saving is estimated
Two parts, per step. The copy itself: its device time minus the time the same bytes take at
pinned bandwidth (measured on the trace's own pinned copies when it has large ones, otherwise
a realistic figure for the link: PCIe 3 12 GB/s for compute capability below 8.0, PCIe 4
24 GB/s for 8.x, PCIe 5 50 GB/s for 9.0 and later), counted only for copies of at least
256 KiB and only the part not hidden behind kernels. The host's wait: the device idle time
while the host sat in the copy call and its stream sync, plus the idle gap after it as far as
the host could have filled it while the copy was running (with `non_blocking=True` the next
kernels are queued behind the copy). Pinning in the DataLoader's worker processes adds no
time to the step. The replay makes the same change to the step graph: each copy runs at
pinned bandwidth, its call costs what enqueueing a copy costs (the trace's own copy calls that
returned before their copy began, else 10 µs: a pageable copy's call holds the host while the
driver stages the bytes, so the trace shows it as host work as long as the copy) and the host
no longer waits for it, so the host's next work overlaps the copy (on the A100 copy benchmark
`../shared/traces/corpus/a100_memcpy_pageable_10steps` this replays to 32.4 ms a step saved;
its pinned twin measured 36.7 ms less). The figure is the median over the steps of each step's sum, so that one
step's one-off stall does not set it (such a step is named in the message).

Reference: https://pytorch.org/docs/stable/notes/cuda.html#use-pinned-memory-buffers
"""

from __future__ import annotations

import numpy as np

from advisor.whatif import Change
from advisor.whatif.changes import device_rows_of, made_async, scale_device, unwait
from advisor.metrics.host_device import (
    BANDWIDTH_BOUND_BYTES,
    device_exposed_fraction,
    h2d_copies,
    op_tree_of,
    per_step,
    pinned_bandwidth,
)

from advisor.engine import Context
from advisor.metrics.source import source_lines
from advisor.snippets import dataloader_call

ID = "h2d-pageable-copy"
TITLE = "Host-to-device copies come from pageable memory"
GROUP = "transfer"
TESTED_ON = ("nvidia", "mtia", "cpu")  # vendors whose real traces the tests run it on (advisor/metrics/vendors.py)
DOCS = "https://pytorch.org/docs/stable/notes/cuda.html#use-pinned-memory-buffers"
DEFAULTS = {"min_share": 0.002, "min_bytes_per_step": 1 << 20}
FIX = "Pin the batches (DataLoader(pin_memory=True)) and copy them with .to(device, non_blocking=True)."
AFTER = """loader = DataLoader(train_set, batch_size=64, num_workers=8, pin_memory=True)
for x, y in loader:
    x = x.to(device, non_blocking=True)
    y = y.to(device, non_blocking=True)
"""

# A run that loads no batches through a DataLoader: pin the tensors it copies itself.
PIN_WITHOUT_LOADER = "Pin the host tensors that are copied each step (allocate them once with pin_memory=True, or t.pin_memory()) and copy them with .to(device, non_blocking=True)."
PIN_WITHOUT_LOADER_SNIPPET = """staging = torch.empty(shape, dtype=dtype, pin_memory=True)   # once, outside the loop
staging.copy_(host_tensor)
x = staging.to(device, non_blocking=True)
"""


def check(ctx: Context):
    m = ctx.metrics
    if not m.has_device or ctx.step_ms <= 0:
        return None
    tl = ctx.timeline
    tree = op_tree_of(ctx.metrics)
    copies = h2d_copies(tl, tree)
    pageable = copies[(copies["copy_src"] == "Pageable") & ~copies["cpu_made"]]
    if len(pageable) == 0:
        return None
    total_bytes = float(np.nansum(pageable["bytes"].to_numpy()))
    bytes_per_step = total_bytes / tl.n_steps
    if bytes_per_step < ctx.options["min_bytes_per_step"]:
        return None

    pinned_gbps, bw_source = pinned_bandwidth(m, copies)
    size = pageable["bytes"].fillna(0).to_numpy()
    dur = pageable["dur"].to_numpy(np.float64)
    exposed = device_exposed_fraction(tl, pageable["ts"].to_numpy(np.int64), pageable["end"].to_numpy(np.int64))
    big = size >= BANDWIDTH_BOUND_BYTES
    copy_saved = np.where(big, np.maximum(dur - size / pinned_gbps, 0.0) * exposed, 0.0)
    block = tl.blocking_cost(pageable["call_ts"].to_numpy(np.int64), pageable["block_end"].to_numpy(np.int64))
    host_wait = (pageable["block_end"] - pageable["call_ts"]).to_numpy(np.float64)

    # Per step, then the median: the copies recur every step, and one step's one-off stall
    # (page faults on the first batch, say) should not set the figure for all of them.
    step_i = tl.step_index(pageable["ts"].to_numpy(np.int64))
    per_step_ns = np.zeros(tl.n_steps)
    np.add.at(per_step_ns, step_i[step_i >= 0], (copy_saved + block["cost"].to_numpy(np.float64))[step_i >= 0])
    copy_ns = np.zeros(tl.n_steps)
    np.add.at(copy_ns, step_i[step_i >= 0], copy_saved[step_i >= 0])
    saving = float(np.median(per_step_ns)) / 1e6
    copy_ms = float(np.median(copy_ns)) / 1e6
    block_ms = saving - copy_ms
    if saving <= 0 or saving / ctx.step_ms < ctx.options["min_share"]:
        return None

    measured = total_bytes / max(float(dur.sum()), 1.0)  # bytes/ns == GB/s
    evidence = {
        "pageable_copies_per_step": round(len(pageable) / tl.n_steps, 2),
        "mb_per_step": round(bytes_per_step / 1e6, 2),
        "copy_ms_per_step": round(per_step(dur.sum(), tl), 3),
        "measured_gbps": round(measured, 2),
        "pinned_gbps_assumed": round(pinned_gbps, 1),
        "pinned_gbps_source": bw_source,
        "host_blocked_ms_per_step": round(per_step(host_wait.sum(), tl), 3),
        "saving_from_faster_copy_ms": round(copy_ms, 3),
        "saving_from_not_blocking_ms": round(block_ms, 3),
        "steps": tl.step_numbers(pageable["ts"].to_numpy(np.int64)),
    }
    steps = m.steps["step"].to_numpy()
    evidence["saving_by_step_ms"] = {int(steps[i]): round(float(v) / 1e6, 3) for i, v in enumerate(per_step_ns)}
    ops = pageable["copy_op"].to_numpy()
    lines = source_lines(ctx.events, tree.ops.iloc[ops[ops >= 0]]) if (ops >= 0).any() else []
    if lines:
        evidence["source"] = lines

    loaders = ctx.recorded.dataloaders
    confidence = "high"
    if loaders:
        pins = [dl.pin_memory for dl in loaders]
        evidence["dataloader_pin_memory"] = pins
        if pins and all(p is True for p in pins):
            fix = (
                "The DataLoader already pins its batches, yet these copies are pageable: the copied tensors are made "
                "after loading (a transform or .float() in the loop?). Pin them (t.pin_memory()) or do that work on the GPU, "
                "and copy with non_blocking=True."
            )
            confidence = "medium"
        else:
            fix = "Set pin_memory=True in the DataLoader and copy with .to(device, non_blocking=True)."
    elif ctx.uses_dataloader:
        fix = FIX
    else:
        fix = PIN_WITHOUT_LOADER
    message = (
        f"{evidence['pageable_copies_per_step']:g} copies/step ({bytes_per_step / 1e6:.1f} MB) go host→device from pageable "
        f"memory at {measured:.1f} GB/s, and the host waits {evidence['host_blocked_ms_per_step']:.2f} ms/step for them; "
        f"pinned, they run at ~{pinned_gbps:.0f} GB/s, and with non_blocking=True the host goes on without waiting."
    )
    worst = max(evidence["saving_by_step_ms"].items(), key=lambda kv: kv[1], default=None)
    if worst is not None and len(per_step_ns) > 2 and worst[1] > 3 * saving:
        message += f" (Step {worst[0]} alone lost {worst[1]:.1f} ms in these copies; the saving is the median step's.)"
    # The fix: each copy runs at pinned bandwidth and the host no longer waits for it.
    rows = device_rows_of(ctx.events, pageable["correlation"].to_numpy(np.int64))
    d = ctx.events.device
    ratio = np.where(
        d["bytes"].iloc[rows].fillna(0).to_numpy() >= BANDWIDTH_BOUND_BYTES,
        np.clip(d["bytes"].iloc[rows].fillna(0).to_numpy() / pinned_gbps / np.maximum(d["dur"].iloc[rows].to_numpy(np.float64), 1), 0, 1),
        1.0,
    )
    # The copy call itself becomes an enqueue: from pageable memory it holds the host while
    # the bytes are staged (the trace shows it as host work as long as the copy), pinned it
    # returns at once and the host queues the next work behind the copy.
    change = Change.merge([
        scale_device(rows, ratio),
        made_async(ctx.events, pageable["correlation"].to_numpy(np.int64)),
        unwait(ctx.events, pageable["call_ts"].to_numpy(np.int64), pageable["block_end"].to_numpy(np.int64)),
    ])
    # The run's own loader settings, pinned: never another batch size or worker count than the run's.
    snippet = AFTER.replace(AFTER.splitlines()[0], dataloader_call(ctx.recorded, pin_memory=True)) if ctx.uses_dataloader else PIN_WITHOUT_LOADER_SNIPPET
    return ctx.finding(message, saving, confidence=confidence, evidence=evidence, fix=fix, snippet=snippet, change=change)
