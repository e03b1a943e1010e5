"""A CPU run's optimizer updates each parameter with its own chain of small ops.

## What it detects
A run with no device activity whose `Optimizer.step` spans run the update one parameter at a
time: at least `min_ops_per_parameter` (3) ops per parameter tensor, each op name repeating
once per parameter, in an optimizer that has a fused CPU implementation (Adam, AdamW, SGD,
Adagrad; PyTorch 2.4 and later). The facts file, when present, must not say `fused=True`.
It fires when the time the fix saves is at least `min_share` (1%) of the step.

## What it needs from the trace
A run with no device activity and its `Optimizer.step` spans with the ops inside them. Without
those spans (an optimizer stepped outside the profiled window, or an unnamed update) it says
nothing; the facts file, when present, rules out an optimizer already `fused=True`. It is not
run where the host's operators are missing (a device-only trace): the report's warning or note
says why.

## Why it is slow
The default (for-loop) implementation dispatches every elementwise op of the update (`mul_`,
`add_`, `lerp_`, `addcmul_`, `sqrt`, `div`, ...) once per parameter from a Python loop: each
dispatch costs the host a few microseconds of Python and ATen overhead, and each op reads and
writes its tensors again. On a CPU this is the default: `foreach` defaults to on only for
device tensors. `fused=True` does the whole update of all parameters in one vectorised pass per
parameter group; `foreach=True` at least groups the ops into list ops.

## Evidence used
- the `Optimizer.step` spans in the steps and the ops inside them;
- per op name, how often it runs per step (the parameter count is the least frequent one's)
  and its shortest run (its fixed cost, paid on the smallest tensor such as a bias);
- the spans' own time, and `_init_group`'s inside them where Python frames are recorded;
- from the facts file, when present: the optimizers' `foreach` and `fused` settings.

## Example
Before:
```python
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
```
After:
```python
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)   # one pass per group
```

## How the saving is estimated
What `fused=True` leaves of the optimizer is everything in the `Optimizer.step` spans outside
the per-parameter loop (the step's wrappers and hooks, the group bookkeeping `_init_group`:
every implementation runs them) and one vectorised pass over each parameter group
(`aten::_fused_adamw_`, `aten::_fused_sgd_`), which still visits each tensor:
- the loop is the for-loop implementation's `_single_tensor_*` frame, where the trace has
  Python frames; without them only `_init_group` is kept beside the pass (none without frames);
- the pass: the per-parameter ops' time over the ops per parameter (`distinct_ops`: the
  per-parameter update reads and writes each tensor that many times, the fused one once), so
  one op's fixed cost per tensor and one pass of the arithmetic stay.

`advisor profile` times the optimizer's step in the unprofiled steps after the window, and the
replay holds the spans at that time (`optimizer_scale`, CPU runs), measured rather than assumed
to shrink with the rest of the host (on AdvisorBench's `tabular_optimizer`: x0.60 to x0.67,
the rest x0.57 to x0.58). What the fused update keeps runs few Python calls, so its traced time
stands as its own, and the share removed is of the unprofiled span. Everything else goes: the
per-parameter Python loop, each op's dispatch, the `.item()` of the step count, the extra
passes over memory. Before (AdvisorBench's `transformer_optimizer`):
`AdamW(model.parameters(), foreach=False)`, 51 tensors, 10 ops each per step; after:
`AdamW(model.parameters(), fused=True)`. The figure is the replayed step's, the profiler's own
cost taken out (`advisor.whatif`), and `min_share` is judged against that replayed step, not
the profiled one. The time found in the spans is then replayed as the host's work that much
shorter (`host_shorter_by`), so that it adds to `cpu-threads`' fix (more threads for the matrix
ops leave the optimizer's loop as it is) instead of the larger of the two removals in one CPU
step winning. `foreach=True` keeps one list op per op name and its Python around it, and saves
less (on a held-out per-parameter Adam: 14% with `foreach`, 30% with `fused`); the promise is
`fused=True`'s. Earlier models promised 2% where the pair measured 6.8% (the ops' fixed cost
only), then 12% against 8.0% and 5.6% (the loop's profiled time, all of it but one pass of
arithmetic and `_init_group`, removed).

Reference: https://pytorch.org/docs/stable/generated/torch.optim.AdamW.html
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from advisor.engine import Context
from advisor.metrics.breakdown import name_matches
from advisor.metrics.host_device import OPTIMIZER_SPAN
from advisor.metrics.steps import step_of
from advisor.whatif import Change

ID = "cpu-optimizer"
TITLE = "The optimizer updates one parameter at a time on the CPU"
GROUP = "optimizer"
TESTED_ON = ("cpu",)  # vendors whose real traces the tests run it on (advisor/metrics/vendors.py)
DOCS = "https://pytorch.org/docs/stable/generated/torch.optim.AdamW.html"
DEFAULTS = {"min_share": 0.01, "min_ops_per_parameter": 3}
TRAINING_ONLY = True
FUSED_ON_CPU = {"Adam", "AdamW", "SGD", "Adagrad"}
FIX = "Construct the optimizer with fused=True (PyTorch 2.4 and later on the CPU), or foreach=True."
OPTIMIZER_NAME = re.compile(r"^Optimizer\.step#(\w+)\.step$")
# The Python frame of the optimizer's per-group bookkeeping, which a fused update runs too.
INIT_GROUP = re.compile(r"optim/\w+\.py\(\d+\): _init_group$")
# The Python frame of the for-loop implementation's per-parameter loop, which a fused one replaces.
PER_PARAMETER_LOOP = re.compile(r"optim/\w+\.py\(\d+\): _single_tensor_\w+$")


def _inside(events: pd.DataFrame, s: np.ndarray, e: np.ndarray) -> float:
    """ns of the outermost `events` that lie inside the spans [s, e)."""
    if len(events) == 0 or len(s) == 0:
        return 0.0
    ts, end = events["ts"].to_numpy(np.int64), events["end"].to_numpy(np.int64)
    j = np.searchsorted(s, ts, side="right") - 1
    inside = (j >= 0) & (end <= e[np.maximum(j, 0)])
    ts, end = ts[inside], end[inside]
    order = np.argsort(ts, kind="stable")
    ts, end = ts[order], end[order]
    top = np.ones(len(ts), dtype=bool)
    if len(ts) > 1:
        top[1:] = ts[1:] >= np.maximum.accumulate(end)[:-1]
    return float((end[top] - ts[top]).sum())


def _optimizer_scale(ctx: Context) -> float:
    """The replay's factor from the window's optimizer spans to the unprofiled steps' time in
    the optimizer (1.0 where the run did not time it)."""
    replay = ctx.replay
    if not replay.available:
        return 1.0
    _ = replay.base
    return replay.optimizer_scale if replay.optimizer_scale is not None else 1.0


def check(ctx: Context):
    m = ctx.metrics
    if m.has_device or ctx.step_ms <= 0 or len(m.steps) == 0:
        return None
    settings = ctx.recorded.optimizers or []
    if any(o.fused is True for o in settings):
        return None
    host = ctx.events.host
    spans = host[name_matches(host["name"], OPTIMIZER_SPAN)]
    if len(spans) == 0:
        return None
    names = spans["name"].astype(str).str.extract(OPTIMIZER_NAME)[0].dropna()
    if len(names) == 0:
        return None
    optimizer = str(names.value_counts().index[0])
    if optimizer not in FUSED_ON_CPU:
        return None
    st = m.steps
    ss, se = st["start"].to_numpy(np.int64), st["end"].to_numpy(np.int64)
    rows = []
    for span in spans.itertuples():
        step = int(step_of(ss, se, np.array([span.ts], dtype=np.int64))[0])
        if step < 0:
            continue
        inner = host[(host["ts"] >= span.ts) & (host["end"] <= span.end) & (host["kind"] == "op").to_numpy()]
        if len(inner) == 0:
            continue
        # the outermost ops of the update (their children are the same dispatch)
        ts, end = inner["ts"].to_numpy(np.int64), inner["end"].to_numpy(np.int64)
        top = np.ones(len(inner), dtype=bool)
        running = np.maximum.accumulate(end)
        top[1:] = ts[1:] >= running[:-1]
        rows.append(inner[top].assign(step=step, span=span.Index))
    if not rows:
        return None
    ops = pd.concat(rows)
    ops = ops.assign(op=ops["name"].astype(str), dur=(ops["end"] - ops["ts"]))
    per_span = ops.groupby(["span", "op"]).size()
    # The parameter count: how often most op names repeat in one step (once per parameter).
    params = int(per_span[per_span >= 2].groupby(level=0).agg(lambda c: c.mode().iloc[0]).median()) if (per_span >= 2).any() else 0
    distinct = int(round(len(ops) / max(params, 1) / max(ops["span"].nunique(), 1)))
    if params < 2 or distinct < ctx.options["min_ops_per_parameter"]:
        return None
    n = len(st)
    dur = ops["dur"].to_numpy(np.int64)
    fixed = ops.groupby(["span", "op"])["dur"].transform("min").to_numpy(np.int64)
    # The update's arithmetic: each op's time beyond its fixed cost. A fused update does it in
    # one pass over each parameter instead of `distinct` passes (the ops are memory-bound: each
    # reads and writes the parameter's tensors again), so one pass's worth stays.
    # The fused kernel still visits each parameter tensor: one op's fixed cost per parameter.
    arithmetic_ns = float((dur - fixed).sum())
    fused_ns = (arithmetic_ns + float(fixed.sum())) / max(distinct, 1)
    # What stays of each optimizer span beside it: everything outside the per-parameter loop
    # (the step's wrappers and hooks, the parameter-group bookkeeping), where the trace has
    # Python frames; else `_init_group` alone, where it has that frame.
    stepped = spans.loc[sorted(set(ops["span"]))].sort_values("ts", kind="stable")
    span_s, span_e = stepped["ts"].to_numpy(np.int64), stepped["end"].to_numpy(np.int64)
    span_ns = float((span_e - span_s).sum())
    loop_ns = _inside(host[name_matches(host["name"], PER_PARAMETER_LOOP)], span_s, span_e)
    outside_ns = span_ns - loop_ns if loop_ns > 0 else _inside(host[name_matches(host["name"], INIT_GROUP)], span_s, span_e)
    kept_ns = fused_ns + outside_ns
    # The replay holds the spans at the optimizer step's unprofiled time where the run timed it
    # (`RankReplay.optimizer_scale`). What a fused update keeps runs few Python calls and ops, so
    # its profiled time is about its own; the profiler's cost sits in the per-parameter loop,
    # which goes. So the share removed is of the unprofiled span, the kept time taken as traced.
    unprofiled_scale = _optimizer_scale(ctx)
    share = float(np.clip(1.0 - kept_ns / max(span_ns * unprofiled_scale, 1.0), 0.0, 1.0))
    # The fix, replayed: the optimizer spans (their per-parameter Python loop, each op's
    # dispatch and fixed cost, the extra passes over memory) shrink to the fused update.
    change = Change(host_remove=[(span_s, span_e, share)])
    estimate_ms = share * span_ns * unprofiled_scale / 1e6 / n
    replayed = ctx.replayed_saving(change)
    if replayed is not None and replayed > 0:
        # The same time, as the host's work that much shorter: more threads for the model's
        # ops (cpu-threads) leave the optimizer's Python loop as it is, so the two fixes add
        # (the larger of two removals in one CPU step would win in the replay).
        spread = ctx.replay.host_shorter_by(replayed)
        if spread is not None:
            change = spread
            replayed = ctx.replayed_saving(change)
    saving = replayed if replayed is not None else estimate_ms
    # The floor is judged on the step at the replay's pace (the profiler's own cost taken out,
    # as it is from the saving), not on the profiled step.
    base_ms = ctx.replay.baseline_ms if replayed is not None else ctx.step_ms
    if base_ms <= 0 or saving / base_ms < ctx.options["min_share"]:
        return None
    fixed_ms = float(fixed.sum()) / 1e6 / n
    step_ms = span_ns / 1e6 / n
    evidence = {
        "optimizer": optimizer,
        "optimizer_step_ms_per_step": round(step_ms, 3),
        "ops_per_step": round(len(ops) / n, 1),
        "parameters": params,
        "distinct_ops": distinct,
        "fixed_cost_ms_per_step": round(fixed_ms, 3),
        "arithmetic_ms_per_step": round(arithmetic_ns / 1e6 / n, 3),
        "fused_update_ms_per_step": round(fused_ns / 1e6 / n, 3),
        "outside_the_loop_ms_per_step": round(outside_ns / 1e6 / n, 3),
        "unprofiled_scale": round(unprofiled_scale, 3),
        "removed_ms_per_step": round(estimate_ms, 3),
        "top_ops": ops["op"].value_counts().head(5).to_dict(),
        "steps": sorted(set(int(st["step"].iloc[i]) for i in ops["step"])),
    }
    if settings:
        evidence["optimizer_settings"] = [{"class": o.class_, "foreach": o.foreach, "fused": o.fused} for o in settings]
    message = (
        f"{optimizer}.step dispatches {len(ops) / n:.0f} ops per step, {distinct} per parameter for {params} parameters "
        f"({step_ms:.1f} ms/step in the optimizer); fused=True does the update of each group in one vectorised pass: "
        f"the per-parameter Python loop and each op's dispatch go, and of the ops' arithmetic "
        f"({arithmetic_ns / 1e6 / n:.2f} ms/step over {distinct} passes) one pass stays, replayed "
        f"(foreach=True keeps a list op per op name and saves less)."
    )
    snippet = f"optimizer = torch.optim.{optimizer}(model.parameters(), lr=lr, fused=True)   # one pass per parameter group\n"
    return ctx.finding(message, saving, confidence="medium", evidence=evidence, snippet=snippet, change=change)
