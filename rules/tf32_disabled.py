"""fp32 matmuls and convolutions run without TF32 on an Ampere-or-newer GPU.

## What it detects
On compute capability 8.0 or newer, GEMM and convolution kernels that run in plain fp32
(`sgemm`, `scudnn`, `implicit_convolve_sgemm`, ... — no Tensor Cores) hold at least
`min_share` (3%) of the step once their TF32 speed-up is applied. Matmuls and convolutions are
judged apart, because PyTorch has one switch for each:
`torch.backends.cuda.matmul.allow_tf32` (off by default since PyTorch 1.12) and
`torch.backends.cudnn.allow_tf32` (on by default).

## Why it is slow
TF32 runs fp32 matmuls on the Tensor Cores with a 10-bit mantissa and fp32 range (A100: 156
TFLOPS against 19.5 for fp32). Most training is insensitive to the lost mantissa bits, and
the switch is one line; without it every fp32 matmul uses the slow fp32 units.

## Evidence used
- the fp32 GEMM/convolution kernels inside the steps (plain fp32 by name, or launched by a
  conv/matmul op and not a Tensor Core kernel), and their launching ops;
- the compute capability (trace, else facts, else library kernel names);
- TF32 kernels of the same family in the trace (they show the switch is already on, and the
  fp32 ones are the library's own choice for those shapes: not reported);
- from the facts file: `tf32.matmul`, `tf32.cudnn`, `tf32.float32_matmul_precision`; without
  it the rule says it could not check the switches and lowers its confidence.

## Example
Before:
```python
model = build_model().cuda()        # fp32 matmuls on the fp32 units
```
After:
```python
torch.set_float32_matmul_precision("high")      # TF32 for matmuls
torch.backends.cudnn.allow_tf32 = True          # TF32 for convolutions (the default)
model = build_model().cuda()
```

## How the saving is estimated
Per step: the fp32 GEMM/convolution kernel time of the families whose switch is off, times
(1 − 1/speed-up), times the share of kernel time on the timeline. fp32 → TF32 speed-ups
(conservative; the datasheet ratios are 2-8×):

| architecture | compute capability | fp32 → TF32 |
| --- | --- | --- |
| Ampere A100/A30 | 8.0 | 2.0× |
| Ampere/Ada A10, L4, L40, RTX 30/40 | 8.6 | 1.2× |
| Hopper | 9.0 | 2.0× |
| Blackwell | 10.0 | 2.0× |
| Blackwell RTX 50 | 12.0 | 1.2× |

The further TF32 → bf16 step belongs to `tensor-cores-unused`, which counts only that part of
the same kernels, so the two never count the same time twice.

Reference: https://pytorch.org/docs/stable/notes/cuda.html#tensorfloat-32-tf32-on-ampere-and-later-devices
"""

from __future__ import annotations

from advisor.whatif.changes import scale_device

import re

import numpy as np

from advisor.engine import Context
from advisor.metrics.breakdown import _matches
from advisor.metrics.compute import (
    arch_speedup,
    device_capability,
    is_conv,
    kernel_evidence,
    kernel_exposure,
    kernel_precision,
    step_kernels,
)

ID = "tf32-disabled"
TITLE = "fp32 matmuls/convolutions run without TF32"
DOCS = "https://pytorch.org/docs/stable/notes/cuda.html#tensorfloat-32-tf32-on-ampere-and-later-devices"
DEFAULTS = {"min_capability": 8.0, "min_share": 0.03}
FIX = 'Allow TF32: torch.set_float32_matmul_precision("high") for matmuls, torch.backends.cudnn.allow_tf32 = True for convolutions.'
AFTER = """torch.set_float32_matmul_precision("high")   # same as torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.allow_tf32 = True       # convolutions (PyTorch's default)
"""
# Kernels that only move data for a convolution; TF32 does not change them.
LAYOUT_KERNEL = re.compile(r"nchwToNhwc|nhwcToNchw|transpose|Transpose")


