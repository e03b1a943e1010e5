"""Most of the GPU's memory is unused while the GPU waits: the batch could be larger.

## What it detects
Peak device memory is below `max_share` (25%) of the device's memory while the GPU is busy
less than `max_utilization` (80%) of the step, and the per-step overhead a larger batch would
spread over more samples is at least `min_share` (3%) of the step.

## What it needs from the trace
The device's busy share (kernel records) and a peak memory: the facts file's, else the trace's
`[memory]` events (`profile_memory=True`), with the device's memory. Without a peak it says
nothing. It is not run where the launches have no kernel records (the device's activity is
missing); where the host's operators are missing (a device-only trace); where the device's
timeline lies outside the host's; on a window whose every step holds first-call work (a single
cold pass): the report's warning or note says why.

## Why it is slow
Part of every step costs the same whatever the batch size: launching each op's kernels,
Python and dispatcher work between them, the optimizer step and `zero_grad`, gradient
all-reduce, synchronisations. With a small batch that fixed cost is paid for few samples.
A batch k times larger pays it once for k times the samples, and its kernels use the GPU
better: a kernel's last wave of blocks is often partly empty, and k times the blocks pay
that tail once instead of k times.

## Evidence used
- peak memory: from the facts file (`max_memory_reserved/allocated` over the whole run)
  when present, else the trace's `[memory]` totals; a trace with only allocation sizes (2021
  schema) gives a lower bound — what was allocated before the window is unseen — so the rule
  then asks for half the headroom, assumes at most a 2× batch and reports at low confidence;
- GPU utilisation and the step-time breakdown (runtime, CPU work, other, memset,
  communication) plus the optimizer's kernel time: the per-step cost that does not grow
  with the batch;
- each kernel's launch dimensions, blocks per SM and occupancy (the trace's kernel
  arguments): how many waves its blocks take now and would take with k times as many;
- the DataLoader batch size from the facts file, for the fix.

## Example
Before:
```python
loader = DataLoader(train_set, batch_size=32, num_workers=8)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
```
After:
```python
loader = DataLoader(train_set, batch_size=128, num_workers=8)          # 4x the samples per step
optimizer = torch.optim.SGD(model.parameters(), lr=0.1 * 128 / 32)    # scale the LR, warm it up
```
A larger batch changes the optimisation: scale the learning rate with the batch (linear
scaling with a few epochs of warm-up is the usual start) and check that the run still
converges to the same accuracy; fewer steps per epoch is the point, not a side effect.

## Fix: `advisor fix --unsafe-fixes` (unsafe: fewer steps per epoch, the learning rate must follow)
Written only where the DataLoader's `batch_size` is the number the run used, with the note to
scale the learning rate (linear scaling, with warm-up):
```diff
-loader = DataLoader(train_set, batch_size=64)
+loader = DataLoader(train_set, batch_size=256)
```
A batch size from a command-line switch is not guessed: the fix says which size to run with.

## How the saving is estimated
Batch factor k = min(4, ⌊80% of device memory / peak⌋) (2 with only a lower bound). The fix
is replayed: in the step graph the work that grows with the batch grows (the kernels other
than the optimizer's, the batch's host→device copies, the DataLoader's time on the host),
while launches, syncs, the optimizer, `zero_grad` and the rest of the host's per-step work
stay as they are; the replayed step divided by k is the time per current step's samples,
and the saving is the replayed baseline minus that. What the replay cannot place (the
remainder, see `advisor/whatif`) is a per-step cost too, spread over the k× samples.

What grows with the batch: the DataLoader's per-sample fetch and collate (the loop's wait
for its batch grows k× when the training process loads; with workers at capacity, their
wait stretches to k × (wait + the rest of the step) − the rest: `loader_growth` in the
evidence), the batch's host→device bytes, and every kernel but the optimizer's; what
amortises: launches, the host's per-op work, syncs, the optimizer and `zero_grad`.

How much a kernel grows: its blocks run in waves of (SMs × blocks one SM holds) — the
blocks per SM come from the trace's grid and `blocks per SM`, the blocks one SM holds from
its occupancy and the device's warps per SM (64 on compute capability 7.0/8.0/9.0, 48 on
8.6/8.9, 32 on 7.5). k times the blocks take ⌈k × blocks / slots⌉ waves against
⌈blocks / slots⌉ now: a kernel of 2.2 waves takes 9 instead of 4 × 3 = 12 (time ∝ waves,
each wave as long as now). Kernels whose grid does not fill one wave (their grid may not
follow the batch: a reduction over it), copies and kernels without launch dimensions grow
k×. The evidence's `kernel_growth` is the resulting growth of the grown device time.
The rule's own estimate, kept in the evidence as `estimate_ms`, is the fixed per-step time
× (1 − 1/k): the runtime, CPU-work, other, memset and communication slices plus the
optimizer's kernel time, less the host time of the batch's own copies.

Reference: https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html
"""

