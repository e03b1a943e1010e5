"""GEMMs too small to fill the device: few output tiles, a low share of the peak, called many times.

## What it detects
GEMMs that run at least twice per step with the same shape, whose output gives the device
fewer 128×128 tiles than it has multiprocessors (`ceil(M/128)·ceil(N/128)·batch` below the SM
count from the trace's device properties), and that reach less than `max_ceiling_share`
(25%) of the device's ceiling for their precision (metrics.roofline), while batching them
would save at least `min_share` (1%) of the step.

## What it needs from the trace
The roofline: the GEMM ops' input shapes and types (`record_shapes=True`) and their kernels, on
a device of the peak table (its multiprocessor count from the device properties, 108 when
absent). Without input shapes it says nothing. It is not run where the launches have no kernel
records (the device's activity is missing); where the host's operators are missing (a
device-only trace): the report's warning or note says why.

## Why it is slow
A GEMM kernel gives each multiprocessor one output tile at a time. An output of 64×512 on a
132-SM H100 keeps 4 of them busy and leaves the rest idle, whatever the precision, and a
small kernel's launch and ramp cost as much as its work. Many such GEMMs of one shape (one per
head, per expert, per timestep) are one batched GEMM (`torch.bmm`, a grouped GEMM) or one
GEMM over concatenated weights that fills the device.

## Evidence used
- each GEMM's M, N, K, batch and dtype from its op's input shapes (`record_shapes=True`), its
  calls per step and the time of its kernels inside the steps;
- the device's multiprocessor count (deviceProperties `numSms`; 108 when absent) and its
  ceiling per precision (advisor.metrics.devices);
- the run's own GEMMs of the same precision that do fill the device: the rate a batched GEMM
  would reach.

## Example
Before:
```python
outs = [x @ w for w in expert_weights]              # eight small GEMMs
```
After:
```python
outs = torch.bmm(x.expand(len(ws), *x.shape), torch.stack(ws))   # one batched GEMM
```

## How the saving is estimated
Per shape: its FLOPs per step at the TFLOP/s that the run's GEMMs of the same precision
which fill the device reached (weighted by their time), or at `max_ceiling_share` of the
device's ceiling where the run has none, against its measured time. The fix is replayed as
those kernels running at that share of their time.

Reference: https://docs.nvidia.com/deeplearning/performance/dl-performance-matrix-multiplication/index.html#wave-quant
"""

from __future__ import annotations

import numpy as np

from advisor.engine import Context
from advisor.metrics.roofline import full_table, kernel_rows, output_tiles
from advisor.whatif.changes import scale_op_rows

ID = "small-gemm"
TITLE = "GEMMs too small to fill the device"
GROUP = "compute"
TESTED_ON = ("nvidia",)  # vendors whose real traces the tests run it on (advisor/metrics/vendors.py)
DOCS = "https://docs.nvidia.com/deeplearning/performance/dl-performance-matrix-multiplication/index.html#wave-quant"
DEFAULTS = {"min_share": 0.01, "max_ceiling_share": 0.25, "min_calls_per_step": 2}
FIX = "Batch same-shaped small GEMMs into one (torch.bmm, a grouped GEMM, or one GEMM over concatenated weights), or fuse them with torch.compile."
AFTER = """w = torch.stack(expert_weights)                  # [E, K, N]
out = torch.bmm(x.expand(w.shape[0], *x.shape), w)   # one GEMM that fills the device
"""
DEFAULT_SMS = 108


def check(ctx: Context):
    m = ctx.metrics
    r = m.roofline
    if r is None or not r.available or r.device is None or ctx.step_ms <= 0:
        return None
    table = full_table(m)
    if len(table) == 0:
        return None
    opts = ctx.options
    sms = r.sm_count or DEFAULT_SMS
    gemm = (table["kind"] == "gemm").to_numpy()
    tiles = np.where(gemm, output_tiles(table), np.inf)
    share = table["ceiling_share"].to_numpy(np.float64)
    calls = table["calls"].to_numpy(np.float64)
    small = gemm & (tiles < sms) & (share < opts["max_ceiling_share"]) & (calls >= opts["min_calls_per_step"])
    if not small.any():
        return None
    big = gemm & (tiles >= sms) & (table["time_ms"].to_numpy(np.float64) > 0)
    flops_step = table["flops"].to_numpy(np.float64) * calls
    time_ms = table["time_ms"].to_numpy(np.float64)
    rows, factors, listed = [], [], []
    for i in np.nonzero(small)[0]:
        p = table["precision"].iat[i]
        same = big & (table["precision"] == p).to_numpy()
        if same.any():
            rate = float(flops_step[same].sum() / time_ms[same].sum() / 1e9)
        else:
            peak = table["attainable_tflops"].iat[i]
            if not np.isfinite(peak):
                continue
            rate = float(peak) * opts["max_ceiling_share"]
        new_ms = flops_step[i] / rate / 1e9
        if not np.isfinite(new_ms) or new_ms >= time_ms[i]:
            continue
        rows.append(i)
        factors.append(new_ms / time_ms[i])
        listed.append({"op": table["op"].iat[i], "shape": table["shape"].iat[i], "precision": p, "calls_per_step": round(float(calls[i]), 1),
                       "tiles": int(tiles[i]), "ms_per_step": round(float(time_ms[i]), 3), "tflops": round(float(table["tflops"].iat[i]), 2),
                       "batched_tflops": round(rate, 2)})
    if not rows:
        return None
    saving_ms = float(sum(time_ms[i] * (1 - f) for i, f in zip(rows, factors, strict=True)))
    if saving_ms / ctx.step_ms < opts["min_share"]:
        return None
    change = scale_op_rows(m.kernels.index.to_numpy(), kernel_rows(m), len(table), rows, factors)
    if change is None:
        return None
    listed.sort(key=lambda d: -d["ms_per_step"])
    top = listed[0]
    message = (
        f"{len(rows)} GEMM shape(s) too small to fill the {sms} multiprocessors take {float(time_ms[rows].sum()):.2f} ms/step "
        f"(e.g. {top['op']} {top['shape']}, {top['calls_per_step']:g} calls/step, {top['tiles']} output tiles, {top['tflops']:.1f} TFLOP/s). "
        "Batching them fills the multiprocessors."
    )
    evidence = {"shapes": listed[:10], "sm_count": sms, "sm_count_recorded": r.sm_count is not None}
    return ctx.finding(message, saving_ms, confidence="medium", evidence=evidence, fix=FIX, snippet=AFTER, change=change)
