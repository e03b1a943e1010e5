"""fp32 matmuls and convolutions run without TF32 on an Ampere-or-newer GPU.

## What it detects
On compute capability 8.0 or newer, GEMM, convolution, attention and RNN kernels that run
in fp32 on the FMA units (precision `fp32-fma`, see "How the precision is decided" below)
hold at least `min_share` (3%) of the step once their TF32 speed-up is applied. Matmuls
and cuDNN work are judged apart, because PyTorch has one switch for each:
`torch.backends.cuda.matmul.allow_tf32` (off by default since PyTorch 1.12; also set by
`torch.set_float32_matmul_precision("high")`) for GEMMs and attention, and
`torch.backends.cudnn.allow_tf32` (on by default) for convolutions and cuDNN RNNs.

## What it needs from the trace
The device's kernel records on an NVIDIA GPU of compute capability 8.0 or more; without them
it says nothing. The TF32 switches come from the facts file; without it a switch looks off
when no TF32 kernel of its family ran, and the finding says the switches are not recorded.
The launching ops' input types (`record_shapes=True`) make each kernel's precision exact;
without them the kernel names decide, and the finding says whether the trace holds no input
types at all or holds them but not on these kernels' ops (evidence `record_shapes`).

## Why it is slow
TF32 runs fp32 matmuls on the Tensor Cores with a 10-bit mantissa and fp32 range (A100: 156
TFLOPS against 19.5 for fp32; H100: 494 against 67). Most training is insensitive to the
lost mantissa bits, and the switch is one line; without it every fp32 matmul uses the slow
FMA units. On an H100 a ViT's fp32 step went from 60.4 to 32.2 ms with it.

## Evidence used
- each kernel inside the steps with its family, precision and launching op (metrics.precision);
- the compute capability (trace, else facts, else library kernel names);
- TF32 kernels of the same switch in the trace (they show the switch is already on, and the
  fp32 ones are the library's own choice for those shapes: not reported);
- from the facts file: `tf32.matmul`, `tf32.cudnn`, `tf32.float32_matmul_precision`; without
  it the rule says it could not check the switches and lowers its confidence;
- where the precision came from (op input types, kernel names, switches): a trace without
  input types and without a facts file is judged on kernel names alone, at low confidence.

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

## Fix: `advisor fix --unsafe-fixes` (unsafe: changes numerics)
```diff
 import torch
+torch.backends.cuda.matmul.allow_tf32 = True
+torch.backends.cudnn.allow_tf32 = True
```
A script that asks for `set_float32_matmul_precision("highest")` is left alone, with the
reason. A `transformers` Trainer gets `TrainingArguments(tf32=True)`.

## How the saving is estimated
Per step: each fp32-fma kernel's time of the families whose switch is off, times
(1 − 1/speed-up of its family), times the share of kernel time on the timeline (kernels
hidden under other streams do not shorten the step). The speed-ups are the per-family ratios
measured on Hopper (`benchmarks/results/precision_ratios.txt`), and this conservative table
elsewhere, on all of a family's kernels (the datasheet ratios are higher: see
`benchmarks/results/rule_constants.md`):

| architecture | compute capability | fp32 → TF32 |
| --- | --- | --- |
| Ampere A100/A30 | 8.0 | 2.0× |
| Ampere/Ada A10, L4, L40, RTX 30/40 | 8.6 | 1.2× |
| Hopper | 9.0 | 2.0× |
| Blackwell | 10.0 | 2.0× |
| Blackwell RTX 50 | 12.0 | 1.2× |

Kernel time is not inflated by the profiler, so the saving is not scaled to the unprofiled
steps. `tensor-cores-unused` promises what autocast gives the same kernels from the run as it
is (fp32 → bf16, net of autocast's casts); both read one per-kernel table built once per
rank (`metrics.compute.precision_table`: each kernel's family, precision, TF32 switch and
`metrics.precision.precision_speedup`'s duration scale factor per target), and when both
fixes are replayed together each kernel runs at the better of the two rates, so the same
time is never saved twice.

Reference: https://pytorch.org/docs/stable/notes/cuda.html#tensorfloat-32-tf32-on-ampere-and-later-devices

## Measured pairs that confirm the model
the H100 ViT `--tf32` pair (25.12 ms promised, 28.47 measured), within ±25% (`benchmarks/results/promise_accuracy.txt`). Its rule page's `CONFIRMED_BY`
says so to the ranking: a promise with "up to" parts that no measured pair checked (torch.compile's
layout and batch-norm parts) ranks above this fix only where it saves more than twice as much.
"""

from __future__ import annotations

from advisor.whatif.changes import scale_device

import numpy as np

from advisor.engine import Context
from advisor.metrics.compute import (
    device_capability,
    kernel_evidence,
    kernel_exposure,
    precision_table,
)
from advisor.metrics.precision import (
    names_only_sentence,
    record_shapes_in_trace,
    FROM_OP,
    TF32_SWITCH_OF_FAMILY,
    Tf32Switches,
    ratio_table,
    tf32_switches_off,
    with_precision_page,
)

__doc__ = with_precision_page(__doc__)

