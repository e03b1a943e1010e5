"""The GPU sits idle for a large part of each step.

## What it detects
The share of each step with no kernel, copy or memset running on the device is above
`1 - max_utilization` (GPU utilisation below 60% by default). This is a symptom: it says the
device waits, not why; the rules that explain the wait (the DataLoader, pageable or oversized
copies, host synchronisation, launch overhead, `zero_grad` memsets, a batch too small for the
device) name the fix. When they fire, this finding keeps only what their fixes, replayed
together, leave (and is dropped when that is under 1% of the step), and points at them.

## What it needs from the trace
The device's kernel, copy and memset records and at least `min_kernels_per_step` kernels per
step; the host's operators and runtime calls say what the host did meanwhile. A CPU-only run,
or a device listed but running nothing, gets nothing from it. It is not run where the launches
have no kernel records (the device's activity is missing); where the host's operators are
missing (a device-only trace); where the device's timeline lies outside the host's; where
launched work waited with nothing recorded on the device; on a window whose every step holds
first-call work (a single cold pass): the report's warning or note says why.

## Why it is slow
Whatever the GPU does not do while it is idle has to be done later: idle time is step time
that no faster kernel can win back. It comes from the host — loading data, copying from
pageable memory, waiting on `.item()`/`.cpu()`, launching many small kernels, Python work
between steps — running while nothing is queued on the device.

## Evidence used
- the device's busy intervals (kernels, copies, memsets, merged over streams) and the idle
  intervals they leave inside each step;
- what the host was doing during that idle time, which picks the fix: waiting for the device
  (a synchronize, or a blocking copy to the host), inside a DataLoader span, launching
  host→device copies, launching kernels, or running its own code. The largest wins: a run
  with no DataLoader spans is never told to change its DataLoader;
- the op the step's thread was in at each idle instant (the innermost one, counted once,
  with the outermost annotation around it), and the longest idle gaps;

## Example
When the host is in the DataLoader during the idle time:

Before:
```python
for x, y in DataLoader(ds, batch_size=32):          # loads in the training process
    x, y = x.cuda(), y.cuda()                         # pageable, blocking copy
    loss = loss_fn(model(x), y)
    print(loss.item())                                # waits for the GPU every step
```
After:
```python
for x, y in DataLoader(ds, batch_size=32, num_workers=8, pin_memory=True, persistent_workers=True):
    x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
    loss = loss_fn(model(x), y)
    if step % 100 == 0:
        print(loss.item())
```
When it waits for the device instead (a blocking `.cpu()` of a small tensor whose producer
waits on a collective), the fix is to take the wait off the step's path: copy into pinned
memory with `non_blocking=True` and read the value later, or overlap the wait with the
previous batch's work.

## How the saving is estimated
Replayed: the host time spent while the device was idle is taken off the host's path and
the step graph is replayed on top of every other finding's fix; the saving is how much
shorter that makes the replayed step. The rule's
own estimate (evidence `estimate_ms`) is the mean idle time per step, step duration minus the
time with any device activity: the most the step can shrink by keeping the device fed. Confidence is low when the host mostly waits for the device (both
then wait on something else, which removing the wait may not speed up) or the trace has no
step markers, high when one activity explains at least half of the idle time.

Reference: https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html
"""

from __future__ import annotations

from advisor.whatif import Change

import numpy as np
import pandas as pd

from advisor.engine import Context
from advisor.metrics.breakdown import DATALOADER_NAME, name_matches, text_of
from advisor.metrics.compute import step_kernels
from advisor.metrics.hierarchy import OpTree, op_tree
from advisor.metrics.intervals import covers_bounds, intersect, merge, sorted_unique, subtract
from advisor.metrics.host_device import (
    COPY_CALL,
    LAUNCH_CALL,
    op_tree_of,
    sync_calls,
)
from advisor.snippets import dataloader_call, suggested_workers

