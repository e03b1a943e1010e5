"""The optimizer updates parameters one tensor at a time.

## What it detects
`Optimizer.step#...` spans inside the steps that launch at least `min_launches` kernels
(50 by default) with no `_foreach_`/`_fused_` op and no multi-tensor kernel among them: the
for-loop implementation, one or more small elementwise kernels per parameter. It fires when
the estimated saving is at least `min_share` of the step (0.3% by default: the fix is one argument).

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
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)   # or foreach=True
```
`foreach` is the default on CUDA since PyTorch 2.0 when every parameter is on the GPU; a
per-tensor step there means `foreach=False`, parameters on several devices, or an older
PyTorch.

## How the saving is estimated
The fix is replayed: the per-parameter kernels run back to back with their launch calls
reduced to a tenth, half of the optimizer step's host time goes (a multi-tensor step still
walks the parameter lists on the host), and each kernel loses its fixed cost (2 µs or 80%
of it, whichever is less). The saving is how much shorter the replayed step is. The rule's
own estimate, kept in the evidence as `estimate_ms`: the device idle time inside the optimizer step (the device waits for the host's launches),
plus a fixed per-kernel cost for each per-parameter kernel: the smaller of the kernel's
duration and 2 µs, the start-up cost a multi-tensor kernel pays once for dozens of tensors.
The arithmetic itself (reading and writing every parameter) stays and is not counted.

Reference: https://pytorch.org/docs/stable/optim.html#algorithms
"""

from __future__ import annotations

from advisor.whatif import Change
from advisor.whatif.changes import device_rows_of, graphed, scale_device

import numpy as np
from advisor.metrics.host_device import (
    launches_in_spans,
    op_tree_of,
    per_parameter_optimizer_steps,
    per_step,
)

from advisor.engine import Context
from advisor.metrics.source import source_lines

ID = "single-tensor-optimizer"
TITLE = "The optimizer launches kernels one parameter at a time"
DOCS = "https://pytorch.org/docs/stable/optim.html#algorithms"
DEFAULTS = {"min_share": 0.003, "min_launches": 50}
TRAINING_ONLY = True  # gradients and optimizers: silent on inference runs
KERNEL_FIXED_COST_NS = 2_000
# Share of the optimizer step's host time that a multi-tensor step no longer spends.
HOST_SHARE_SAVED = 0.5
FIX = "Use the multi-tensor implementation: foreach=True, or fused=True where the optimizer has it (Adam, AdamW, SGD, ...)."
AFTER = """optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)   # or foreach=True
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
    lines = source_lines(ctx.frames, spans)
    if lines:
        evidence["source"] = lines
    facts = [o for o in (ctx.fact("optimizers", default=[]) or []) if isinstance(o, dict)]
    confidence = "medium"
    if facts:
        evidence["optimizer_settings"] = [{k: o.get(k) for k in ("class", "foreach", "fused")} for o in facts]
        if any(o.get("foreach") is False or (o.get("foreach") is None and o.get("fused") in (None, False)) for o in facts):
            confidence = "high"
    fused_ok = optimizer in {"Adam", "AdamW", "SGD", "Adagrad", "Adamax", "RMSprop", "RAdam", "NAdam"}
    choice = "fused=True" if fused_ok else "foreach=True"
    message = (
        f"{optimizer}.step launches {evidence['kernels_per_step']:.0f} small kernels per step, one set per parameter "
        f"(median {evidence['median_kernel_us']} µs); {choice} packs them into a few multi-tensor kernels: ~{saving:.2f} ms/step."
    )
    fix = f"Construct the optimizer with {choice}" + (" (or foreach=True)." if fused_ok else ".")
    # The fix, replayed: the per-parameter launches become a few multi-tensor ones (launch calls
    # and most of the optimizer's host time go, its kernels run back to back), and each kernel
    # loses its fixed cost (the same bytes move in far fewer kernels).
    rows = device_rows_of(ctx.frames, lk["correlation"].to_numpy(np.int64))
    d = ctx.frames.device["dur"].to_numpy(np.float64)[rows]
    kept = np.maximum(d - KERNEL_FIXED_COST_NS, 0.2 * d) / np.maximum(d, 1)
    change = Change.merge(
        [graphed(ctx.frames, rows, (spans["ts"].to_numpy(np.int64), spans["end"].to_numpy(np.int64)), HOST_SHARE_SAVED), scale_device(rows, kept)]
    )
    return ctx.finding(
        message, saving, confidence=confidence, evidence=evidence, fix=fix, snippet=AFTER.replace("AdamW", optimizer if fused_ok else "AdamW"), change=change
    )
