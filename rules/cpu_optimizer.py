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
What `fused=True` leaves of the optimizer is one vectorised pass over each parameter group
(`aten::_fused_adamw_`, `aten::_fused_sgd_`) and the group bookkeeping every implementation
runs (`_init_group`). So the fix is replayed as the `Optimizer.step` spans shrunk to:
- one pass of the update's arithmetic: each per-parameter op's time beyond its fixed cost (the
  shortest run of the same op in that step), summed, over the ops per parameter (`distinct_ops`:
  the per-parameter update reads and writes each tensor that many times, the fused one once);
- `_init_group`'s own time, where the trace has Python frames.

Everything else in the spans goes: the per-parameter Python loop of the for-loop
implementation (`_single_tensor_adamw`, `_single_tensor_sgd`), each op's dispatch, the
`.item()` of the step count, the extra passes over memory. Before (AdvisorBench's
`transformer_optimizer`): `AdamW(model.parameters(), foreach=False)`, 51 tensors, 10 ops each
per step; after: `AdamW(model.parameters(), fused=True)`. The figure is the replayed step's,
the profiler's own cost taken out (`advisor.whatif`), and `min_share` is judged against that
replayed step, not the profiled one. The time found in the spans is then replayed as the
host's work that much shorter (`host_shorter_by`), so that it adds to `cpu-threads`' fix (more
threads for the matrix ops leave the optimizer's loop as it is) instead of the larger of the
two removals in one CPU step winning. `foreach=True` keeps one list op per op name and its
Python around it, and saves less (on a held-out per-parameter Adam: 14% with `foreach`, 30%
with `fused`); the promise is `fused=True`'s. The earlier model (the ops' fixed cost only)
promised 2% where the pair measured 6.8% (`tabular_optimizer`).

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
    arithmetic_ns = float((dur - fixed).sum())
    fused_ns = arithmetic_ns / max(distinct, 1)
    # What stays of each optimizer span beside it: the parameter-group bookkeeping that every
    # implementation runs (`_init_group`, where the trace has Python frames).
    in_spans = host[name_matches(host["name"], INIT_GROUP)]
    stepped = spans.loc[sorted(set(ops["span"]))].sort_values("ts", kind="stable")
    span_s, span_e = stepped["ts"].to_numpy(np.int64), stepped["end"].to_numpy(np.int64)
    span_ns = float((span_e - span_s).sum())
    kept_ns = fused_ns + _inside(in_spans, span_s, span_e)
    share = float(np.clip(1.0 - kept_ns / max(span_ns, 1.0), 0.0, 1.0))
    # The fix, replayed: the optimizer spans (their per-parameter Python loop, each op's
    # dispatch and fixed cost, the extra passes over memory) shrink to the fused update.
    change = Change(host_remove=[(span_s, span_e, share)])
    estimate_ms = (span_ns - kept_ns) / 1e6 / n if span_ns > kept_ns else 0.0
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
