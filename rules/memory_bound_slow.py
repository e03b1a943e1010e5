"""Memory-bound ops run far below the device's memory bandwidth.

## What it detects
Vector ops (norms, softmax, elementwise ops, reductions, copies, optimizer updates;
metrics.roofline), which sit under the memory roof, moving at least `min_bytes`
(1 MiB) per call, yet streaming at less than `max_bandwidth_share` (30%) of the bandwidth
this run's own simple elementwise kernels reached (the datasheet's bandwidth where the run
shows none), and whose time at that bandwidth would save at least `min_share` (2%) of the
step.

GEMMs, convolutions and attention far from their ceilings are left to `tensor-core-tile`
and `small-gemm`; cuDNN's and MIOpen's batch norms to the fusing findings
(`unfused-elementwise`, `compile-graph-breaks`), which price them at the same bandwidth.
A symptom: it is saved only what the other findings' fixes leave.

## What it needs from the trace
The roofline (`advisor report --ops`): the ops' input shapes and types (`record_shapes=True`)
and the kernels they launched. Without input shapes the roofline is not available and it says
nothing. It is not run where the launches have no kernel records (the device's activity is
missing); where the host's operators are missing (a device-only trace): the report's warning or
note says why.

## Why it is slow
A memory-bound op can go no faster than its bytes over the memory's bandwidth; one far
below that is not limited by the memory but by how it reads it: strided or transposed
inputs (a permuted tensor copied element by element), a layout the kernel was not written
for (an NCHW batch norm on channels-last data), broadcasting that re-reads an operand, or a
reduction over a short inner dimension that leaves most of the device idle.

## Evidence used
- each op's bytes per call from its input shapes and dtypes (each input read once, each
  output written once), and its kernels' time inside the steps;
- the bandwidth of the run's own elementwise kernels on large tensors (their 90th
  percentile, metrics.elementwise), else the device table's (advisor.metrics.devices).

## Example
Before:
```python
y = x.permute(0, 2, 3, 1).contiguous()   # a strided copy at a fraction of the bandwidth
z = torch.nn.functional.layer_norm(y, y.shape[-1:])
```
After:
```python
model = model.to(memory_format=torch.channels_last)   # no permuted copies
model = torch.compile(model)                          # fused, coalesced kernels
```

## How the saving is estimated
Per op shape: its bytes per step at the reference bandwidth (no faster than its FLOPs on the
fp32 units), against its measured time; the
fix is replayed as its kernels running at that share of their time. The bytes are a lower
bound on what the op must move, so the saving is what reaching the bandwidth would give.

Reference: https://docs.nvidia.com/deeplearning/performance/dl-performance-memory-limited/index.html
"""

from __future__ import annotations

import numpy as np

from advisor.engine import Context
from advisor.metrics.roofline import full_table, kernel_rows
from advisor.whatif.changes import scale_op_rows

ID = "memory-bound-slow"
TITLE = "Memory-bound ops run far below the memory bandwidth"
GROUP = "compute"
TESTED_ON = ("nvidia",)  # vendors whose real traces the tests run it on (advisor/metrics/vendors.py)
DOCS = "https://docs.nvidia.com/deeplearning/performance/dl-performance-memory-limited/index.html"
DEFAULTS = {"min_share": 0.02, "max_bandwidth_share": 0.30, "min_bytes": 1 << 20}
SYMPTOM = True  # its fixes (layout, fusing) overlap the other findings': saved only what theirs leave
CUDNN_BATCH_NORM_OPS = ["aten::cudnn_batch_norm", "aten::cudnn_batch_norm_backward", "aten::miopen_batch_norm", "aten::miopen_batch_norm_backward"]
FIX = "Make the slow memory-bound ops stream: keep tensors contiguous in the layout their kernels expect (channels_last for convolutional models), avoid permute+contiguous copies, and fuse them with torch.compile."
AFTER = """model = model.to(memory_format=torch.channels_last)
model = torch.compile(model)   # fused, coalesced memory-bound kernels
"""


def check(ctx: Context):
    m = ctx.metrics
    r = m.roofline
    if r is None or not r.available or ctx.step_ms <= 0:
        return None
    reference = r.bandwidth_tbps or (r.device.memory_tbps if r.device is not None else None)
    if not reference:
        return None
    table = full_table(m)
    if len(table) == 0:
        return None
    opts = ctx.options
    tbps = table["tbps"].to_numpy(np.float64)
    time_ms = table["time_ms"].to_numpy(np.float64)
    moved = table["bytes"].to_numpy(np.float64)
    calls = table["calls"].to_numpy(np.float64)
    # Matrix work far from its ceilings is the tile and size findings' business; cuDNN's batch
    # norms are priced at the memory's speed by the fusing findings (metrics.elementwise).
    vector = ~table["kind"].isin(["gemm", "conv", "attention"]).to_numpy()
    priced = table["op"].isin(CUDNN_BATCH_NORM_OPS).to_numpy()
    slow = vector & ~priced & (moved >= opts["min_bytes"]) & (tbps < opts["max_bandwidth_share"] * reference) & (time_ms > 0)
    if not slow.any():
        return None
    new_ms = moved * calls / (reference * 1e9)  # bytes per step / (TB/s): ms
    if r.device is not None:  # and never faster than the fp32 units allow
        new_ms = np.maximum(new_ms, table["flops"].to_numpy(np.float64) * calls / (r.device.fp32 * 1e9))
    rows = np.nonzero(slow)[0]
    factors = new_ms[rows] / time_ms[rows]
    saving_ms = float((time_ms[rows] - new_ms[rows]).sum())
    if saving_ms / ctx.step_ms < opts["min_share"]:
        return None
    change = scale_op_rows(m.kernels.index.to_numpy(), kernel_rows(m), len(table), rows, factors)
    if change is None:
        return None
    order = rows[np.argsort(-(time_ms[rows] - new_ms[rows]))]
    listed = [{"op": table["op"].iat[i], "shape": table["shape"].iat[i], "dtype": table["dtype"].iat[i], "ms_per_step": round(float(time_ms[i]), 3),
               "tbps": round(float(tbps[i]), 3), "at_reference_ms": round(float(new_ms[i]), 3)} for i in order[:10]]
    top = listed[0]
    source = "this run's elementwise kernels" if r.bandwidth_tbps else f"{r.device.name}'s datasheet"
    message = (
        f"{len(rows)} memory-bound op shape(s) stream at under {opts['max_bandwidth_share']:.0%} of {reference:.2f} TB/s ({source}) and take "
        f"{float(time_ms[rows].sum()):.2f} ms/step (e.g. {top['op']} {top['shape']}: {top['tbps']:.2f} TB/s). At that bandwidth they take less time."
    )
    evidence = {"ops": listed, "reference_tbps": round(float(reference), 3), "reference": source}
    return ctx.finding(message, saving_ms, confidence="low", evidence=evidence, fix=FIX, snippet=AFTER, change=change)