from __future__ import annotations

from advisor.whatif import Change
from advisor.whatif.changes import batch_growth, scale_device
from advisor.whatif.savings import dataloader_spans

import math

import numpy as np

from advisor.snippets import first_loader
from advisor.engine import Context, is_training
from advisor.metrics.breakdown import STEP_NAME, name_matches
from advisor.metrics.compute import kernel_exposure, launched_inside, step_kernels
from advisor.metrics.host_device import OPTIMIZER_SPAN
from advisor.metrics.intervals import covers_bounds, merge, sorted_unique
from advisor.metrics.memory_use import FACTS, LOWER_BOUND, memory_use

ID = "spare-gpu-memory"
# The fix changes what is trained (or, serving, each request's latency), not only its speed: the
# ranking puts it after a fix that changes nothing but speed and saves at least half as much.
RECIPE = "batch size"
TITLE = "GPU memory is mostly unused: the batch could be larger"
GROUP = "memory"
TESTED_ON = ("nvidia", "amd", "mtia", "cpu")  # vendors whose real traces the tests run it on (advisor/metrics/vendors.py)
DOCS = "https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html"
DEFAULTS = {"max_share": 0.25, "max_utilization": 0.80, "max_batch_factor": 4, "usable_share": 0.80, "min_share": 0.03}
# Per-step overhead that these fixes remove is no longer there for a larger batch to spread.
FIX = "Raise the batch size (memory allows it) and scale the learning rate with it; check convergence."
AFTER = """loader = DataLoader(train_set, batch_size=4 * batch_size, num_workers=8)
optimizer = torch.optim.SGD(model.parameters(), lr=base_lr * 4)   # linear scaling, with warm-up
"""
FIXED_CATEGORIES = ("runtime", "cpu_exec", "other", "memset", "communication")
# An inference run has no learning rate: a larger batch is more requests per forward pass,
# more throughput for a longer wait per request.
INFERENCE_FIX = (
    "Serve more requests per forward pass ({grow}: dynamic batching in the server, or a larger offline batch) under "
    "torch.inference_mode(); throughput grows, and each request waits for its batch to fill, so weigh it against the latency you need."
)
INFERENCE_AFTER = """with torch.inference_mode():                          # no autograd bookkeeping
    batch = torch.stack(requests[:{n}])                # {n} requests per forward pass
    outputs = model(batch.to(device, non_blocking=True))
"""


