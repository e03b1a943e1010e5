"""A CPU with native bf16 runs the model's matrix ops in fp32.

## What it detects
A run with no device activity whose matrix ops (linear, matmul, convolution and the matrix
products of their backward) take fp32 inputs, on a CPU that computes in bf16 natively: the
facts file of `advisor profile` records the CPU's flags, and one of them must be `avx512_bf16`
or `amx_bf16` (the trace does not say what the CPU supports: without that record the rule
stays silent). The facts must not say that bf16 autocast was in use. It fires when the time
the fix saves is at least `min_share` (5%) of the step (the unprofiled step where the facts
record one: the saving is unprofiled time).

## What it needs from the trace
A run with no device activity, the matrix ops' input types (`record_shapes=True`) and the facts
file of `advisor profile`, whose `cpu_features.flags` say the CPU computes in bf16
(`avx512_bf16`, `amx_bf16`). The trace alone does not say what the CPU supports: without the
facts file, or without input types, it says nothing. It is not run where the host's operators
are missing (a device-only trace): the report's warning or note says why.

## Why it is slow
An fp32 matrix product on the CPU runs on AVX-512 (or AVX2) fused multiply-adds, 16 fp32
lanes per instruction. CPUs with AVX512-BF16 (`vdpbf16ps`: two bf16 products per fp32 lane)
or AMX (tile matrix units) do the same product in bf16 at two or more times the rate, and
read half the bytes. `torch.autocast("cpu", dtype=torch.bfloat16)` runs the matrix ops in bf16
(casting their inputs on every call) and keeps precision-sensitive ops (normalisation,
softmax, losses) in fp32. Small products gain nothing: the casts and the bf16 kernel's
fixed cost outweigh the faster arithmetic, and the estimate counts that loss.

## Evidence used
- from the facts file: `cpu_features.flags` (avx512_bf16, amx_bf16), `autocast`;
- the host ops that autocast turns to bf16 (outermost `aten::linear`, `matmul`, `mm`, `bmm`,
  `addmm`, `baddbmm`, `conv*`, `convolution`), their inputs' dtype (`Input type`, fp32),
  each call's duration, and whether it runs inside a backward node (`*Backward*`,
  `autograd::engine::evaluate_function`).

## Example
Before:
```python
with torch.inference_mode():
    out = model(batch)
```
After:
```python
with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
    out = model(batch)          # matrix ops in bf16, normalisation and softmax in fp32
```
For training, wrap the forward pass and the loss the same way (no gradient scaler is needed
with bf16); check the model's accuracy on a validation run.

## How the saving is estimated
Each fp32 matrix op's call of t µs takes t × r(t) under autocast, its casts included, with r
interpolated (in log t) from this table (`RATIO_TABLE`, `BF16_TABLE`; measured by
`benchmarks/cpu_bf16_speedup.py`, see `benchmarks/results/rule_constants.md`):

| fp32 call (µs) | autocast / fp32 | bf16 / fp32 |
| --- | --- | --- |
| 23 | 2.04 | 1.42 |
| 53 | 1.17 | 0.88 |
| 93 | 0.89 | 0.72 |
| 173 | 0.71 | 0.59 |
| 334 | 0.60 | 0.53 |
| 654 | 0.55 | 0.50 |
| 1360 | 0.52 | 0.48 |
| 2800 | 0.51 | 0.45 |
| 22000 | 0.49 | 0.45 |

The autocast column (its casts included) is for the forward pass's calls; the bf16 column
(inputs already bf16, no casts) for the products of a backward pass, whose inputs (the
activations autocast saved, the gradients) are bf16 already.

Below the first row the ratio is the first row's, above the last the last's. Each call's time
is taken without the profiler's cost of the events it holds (`PROFILER_NS_PER_EVENT`, central
figure, per nested op or Python function), and a window that ran slower than the unprofiled
steps beyond that cost (another process on the cores) is brought to their pace. The fix is
replayed as a host `ms` shorter per step, the sum over the calls of t × (1 - r) (calls that
autocast makes slower count against it): on a CPU-only run the host is the step, and a
faster kernel composes with more threads by multiplying. CPUs with AMX gain more than this
table says: a lower bound there.

An inference run that takes PyTorch's native Transformer fast path
(`aten::_transformer_encoder_layer_fwd`, `_native_multi_head_attention`) is listed as
considered, not ranked: autocast turns that path off, and AdvisorBench's transformer serving
loop (`inference_clean`) measured 38% to 50% slower under it (`benchmarks/advisorbench/unseeded.py`).
An inference run whose fp32 matrix time is mostly convolutions is listed as considered, not
ranked, for the same kind of reason: on AdvisorBench's two convolution inference loops (batch
8, 32×32 images, 3 to 64 channels) the twin under bf16 autocast, fresh processes alternated 9
times on an idle machine, measured -3.2% to 5.8% over four runs (`cnn_inference`, 25.8%
promised) and 7.7% to 14.0% over five (`inference_threads`, 20.4% promised): the first convolution (3 input channels) runs slower
in bf16, and the table's convolution rows (16 channels and more) do not describe such calls
(`benchmarks/advisorbench/unseeded.py`, `benchmarks/results/advisorbench_cpu_unseeded.txt`).
This was decided on those two workloads' measurements.

A training run's finding is listed as considered, not ranked, with its estimate and the
reason: on this project's CPU training recordings the estimate ran 1.2 to 2.4 times what
applying the fix measured (the backward's products and the gradients' casts gain less), and
such a promise would outrank fixes whose promises hold. An inference run's finding is
ranked, medium confidence. The recordings and their figures are in
`benchmarks/results/rule_constants.md`.

The promise is given in its parts (evidence `promise_parts`, and the message): the calls
autocast makes slower (their casts included in the measured ratios; a cost) and the per-op
speed-ups, which take the rest of the replayed saving (at most the calls that gain, at their
ratios). They add up to the saving. No measured pair confirms the speed-ups (the training
recordings measured 0.4 to 0.9 of them; the inference pair in
`tests/data/cpu_inference_grad/runs`, `batch256` → `batch256_bf16`, measured 1.17 ms against
1.50 promised), so they read "up to".

On AdvisorBench's 2-core Xeon (avx512_bf16, amx_bf16) an earlier pair at a load average of 7.3
to 8.5 had `inference_threads` 32.6% faster under bf16 autocast; on the idle machine the same
pair measured 7.7% to 14.0% over five runs, and `cnn_inference` (two threads) -3.2% to 5.8%: the
busy machine's figure was the load's. The estimate stays an "up to" figure; no pair has checked
it within ±30%, so a fix whose model measured pairs confirm ranks above it unless it saves over
twice as much (`advisor.engine.ranking.UNCHECKED_MARGIN`).

Reference: https://pytorch.org/docs/stable/amp.html#cpu-op-specific-behavior
"""

