"""The GPU waits for the host to launch its many short kernels.

## What it detects
Steps made of many short kernels (at least `min_kernels_per_step`, 32 by default: a short
inference step of ~60 kernels separated by ~50 µs gaps is launch-bound too; or tiny
iterations of a few kernels each, as many over the window: 100 calls of a compiled linear,
one 6 µs kernel each; with a median under `max_median_kernel_us`, 50 µs) where the device keeps running dry between
them: idle gaps shorter than `max_gap_ms` (1 ms) that end with a kernel the host launched
only after the device had gone idle. It fires when those gaps add up to at least
`min_share` of the step (3% by default).

## What it needs from the trace
The device's kernel records and the runtime calls that launched them (linked by correlation
id), with many short kernels per step. A CPU-only run, or a device listed but running nothing,
gets nothing from it. It is not run where the launches have no kernel records (the device's
activity is missing); where the host's operators are missing (a device-only trace); where the
device's timeline lies outside the host's; where launched work waited with nothing recorded on
the device; on a window whose every step holds first-call work (a single cold pass): the
report's warning or note says why.

## Why it is slow
Eager PyTorch launches every op's kernels from Python, one by one: each costs the host
roughly 5–20 µs of dispatch and launch overhead. When the kernels themselves take only a
few microseconds, the device finishes each one before the host has launched the next, and
the step takes as long as the host needs to launch it, not as long as the GPU needs to run
it. CUDA graphs replay a whole captured sequence with one launch; `torch.compile` also fuses
many small kernels into fewer, bigger ones; a larger batch makes each kernel longer for the
same number of launches.

## Evidence used
- the device's idle gaps inside the steps and, for each, when the kernel after it was
  launched (from the runtime call linked by correlation id);
- kernel count and durations per step; the ops that launched the kernels after the gaps;
- from the facts file, when present: whether `torch.compile` is already used.
Not launch overhead, so not counted: idle time inside DataLoader spans (when their exposed
share reaches `dataloader-stall`'s `min_share`), while the host was held in a sync, a
blocking or pageable copy or an allocator call (the device waited for that call), and inside
the optimizer's step (it runs outside the model that the fix graphs). Gaps in `zero_grad`
count: the fix keeps `zero_grad(set_to_none=True)`, which drops its memsets.

## Example
Before:
```python
model = MyModel().cuda()
for x, y in loader:
    loss = criterion(model(x), y)
```
After:
```python
model = torch.compile(MyModel().cuda(), mode="reduce-overhead")   # CUDA graphs
for x, y in loader:
    torch.compiler.cudagraph_mark_step_begin()   # training loops: a new iteration starts
    loss = criterion(model(x), y)
```
In a training loop, mark each iteration's start (as above) so the graphs may reuse the last
iteration's output memory, and keep `zero_grad(set_to_none=True)` (the default): the
gradients live in the graphs' memory, and zeroing them in place stops PyTorch with
"accessing tensor output of CUDAGraphs that has been overwritten by a subsequent run". If shapes vary from step to step, pad them to a few fixed sizes first (each new shape is a
new graph), or raise the batch size so each launch does more work.

## How the saving is estimated
The fix is replayed: the step's kernels are issued back to back on their streams (as a
captured graph launches them) and each launch call keeps a tenth of its cost. The saving is
how much shorter the replayed step is, which counts only the gaps that were on the critical
path. The host's work inside the short starved gaps (the per-op dispatch the device waited
for) goes too; the rest of the host's time, the DataLoader's included, stays.

Where the facts file has the unprofiled step times, part of the unprofiled step may be
explained by neither the (profiler-corrected) host nor the device in the trace: the replay's
remainder. On a launch-bound step that is host time the trace does not show (the Python
around each op, a compiled region's guards). The share of it that lies in the captured
region goes too: the region is the host's time from the first to the last kernel launch of
each step, taken as a share of the steps' own host work (DataLoader waits left out). The
device's own time stays as the trace measured it, so the replayed step never drops below
the device's busy time in the window. How this compared with applying the fix on a recorded
run is in `benchmarks/results/rule_constants.md`.

The rule's own estimate (evidence `estimate_ms`) is the sum of the launch-starved gaps per
step (as above), each shorter than `max_gap_ms` (longer gaps are host work, not launch
overhead). That is what a captured CUDA graph, which launches back to back, would remove;
parts of a step that cannot be captured keep their gaps, so this is an upper bound and the
confidence is medium.

Reference: https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html#use-cuda-graphs
"""

