"""Gradients are all-reduced one tensor at a time instead of in buckets.

## What it detects
At least `min_calls` (16) all-reduce calls per step (`c10d::allreduce_`, or the
`nccl:all_reduce` / `gloo:all_reduce` ranges of older traces), most of them far smaller than a
bucket (`bucket_cap_mb`, 25 MB): the pattern of a loop that averages gradients itself,

```python
for p in model.parameters():
    dist.all_reduce(p.grad)
```

or of DistributedDataParallel with buckets set so small that each holds one gradient. It fires
when the estimated saving is at least `min_share` (2%) of the step.

## What it needs from the trace
All-reduce calls in the profiled steps (`c10d::allreduce_`, or the
`nccl:all_reduce`/`gloo:all_reduce` ranges of older traces) the message sizes come from their
tensors' recorded shapes (`record_shapes=True`). Without all-reduce calls it says nothing. It
is not run where the launches have no kernel records (the device's activity is missing); where
the host's operators are missing (a device-only trace); where the device's timeline lies
outside the host's: the report's warning or note says why.

## Why it is slow
Every collective pays a fixed cost however small its message: a launch, a handshake between
all ranks (each call waits for the slowest rank to arrive) and the protocol's latency, tens of
microseconds on NVLink and hundreds on Ethernet or the CPU's gloo backend. A model with 160
parameters pays it 160 times per step, and the sum easily exceeds the time the bytes take
to move. `DistributedDataParallel` packs gradients into buckets of `bucket_cap_mb` and
all-reduces each bucket as soon as backward has filled it: a handful of large calls, most of
them hidden behind the rest of backward.

## Evidence used
- the all-reduce calls in the profiled steps, per step, and the size of each message
  (elements of its tensors, from the recorded shapes; bytes assume 4-byte gradients);
- each call's duration: the collective kernel on the device when there is one (NCCL, RCCL),
  else the backend's host range (gloo), else the call itself;
- whether the run uses `DistributedDataParallel` (facts file, or its forward in the trace).

## Example
Before:
```python
loss.backward()
for p in model.parameters():
    dist.all_reduce(p.grad)
    p.grad /= world_size
opt.step()
```
After:
```python
model = DDP(model, device_ids=[rank], bucket_cap_mb=25)   # buckets, overlapped with backward
loss.backward()                                            # gradients arrive averaged
opt.step()
```
(Or, keeping the loop: `flat = torch.cat([p.grad.reshape(-1) for p in params])`, one
`dist.all_reduce(flat)`, then copy the slices back.)

## How the saving is estimated
A latency/bandwidth model fitted to the run's own calls: the latency is the median duration
of the smallest quarter of the messages, the time per byte the slope between the medians of
the smallest and the largest quarter (when all messages are alike, each call's time above
the latency is kept instead). Bucketed, the step's bytes travel in
`ceil(total MB / bucket_cap_mb)` calls that pay the latency once each. Saving per step: the
measured all-reduce time minus that prediction. Time a call spent waiting for a slower rank
counts as saved (fewer calls, fewer meeting points), which holds when the ranks are alike;
overlap with backward, which DDP adds on top, is not counted (see `communication-exposed`).
Hence medium confidence (how the estimate compared with DDP on a recorded run:
`benchmarks/results/rule_constants.md`).

Reference: https://pytorch.org/docs/stable/notes/ddp.html#internal-design
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from advisor.engine import Context
from advisor.metrics.breakdown import name_matches
from advisor.metrics.events import rank_events

ID = "unbucketed-allreduce"
TITLE = "Gradients are all-reduced one tensor at a time"
GROUP = "distributed"
TESTED_ON = ("nvidia", "cpu")  # vendors whose real traces the tests run it on (advisor/metrics/vendors.py)
DOCS = "https://pytorch.org/docs/stable/notes/ddp.html#internal-design"
DEFAULTS = {"min_calls": 16, "bucket_cap_mb": 25.0, "min_share": 0.02}
TRAINING_ONLY = True  # gradients and optimizers: silent on inference runs
FIX = "All-reduce gradients in buckets: wrap the model in DistributedDataParallel (bucket_cap_mb=25) instead of a per-parameter all_reduce loop."
AFTER = """model = DDP(model, device_ids=[rank], bucket_cap_mb=25)   # buckets, overlapped with backward
loss.backward()                                            # gradients arrive averaged
opt.step()
"""
AFTER_DDP = """model = DDP(model, device_ids=[rank], bucket_cap_mb=25)   # the default; larger buckets, fewer calls
"""
C10D_CALL = re.compile(r"^c10d::allreduce_$")
BACKEND_RANGE = re.compile(r"^(nccl|gloo|rccl|mpi|ucc):all_?reduce$", re.IGNORECASE)
ALLREDUCE_KERNEL = re.compile(r"AllReduce", re.IGNORECASE)
DDP_SPAN = re.compile(r"^DistributedDataParallel\.forward$")
GRADIENT_BYTES = 4


def _numel(dims) -> int:
    """Elements of an all-reduce's first argument: one shape, or a list of shapes."""
    first = dims[0] if isinstance(dims, list) and dims else None
    if not isinstance(first, list) or not first:
        return 0
    if all(isinstance(x, int) for x in first):
        return int(np.prod(first, dtype=np.int64))
    return int(sum(np.prod(s, dtype=np.int64) for s in first if isinstance(s, list) and all(isinstance(x, int) for x in s)))