from __future__ import annotations

import re

import numpy as np

from advisor.engine import Context
from advisor.metrics.attention import NATIVE_MHA_OP
from advisor.metrics.breakdown import name_matches, text_of
from advisor.metrics.intervals import merge
from advisor.metrics.steps import step_of
from advisor.whatif.parts import PromisePart
from advisor.whatif.savings import PROFILER_NS_PER_EVENT

ID = "cpu-autocast"
TITLE = "Matrix ops run in fp32 on a CPU with native bf16"
GROUP = "compute"
TESTED_ON = ("cpu",)  # vendors whose real traces the tests run it on (advisor/metrics/vendors.py)
DOCS = "https://pytorch.org/docs/stable/amp.html#cpu-op-specific-behavior"
DEFAULTS = {"min_share": 0.05}
FIX = 'Run the forward pass (and the loss) under torch.autocast("cpu", dtype=torch.bfloat16).'
AFTER = """with torch.autocast("cpu", dtype=torch.bfloat16):   # matrix ops in bf16, the rest as autocast decides
    out = model(batch)
"""
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
MATRIX_OP = re.compile(r"^aten::(linear|matmul|mm|bmm|addmm|baddbmm|addbmm|conv\dd|convolution|_convolution|mkldnn_convolution|convolution_backward)$")
# fp32 time of one call (µs) -> its time under bf16 autocast over its fp32 time, casts included
# (benchmarks/results/cpu_bf16_speedup.txt; the rule page shows the same table).
RATIO_TABLE = ((23, 2.04), (53, 1.17), (93, 0.89), (173, 0.71), (334, 0.60), (654, 0.55), (1360, 0.52), (2800, 0.51), (22000, 0.49))
# the same with inputs already bf16 (no casts): a backward pass's products under autocast
BF16_TABLE = ((23, 1.42), (53, 0.88), (93, 0.72), (173, 0.59), (334, 0.53), (654, 0.50), (1360, 0.48), (2800, 0.45), (22000, 0.45))
BACKWARD_SPAN = re.compile(r"(Backward\d*$|^autograd::engine::evaluate_function)")