def batch_copy_host_ms(events, steps) -> float:
    """Host-only time per step inside the ops that issue host-to-device copies (`aten::to`, `copy_`).

    The union of the spans of ops that contain a `cudaMemcpy*` call launching an HtoD copy,
    inside the steps and outside any device activity (the part the breakdown counts as
    runtime or CPU work): the part of that overhead that scales with the batch's bytes.
    """
    dev = events.device
    rt = events.runtime
    h2d_corr = dev.loc[(dev["kind"] == "memcpy") & (dev["copy_kind"] == "HtoD"), "correlation"]
    calls = rt[rt["correlation"].isin(h2d_corr[h2d_corr >= 0])]
    host = events.host
    ops = host[(host["kind"] == "op").to_numpy() & ~name_matches(host["name"], STEP_NAME)]
    if len(calls) == 0 or len(ops) == 0 or len(steps) == 0:
        return 0.0
    call_ts = np.sort(calls["ts"].to_numpy(np.int64))
    o_ts, o_end = ops["ts"].to_numpy(np.int64), ops["end"].to_numpy(np.int64)
    contains = np.searchsorted(call_ts, o_end, side="left") > np.searchsorted(call_ts, o_ts, side="left")
    cs, ce = merge(o_ts[contains], o_end[contains])
    ds, de = merge(dev["ts"].to_numpy(np.int64), dev["end"].to_numpy(np.int64))
    ss, se = steps["start"].to_numpy(np.int64), steps["end"].to_numpy(np.int64)
    b = sorted_unique(np.concatenate([cs, ce, ds, de, ss, se]))
    if len(b) < 2:
        return 0.0
    lo, hi = b[:-1], b[1:]
    host_only = covers_bounds(b, cs, ce) & ~covers_bounds(b, ds, de) & covers_bounds(b, ss, se)
    return float((hi - lo)[host_only].sum()) / 1e6 / max(len(steps), 1)


# A wait for the workers' batches at least this share of the step: the workers are at capacity.
LOADER_BOUND_SHARE = 0.05


def loader_wait_growth(wait_ms: float, step_ms: float, factor: int, num_workers: int | None) -> float:
    """How much longer the loop's wait for its batch gets with a `factor`× batch.

    Loading in the training process (`num_workers=0`, or unknown): the wait is the loading,
    per sample, so it grows `factor` times. With workers that keep the loop waiting a real
    share of the step they are at capacity: each batch takes them wait + the rest of the
    step, `factor` times that with `factor`× the samples, while the rest of the step (its
    per-step host work) is counted as it is now: the wait becomes
    factor × (wait + rest) − rest. Workers whose batch is ready (a wait under 5% of the step)
    may have room to spare, which the trace cannot tell: their wait grows `factor` times.
    """
    if not num_workers or wait_ms <= 0 or step_ms <= 0 or wait_ms < LOADER_BOUND_SHARE * step_ms:
        return float(factor)
    rest = max(step_ms - wait_ms, 0.0)
    return float(factor + (factor - 1) * rest / wait_ms)