def _step_of(m, ts: np.ndarray) -> np.ndarray:
    start = m.steps["start"].to_numpy(np.int64)
    end = m.steps["end"].to_numpy(np.int64)
    idx = np.searchsorted(start, ts, side="right") - 1
    ok = (idx >= 0) & (ts < end[np.clip(idx, 0, None)])
    return np.where(ok, idx, -1)


def allreduce_calls(m) -> pd.DataFrame:
    """One row per all-reduce in the profiled steps: step index, elements, duration (ns).

    The calls are the `c10d::allreduce_` ops when the trace has them (one per call whatever
    the backend), else the backend's own ranges. Durations come from the collective kernels
    when the device ran them (matched in order: the n-th call's kernel is the n-th AllReduce
    kernel), else from the backend ranges, else from the calls.
    """
    host = rank_events(m).host
    calls = host[name_matches(host["name"], C10D_CALL)]
    ranges = host[name_matches(host["name"], BACKEND_RANGE)]
    if len(calls) == 0:
        calls = ranges
    if len(calls) == 0:
        return pd.DataFrame(columns=["step", "numel", "dur"])
    calls = calls.sort_values("ts")
    ts = calls["ts"].to_numpy(np.int64)
    numel = np.array([_numel(d) for d in calls["input_dims"]], dtype=np.int64)
    dur = calls["dur"].to_numpy(np.int64)
    dev = rank_events(m).device
    kernels = dev[(dev["kind"] == "kernel") & name_matches(dev["name"], ALLREDUCE_KERNEL)].sort_values("ts") if m.has_device else dev.iloc[:0]
    if len(kernels) == len(calls):
        dur = kernels["dur"].to_numpy(np.int64)
    elif len(ranges) == len(calls) and ranges is not calls:
        dur = ranges.sort_values("ts")["dur"].to_numpy(np.int64)
    out = pd.DataFrame({"step": _step_of(m, ts), "numel": numel, "dur": dur})
    return out[out["step"] >= 0].reset_index(drop=True)


