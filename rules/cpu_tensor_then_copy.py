"""Tensors are made on the CPU and then copied to the GPU, every step.

## What it detects
A host→device copy inside a step whose source tensor was made, right before, by a factory
op on the CPU: the `aten::to`/`aten::copy_` that launched the copy directly follows (as the
next op at the same level of the call tree) an `aten::zeros`, `ones`, `empty`, `full`,
`rand`, `randn`, `randint`, `randperm`, `arange`, `linspace`, `eye`, `*_like`, ... that
launched no device work itself, and whose tensor has the copied tensor's size where the
trace records both (an uninitialised `aten::empty` right before a copy is the copy's
destination, not data). It fires when the copies cost at least `min_share` of the step
(0.2% by default).

## What it needs from the trace
Device activity, the host's operators (their nesting on each thread) and the host→device copies
they launched. Without the host's operators nothing names the factory op before a copy, and it
says nothing. It is not run where the launches have no kernel records (the device's activity is
missing); where the host's operators are missing (a device-only trace); where the device's
timeline lies outside the host's; where copy calls have no copy records: the report's warning
or note says why.

## Why it is slow
`torch.zeros(n).to(device)` or `torch.randn(shape).cuda()` fills memory on the CPU, then
pushes the bytes over PCIe from pageable memory: the host blocks in the copy, the device
waits for the copy. Made with `device=` the tensor is filled by one kernel on the GPU
(microseconds) and nothing crosses the link. Data that really comes from the host (a batch,
a Python list) is not flagged: it has to cross anyway (see `h2d-pageable-copy`).

## Evidence used
- the call tree of host ops (nesting rebuilt from the times on each thread): the copy op
  and the factory op just before it, and the user source line when the trace has stacks;
- the copy's device time and the host's wait in the copy call and its stream sync, with the
  device idle time during and after it.

## Example
Before:
```python
noise = torch.randn(x.shape).to(device)
mask = torch.ones(batch, seq_len).cuda()
```
After:
```python
noise = torch.randn(x.shape, device=device)      # or torch.randn_like(x)
mask = torch.ones(batch, seq_len, device=device)
```

## How the saving is estimated
The copies' device time not hidden behind kernels, plus the host's wait in the copy calls
measured like `h2d-pageable-copy` (the device idle time while the host was stuck, and the
idle gap after it that the host could have filled). These copies are claimed here, not by
`h2d-pageable-copy`: the fix removes them instead of speeding them up. Making the tensor on
the device costs a fill kernel of a few microseconds, which is not subtracted.

Reference: https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html#create-tensors-directly-on-the-target-device
"""

from __future__ import annotations

import numpy as np
from advisor.metrics.host_device import (
    device_exposed_fraction,
    h2d_copies,
    op_tree_of,
    per_step,
)

from advisor.engine import Context
from advisor.metrics.source import source_lines

ID = "cpu-tensor-then-copy"
TITLE = "Tensors are made on the CPU and copied to the GPU each step"
GROUP = "transfer"
TESTED_ON = ("nvidia", "amd", "cpu")  # vendors whose real traces the tests run it on (advisor/metrics/vendors.py)
DOCS = "https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html#create-tensors-directly-on-the-target-device"
DEFAULTS = {"min_share": 0.002}
FIX = "Create the tensor on the GPU: pass device= to the factory (torch.zeros(..., device=device)) or use *_like(x)."
AFTER = """noise = torch.randn(x.shape, device=device)     # or torch.randn_like(x)
mask = torch.ones(batch, seq_len, device=device)
"""


def check(ctx: Context):
    m = ctx.metrics
    if not m.has_device or ctx.step_ms <= 0:
        return None
    tl = ctx.timeline
    tree = op_tree_of(ctx.metrics)
    copies = h2d_copies(tl, tree)
    made = copies[copies["cpu_made"]]
    if len(made) == 0:
        return None
    exposed = device_exposed_fraction(tl, made["ts"].to_numpy(np.int64), made["end"].to_numpy(np.int64))
    copy_ns = (made["dur"].to_numpy(np.float64) * exposed).sum()
    block = tl.blocking_cost(made["call_ts"].to_numpy(np.int64), made["block_end"].to_numpy(np.int64))
    saving = per_step(copy_ns + block["cost"].sum(), tl)
    if saving / ctx.step_ms < ctx.options["min_share"]:
        return None

    factories = made["factory_op"].value_counts()
    factory_rows = tree.ops.iloc[made["factory_pos"].to_numpy()]
    evidence = {
        "copies_per_step": round(len(made) / tl.n_steps, 2),
        "mb_per_step": round(float(np.nansum(made["bytes"].to_numpy())) / tl.n_steps / 1e6, 3),
        "factories": {str(k): int(v) for k, v in factories.items()},
        "copy_ms_per_step": round(per_step(made["dur"].sum(), tl), 3),
        "host_blocked_ms_per_step": round(per_step((made["block_end"] - made["call_ts"]).sum(), tl), 3),
        "copy_kinds": made["name"].astype(str).value_counts().to_dict(),
        "steps": tl.step_numbers(made["ts"].to_numpy(np.int64)),
    }
    lines = source_lines(ctx.events, factory_rows)
    if not lines:
        lines = source_lines(ctx.events, tree.ops.iloc[made["copy_op"].to_numpy()])
    if lines:
        evidence["source"] = lines
    top = str(factories.index[0])
    where = f" at {lines[0]}" if lines else ""
    message = (
        f"{evidence['copies_per_step']:g} tensors/step are made on the CPU ({top}{where}) and then copied to the GPU "
        f"({evidence['mb_per_step']:.2f} MB, host blocked {evidence['host_blocked_ms_per_step']:.2f} ms); "
        "create them with device= and the copies go."
    )
    fix = f"Pass device= to torch.{top.removeprefix('aten::')}(...) instead of making the tensor on the CPU and copying it."
    return ctx.finding(message, saving, confidence="high" if lines else "medium", evidence=evidence, fix=fix)