def check(ctx: Context):
    m = ctx.metrics
    opts = ctx.options
    util = m.gpu_utilization
    step_ms = ctx.step_ms
    if util is None or step_ms <= 0 or util >= opts["max_utilization"]:
        return None
    mem = memory_use(m, ctx.recorded.device)
    peak = mem.peak
    share = mem.share(peak)
    if share is None:
        return None
    bound_only = mem.source == LOWER_BOUND
    max_share = opts["max_share"] / 2 if bound_only else opts["max_share"]
    if share >= max_share:
        return None
    factor = 2 if bound_only else min(int(opts["max_batch_factor"]), math.floor(opts["usable_share"] / share))
    if factor < 2:
        return None

    bd = m.breakdown_mean_ms
    fixed_parts = {c: bd[c] for c in FIXED_CATEGORIES}
    # Copying the batch to the device grows with the batch: its host time is not overhead.
    copy_ms = batch_copy_host_ms(ctx.events, m.steps)
    fixed_parts["minus_batch_copies"] = -min(copy_ms, fixed_parts["runtime"] + fixed_parts["cpu_exec"])
    host = ctx.events.host
    k = step_kernels(m)
    opt_mask = launched_inside(ctx.metrics, host[name_matches(host["name"], OPTIMIZER_SPAN)])[k.index.to_numpy()]
    n_steps = max(len(m.steps), 1)
    fixed_parts["optimizer_kernels"] = float(k.loc[opt_mask, "dur"].sum()) / 1e6 / n_steps * kernel_exposure(m, k)
    fixed_ms = float(sum(fixed_parts.values()))
    saving_ms = fixed_ms * (1 - 1 / factor)
    if saving_ms / step_ms < opts["min_share"]:
        return None

    gb = 1024**3
    loaders = ctx.recorded.dataloaders or []
    batch = loaders[0].batch_size if loaders else None
    what = "peak reserved" if mem.peak_reserved is not None else "peak allocated"
    if bound_only:
        seen = (
            f"the window's own allocations peak at {peak / gb:.2f} GiB of {mem.device_bytes / gb:.1f} GiB "
            "(earlier allocations such as the weights are not in this trace)"
        )
    else:
        seen = f"{what} memory is {peak / gb:.2f} GiB of {mem.device_bytes / gb:.1f} GiB ({100 * share:.0f}%)"
    grow = f"batch_size={batch} → {batch * factor}" if batch else f"a {factor}× larger batch"
    fix = (
        f"Try {grow} and scale the learning rate with it (linear scaling with warm-up), then check that the run still converges."
    )
    message = (
        f"The GPU is busy {100 * util:.0f}% of the step and {seen}. A {factor}× batch spreads {fixed_ms:.1f} ms/step of "
        f"fixed overhead over {factor}× the samples. It changes what is trained "
        "(fewer, larger optimizer steps), not only its speed: scale the learning rate with it and check the run still converges."
    )
    evidence = {
        **mem.evidence(share),
        "gpu_utilization": round(util, 4),
        "batch_factor": factor,
        "fixed_ms_per_step": {c: round(v, 3) for c, v in fixed_parts.items()},
        "batch_size": batch,
        "steps": m.steps["step"].tolist(),
    }
    confidence = "low" if bound_only else ("high" if mem.source == FACTS else "medium")
    snippet = AFTER.replace("4 * batch_size", str(batch * factor) if batch else f"{factor} * batch_size").replace("base_lr * 4", f"base_lr * {factor}")
    workers = first_loader(ctx.recorded).num_workers  # the run's own workers, or none shown
    snippet = snippet.replace(", num_workers=8", f", num_workers={workers}" if workers else "")
    if not is_training(m, ctx.recorded):
        evidence["mode"] = "inference"
        fix = INFERENCE_FIX.format(grow=grow)
        message = (
            f"The GPU is busy {100 * util:.0f}% of the step and {seen}. Serving {factor}× the requests per forward pass spreads "
            f"{fixed_ms:.1f} ms/step of fixed overhead over {factor}× the samples: more throughput, "
            "for a longer wait per request (latency)."
        )
        snippet = INFERENCE_AFTER.format(n=batch * factor if batch else f"{factor} * batch_size")
    # The fix, replayed: the batch's work grows with it (kernels other than the optimizer's,
    # the batch's copies, the DataLoader's time); launches, syncs and other host work do not.
    # The replayed step is then divided by the factor: the saving is per current step.
    grows = k.index.to_numpy()[~opt_mask]
    copies = ctx.events.device.index.to_numpy()[(ctx.events.device["kind"] == "memcpy").to_numpy() & (ctx.events.device["copy_kind"] == "HtoD").to_numpy()]
    dl_s, dl_e = dataloader_spans(ctx.events)
    loader_growth = loader_wait_growth(float((dl_e - dl_s).sum()) / 1e6 / n_steps, step_ms, factor, loaders[0].num_workers if loaders else None)
    evidence["loader_growth"] = round(loader_growth, 3)
    grown = np.concatenate([grows, copies])
    growth = batch_growth(ctx.events, grown, float(factor), m.device.capability)
    device_ns = ctx.events.device["dur"].to_numpy(np.float64)[grown]
    evidence["kernel_growth"] = round(float((device_ns * growth).sum() / max(device_ns.sum(), 1.0)), 3)
    change = Change.merge([scale_device(grown, growth), Change(host_remove=[(dl_s, dl_e, 1.0 - loader_growth)], per_sample=float(factor))])
    return ctx.finding(message, saving_ms, confidence=confidence, evidence=evidence, fix=fix, snippet=snippet, change=change)