def bucketed_saving_ns(calls: pd.DataFrame, n_steps: int, bucket_bytes: float) -> tuple[float, dict]:
    """Per step: measured all-reduce time minus the same bytes in full buckets.

    latency = median duration of the smallest quarter of the messages; time per byte = the
    slope between the medians of the smallest and the largest quarter (medians, so that a few
    calls that waited for a slower rank do not pass for transfer time). When the sizes do not
    allow a slope, every call's time above the latency is kept as transfer time.
    """
    size = calls["numel"].to_numpy(np.float64) * GRADIENT_BYTES
    dur = calls["dur"].to_numpy(np.float64)
    small = size <= np.quantile(size, 0.25)
    large = size >= np.quantile(size, 0.75)
    latency = float(np.median(dur[small]))
    per_step_bytes = float(size.sum()) / n_steps
    buckets = max(1, int(np.ceil(per_step_bytes / bucket_bytes)))
    size_gap = float(np.median(size[large]) - np.median(size[small]))
    time_gap = float(np.median(dur[large])) - latency
    if size_gap > 0 and time_gap > 0:
        transfer = per_step_bytes * time_gap / size_gap
        gbps = size_gap / time_gap
    else:
        transfer = float(np.clip(dur - latency, 0, None).sum()) / n_steps
        gbps = None
    measured = float(dur.sum()) / n_steps
    predicted = buckets * latency + transfer
    model = {
        "latency_ms": round(latency / 1e6, 4),
        "bandwidth_gbps": round(gbps, 2) if gbps is not None else None,
        "buckets_per_step": buckets,
        "predicted_ms_per_step": round(predicted / 1e6, 3),
    }
    return max(measured - predicted, 0.0), model


def check(ctx: Context):
    m = ctx.metrics
    opts = ctx.options
    n_steps = len(m.steps)
    if n_steps == 0 or ctx.step_ms <= 0:
        return None
    calls = allreduce_calls(m)
    if len(calls) == 0:
        return None
    per_step_calls = len(calls) / n_steps
    bucket_bytes = float(opts["bucket_cap_mb"]) * 2**20
    size = calls["numel"].to_numpy(np.float64) * GRADIENT_BYTES
    if per_step_calls < opts["min_calls"] or np.median(size) > bucket_bytes / 4:
        return None
    saving_ns, model = bucketed_saving_ns(calls, n_steps, bucket_bytes)
    saving = saving_ns / 1e6
    if saving / ctx.step_ms < opts["min_share"]:
        return None
    ddp = bool(ctx.recorded.parallel.ddp) or bool(name_matches(ctx.events.host["name"], DDP_SPAN).any())
    evidence = {
        "allreduce_calls_per_step": round(per_step_calls, 1),
        "allreduce_ms_per_step": round(float(calls["dur"].sum()) / n_steps / 1e6, 3),
        "median_message_kb": round(float(np.median(size)) / 1024, 1),
        "largest_message_kb": round(float(size.max()) / 1024, 1),
        "mb_per_step": round(float(size.sum()) / n_steps / 2**20, 3),
        "bucket_cap_mb": opts["bucket_cap_mb"],
        **model,
        "ddp": ddp,
        "steps": sorted(int(s) for s in m.steps["step"].to_numpy()[np.unique(calls["step"].to_numpy())]),
    }
    world = ctx.recorded.world_size or ctx.events.distributed.get("world_size")
    if world:
        evidence["world_size"] = world
    message = (
        f"{per_step_calls:.0f} all-reduces per step (median message {evidence['median_message_kb']:.0f} KB, "
        f"{evidence['mb_per_step']:.2f} MB in all) take {evidence['allreduce_ms_per_step']:.1f} ms/step, each paying "
        f"~{1e3 * model['latency_ms']:.0f} µs of latency; in {model['buckets_per_step']} bucket"
        f"{'s' if model['buckets_per_step'] != 1 else ''} of {opts['bucket_cap_mb']:g} MB they would take "
        f"~{model['predicted_ms_per_step']:.1f} ms."
    )
    if ddp:
        fix = (
            "DistributedDataParallel is all-reducing nearly one gradient per call: raise bucket_cap_mb "
            "(25 MB is the default) so that each bucket holds many gradients."
        )
        snippet = AFTER_DDP
    else:
        fix, snippet = FIX, AFTER
    if not m.has_device:  # CPU ranks (gloo): DDP takes no device ids
        snippet = snippet.replace("device_ids=[rank], ", "")
    return ctx.finding(message, saving, confidence="medium", evidence=evidence, fix=fix, snippet=snippet)