from __future__ import annotations

from advisor.whatif.changes import graphed, host_work_share

import numpy as np
from advisor.metrics.host_device import (
    LAUNCH_CALL,
    held_windows,
    optimizer_step_windows,
    per_step,
    runtime_calls,
)

from advisor.engine import Context, is_training
from advisor.metrics.intervals import intersect, merge, subtract

ID = "launch-bound"
TITLE = "The GPU waits for the host to launch kernels"
GROUP = "host"
TESTED_ON = ("nvidia", "amd", "mtia", "cpu")  # vendors whose real traces the tests run it on (advisor/metrics/vendors.py)
DOCS = "https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html#use-cuda-graphs"
DEFAULTS = {"min_share": 0.03, "min_kernels_per_step": 32, "max_median_kernel_us": 50.0, "max_gap_ms": 1.0}
FIX = (
    "Cut launch overhead: torch.compile(model, mode='reduce-overhead') (CUDA graphs; mark each iteration with "
    "torch.compiler.cudagraph_mark_step_begin() and keep zero_grad(set_to_none=True)), or a larger batch so each kernel does more work."
)
AFTER = """model = torch.compile(model, mode="reduce-overhead")   # CUDA graphs: one launch per step
for x, y in loader:
    torch.compiler.cudagraph_mark_step_begin()              # each training iteration
"""
INFERENCE_FIX = (
    "Cut launch overhead per request: capture the forward pass in a CUDA graph (torch.compile(model, mode='reduce-overhead'), "
    "static input shapes, padded to a few sizes), run it under torch.inference_mode(), and batch more requests per launch "
    "for throughput, as far as the latency you need allows."
)
INFERENCE_AFTER = """model = torch.compile(model, mode="reduce-overhead")   # CUDA graphs: one launch per forward
with torch.inference_mode():
    outputs = model(batch)                                  # same shapes every call (pad to a few sizes)
"""


