"""The optimizer updates parameters one tensor at a time.

## What it detects
`Optimizer.step#...` spans inside the steps that launch at least `min_launches` kernels
(50 by default) with no `_foreach_`/`_fused_` op and no multi-tensor kernel among them: the
for-loop implementation, one or more small elementwise kernels per parameter. It fires when
the estimated saving is at least `min_share` of the step (0.3% by default: the fix is one argument).

## What it needs from the trace
Device activity and the `Optimizer.step#...` spans with the kernels launched inside them.
Without optimizer spans (an update outside the window, or unnamed) it says nothing. It is not
run where the launches have no kernel records (the device's activity is missing); where the
host's operators are missing (a device-only trace); where the device's timeline lies outside
the host's: the report's warning or note says why.

## Why it is slow
For a model with N parameter tensors the per-tensor implementation launches several kernels
for each of them every step (SGD with momentum: `mul_`, `add_`, `add_`). Each launch costs
the host microseconds and each tiny kernel has a fixed start-up cost on the device. The
`foreach` implementation packs many tensors into one multi-tensor kernel launch; the
`fused` one does the whole update of a parameter group in one kernel.

## Evidence used
- the optimizer step spans, the kernels launched inside them and their durations;
- `_foreach_`/`_fused_` ops and multi-tensor kernel names (their presence means the fast
  path is already in use);
- the device idle time inside the optimizer step;
- from the facts file, when present: each optimizer's class and `foreach`/`fused` flags.

## Example
Before:
```python
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
```
After:
```python
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)   # fused=True goes further
```
`foreach` is the default on CUDA since PyTorch 2.0 when every parameter is on the GPU; a
per-tensor step there means `foreach=False` (the fix then says to drop it), parameters on
several devices, or an older PyTorch. `fused=True` (Adam, AdamW, SGD, ...) does the whole
update in one kernel per group and saves at least as much; the saving shown is foreach's,
the change the finding recommends.

## Fix: `advisor fix` (safe)
```diff
-optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
+optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
```
`fused=True` is left to the user (it needs every parameter on the GPU). A `transformers`
Trainer gets `TrainingArguments(optim="adamw_torch_fused")`.

## How the saving is estimated
The fix is replayed on the step graph; what `foreach=True` changes, read from this run:
- **host dispatch**: every op directly under the optimizer step that launched a kernel
  (`aten::mul_`, `aten::lerp_`, ...) together with the Python binding that called it is a
  per-parameter dispatch. A multi-tensor step makes one list op per per-parameter op (the
  parameter count is the least frequent op's count per step) and launches one kernel per
  48 tensors (PyTorch's `multi_tensor_apply` takes 110/64/48/36/30 tensors for 1-5 lists;
  an optimizer's list ops mostly take three): e.g. AdamW over 101 tensors keeps 8 × 3 = 24
  of 808 dispatches, 3%. The dispatch windows lose the rest of their host time and the
  launch calls the rest of their cost. The optimizer's other host work (Python bookkeeping
  per parameter, step counters on the host) stays: the multi-tensor path still does it.
- **device**: each kernel's fixed cost (start-up and tail) is the shortest duration of the
  same kernel in this step (the one on the smallest tensor, a bias, is almost all fixed
  cost); a multi-tensor kernel pays it once per launch, so each per-parameter kernel keeps
  the same 3% of it, and the kernels run back to back.
- **critical path**: the replay decides whether the optimizer's host time delays the step
  (it does when a per-step `.item()` and an in-process DataLoader keep the host from
  running ahead). Where the facts file has unprofiled step times, the part of the step
  that neither the calibrated host nor the device places (host time on the critical path
  the graph cannot locate) shrinks by the share of the steps' own host work (the DataLoader's
  wait aside) the dispatches removed (`host_work_share_removed` in the evidence).

The saving is how much shorter the replayed step is. The rule's own estimate, kept in the
evidence as `estimate_ms`: the device idle time inside the optimizer step (the device waits
for the host's launches), plus a fixed per-kernel cost for each per-parameter kernel: the
smaller of the kernel's duration and 2 µs. The arithmetic itself (reading and writing every
parameter) stays and is not counted.

Reference: https://pytorch.org/docs/stable/optim.html#algorithms

## Measured pairs that confirm the model
the H100 ViT `--foreach` pair (2.74 ms promised, 3.06 measured), within ±25% (`benchmarks/results/promise_accuracy.txt`). Its rule page's `CONFIRMED_BY`
says so to the ranking: a promise with "up to" parts that no measured pair checked (torch.compile's
layout and batch-norm parts) ranks above this fix only where it saves more than twice as much.
"""