ID = "tf32-disabled"
TITLE = "fp32 matmuls/convolutions run without TF32"
# Measured pairs that confirm the saving model (advisor.engine.ranking.UNCHECKED_MARGIN).
CONFIRMED_BY = "the H100 ViT --tf32 pair (25.12 ms promised, 28.47 measured)"
GROUP = "compute"
TESTED_ON = ("nvidia", "amd", "mtia", "cpu")  # vendors whose real traces the tests run it on (advisor/metrics/vendors.py)
DOCS = "https://pytorch.org/docs/stable/notes/cuda.html#tensorfloat-32-tf32-on-ampere-and-later-devices"
DEFAULTS = {"min_capability": 8.0, "min_share": 0.03}
FIX = 'Allow TF32: torch.set_float32_matmul_precision("high") for matmuls, torch.backends.cudnn.allow_tf32 = True for convolutions.'
AFTER = """torch.set_float32_matmul_precision("high")   # same as torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.allow_tf32 = True       # convolutions (PyTorch's default)
"""
SWITCH_OF_FAMILY = TF32_SWITCH_OF_FAMILY  # which switch governs each kernel family
WHAT = {"gemm": "matmuls", "attention": "attention", "conv": "convolutions", "rnn": "RNNs"}


def check(ctx: Context):
    m = ctx.metrics
    opts = ctx.options
    cap = device_capability(m, ctx.recorded.device.compute_capability)
    if not cap.nvidia or cap.value is None or cap.value < opts["min_capability"]:
        return None
    table = ratio_table(cap.value)
    if table.arch is None or table.arch.tf32_over_fp32 is None:
        return None
    kp = precision_table(m, cap.value)  # the per-kernel precision table tensor-cores-unused reads too
    k = kp.kernels
    step_ms = ctx.step_ms
    if len(k) == 0 or step_ms <= 0:
        return None
    family, precision, switch_of, dur = kp.family, kp.precision, kp.switch_of, kp.dur
    fp32 = (precision == "fp32-fma") & (switch_of != "")
    recorded = Tf32Switches.from_facts(ctx.recorded)
    switches = {"matmul": recorded.matmul, "cudnn": recorded.cudnn}
    off = tf32_switches_off(k, recorded)
    if not off:
        return None
    chosen = fp32 & np.isin(switch_of, list(off))
    scale = kp.scale_to("tf32")
    exposure = kernel_exposure(m, k)
    n_steps = max(len(m.steps), 1)
    fp32_ns = dur[chosen].sum()
    saving_ms = float((dur * (1 - scale))[chosen].sum()) * exposure / n_steps / 1e6
    if saving_ms / step_ms < opts["min_share"]:
        return None

    families = {}
    for f in FAMILIES_IN_ORDER:
        mask = chosen & (family == f)
        if not mask.any():
            continue
        ratio, source = table.ratio(f, "fp32-fma", "tf32")
        families[f] = {
            "fp32_ms_per_step": round(dur[mask].sum() / n_steps / 1e6, 3),
            "switch": SWITCH_OF_FAMILY[f],
            "tf32_switch": switches[SWITCH_OF_FAMILY[f]],
            "tf32_kernels_seen": off[SWITCH_OF_FAMILY[f]],
            "speedup": ratio,
            "speedup_source": f"measured on an {table.measured_on}" if source == "measured" else f"conservative, {table.arch.name}",
        }
    from_op = float(dur[chosen & (kp.source == FROM_OP)].sum() / fp32_ns)
    names_only = from_op == 0 and ctx.recorded.schema is None
    switches_known = all(switches[s] is not None for s in off)
    what = " and ".join(WHAT[f] for f in families)
    fixes = []
    if "matmul" in off:
        fixes.append('torch.set_float32_matmul_precision("high") (or torch.backends.cuda.matmul.allow_tf32 = True)')
    if "cudnn" in off:
        fixes.append("torch.backends.cudnn.allow_tf32 = True")
    fix = "Set " + " and ".join(fixes) + " before building the model."
    gpu = f"{m.device.name or table.arch.name + ' GPU'} (cc {cap.value:.1f})"
    speedups = ", ".join(f"{WHAT[f]} {v['speedup']:g}×" for f, v in families.items())
    how = f"measured on an {table.measured_on}" if any(v["speedup_source"].startswith("measured") for v in families.values()) else f"conservative, {table.arch.name}"
    message = (
        f"{fp32_ns / n_steps / 1e6:.1f} ms/step of fp32 {what} run on the FMA units, without TF32, on {gpu}. "
        f"Allowing TF32 runs them on the Tensor Cores (fp32 → TF32 {speedups}, {how})."
    )
    if not switches_known:
        message += " The TF32 switches are not recorded (no facts file); no TF32 kernel of this kind ran, so they look off."
    record_shapes = record_shapes_in_trace(m)
    if names_only:
        message += names_only_sentence(record_shapes)
    candidates = k[chosen]
    evidence = {
        "record_shapes": record_shapes,  # the names-only sentence says why from this
        "compute_capability": cap.value,
        "compute_capability_source": cap.source,
        "architecture": table.arch.name,
        "families": families,
        "precision_from_op_input_types": round(from_op, 4),
    }
    evidence.update(kernel_evidence(ctx.events, candidates, m.steps, exposure, by_eligible_op=True))
    if names_only:
        confidence = "low"
    else:
        confidence = "high" if switches_known and cap.source != "kernel names" else "medium"
    change = scale_device(k.index.to_numpy()[chosen], scale[chosen])  # the fix, replayed: these kernels at the TF32 rate
    return ctx.finding(message, saving_ms, confidence=confidence, evidence=evidence, fix=fix, snippet=AFTER, change=change)


FAMILIES_IN_ORDER = ("gemm", "attention", "conv", "rnn")
