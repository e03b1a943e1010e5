"""bf16/fp16 GEMMs dominate a Hopper or Blackwell step: FP8 GEMMs would run them up to twice as fast.

## What it detects
On an NVIDIA GPU of compute capability 9.x (Hopper) or 10.x (Blackwell), whose Tensor Cores
multiply FP8 (e4m3/e5m2) matrices, the GEMM and grouped-GEMM kernels inside the steps that run
in bf16 or fp16 hold at least `min_gemm_share` (25%) of the steps' kernel time, and running
them in FP8 would save at least `min_share` (3%) of the step. GEMMs already in FP8 or an MX/NV
block-scaled format are not counted. This is a change to the numerics, not a free speed-up:
the finding says so and ranks behind a fix that changes nothing but speed and saves at least
half as much (`advisor.engine.ranking`).

Options: `min_gemm_share` (float, 0.25): the least share of the steps' kernel time in
bf16/fp16 GEMM kernels; `min_share` (float, 0.03): the least saving, as a share of the step,
worth a finding.

## What it needs from the trace
The device's kernel records on an NVIDIA GPU of compute capability 9.x or 10.x (from the
trace's device properties, else the facts file, else kernel names at lower confidence), whose
peak table has FP8. On any other device, or without kernels, it says nothing. It is not run
where the launches have no kernel records (the device's activity is missing); where the host's
operators are missing (a device-only trace): the report's warning or note says why.

## Why it is slow
Hopper and Blackwell Tensor Cores run FP8 matrix products at twice their bf16/fp16 rate
(H100 SXM: 1,979 against 989 dense TFLOP/s; B200: 4,500 against 2,250), and FP8 operands move
half the bytes. Large GEMMs of a transformer's linear layers run near the Tensor Cores' peak, so
their time follows the rate. FP8 training keeps a scale per tensor (Transformer Engine's delayed
scaling, torchao's dynamic per-tensor or per-row scaling) or per block (MX formats on
Blackwell) and keeps master weights and optimizer states in higher precision.

## Evidence used
- the kernel table (`advisor.metrics.kernel_taxonomy`, `advisor.metrics.precision`): each
  kernel's family (GEMM, grouped GEMM) and math precision, read from its name first;
- the compute capability from the trace's device properties (else the facts file, else kernel
  names, at lower confidence) and the device's bf16, fp16 and FP8 peaks (`advisor.metrics.devices`);
- the share of kernel time on the timeline.

## Example
Before:
```python
model = Transformer(config).cuda().to(torch.bfloat16)
```
After (torchao float8 training: the model's `nn.Linear` layers run their GEMMs in FP8):
```python
from torchao.float8 import convert_to_float8_training
convert_to_float8_training(model)
model = torch.compile(model)
```
With Transformer Engine: build the layers from `transformer_engine.pytorch` (`te.Linear`,
`te.TransformerLayer`) and run the forward pass under `te.fp8_autocast(enabled=True)`.

## How the saving is estimated
Up to the bf16/fp16 GEMM kernels' time per step times (1 − the device's bf16 or fp16 peak over
its FP8 peak), from the device table (half their time on H100, H200, B200 and B300), times the
share of kernel time on the timeline. The casts of activations and weights to FP8 and the
scales' bookkeeping are not counted (a compiled model fuses them into neighbouring kernels), nor
GEMMs too small to run near the peak: the figure is an upper bound. The fix is replayed as those
kernels scaled by the ratio of the peaks.

Reference: https://github.com/pytorch/ao/tree/main/torchao/float8
"""

from __future__ import annotations

import numpy as np

from advisor.engine import Context, is_training
from advisor.metrics.compute import device_capability, kernel_evidence, kernel_exposure, step_kernels
from advisor.metrics.devices import device_ceiling
from advisor.whatif.changes import scale_device

ID = "fp8-gemm"
# The fix changes the numerics of what is trained (or of the outputs served), not only its
# speed: the ranking puts it after a fix that changes nothing but speed and saves at least half as much.
RECIPE = "precision"
TITLE = "bf16/fp16 GEMMs dominate a Hopper/Blackwell step: FP8 would run them faster"
GROUP = "compute"
TESTED_ON = ("nvidia",)  # vendors whose real traces the tests run it on (advisor/metrics/vendors.py)
DOCS = "https://github.com/pytorch/ao/tree/main/torchao/float8"
DEFAULTS = {"min_gemm_share": 0.25, "min_share": 0.03}
FIX = (
    "Run the large linear layers' GEMMs in FP8: torchao's convert_to_float8_training(model) (then torch.compile), "
    "or Transformer Engine's te.Linear under te.fp8_autocast; check the loss against the bf16 run."
)
AFTER = """from torchao.float8 import convert_to_float8_training
convert_to_float8_training(model)   # nn.Linear GEMMs in FP8, master weights stay bf16/fp32
model = torch.compile(model)
"""
GEMM_FAMILIES = ("gemm", "grouped_gemm")
SIXTEEN_BIT = ("bf16", "fp16")