from __future__ import annotations

from advisor.whatif import Change
from advisor.whatif.changes import device_rows_of, host_work_share, row_set, row_values, runtime_rows_of

import numpy as np
import pandas as pd
from advisor.metrics.breakdown import text_of
from advisor.metrics.host_device import (
    launches_in_spans,
    op_tree_of,
    optimizer_dispatch_windows,
    per_parameter_optimizer_steps,
    per_step,
)

from advisor.engine import Context
from advisor.metrics.source import source_lines

ID = "single-tensor-optimizer"
TITLE = "The optimizer launches kernels one parameter at a time"
# Measured pairs that confirm the saving model (advisor.engine.ranking.UNCHECKED_MARGIN).
CONFIRMED_BY = "the H100 ViT --foreach pair (2.74 ms promised, 3.06 measured)"
GROUP = "optimizer"
TESTED_ON = ("nvidia", "amd")  # vendors whose real traces the tests run it on (advisor/metrics/vendors.py)
DOCS = "https://pytorch.org/docs/stable/optim.html#algorithms"
DEFAULTS = {"min_share": 0.003, "min_launches": 50}
TRAINING_ONLY = True  # gradients and optimizers: silent on inference runs
KERNEL_FIXED_COST_NS = 2_000
# Tensors one multi-tensor kernel takes: PyTorch's multi_tensor_apply packs at most
# 110/64/48/36/30 tensors per launch for 1-5 lists (ATen/native/cuda/MultiTensorApply.cuh);
# an optimizer's list ops mostly take three (parameter or state, gradient, state).
TENSORS_PER_LAUNCH = 48
FUSED_OPTIMIZERS = {"Adam", "AdamW", "SGD", "Adagrad", "Adamax", "RMSprop", "RAdam", "NAdam"}
FIX = "Use the multi-tensor implementation: foreach=True (the default for CUDA parameters unless foreach=False turns it off)."
AFTER = """optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)   # fused=True goes further
"""