ID = "gpu-idle"
TITLE = "The GPU is idle for much of each step"
GROUP = "host"
TESTED_ON = ("nvidia", "amd", "mtia", "cpu")  # vendors whose real traces the tests run it on (advisor/metrics/vendors.py)
DOCS = "https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html"
DEFAULTS = {"max_utilization": 0.60, "min_kernels_per_step": 10}
SYMPTOM = True  # its saving is what the other findings' fixes leave (see the engine)
FIX = "Keep work queued on the device: load data in workers, copy from pinned memory with non_blocking=True, avoid per-step syncs, fuse small kernels."
AFTER = """loader = DataLoader(ds, batch_size=32, num_workers=8, pin_memory=True, persistent_workers=True)
for x, y in loader:
    x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
    ...
"""


def idle_intervals(events, steps: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(start, end, step index) of every stretch inside a step with no device activity."""
    dev = events.device
    ds, de = merge(dev["ts"].to_numpy(np.int64), dev["end"].to_numpy(np.int64))
    ss, se = steps["start"].to_numpy(np.int64), steps["end"].to_numpy(np.int64)
    b = sorted_unique(np.concatenate([ss, se, ds, de]))
    if len(b) < 2:
        return b[:0], b[:0], b[:0]
    lo, hi = b[:-1], b[1:]
    in_step = covers_bounds(b, ss, se)
    idle = in_step & ~covers_bounds(b, ds, de)
    s, e = merge(lo[idle], hi[idle])
    step_idx = np.searchsorted(ss, s, side="right") - 1
    return s, e, step_idx


def host_during(events, s: np.ndarray, e: np.ndarray, n_steps: int, limit: int = 5, tree: OpTree | None = None) -> list[dict]:
    """What the step's thread was doing during the given intervals: per innermost open op, the
    overlapping time, with the outermost annotation around it (`within`). Each instant is
    counted once, in the op the host was actually in, not again in every op that encloses it."""
    if len(s) == 0 or len(events.steps) == 0 and len(events.host) == 0:
        return []
    tree = tree if tree is not None else op_tree(events)
    ops = tree.ops
    tid = str(events.steps["tid"].iloc[0]) if len(events.steps) else _busiest_thread(ops)
    on_thread = tree.thread == tid
    if not on_thread.any():
        return []
    op_ts, op_end = ops["ts"].to_numpy(np.int64), ops["end"].to_numpy(np.int64)
    # Only the ops that reach into an interval can split it: the others' bounds lie outside.
    ms, me = merge(s, e)
    first = np.searchsorted(me, op_ts, side="right")  # the first interval that ends after the op starts
    reach = on_thread & (first < len(ms)) & (ms[np.minimum(first, len(ms) - 1)] < op_end) if len(ms) else np.zeros(len(ops), dtype=bool)
    b = sorted_unique(np.concatenate([s, e, op_ts[reach], op_end[reach]]))
    lo, hi = b[:-1], b[1:]
    keep = covers_bounds(b, s, e)
    lo, hi = lo[keep], hi[keep]
    inner = tree.innermost(lo, np.full(len(lo), tid))
    hit = inner >= 0
    if not hit.any():
        return []
    outer = tree.nearest_ancestor(inner[hit], np.ones(len(ops), dtype=bool), outermost=True)
    # grouped by name codes (one per distinct name), named after
    if isinstance(ops["name"].dtype, pd.CategoricalDtype):
        codes, distinct = ops["name"].array.codes, ops["name"].cat.categories
    else:
        codes, distinct = pd.factorize(text_of(ops["name"]))
    names = np.append(np.asarray(distinct, dtype=object), np.nan)  # code -1: a missing name
    g = pd.DataFrame({"name": codes[inner[hit]], "within": codes[outer], "ns": hi[hit] - lo[hit]})
    g = g.groupby(["name", "within"], sort=False)["ns"].sum().sort_values(ascending=False).head(limit)
    out = []
    for (name, within), ns in g.items():
        row = {"name": str(names[name])[:110], "idle_ms_per_step": round(float(ns) / 1e6 / max(n_steps, 1), 3)}
        if within != name:
            row["within"] = str(names[within])[:110]
        out.append(row)
    return out


def _busiest_thread(ops: pd.DataFrame) -> str:
    return str(ops.groupby("tid")["dur"].sum().idxmax()) if len(ops) else ""


# What the host does while the device idles, in the order a fix is chosen (the largest wins).
ACTIVITIES = ("waits for the device", "loads data", "copies to the device", "launches kernels", "runs host code")


def idle_by_activity(ctx: Context, s: np.ndarray, e: np.ndarray) -> dict[str, float]:
    """Device idle ns inside the steps, by what the host was doing: waiting in a sync or a
    blocking copy, in a DataLoader span, launching a host→device copy, launching kernels;
    the rest of the time the host ran its own code (or nothing the profiler recorded)."""
    events = ctx.events
    rt = events.runtime
    rt_name = rt["name"]
    calls = {
        "waits for the device": _wait_windows(ctx),
        "loads data": _span_windows(events.host, DATALOADER_NAME),
        "copies to the device": _call_windows(rt, name_matches(rt_name, COPY_CALL) & _h2d_calls(events)),
        "launches kernels": _call_windows(rt, name_matches(rt_name, LAUNCH_CALL)),
    }
    out: dict[str, float] = {}
    rest_s, rest_e = s, e
    for what, (ws, we) in calls.items():
        a_s, a_e = intersect(rest_s, rest_e, ws, we)
        out[what] = float((a_e - a_s).sum())
        rest_s, rest_e = subtract(rest_s, rest_e, ws, we)
    out["runs host code"] = float((rest_e - rest_s).sum())
    return out


def _span_windows(rows: pd.DataFrame, pattern) -> tuple[np.ndarray, np.ndarray]:
    r = rows[name_matches(rows["name"], pattern)]
    return merge(r["ts"].to_numpy(np.int64), r["end"].to_numpy(np.int64))


def _call_windows(rows: pd.DataFrame, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return merge(rows["ts"].to_numpy(np.int64)[mask], rows["end"].to_numpy(np.int64)[mask])


def _h2d_calls(events) -> np.ndarray:
    """Runtime calls that launched a host→device copy (by correlation id)."""
    dev = events.device
    h2d = dev[(dev["kind"] == "memcpy") & (dev["copy_kind"] == "HtoD")]["correlation"]
    return events.runtime["correlation"].isin(h2d[h2d >= 0]).to_numpy()


def _wait_windows(ctx: Context) -> tuple[np.ndarray, np.ndarray]:
    """Where the host waits for the device: syncs and blocking device→host copies."""
    calls = sync_calls(ctx.timeline, op_tree_of(ctx.metrics))
    return merge(calls["ts"].to_numpy(np.int64), calls["end"].to_numpy(np.int64))


def _where(rows: list[dict]) -> str:
    return ", ".join(f"{h['name']}" + (f" in {h['within']}" if h.get("within") else "") + f" ({h['idle_ms_per_step']:.1f} ms)" for h in rows)


ADVICE = {
    "waits for the device": (
        "The host is blocked waiting for the device (a synchronize, or a copy to the host such as .cpu()/.item()/.tolist()) "
        "while the device itself has nothing queued: both wait on something else (another stream, a collective, another "
        "rank). Take the wait off the step's path: copy with non_blocking=True into pinned memory and read the value a step "
        "later, or overlap it with the previous batch's work (a pipelined input distribution)."
    ),
    "loads data": "The host is inside the DataLoader: load batches in worker processes (num_workers, persistent_workers) so they are ready when asked for.",
    "copies to the device": "The host is launching host→device copies: pin the source tensors and copy with non_blocking=True so the host can queue work behind them.",
    "launches kernels": "The host is launching many small kernels one by one: fewer, larger kernels (torch.compile, CUDA graphs, fused or multi-tensor ops) keep the device ahead.",
    "runs host code": "The host runs its own code while nothing is queued on the device: move that work out of the step, overlap it with device work, or make it cheaper.",
}
SNIPPETS = {
    "waits for the device": """pinned = torch.empty(shape, dtype=dtype, pin_memory=True)
pinned.copy_(t, non_blocking=True)           # no wait here
done = torch.cuda.Event(); done.record()
...                                          # queue the next work first
done.synchronize(); value = pinned.tolist()  # read it when it is needed
""",
    "loads data": AFTER,
    "copies to the device": """x = x.pin_memory().to(device, non_blocking=True)
""",
    "launches kernels": """model = torch.compile(model)                  # fuses small kernels
""",
    "runs host code": "",
}


def check(ctx: Context):
    m = ctx.metrics
    util = m.gpu_utilization
    step_ms = ctx.step_ms
    if util is None or step_ms <= 0 or not len(m.kernels):
        return None
    if util >= ctx.options["max_utilization"]:
        return None
    steps = m.steps
    if len(step_kernels(m)) / max(len(steps), 1) < ctx.options["min_kernels_per_step"]:
        return None  # too little device work to speak of a training step's utilisation
    s, e, step_idx = idle_intervals(ctx.events, steps)
    n = max(len(steps), 1)
    idle_ms = float((e - s).sum()) / 1e6 / n
    if idle_ms <= 0:
        return None
    gaps = np.argsort(s - e)[:3]  # longest first
    by_activity = idle_by_activity(ctx, s, e)
    main = max(ACTIVITIES, key=lambda a: by_activity[a])
    main_share = by_activity[main] / max(float((e - s).sum()), 1.0)
    during_rows = host_during(ctx.events, s, e, n, tree=op_tree_of(m))
    evidence = {
        "gpu_utilization": round(util, 4),
        "idle_ms_per_step": round(idle_ms, 3),
        "per_step_utilization": [round(float(v), 4) for v in m.utilization.to_numpy()],
        "idle_ms_per_step_while_host": {a: round(by_activity[a] / 1e6 / n, 3) for a in ACTIVITIES},
        "host_during_idle": during_rows,
        "longest_idle_gaps": [
            {"step": int(steps["step"].iloc[step_idx[i]]), "ms": round(float(e[i] - s[i]) / 1e6, 3)} for i in gaps if step_idx[i] >= 0
        ],
        "steps": steps["step"].tolist(),
    }
    marked = len(ctx.events.steps) > 0
    top = during_rows[:3]
    during = f": meanwhile the host {main} {100 * main_share:.0f}% of that time" + (f", in {_where(top)}" if top else "")
    message = f"The {m.device.kind} is idle {100 * (1 - util):.0f}% of each {step_ms:.1f} ms step ({idle_ms:.1f} ms){during}. {ADVICE[main]}"
    if not marked and list(steps["name"]) == ["(whole trace)"]:
        message += " The trace has no ProfilerStep markers, so the whole window counts as one step (setup included)."
    elif not marked:
        message += " The trace has no ProfilerStep markers: its steps are the iterations found from what repeats (see the notes)."
    # The fix, replayed: the host work that ran while the device idled is taken off the host's
    # path (done in workers, overlapped, or issued ahead), so the device is fed as soon as it
    # can be; what the device itself waits for (its own dependencies) stays.
    change = Change(host_remove=[(s, e, 1.0)])
    # When the host only waits for the device, what both wait for is elsewhere and removing
    # the wait may win little.
    confidence = "low" if not marked or main == "waits for the device" else ("high" if main_share >= 0.5 else "medium")
    snippet = SNIPPETS[main]
    if main == "loads data":  # the run's own loader settings, never invented ones
        call = dataloader_call(ctx.recorded, dataset="ds", num_workers=suggested_workers(ctx.recorded, ctx.world_size), pin_memory=True, persistent_workers=True)
        snippet = AFTER.replace(AFTER.splitlines()[0], call)
    return ctx.finding(message, idle_ms, confidence=confidence, evidence=evidence, fix=ADVICE[main], snippet=snippet, change=change)
