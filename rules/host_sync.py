"""The training loop makes the host wait for the GPU inside the step.

## What it detects
Calls inside the steps in which the host waits for the device: `cudaStreamSynchronize`,
`cudaDeviceSynchronize`, `cudaEventSynchronize` (and their HIP names), and device→host
copies whose launch call returned only after the copy had finished. Each is traced back to
the op that made it: `aten::item`/`aten::_local_scalar_dense` (`.item()`, `float(t)`),
`aten::nonzero`/`masked_select`/`unique` (shapes that depend on the data), `aten::is_nonzero`
(`if tensor:`), `aten::to`/`copy_` (`.cpu()`, `.tolist()`, `print(t)`), or no op at all (an
explicit `torch.cuda.synchronize()`). It fires when the time they cost is at least
`min_share` of the step (0.5% by default).

## What it needs from the trace
The host's runtime calls (synchronize calls, blocking device→host copies) inside the steps and
the ops that made them, on a run with device activity. A sync that no op made is named as an
explicit `torch.cuda.synchronize()`. It is not run where the launches have no kernel records
(the device's activity is missing); where the host's operators are missing (a device-only
trace); where the device's timeline lies outside the host's; where launched work waited with
nothing recorded on the device; on a window whose every step holds first-call work (a single
cold pass): the report's warning or note says why.

## Why it is slow
CUDA work is asynchronous: the host normally queues kernels far ahead of the GPU. A sync
empties that queue. While the host waits, it prepares nothing; when the wait ends, the GPU
has run dry and idles until the host has launched the next kernels — and any CPU work the
host does next (logging, the next batch's Python) is now on the critical path instead of
hidden behind the GPU.

## Evidence used
- the sync calls and blocking device→host copies inside the host's steps, their durations,
  and the op (and user source line, when the trace has stacks) behind each;
- the device's activity during each wait and the idle gap after it (DataLoader time in that
  gap is left to `dataloader-stall` when that rule fires);
- the stream syncs that a pageable host→device copy makes are left to `h2d-pageable-copy`.

## Example
Before:
```python
for step, (x, y) in enumerate(loader):
    loss = criterion(model(x), y)
    loss.backward(); opt.step(); opt.zero_grad()
    total += loss.item()                 # waits for the GPU every step
```
After:
```python
total = torch.zeros((), device=device)
for step, (x, y) in enumerate(loader):
    loss = criterion(model(x), y)
    loss.backward(); opt.step(); opt.zero_grad()
    total += loss.detach()               # stays on the GPU
    if step % 100 == 0:
        print(total.item() / (step + 1))  # one wait every 100 steps
```

## How the saving is estimated
The fix is replayed: the step graph is simulated with the host no longer waiting in these
calls, and the saving is how much shorter the replayed step is. That is what removing a
sync buys only when the host was on the critical path: a GPU-bound loop gains nothing, and a
loop whose host work (the next batch, logging) ran after the wait gains that work's overlap
with the device. The finding needs the replayed saving to reach `min_share`. The rule's own
estimate, kept in the evidence as `estimate_ms`, is, for each wait: the part of the idle gap after it that the host could have filled while the
GPU was still busy during the wait, i.e. `min(device busy time during the wait, device idle
gap after it)`, summed per step. Idle time *during* a wait is not counted: if the device
idles while the host waits, both are waiting for something else (another stream, another
rank), which removing the sync would not speed up. Reading values every N steps keeps one
wait in N.

An explicit `torch.cuda.synchronize()` or a blocking copy to the host (an inference step's
final `.cpu()` of its output) that closes its step (no device work of the step is
launched after it: a benchmark harness timing each iteration) makes the host wait while the
GPU finishes work that was queued anyway. It costs only the device idle it causes before the
step ends, usually none; the idle at the start of the next step is that step's own host work
(the next batch, the first launches), which `gpu-idle` and `dataloader-stall` explain. Such
syncs are counted that way and left out of the replayed change.

Reference: https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html#avoid-unnecessary-cpu-gpu-synchronization

## Measured pairs that confirm the model
the H100 ViT `--no-sync` pair (9.37 ms promised, 9.57 measured), within ±25% (`benchmarks/results/promise_accuracy.txt`). Its rule page's `CONFIRMED_BY`
says so to the ranking: a promise with "up to" parts that no measured pair checked (torch.compile's
layout and batch-norm parts) ranks above this fix only where it saves more than twice as much.
"""

from __future__ import annotations

from advisor.whatif.changes import unwait

import numpy as np
import pandas as pd
from advisor.metrics.host_device import (
    SYNC_CAUSES,
    candidates,
    per_step,
    sync_calls,
)

from advisor.engine import Context
from advisor.metrics.source import source_lines

ID = "host-sync"
TITLE = "The host waits for the GPU inside the step"
# Measured pairs that confirm the saving model (advisor.engine.ranking.UNCHECKED_MARGIN).
CONFIRMED_BY = "the H100 ViT --no-sync pair (9.37 ms promised, 9.57 measured)"
GROUP = "host"
TESTED_ON = ("nvidia", "amd", "cpu")  # vendors whose real traces the tests run it on (advisor/metrics/vendors.py)
DOCS = "https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html#avoid-unnecessary-cpu-gpu-synchronization"
DEFAULTS = {"min_share": 0.005}
FIX = "Keep per-step values on the GPU (loss.detach(), running sums as tensors) and read them every N steps; avoid data-dependent shapes and explicit synchronize() in the loop."
AFTER = """total = torch.zeros((), device=device)
for step, (x, y) in enumerate(loader):
    loss = criterion(model(x), y)
    loss.backward(); opt.step(); opt.zero_grad()
    total += loss.detach()                # no sync
    if step % 100 == 0:
        print(total.item() / (step + 1))  # one sync every 100 steps
"""