def check(ctx: Context):
    m = ctx.metrics
    if not m.has_device or ctx.step_ms <= 0:
        return None
    tree = op_tree_of(ctx.metrics)
    base = ctx.timeline
    spans = per_parameter_optimizer_steps(base, tree, int(ctx.options["min_launches"]))
    if len(spans) == 0:
        return None
    tl = base
    lk = launches_in_spans(tl, tree, spans["pos"].to_numpy())
    k_dur = lk["k_dur"].fillna(0).to_numpy(np.float64)
    fixed_ns = float(np.minimum(k_dur, KERNEL_FIXED_COST_NS).sum())
    idle_ns = float(tl.idle(spans["ts"].to_numpy(np.int64), spans["end"].to_numpy(np.int64)).sum())
    saving = per_step(fixed_ns + idle_ns, tl)
    if saving / ctx.step_ms < ctx.options["min_share"]:
        return None

    names = spans["optimizer"].value_counts()
    optimizer = str(names.index[0])
    evidence = {
        "optimizer": optimizer,
        "kernels_per_step": round(len(lk) / tl.n_steps, 1),
        "median_kernel_us": round(float(np.median(k_dur)) / 1e3, 2) if len(k_dur) else None,
        "kernel_ms_per_step": round(per_step(k_dur.sum(), tl), 3),
        "optimizer_step_ms_per_step": round(per_step(spans["dur"].sum(), tl), 3),
        "device_idle_in_step_ms": round(per_step(idle_ns, tl), 3),
        "top_kernels": lk["kernel"].astype(str).str.slice(0, 90).value_counts().head(3).to_dict(),
        "steps": tl.step_numbers(spans["ts"].to_numpy(np.int64)),
    }
    lines = source_lines(ctx.events, spans)
    if lines:
        evidence["source"] = lines
    facts = ctx.recorded.optimizers or []
    confidence = "medium"
    disabled = False  # foreach=False given explicitly: the default multi-tensor path was turned off
    if facts:
        evidence["optimizer_settings"] = [{"class": o.class_, "foreach": o.foreach, "fused": o.fused} for o in facts]
        disabled = any(o.foreach is False for o in facts)
        if disabled or any(o.foreach is None and o.fused in (None, False) for o in facts):
            confidence = "high"
    fused_ok = optimizer in FUSED_OPTIMIZERS

    # The fix, replayed: what packing the per-parameter ops into multi-tensor ones changes.
    ws, we, dispatch = optimizer_dispatch_windows(tl, tree, spans["pos"].to_numpy(np.int64))
    kept = multi_tensor_share(dispatch, len(lk))
    evidence["dispatch_ms_per_step"] = round(per_step(float((we - ws).sum()), tl), 3)
    evidence["multi_tensor_launch_share"] = round(kept, 4)
    rows = device_rows_of(ctx.events, lk["correlation"].to_numpy(np.int64))
    d = ctx.events.device["dur"].to_numpy(np.float64)[rows]
    names = text_of(ctx.events.device["name"])[rows]
    # Each kernel's fixed cost: the shortest run of the same kernel in this step (on the
    # smallest tensor, such as a bias, it is almost all start-up and tail). A multi-tensor
    # kernel pays it once per launch, so each per-parameter kernel keeps `kept` of it.
    fixed = pd.Series(d).groupby(names).transform("min").to_numpy(np.float64) if len(d) else d
    scale = np.where(d > 0, (d - fixed * (1.0 - kept)) / np.maximum(d, 1), 1.0)
    calls = runtime_rows_of(ctx.events, lk["correlation"].to_numpy(np.int64))
    change = Change(
        host_remove=[(ws, we, 1.0 - kept)],
        call_scale=row_values(calls, kept),
        device_scale=row_values(rows, scale),
        tight_launch=row_set(rows),
        remainder_share=host_work_share(ctx.events, m.steps, ws, we, 1.0 - kept),
    )
    evidence["host_work_share_removed"] = round(change.remainder_share, 4)

    choice = "foreach=True"
    message = (
        f"{optimizer}.step launches {evidence['kernels_per_step']:.0f} small kernels per step, one set per parameter "
        f"(median {evidence['median_kernel_us']} µs); {choice} packs them into a few multi-tensor kernels."
    )
    if disabled:
        fix = f"Drop foreach=False from the {optimizer} constructor (or pass foreach=True): the multi-tensor path is the default for CUDA parameters."
    else:
        fix = f"Construct the optimizer with {choice}."
    if fused_ok:
        fix += " fused=True goes further (one kernel per update); the saving shown is foreach's."
    return ctx.finding(message, saving, confidence=confidence, evidence=evidence, fix=fix, snippet=AFTER.replace("AdamW", optimizer if fused_ok else "AdamW"), change=change)


def multi_tensor_share(dispatch: pd.DataFrame, launches: int) -> float:
    """Share of the per-parameter dispatches (and launches) a multi-tensor step still makes.

    Per optimizer step, an op that runs once per parameter counts the parameters (the least
    frequent op); each per-parameter op becomes one list op, which launches one kernel per
    `TENSORS_PER_LAUNCH` tensors. E.g. AdamW over 101 tensors: 808 dispatches become 8 list
    ops of 3 launches each, 3% of them.
    """
    if len(dispatch) == 0 or launches == 0:
        return 1.0
    counts = dispatch.groupby(["span", dispatch["name"].astype(str)]).size()
    per_span = counts.groupby(level=0)
    n_params = per_span.min().astype(np.float64)
    list_ops = per_span.sum() / n_params
    kept = float((np.round(list_ops) * np.ceil(n_params / TENSORS_PER_LAUNCH)).sum())
    return min(kept / launches, 1.0)