def check(ctx: Context):
    m = ctx.metrics
    if not m.has_device or ctx.step_ms <= 0 or len(m.steps) == 0:
        return None
    base = ctx.timeline
    k = m.kernels
    k = k[base.in_steps(k["ts"].to_numpy(np.int64))]
    per_step_kernels = len(k) / base.n_steps
    median_us = float(k["dur"].median()) / 1e3 if len(k) else 0.0
    # Many kernels per step, or, where each iteration is tiny (one compiled call, one kernel:
    # a latency benchmark), many over the window: the launches are what each iteration waits for.
    if (per_step_kernels < ctx.options["min_kernels_per_step"] and len(k) < ctx.options["min_kernels_per_step"]) or median_us > ctx.options["max_median_kernel_us"]:
        return None

    # Short starved gaps inside the steps.
    gs, ge = base.starved_s, base.starved_e
    short = (ge - gs) < ctx.options["max_gap_ms"] * 1e6
    gs, ge = gs[short], ge[short]
    ss, se = merge(base.step_s, base.step_e)
    gs, ge = intersect(gs, ge, ss, se)
    tl = base
    # Idle time while the host was held in a sync, a pageable copy or an allocator call is
    # that call's (the device waited for it), and the optimizer's step runs outside the model
    # that the fix graphs: neither is launch overhead a graph removes.
    fs, fe = subtract(*subtract(gs, ge, *held_windows(tl)), *optimizer_step_windows(tl))
    gap_ns = float((fe - fs).sum())
    saving = per_step(gap_ns, tl)
    if saving / ctx.step_ms < ctx.options["min_share"]:
        return None

    # Which ops' kernels the device was waiting for.
    after = k[np.isin(k["ts"].to_numpy(np.int64), fe)]
    waited_for = after["op"].fillna("(unknown op)").astype(str).value_counts(normalize=True).head(5).round(3).to_dict()
    lc = runtime_calls(ctx.events, LAUNCH_CALL)
    lc = lc[base.in_host_steps(lc["ts"].to_numpy(np.int64))]
    idle_share = 1.0 - (m.gpu_utilization or 0.0)
    compiled = ctx.recorded.compile.used
    evidence = {
        "kernels_per_step": round(per_step_kernels, 1),
        "median_kernel_us": round(median_us, 2),
        "starved_gaps_per_step": round(len(fs) / tl.n_steps, 1),
        "median_gap_us": round(float(np.median(fe - fs)) / 1e3, 1) if len(fs) else None,
        "gap_ms_per_step": round(saving, 3),
        "mean_launch_call_us": round(float(lc["dur"].mean()) / 1e3, 2) if len(lc) else None,
        "device_idle_share": round(idle_share, 4),
        "waiting_for_ops": waited_for,
        "steps": tl.step_numbers(fs),
    }
    if compiled is not None:
        evidence["torch_compile_used"] = compiled
    if compiled:
        fix = (
            "torch.compile is already used: compile with mode='reduce-overhead' (CUDA graphs; keep zero_grad(set_to_none=True)) "
            "and check for graph breaks (TORCH_LOGS=graph_breaks); or raise the batch size."
        )
    else:
        fix = FIX
    message = (
        f"{per_step_kernels:.0f} kernels/step (median {median_us:.1f} µs) outrun the host: the GPU sits idle "
        f"{saving:.1f} ms/step in {evidence['starved_gaps_per_step']:.0f} short gaps waiting for the next launch; "
        f"CUDA graphs (torch.compile mode='reduce-overhead') or a larger batch take those waits off the device."
    )
    snippet = None
    if not is_training(m, ctx.recorded):
        evidence["mode"] = "inference"
        fix, snippet = INFERENCE_FIX, INFERENCE_AFTER
        message = (
            f"{per_step_kernels:.0f} kernels per forward pass (median {median_us:.1f} µs) outrun the host: the GPU sits idle "
            f"{saving:.1f} ms of each {ctx.step_ms:.1f} ms step in {evidence['starved_gaps_per_step']:.0f} short gaps waiting for the next launch, "
            "latency every request pays; a CUDA graph of the forward pass (torch.compile mode='reduce-overhead') takes those waits off "
            "the device, and more requests per launch raise throughput."
        )
    # The fix, replayed: the step's kernels are issued as a graph, back to back on their
    # streams, their launch calls shrink to a small share of their cost, and the host work
    # in the starved gaps (the per-op dispatch the device waited for) goes.
    # The time the calibration could place on neither the host nor the device (the unprofiled
    # step's remainder, host work the profiler did not see: a compiled region's guards, the
    # Python around each op) goes as far as it lies in the captured region: the region's share
    # of the steps' own host work.
    change = graphed(ctx.events, k.index.to_numpy(), (fs, fe), 1.0)
    region_s, region_e = launch_region(m, k, base.step_index(k["ts"].to_numpy(np.int64)))
    change.remainder_share = host_work_share(ctx.events, m.steps, region_s, region_e, 1.0)
    return ctx.finding(message, saving, confidence="medium", evidence=evidence, fix=fix, snippet=snippet, change=change)


def launch_region(m, kernels, step_index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per step, the host window from the first to the last launch call of these kernels (the
    region a captured graph replaces with one launch); `step_index` is each kernel's step."""
    launch_ts = m.launches.set_index("device_row")["launch_ts"].reindex(kernels.index).to_numpy(np.float64)
    ok = ~np.isnan(launch_ts) & (np.asarray(step_index) >= 0)
    if not ok.any():
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    step = np.asarray(step_index, dtype=np.int64)[ok]
    ts = launch_ts[ok].astype(np.int64)
    n = int(step.max()) + 1
    first = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    last = np.full(n, np.iinfo(np.int64).min, dtype=np.int64)
    np.minimum.at(first, step, ts)
    np.maximum.at(last, step, ts)
    seen = last >= first
    return first[seen], last[seen]