ADVICE = {
    "item": "read .item() every N steps and keep running values as tensors (loss.detach())",
    "data-dependent shape": "use masks/torch.where instead of nonzero/boolean indexing, or pass size= to nonzero_static",
    "python bool": "avoid `if tensor:`/torch.equal in the loop; compare on the device (torch.where) or check every N steps",
    "blocking copy": "copy to the host every N steps, or with .to('cpu', non_blocking=True) into pinned memory and read it later",
    "explicit": "remove torch.cuda.synchronize() from the loop (time with CUDA events, or the profiler, instead)",
    "other": "find the op that reads device values back on the host and keep the value on the device",
}
WHAT = {label: what for label, _, what in SYNC_CAUSES} | {"explicit": "torch.cuda.synchronize()", "other": "other ops"}


def closing_syncs(ctx: Context, calls: pd.DataFrame, tl) -> np.ndarray:
    """Which calls are an explicit synchronize that closes its step: no device work launched
    in the same step after the call returns."""
    out = np.zeros(len(calls), dtype=bool)
    # an explicit synchronize, or a blocking copy to the host (the output's final `.cpu()`)
    explicit = calls["cause"].isin(["explicit", "blocking copy"]).to_numpy()
    if not explicit.any():
        return out
    lk = ctx.metrics.launches
    lts = lk["launch_ts"].dropna().to_numpy(np.int64)
    lstep = tl.step_index(lts)
    ends = calls["end"].to_numpy(np.int64)
    cstep = tl.step_index(calls["ts"].to_numpy(np.int64))
    for i in np.flatnonzero(explicit & (cstep >= 0)):
        out[i] = not bool(((lstep == cstep[i]) & (lts >= ends[i])).any())
    return out


def check(ctx: Context):
    found = candidates(ctx.timeline, sync_calls)
    if found is None:
        return None
    calls, tl, tree = found
    cost = tl.blocking_cost(calls["ts"].to_numpy(np.int64), calls["end"].to_numpy(np.int64), count_idle_during=False)
    calls = pd.concat([calls, cost], axis=1)
    calls["wait"] = calls["end"] - calls["ts"]
    closing = closing_syncs(ctx, calls, tl)
    if closing.any():
        # A synchronize that closes its step: only the idle it causes before the step ends.
        ends = calls["end"].to_numpy(np.int64)[closing]
        step_end = tl.step_e[tl.step_index(calls["ts"].to_numpy(np.int64)[closing])]
        clipped = tl.starved(ends, np.minimum(calls["after_end"].to_numpy(np.int64)[closing], step_end))
        calls.loc[closing, "cost"] = clipped
    saving = per_step(calls["cost"].sum(), tl)
    # The fix: the host no longer waits in these calls. Whether that buys time depends on
    # whether the host was on the step's critical path, which only the replay sees.
    waits = calls[~closing]
    change = unwait(ctx.events, waits["ts"].to_numpy(np.int64), waits["ts"].to_numpy(np.int64)) if len(waits) else None
    replayed = ctx.replayed_saving(change) if change is not None else None
    if (replayed if replayed is not None else saving) / ctx.step_ms < ctx.options["min_share"]:
        return None

    by = calls.groupby("cause").agg(count=("wait", "size"), wait=("wait", "sum"), cost=("cost", "sum")).sort_values("cost", ascending=False)
    causes = []
    for cause, r in by.iterrows():
        rows = calls[(calls["cause"] == cause) & (calls["op"] >= 0)]
        entry = {
            "cause": cause,
            "what": WHAT.get(cause, cause),
            "per_step": round(r["count"] / tl.n_steps, 2),
            "wait_ms_per_step": round(per_step(r["wait"], tl), 3),
            "saving_ms_per_step": round(per_step(r["cost"], tl), 3),
        }
        lines = source_lines(ctx.events, tree.ops.iloc[rows["op"].to_numpy()]) if len(rows) else []
        if lines:
            entry["source"] = lines
        causes.append(entry)
    item_ops = int(tree.mask(SYNC_CAUSES[0][1]).sum())
    evidence = {
        "syncs_per_step": round(len(calls) / tl.n_steps, 2),
        "wait_ms_per_step": round(per_step(calls["wait"].sum(), tl), 3),
        "device_idle_after_ms_per_step": round(per_step(calls["idle_after"].sum(), tl), 3),
        "by_cause": causes,
        "sync_calls": calls["name"].value_counts().head(5).to_dict(),
        "item_calls_in_trace": item_ops,
        "steps": tl.step_numbers(calls["ts"].to_numpy(np.int64)),
        "closing_syncs_per_step": round(int(closing.sum()) / tl.n_steps, 2),
    }
    top = causes[0]
    where = f" at {top['source'][0]}" if top.get("source") else ""
    message = (
        f"{evidence['syncs_per_step']:g} host waits per step ({evidence['wait_ms_per_step']:.2f} ms), mostly "
        f"{top['what']}{where}; the GPU then idles until the host catches up; without the waits the host runs ahead."
    )
    fix = "; ".join(f"{c['cause']}: {ADVICE[c['cause']]}" for c in causes[:3])
    return ctx.finding(
        message, saving, confidence="high" if top["cause"] != "other" else "medium", evidence=evidence, fix=fix[0].upper() + fix[1:] + ".", change=change
    )