def _switch(ctx: Context, family: str) -> bool | None:
    """The TF32 switch of a family from the facts file: True, False, or None when not recorded."""
    if family == "conv":
        v = ctx.fact("tf32", "cudnn")
        return None if v is None else bool(v)
    v = ctx.fact("tf32", "matmul")
    precision = ctx.fact("tf32", "float32_matmul_precision")
    if precision in ("high", "medium"):
        return True
    return None if v is None else bool(v)


def check(ctx: Context):
    m = ctx.metrics
    opts = ctx.options
    cap = device_capability(m, ctx.fact("device", "compute_capability"))
    if not cap.nvidia or cap.value is None or cap.value < opts["min_capability"]:
        return None
    arch = arch_speedup(cap.value)
    if arch is None or arch.tf32_over_fp32 is None:
        return None
    k = step_kernels(m)
    step_ms = ctx.step_ms
    if len(k) == 0 or step_ms <= 0:
        return None
    precision = kernel_precision(k, cap.value)
    gemm_like = (k["eligible"].to_numpy(bool) | k["fp32_gemm"].to_numpy(bool)) & ~_matches(k["name"], LAYOUT_KERNEL)
    fp32 = gemm_like & (precision == "fp32")
    tf32 = gemm_like & (precision == "tf32")
    conv = is_conv(k)
    dur = k["dur"].to_numpy(np.float64)
    n_steps = max(len(m.steps), 1)

    families = {}
    for family, mask in (("matmul", ~conv), ("conv", conv)):
        fp32_ns = dur[fp32 & mask].sum()
        if fp32_ns <= 0:
            continue
        switch = _switch(ctx, family)
        has_tf32 = bool((tf32 & mask).any())
        if switch is True or (switch is None and has_tf32):
            continue  # TF32 is allowed; the library chose fp32 kernels for these shapes
        families[family] = {"fp32_ns": fp32_ns, "switch": switch, "tf32_kernels_seen": has_tf32}
    if not families:
        return None

    chosen = np.zeros(len(k), dtype=bool)
    for family in families:
        chosen |= fp32 & (conv if family == "conv" else ~conv)
    fp32_ns = dur[chosen].sum()
    exposure = kernel_exposure(m, k)
    speedup = arch.tf32_over_fp32
    saving_ms = fp32_ns * (1 - 1 / speedup) * exposure / n_steps / 1e6
    if saving_ms / step_ms < opts["min_share"]:
        return None

    recorded = all(f["switch"] is not None for f in families.values())
    names = {"matmul": "matmuls", "conv": "convolutions"}
    what = " and ".join(names[f] for f in families)
    fixes = []
    if "matmul" in families:
        fixes.append('torch.set_float32_matmul_precision("high") (or torch.backends.cuda.matmul.allow_tf32 = True)')
    if "conv" in families:
        fixes.append("torch.backends.cudnn.allow_tf32 = True")
    fix = "Set " + " and ".join(fixes) + " before building the model."
    gpu = f"{m.device.name or arch.name + ' GPU'} (cc {cap.value:.1f})"
    message = (
        f"{fp32_ns / n_steps / 1e6:.1f} ms/step of fp32 {what} run without TF32 on {gpu}. Allowing TF32: "
        f"~{saving_ms:.1f} ms/step ({speedup:g}× fp32 → TF32, {arch.name})."
    )
    if not recorded:
        message += " The TF32 switches are not recorded (no facts file); no TF32 kernel of this kind ran, so they look off."
    candidates = k[chosen]
    evidence = {
        "compute_capability": cap.value,
        "compute_capability_source": cap.source,
        "architecture": arch.name,
        "families": {
            f: {"fp32_ms_per_step": round(v["fp32_ns"] / n_steps / 1e6, 3), "tf32_switch": v["switch"], "tf32_kernels_seen": v["tf32_kernels_seen"]}
            for f, v in families.items()
        },
        "speedup_used": speedup,
    }
    evidence.update(kernel_evidence(ctx.frames, candidates, m.steps, exposure, by_eligible_op=True))
    confidence = "high" if recorded and cap.source != "kernel names" else "medium"
    change = scale_device(k.index.to_numpy()[chosen], 1 / speedup)  # the fix, replayed: these kernels at the TF32 rate
    return ctx.finding(message, saving_ms, confidence=confidence, evidence=evidence, fix=fix, snippet=AFTER, change=change)
