"""Convolutions with fixed shapes run cuDNN's fallback algorithms: cudnn.benchmark is off.

## What it detects
Convolution kernels inside the steps that belong to cuDNN's generic fallback algorithms
(`implicit_convolve_sgemm`, `explicit_convolve_sgemm`, `dgrad_engine`, `wgrad_alg0_engine`,
FFT) hold at least `min_share` (3%) of the step after the estimated gain, the convolution
input shapes are the same in every step, and `torch.backends.cudnn.benchmark` is off. The
switch is read from the facts file. Without one the rule fires only on positive evidence that
the switch is off: the trace holds the run's first convolutions (the device set-up calls,
`cudaGetDeviceProperties` and the like, come before them) and none of its convolution ops
runs the autotuner's trials (a burst of `cudaEventSynchronize`/`cudaStreamSynchronize` calls or
`cudnnFind` inside one op). Fallback kernel names alone prove nothing: with benchmark on, cuDNN
may still pick them, and a window that starts after the first step never shows the tuning.
The message says which of the two the finding rests on.

## What it needs from the trace
The device's convolution kernels inside the steps, and whether cuDNN's autotuner is off: the
facts file's `cudnn_benchmark`, else positive evidence in the trace (its first convolutions
after the device set-up, none running the autotuner's trials). Without either it says nothing.
Static shapes are read from the convolution ops' input shapes (`record_shapes=True`); without
them the finding says so. It is not run where the launches have no kernel records (the device's
activity is missing); where the host's operators are missing (a device-only trace); where the
device's timeline lies outside the host's: the report's warning or note says why.

## Why it is slow
With `cudnn.benchmark = False` PyTorch asks cuDNN's heuristics for one algorithm per
convolution; the heuristics often fall back to the generic algorithms above, which need no
workspace but are slow. With `benchmark = True` the first call of each shape times the
candidate algorithms and keeps the fastest. It pays off when shapes repeat (fixed image size
and batch size); with shapes that change every step it re-tunes every time and costs more
than it saves.

## Evidence used
- the convolution kernels in the steps and which of them are fallback algorithms;
- the convolution ops' recorded input shapes per step (`record_shapes=True`): the same set
  in every step means static shapes; without shapes the rule says so;
- from the facts file: `cudnn_benchmark`; without it, the device set-up calls and the
  synchronize calls inside convolution ops (the autotuner's bursts).

## Example
Before:
```python
model = torchvision.models.resnet50().cuda()
```
After:
```python
torch.backends.cudnn.benchmark = True    # input shapes are fixed: tune once per shape
model = torchvision.models.resnet50().cuda()
```

## Fix: `advisor fix` (safe)
An existing assignment is switched on where it is; otherwise the line goes after the imports:
```diff
 import torch
+torch.backends.cudnn.benchmark = True
```

## How the saving is estimated
The fallback kernels' time per step × (1 − 1/1.5), times the share of kernel time on the
timeline: the tuned algorithms are taken to be 1.5× faster, a conservative figure for cuDNN's
precomputed-GEMM, Winograd and ALGO_1 kernels against the fallbacks. When the same kernels
run in fp32 on a GPU with Tensor Cores, `tensor-cores-unused` claims them first: this rule
then counts its gain on the time left after the mixed-precision speed-up (the standalone
figure is in the evidence), so the two never add up to more than both fixes together.

Reference: https://pytorch.org/docs/stable/backends.html#torch.backends.cudnn.benchmark
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from advisor.engine import Context
from advisor.metrics.breakdown import name_matches
from advisor.metrics.host_device import SYNC_CALL
from advisor.metrics.compute import (
    arch_speedup,
    device_capability,
    is_conv,
    kernel_evidence,
    kernel_exposure,
    kernel_precision,
    step_kernels,
)
from advisor.metrics.steps import step_of

ID = "cudnn-benchmark"
TITLE = "cudnn.benchmark is off: convolutions use fallback algorithms"
GROUP = "compute"
TESTED_ON = ("nvidia", "mtia", "cpu")  # vendors whose real traces the tests run it on (advisor/metrics/vendors.py)
DOCS = "https://pytorch.org/docs/stable/backends.html#torch.backends.cudnn.benchmark"
DEFAULTS = {"min_share": 0.03, "tuned_speedup": 1.5}
FIX = "Set torch.backends.cudnn.benchmark = True when input shapes do not change between steps."
AFTER = """torch.backends.cudnn.benchmark = True
"""
FALLBACK_CONV_KERNEL = re.compile(
    r"implicit_convolve_[sh]gemm|explicit_convolve_[sh]gemm|dgrad_engine|wgrad_alg0_engine|fft2d_|fft_[rc]2[rc]|cudnn::detail::\w*alg0"
)
CONV_OP_WITH_SHAPES = re.compile(r"^aten::(cudnn_convolution|miopen_convolution|_convolution|convolution)$")


def static_shapes(events, steps: pd.DataFrame) -> bool | None:
    """True when every step runs the same convolution input shapes, False when they change,
    None when the trace has no shapes (recorded without record_shapes=True)."""
    host = events.host
    if "input_dims" not in host:
        return None
    conv = host[name_matches(host["name"], CONV_OP_WITH_SHAPES)]
    conv = conv[conv["input_dims"].notna()]
    if len(conv) == 0 or len(steps) == 0:
        return None
    idx = step_of(steps["start"].to_numpy(np.int64), steps["end"].to_numpy(np.int64), conv["ts"].to_numpy(np.int64))
    conv = conv.assign(step_index=idx)[idx >= 0]
    if len(conv) == 0:
        return None
    per_step = conv.groupby("step_index")["input_dims"].apply(lambda s: tuple(sorted(map(str, s))))
    return bool(per_step.nunique() == 1 and len(per_step) == len(steps))


SETUP_CALL = re.compile(r"^(cudaGetDeviceCount|cudaGetDeviceProperties(_v2)?|cudaDriverGetVersion|cuInit|cuDevicePrimaryCtxRetain)$")
# The autotuner times its trials between synchronize calls (the one definition of a sync:
# advisor.metrics.host_waits), or calls cuDNN's own search.
AUTOTUNE_CALL = re.compile(f"{SYNC_CALL.pattern}|cudnnFind")
CONV_OP = re.compile(r"^aten::(cudnn_convolution|miopen_convolution)")
AUTOTUNE_SYNCS = 3  # synchronize calls inside one convolution op: the autotuner timing its trials


def switch_from_trace(events) -> tuple[bool | None, str]:
    """Whether the trace itself shows cudnn.benchmark on (True: the autotuner's bursts), off
    (False: the run's first convolutions ran untuned), or cannot tell (None); and why."""
    host, rt = events.host, events.runtime
    if len(host) == 0 or len(rt) == 0:
        return None, "the trace has no convolution ops or runtime calls"
    conv = host[name_matches(host["name"], CONV_OP)]
    if len(conv) == 0:
        return None, "the trace has no cuDNN convolution ops"
    sync = rt[name_matches(rt["name"], AUTOTUNE_CALL)]
    bursts = 0
    if len(sync):
        cs, ce = conv["ts"].to_numpy(np.int64), conv["end"].to_numpy(np.int64)
        order = np.argsort(cs, kind="stable")
        cs, ce = cs[order], ce[order]
        idx = np.searchsorted(cs, sync["ts"].to_numpy(np.int64), side="right") - 1
        ok = idx >= 0
        inside = np.zeros(len(idx), dtype=bool)
        inside[ok] = sync["ts"].to_numpy(np.int64)[ok] <= ce[idx[ok]]
        counts = np.bincount(idx[inside], minlength=len(cs))
        bursts = int((counts >= AUTOTUNE_SYNCS).sum())
    if bursts:
        return True, f"{bursts} convolution op(s) run the autotuner's synchronize bursts"
    setup = rt[name_matches(rt["name"], SETUP_CALL)]
    if len(setup) and int(setup["ts"].min()) < int(conv["ts"].min()):
        return False, "the trace holds the run's first convolutions (after the device set-up) and none runs the autotuner's trials"
    return None, "the window starts after the run's first convolutions, where the autotuner would show"


def check(ctx: Context):
    m = ctx.metrics
    opts = ctx.options
    step_ms = ctx.step_ms
    benchmark = ctx.recorded.cudnn_benchmark
    if benchmark is True or step_ms <= 0:
        return None
    inferred, why = (None, "") if benchmark is False else switch_from_trace(ctx.events)
    if benchmark is None and inferred is not False:
        return None  # no facts and no positive evidence that the switch is off: fallback names alone prove nothing
    k = step_kernels(m)
    if len(k) == 0:
        return None
    conv = is_conv(k)
    fallback = k[conv & name_matches(k["name"], FALLBACK_CONV_KERNEL)]
    if len(fallback) == 0:
        return None
    shapes = static_shapes(ctx.events, m.steps)
    if shapes is False:
        return None  # shapes change between steps: benchmark mode would re-tune every time
    n_steps = max(len(m.steps), 1)
    exposure = kernel_exposure(m, k)
    speedup = float(opts["tuned_speedup"])
    fallback_ms = float(fallback["dur"].sum()) / 1e6 / n_steps
    standalone_ms = fallback_ms * (1 - 1 / speedup) * exposure
    # The same fp32 kernels are what autocast replaces: count this gain after that one.
    cap = device_capability(m, ctx.recorded.device.compute_capability)
    arch = arch_speedup(cap.value) if cap.nvidia else None
    after_amp = 1.0
    if arch is not None and ctx.recorded.autocast.used is not True:
        if (kernel_precision(fallback, cap.value) == "fp32").all():
            after_amp = 1 / arch.half_over_fp32
    saving_ms = standalone_ms * after_amp
    if saving_ms / step_ms < opts["min_share"]:
        return None

    conv_ms = float(k.loc[conv, "dur"].sum()) / 1e6 / n_steps
    evidence = {
        "fallback_conv_ms_per_step": round(fallback_ms, 3),
        "share_of_conv_kernel_time": round(fallback_ms / conv_ms, 4) if conv_ms else None,
        "static_shapes": shapes,
        "cudnn_benchmark": benchmark,
        "switch_from": "facts" if benchmark is not None else "trace",
        "trace_evidence": why or None,
        "tuned_speedup_used": speedup,
        "standalone_saving_ms": round(standalone_ms, 3),
        "counted_after_mixed_precision": after_amp < 1.0,
    }
    evidence.update(kernel_evidence(ctx.events, fallback, m.steps, exposure))
    message = (
        f"{fallback_ms:.1f} ms/step ({100 * fallback_ms / conv_ms:.0f}% of convolution kernel time) runs cuDNN's fallback "
        "algorithms (implicit GEMM, ALGO_0), the heuristics' pick with cudnn.benchmark off"
    )
    message += "; the convolution shapes repeat every step" if shapes else "; input shapes are not in the trace (record_shapes=False): benchmark only if they stay fixed"
    message += ". cudnn.benchmark = True times the algorithms once per shape and keeps the fastest"
    message += " (counted after autocast's gain on the same kernels)." if after_amp < 1.0 else "."
    if benchmark is None:
        message += f" The switch is not recorded (no facts file); the trace shows it off: {why}."
    else:
        message += " The facts file says cudnn.benchmark is off."
    confidence = "medium" if benchmark is False and shapes else "low"
    return ctx.finding(message, saving_ms, confidence=confidence, evidence=evidence)
