"""zero_grad() writes zeros into every gradient instead of dropping them.

## What it detects
`aten::zero_`, `aten::fill_` or `aten::_foreach_zero_` ops inside the `zero_grad` spans
(`Optimizer.zero_grad#...`, or any annotation named `zero_grad`) of the steps: the
gradients are zeroed in place, one memset or fill kernel per parameter. It fires when the
time this costs is at least `min_share` of the step (0.5% by default).

## What it needs from the trace
Device activity and the `zero_grad` spans (`Optimizer.zero_grad#...`, or an annotation named
`zero_grad`) with the zeroing ops and kernels inside them. Without those spans it says nothing.
It is not run where the launches have no kernel records (the device's activity is missing);
where the host's operators are missing (a device-only trace); where the device's timeline lies
outside the host's: the report's warning or note says why.

## Why it is slow
Zeroing launches one small kernel per parameter — hundreds per step — and the backward pass
then *adds* into the zeroed buffers (a read-modify-write) instead of writing them. With
`set_to_none=True` the gradients are simply dropped: no kernels at all, and backward writes
fresh gradients. PyTorch 2.0 and later make `set_to_none=True` the default, so this shows
up with older PyTorch, or with `zero_grad(set_to_none=False)` / `model.zero_grad()` called
explicitly.

## Evidence used
- the zero_grad spans in the steps and the zeroing ops inside them;
- the kernels and memsets launched from those spans (their device time) and the device
  idle time during the spans (the host is busy launching them one by one);
- from the facts file, when present: `zero_grad_set_to_none`.

## Example
Before:
```python
optimizer.zero_grad(set_to_none=False)   # or model.zero_grad() on PyTorch < 2.0
```
After:
```python
optimizer.zero_grad(set_to_none=True)    # the default from PyTorch 2.0
```
Code that reads `p.grad` after `zero_grad()` must then expect `None`.

## Fix: `advisor fix` (safe)
```diff
-optimizer.zero_grad(set_to_none=False)
+optimizer.zero_grad(set_to_none=True)
```
Lightning and the `transformers` Trainer zero the gradients themselves (set_to_none by default):
the fix says so instead of editing.

## How the saving is estimated
All of the zero_grad span's cost goes: the device time of the kernels and memsets launched
from it, plus the device idle time inside the span (launch-starved: the host was issuing
one small kernel per parameter). Idle time a pageable copy or an allocator call in the same
window already explains is not counted again. The saved read-modify-write in backward is
not counted.

Reference: https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html#use-parameter-grad-none-instead-of-model-zero-grad-or-optimizer-zero-grad
"""

from __future__ import annotations

from advisor.whatif.changes import remove_launches

import numpy as np
from advisor.metrics.host_device import (
    candidates,
    launches_in_spans,
    per_step,
    zero_grad_memsets,
)

from advisor.engine import Context
from advisor.metrics.source import source_lines

ID = "zero-grad-memset"
TITLE = "zero_grad() zeroes every gradient instead of dropping it"
GROUP = "optimizer"
TESTED_ON = ("nvidia",)  # vendors whose real traces the tests run it on (advisor/metrics/vendors.py)
DOCS = "https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html#use-parameter-grad-none-instead-of-model-zero-grad-or-optimizer-zero-grad"
DEFAULTS = {"min_share": 0.005}
TRAINING_ONLY = True  # gradients and optimizers: silent on inference runs
FIX = "Call optimizer.zero_grad(set_to_none=True) (the default from PyTorch 2.0)."
AFTER = """optimizer.zero_grad(set_to_none=True)
"""


def check(ctx: Context):
    found = candidates(ctx.timeline, zero_grad_memsets)
    if found is None:
        return None
    spans, tl, tree = found
    lk = launches_in_spans(tl, tree, spans["pos"].to_numpy())
    kernel_ns = float(lk["k_dur"].fillna(0).sum()) if len(lk) else 0.0
    idle_ns = float(tl.idle(spans["ts"].to_numpy(np.int64), spans["end"].to_numpy(np.int64)).sum())
    saving = per_step(kernel_ns + idle_ns, tl)
    if saving / ctx.step_ms < ctx.options["min_share"]:
        return None

    set_to_none = ctx.recorded.zero_grad_set_to_none
    evidence = {
        "zero_grad_ms_per_step": round(per_step(spans["dur"].sum(), tl), 3),
        "zeroing_ops_per_step": round(float(spans["zero_ops"].sum()) / tl.n_steps, 1),
        "kernels_per_step": round(len(lk) / tl.n_steps, 1),
        "kernel_ms_per_step": round(per_step(kernel_ns, tl), 3),
        "device_idle_ms_per_step": round(per_step(idle_ns, tl), 3),
        "spans": spans["name"].astype(str).unique().tolist()[:3],
        "steps": tl.step_numbers(spans["ts"].to_numpy(np.int64)),
    }
    if set_to_none is not None:
        evidence["zero_grad_set_to_none"] = set_to_none
    lines = source_lines(ctx.events, spans)
    if lines:
        evidence["source"] = lines
    torch_version = ctx.recorded.versions.torch
    where = f" ({lines[0]})" if lines else ""
    message = (
        f"zero_grad{where} zeroes {evidence['zeroing_ops_per_step']:.0f} gradients per step with "
        f"{evidence['kernels_per_step']:.0f} kernels, {evidence['zero_grad_ms_per_step']:.2f} ms with the GPU idle "
        f"{evidence['device_idle_ms_per_step']:.2f} ms; zero_grad(set_to_none=True) launches none of them."
    )
    if torch_version:
        message += f" (PyTorch {torch_version}.)"
    confidence = "high" if set_to_none is False or set_to_none is None else "medium"
    # The fix, replayed: the zeroing kernels and their launches go, and so does the host time
    # zero_grad spent issuing them.
    change = remove_launches(ctx.events, lk["correlation"].to_numpy(np.int64) if len(lk) else [])
    change.host_remove.append((spans["ts"].to_numpy(np.int64), spans["end"].to_numpy(np.int64), 1.0))
    return ctx.finding(message, saving, confidence=confidence, evidence=evidence, change=change)