def autocast_ratio(us: np.ndarray, table=RATIO_TABLE) -> np.ndarray:
    """r(t): the table interpolated in log t, flat outside it."""
    t, r = np.array([p[0] for p in table], dtype=np.float64), np.array([p[1] for p in table])
    return np.interp(np.log(np.maximum(us, 1e-3)), np.log(t), r)


def check(ctx: Context):
    m = ctx.metrics
    if m.has_device or ctx.step_ms <= 0 or len(m.steps) == 0:
        return None
    flags = ctx.recorded.cpu_features.flags
    native = [f for f in BF16_FLAGS if isinstance(flags, list) and f in flags]
    if not native:
        return None
    dtypes = ctx.recorded.autocast.dtypes or []
    if ctx.recorded.autocast.used is True and (not isinstance(dtypes, list) or "bfloat16" in dtypes or not dtypes):
        return None
    host = ctx.events.host
    ops = host[name_matches(host["name"], MATRIX_OP)].sort_values("ts", kind="stable")
    if len(ops) == 0:
        return None
    ts, end = ops["ts"].to_numpy(np.int64), ops["end"].to_numpy(np.int64)
    top = np.ones(len(ops), dtype=bool)  # the outermost call: autocast casts once, at the op it sees first
    top[1:] = ts[1:] >= np.maximum.accumulate(end)[:-1]
    types = ops["input_types"].astype(object).to_numpy()
    first = np.array([str(t).split(",", 1)[0].strip('[" ') if isinstance(t, str) else "" for t in types])
    fp32 = first == "float"
    st = m.steps
    step = step_of(st["start"].to_numpy(np.int64), st["end"].to_numpy(np.int64), ts)
    keep = top & fp32 & (step >= 0)
    if not keep.any():
        return None
    s, e = ts[keep], end[keep]
    us = (e - s) / 1e3
    # Each call's time without the profiler: less the profiler's cost of the events it holds
    # (its nested ops and, with stacks on, Python functions), which bf16 does not speed up.
    kind = text_of(host["kind"])
    marks = np.sort(host["ts"].to_numpy(np.int64)[(kind == "op") | (kind == "python")])
    events = np.searchsorted(marks, e, side="left") - np.searchsorted(marks, s, side="left")
    own_us = np.maximum(us - events * PROFILER_NS_PER_EVENT[1] / 1e3, 0.2 * us)
    # A window slower than the unprofiled steps beyond the profiler's own cost (another
    # process on the cores while it was recorded) is brought to their pace.
    n = len(st)
    lo, hi = int(st["start"].min()), int(st["end"].max())
    in_steps = int(np.searchsorted(marks, hi) - np.searchsorted(marks, lo))
    own_window = ctx.step_ms - in_steps / n * PROFILER_NS_PER_EVENT[1] / 1e6
    pace = 1.0
    if ctx.replay.available and ctx.replay.host_scale < 1.0 and own_window > 0:
        pace = float(np.clip(ctx.replay.baseline_ms / own_window, 0.2, 1.0))
    own_us = own_us * pace
    # Calls inside a backward node take bf16 inputs under autocast: no casts.
    bw = host[name_matches(host["name"], BACKWARD_SPAN)]
    bs, be = merge(bw["ts"].to_numpy(np.int64), bw["end"].to_numpy(np.int64))
    at = np.searchsorted(bs, s, side="right") - 1
    backward = (at >= 0) & (s < be[np.maximum(at, 0)]) if len(bs) else np.zeros(len(s), dtype=bool)
    ratio = np.where(backward, autocast_ratio(own_us, BF16_TABLE), autocast_ratio(own_us))
    fp32_ms = float(own_us.sum()) / 1e3 / n
    gain_us = own_us * (1 - ratio)
    estimate = float(gain_us.sum()) / 1e3 / n
    # The estimate is unprofiled time: a share of the unprofiled step (the replay's baseline).
    step_ms = ctx.replay.baseline_ms if ctx.replay.available else ctx.step_ms
    if step_ms <= 0 or estimate / step_ms < ctx.options["min_share"]:
        return None
    # On a CPU-only run the host is the step: the calls' gain shortens it, composing with more
    # threads (which shorten the same calls) by multiplying.
    change = ctx.replay.host_shorter_by(estimate)
    replayed = ctx.replayed_saving(change) if change is not None else None
    saving = replayed if replayed is not None else estimate
    if saving / step_ms < ctx.options["min_share"]:
        return None
    names = text_of(ops["name"])[keep]
    by_op = {k: round(float(own_us[names == k].sum()) / 1e3 / n, 3) for k in sorted(set(names), key=lambda k: -own_us[names == k].sum())[:5]}
    losing = float(own_us[ratio > 1].sum()) / 1e3 / n
    evidence = {
        "cpu_flags": native,
        "cpu_capability": ctx.recorded.cpu_features.capability,
        "fp32_matrix_ms_per_step": round(fp32_ms, 3),
        "calls_per_step": round(int(keep.sum()) / n, 1),
        "backward_calls_per_step": round(int(backward.sum()) / n, 1),
        "median_call_us": round(float(np.median(own_us)), 1),
        "window_pace": round(pace, 3),
        "autocast_over_fp32": round(float((own_us * ratio).sum() / own_us.sum()), 3),
        "ms_per_step_in_calls_that_lose": round(losing, 3),
        "fp32_matrix_ops": by_op,
        "estimate_ms": round(estimate, 3),
        "steps": sorted(set(int(st["step"].iloc[i]) for i in step[keep])),
    }
    # The promise in its parts (advisor.whatif.parts): the calls autocast makes slower (their
    # casts included in the measured ratios) and the per-op speed-ups, which take the rest of
    # the replayed saving. No measured pair confirms the speed-ups (the training recordings
    # measured 0.4 to 0.9 of them): "up to".
    gaining = float(gain_us[ratio < 1].sum()) / 1e3 / n
    evidence["promise_parts"] = [
        PromisePart("per-op speed-ups", 0.0, gaining, "the calls that gain, at their measured bf16/fp32 ratios", rest=True).as_evidence(),
        PromisePart("calls slower in bf16, casts included", float(gain_us[ratio >= 1].sum()) / 1e3 / n, losing,
                    "those calls' fp32 time").as_evidence(),
    ]
    trains = _trains(ctx)
    training = " (and the loss)" if trains else ""
    outcome = "" if trains else "less latency per batch and more throughput, "
    message = (
        f"{fp32_ms:.1f} ms/step of matrix ops run in fp32 ({keep.sum() / n:.0f} calls per step, median {np.median(own_us):.0f} µs) on a CPU "
        f"with native bf16 ({', '.join(native)}). Under torch.autocast(\"cpu\", dtype=torch.bfloat16) around the forward pass{training}: "
        f"{outcome}each call replayed at its measured bf16/fp32 ratio for its size "
        f"(×{evidence['autocast_over_fp32']:.2f} overall, casts included)."
    )
    fast_path = int(name_matches(host["name"], NATIVE_MHA_OP).sum())
    if fast_path:
        evidence["native_transformer_fast_path_calls"] = fast_path
    conv = np.char.find(np.asarray(names, dtype=str), "conv") >= 0  # aten::conv2d, aten::convolution, ...
    conv_share = float(own_us[conv].sum() / own_us.sum()) if own_us.sum() > 0 else 0.0
    why = _why_not_ranked(trains, fast_path, conv_share)
    if why is not None:
        no_gain = (f"{message} Not ranked: {why} Apply it and compare the unprofiled steps (`advisor profile`, before and "
                   "after) to see what it gives yours.")
        return ctx.finding(message, saving, confidence="low", evidence=evidence, snippet=AFTER, change=change, no_gain=no_gain)
    return ctx.finding(message, saving, confidence="medium", evidence=evidence, snippet=AFTER, change=change)


def _why_not_ranked(trains: bool, fast_path: int, conv_share: float) -> str | None:
    """Why a finding stays considered, from the measured pairs that refute its estimate there."""
    if trains:
        return ("on this project's CPU training recordings bf16 autocast measured 0.4 to 0.9 of what this per-op estimate "
                "promised (the backward's products and the gradients' casts gain less).")
    if fast_path:
        return ("the run takes PyTorch's native Transformer fast path (aten::_transformer_encoder_layer_fwd, "
                "_native_multi_head_attention), which autocast turns off: its layers fall back to their Python path. On "
                "AdvisorBench's transformer serving loop bf16 autocast measured 38-50% slower.")
    if conv_share >= 0.5:
        return ("most of that time is in convolutions, and two convolution inference loops on this project's CPU measured "
                "far less than this per-call estimate (-3.2% to 5.8% against 25.8% promised, 7.7% to 14.0% against "
                "20.4%): a convolution with few channels gains little in bf16 and pays for its casts.")
    return None


def _trains(ctx: Context) -> bool:
    from advisor.engine import is_training

    return is_training(ctx.metrics, ctx.recorded)