def check(ctx: Context):
    m = ctx.metrics
    opts = ctx.options
    step_ms = ctx.step_ms
    cap = device_capability(m, ctx.recorded.device.compute_capability)
    if not cap.nvidia or cap.value is None or not 9.0 <= cap.value < 11.0 or step_ms <= 0:
        return None
    ceiling = device_ceiling(m.device.name)
    if ceiling is None or not ceiling.fp8:
        return None
    k = step_kernels(m)
    total = float(k["dur"].sum())
    if total <= 0:
        return None
    precision = k["precision"].astype(object).to_numpy()
    gemm = np.isin(k["kind"].astype(object).to_numpy(), GEMM_FAMILIES)
    candidates = gemm & np.isin(precision, SIXTEEN_BIT)
    dur = k["dur"].to_numpy(np.float64)
    gemm_ns = float(dur[candidates].sum())
    if gemm_ns / total < opts["min_gemm_share"]:
        return None
    # each precision's time at the FP8 rate: its peak over the FP8 peak
    keep = np.ones(len(k))
    ratios = {}
    for p in SIXTEEN_BIT:
        peak = ceiling.peak_tflops(p)
        sel = candidates & (precision == p)
        if sel.any() and peak:
            ratios[p] = peak / ceiling.fp8
            keep[sel] = ratios[p]
    candidates &= keep < 1.0
    if not candidates.any():
        return None
    n_steps = max(len(m.steps), 1)
    exposure = kernel_exposure(m, k)
    saving_ms = float((dur * (1.0 - keep))[candidates].sum()) * exposure / n_steps / 1e6
    if saving_ms / step_ms < opts["min_share"]:
        return None
    gemm_ms = float(dur[candidates].sum()) / n_steps / 1e6
    fp8_ns = float(dur[gemm & ~np.isin(precision, SIXTEEN_BIT) & (precision == "fp8")].sum())
    gpu = f"{m.device.name or ceiling.name} (cc {cap.value:.1f})"
    rates = ", ".join(f"{p} {ceiling.peak_tflops(p):g} → FP8 {ceiling.fp8:g} TFLOP/s" for p in ratios)
    evidence = {
        "compute_capability": cap.value,
        "compute_capability_source": cap.source,
        "device_ceiling": ceiling.name,
        "peak_tflops": {p: ceiling.peak_tflops(p) for p in (*SIXTEEN_BIT, "fp8")},
        "sixteen_bit_gemm_ms_per_step": round(gemm_ms, 3),
        "sixteen_bit_gemm_share_of_kernel_time": round(gemm_ns / total, 4),
        "fp8_gemm_share_of_kernel_time": round(fp8_ns / total, 4),
        "time_kept_at_fp8": {p: round(r, 4) for p, r in ratios.items()},
        "changes_numerics": True,
    }
    evidence.update(kernel_evidence(ctx.events, k[candidates], m.steps, exposure))
    what = "what is trained" if is_training(m, ctx.recorded) else "the outputs"
    message = (
        f"{100 * gemm_ns / total:.0f}% of kernel time ({gemm_ms:.2f} ms/step) is bf16/fp16 GEMM work on {gpu}, whose Tensor Cores "
        f"run FP8 GEMMs faster ({rates}, {ceiling.source}): in FP8 (torchao float8, Transformer Engine) they would take "
        f"up to {saving_ms:.2f} ms/step less. This is a change to the numerics of {what}, not only its speed: "
        "check the loss (or the accuracy) against the bf16 run, and keep precision-sensitive layers in bf16."
    )
    change = scale_device(k.index.to_numpy()[candidates], keep[candidates])
    confidence = "medium" if cap.source in ("trace", "facts") else "low"
    return ctx.finding(message, saving_ms, confidence=confidence, evidence=evidence, fix=FIX, snippet=AFTER, change=change)
