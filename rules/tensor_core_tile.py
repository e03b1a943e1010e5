"""Matrix shapes miss the Tensor Core tile: a GEMM dimension is not a multiple of 8 (fp16/bf16), 4 (TF32) or 16 (fp8/int8).

## What it detects
GEMMs (`aten::mm`, `addmm`, `bmm`, `baddbmm`, `linear`, `_scaled_mm`) in a Tensor Core
precision whose M, N or K is not a multiple of the tile's: 8 elements for fp16 and bf16, 4
for TF32, 16 for fp8 and int8 (16 bytes in every case), read from the op's input shapes
(`record_shapes=True`) on the roofline (`advisor report --ops`), and whose padded time
would save at least `min_share` (1%) of the step.

## What it needs from the trace
The roofline: the GEMM ops' input shapes and types (`record_shapes=True`) and their kernels, on
a device with Tensor Cores. Without input shapes it says nothing. It is not run where the
launches have no kernel records (the device's activity is missing); where the host's operators
are missing (a device-only trace): the report's warning or note says why.

## Why it is slow
cuBLAS and cuDNN feed the Tensor Cores 16-byte vectors along each matrix dimension. A
dimension that is not a multiple of that width either falls back to slower kernels or runs
tiles that are partly empty, and the leading dimensions of the operands lose their aligned
loads. NVIDIA's guide measures a GEMM with K = 4,095 instead of 4,096 at a fraction of the
aligned speed; the usual culprits are a vocabulary of 50,257 tokens, a hidden size of 1,000,
a batch of odd size flowing into the weight-gradient GEMM.

## Evidence used
- each GEMM's M, N, K and dtype from its op's input shapes and types, and the kernels it
  launched inside the steps (metrics.roofline);
- the TF32 precision from the kernels' own names (an fp32 GEMM that ran TF32 kernels);
- the run's own aligned GEMMs of the same precision: the rate a padded GEMM would reach.

## Example
Before:
```python
head = nn.Linear(768, 50257)               # N = 50,257: not a multiple of 8
```
After:
```python
head = nn.Linear(768, 50304)               # padded to a multiple of 64; slice logits[..., :50257]
```

## How the saving is estimated
Per GEMM shape: its FLOPs padded to the multiple (each misaligned dimension rounded up) at
the TFLOP/s that the run's aligned GEMMs of the same precision reached (weighted by their
time; those within 4× of its FLOPs per call when there are any), against its measured time;
a shape already at least as fast is left out. The fix is replayed as those kernels running
at that share of their time. Without an aligned GEMM of the same precision in the run there
is nothing to compare with, and the rule stays silent.

Reference: https://docs.nvidia.com/deeplearning/performance/dl-performance-matrix-multiplication/index.html#requirements-tc
"""

from __future__ import annotations

import numpy as np

from advisor.engine import Context
from advisor.metrics.roofline import aligned_rate, full_table, kernel_rows, misaligned_gemms, padded
from advisor.whatif.changes import scale_op_rows

ID = "tensor-core-tile"
TITLE = "Matrix shapes miss the Tensor Core tile"
GROUP = "compute"
TESTED_ON = ("nvidia",)  # vendors whose real traces the tests run it on (advisor/metrics/vendors.py)
DOCS = "https://docs.nvidia.com/deeplearning/performance/dl-performance-matrix-multiplication/index.html#requirements-tc"
DEFAULTS = {"min_share": 0.01}
FIX = "Pad the misaligned matrix dimensions (hidden sizes, vocabulary, batch) up to a multiple of 8 for fp16/bf16 (4 for TF32, 16 for fp8/int8), and slice the result."
AFTER = """vocab = 50257
head = nn.Linear(hidden, (vocab + 63) // 64 * 64)   # padded: every GEMM dimension a multiple of 8
logits = head(x)[..., :vocab]
"""


def check(ctx: Context):
    m = ctx.metrics
    if not m.device.has_tensor_cores or m.roofline is None or not m.roofline.available:
        return None
    table = full_table(m)
    if len(table) == 0 or ctx.step_ms <= 0:
        return None
    bad, multiple = misaligned_gemms(table)
    if not bad.any():
        return None
    rows, factors, listed = [], [], []
    for i in np.nonzero(bad)[0]:
        r = table.iloc[i]
        rate = aligned_rate(table, r["precision"], float(r["flops"]), bad)
        if rate is None or not np.isfinite(r["tflops"]) or r["time_ms"] <= 0:
            continue
        dims = np.array([r["m"], r["n"], r["k"]], dtype=np.float64)
        pad = padded(dims, multiple[i])
        padded_flops = float(r["flops"]) * float(np.prod(pad / dims))
        new_ms = padded_flops * r["calls"] / rate / 1e9
        if new_ms >= r["time_ms"]:
            continue
        rows.append(i)
        factors.append(new_ms / r["time_ms"])
        listed.append({
            "op": r["op"], "shape": r["shape"], "precision": r["precision"], "multiple": int(multiple[i]),
            "padded": "×".join(str(int(x)) for x in pad), "ms_per_step": round(float(r["time_ms"]), 3),
            "tflops": round(float(r["tflops"]), 2), "aligned_tflops": round(rate, 2), "padded_ms_per_step": round(new_ms, 3),
        })
    if not rows:
        return None
    change = scale_op_rows(m.kernels.index.to_numpy(), kernel_rows(m), len(table), rows, factors)
    saving_ms = float(sum(table["time_ms"].iloc[i] * (1 - f) for i, f in zip(rows, factors, strict=True)))
    if saving_ms / ctx.step_ms < ctx.options["min_share"] or change is None:
        return None
    listed.sort(key=lambda d: -d["ms_per_step"] + d["padded_ms_per_step"])
    top = listed[0]
    total_ms = float(table["time_ms"].iloc[rows].sum())
    message = (
        f"{len(rows)} GEMM shape(s) with a dimension off the Tensor Core tile take {total_ms:.2f} ms/step "
        f"(e.g. {top['op']} {top['shape']} in {top['precision']}: {top['tflops']:.1f} TFLOP/s; padded to {top['padded']} "
        f"the run's aligned {top['precision']} GEMMs reach {top['aligned_tflops']:.1f}). Padding brings them to that rate."
    )
    evidence = {"shapes": listed[:10], "misaligned_ms_per_step": round(total_ms, 3)}
    return ctx.finding(message, saving_ms, confidence="medium", evidence=evidence, fix=FIX, snippet=AFTER, change=change)
