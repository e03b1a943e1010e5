"""Copying the batch to the GPU takes a real share of the step, even pinned.

## What it detects
Host→device copies of at least 256 KiB inside the steps whose time — as it would be with
pinned memory, and only where no kernel runs alongside — is at least `min_share` of the step
(3% by default), for tensors that are not already 1 or 2 bytes per element.

## What it needs from the trace
Device activity: the host→device copy records with their bytes. The copied tensor's element
size comes from the copy op's input shapes (`record_shapes=True`); without them the element
size is unknown and the finding says so. A run without such copies gets nothing from it. It is
not run where the launches have no kernel records (the device's activity is missing); where the
host's operators are missing (a device-only trace); where the device's timeline lies outside
the host's; where copy calls have no copy records: the report's warning or note says why.

## Why it is slow
The link between host and GPU (PCIe) is one to two orders of magnitude slower than GPU
memory. Images decoded to `float32` on the host are four times the bytes of the `uint8`
pixels they came from; `float64`/`int64` tensors are twice what `float32`/`int32` need. Every
extra byte crosses the slowest link of the machine each step. Converting and normalising on
the GPU costs microseconds there.

## Evidence used
- the host→device copies in the steps: bytes, device time, the part not overlapped by
  kernels;
- the element size of the copied tensor: bytes divided by the element count of the
  `aten::to`/`aten::copy_` input shape (recorded with `record_shapes=True`);
- the pinned bandwidth (see `h2d-pageable-copy`).

## Example
Before:
```python
transform = T.Compose([T.ToTensor(), T.Normalize(mean, std)])   # float32 on the host
for x, y in loader:
    x = x.to(device, non_blocking=True)
```
After:
```python
transform = T.PILToTensor()                                      # uint8 on the host
mean = torch.tensor(mean, device=device).view(1, 3, 1, 1) * 255
std = torch.tensor(std, device=device).view(1, 3, 1, 1) * 255
for x, y in loader:
    x = x.to(device, non_blocking=True).float().sub_(mean).div_(std)
```

## How the saving is estimated
Not counted twice with `h2d-pageable-copy`: the copy time used here is what remains after
pinning (bytes ÷ pinned bandwidth for pageable copies, the measured time for pinned ones),
times the share of the copy no kernel overlaps. Sending the compact type removes the
proportional part of it: three quarters for 4-byte image tensors sent as `uint8` (four
dimensions with 1, 3 or 4 channels), half for 8-byte tensors sent as 4-byte ones and for
other 4-byte tensors sent as 16-bit. When the trace has no shapes the element size is
unknown: the estimate then assumes the 2× case and says so, at low confidence.

Reference: https://pytorch.org/vision/stable/transforms.html#performance-considerations
"""

from __future__ import annotations

from advisor.whatif.changes import device_rows_of, scale_device

import numpy as np
import pandas as pd
from advisor.metrics.host_device import (
    BANDWIDTH_BOUND_BYTES,
    device_exposed_fraction,
    first_input_shape,
    h2d_copies,
    op_tree_of,
    per_step,
    pinned_bandwidth,
)

from advisor.engine import Context
from advisor.metrics.source import source_lines

ID = "h2d-copy-volume"
TITLE = "Too many bytes cross to the GPU each step"
GROUP = "transfer"
TESTED_ON = ("nvidia", "cpu")  # vendors whose real traces the tests run it on (advisor/metrics/vendors.py)
DOCS = "https://pytorch.org/vision/stable/transforms.html#performance-considerations"
DEFAULTS = {"min_share": 0.03}
FIX = "Send compact types to the GPU (uint8 images, int32/float32 instead of 64-bit) and convert/normalise there."
AFTER = """transform = T.PILToTensor()                     # keep uint8 on the host
mean = torch.tensor(MEAN, device=device).view(1, 3, 1, 1) * 255
std = torch.tensor(STD, device=device).view(1, 3, 1, 1) * 255
for x, y in loader:
    x = x.to(device, non_blocking=True).float().sub_(mean).div_(std)
"""


def _shrink(elem_bytes: float, shape: list[int] | None) -> tuple[float, str]:
    """(factor the bytes shrink by, what to send instead) for one copied tensor."""
    if not np.isfinite(elem_bytes):
        return 2.0, "a 16-bit or 8-bit type (element size unknown: no shapes in the trace)"
    e = int(round(elem_bytes))
    image = shape is not None and len(shape) == 4 and (shape[1] in (1, 3, 4) or shape[-1] in (1, 3, 4))
    if e == 4 and image:
        return 4.0, "uint8 pixels (4-byte image tensor)"
    if e == 8:
        return 2.0, "4-byte values (float32/int32 instead of float64/int64)"
    if e == 4:
        return 2.0, "16-bit values (bfloat16/float16) or uint8 if the data is quantised"
    return 1.0, ""


def check(ctx: Context):
    m = ctx.metrics
    if not m.has_device or ctx.step_ms <= 0:
        return None
    tl = ctx.timeline
    tree = op_tree_of(ctx.metrics)
    copies = h2d_copies(tl, tree)
    big = copies[(copies["bytes"] >= BANDWIDTH_BOUND_BYTES) & ~copies["cpu_made"]].reset_index(drop=True)
    if len(big) == 0:
        return None
    pinned_gbps, bw_source = pinned_bandwidth(m, copies)
    size = big["bytes"].to_numpy(np.float64)
    dur = big["dur"].to_numpy(np.float64)
    pageable = (big["copy_src"] == "Pageable").to_numpy()
    after_pinning = np.where(pageable, np.minimum(size / pinned_gbps, dur), dur)
    exposed = device_exposed_fraction(tl, big["ts"].to_numpy(np.int64), big["end"].to_numpy(np.int64))
    cost = after_pinning * exposed
    share = per_step(cost.sum(), tl) / ctx.step_ms
    if share < ctx.options["min_share"]:
        return None

    elem = size / big["numel"].to_numpy(np.float64)
    shapes = [first_input_shape(tree, int(p)) for p in big["copy_op"].to_numpy()]
    plans = [_shrink(e, s) for e, s in zip(elem, shapes, strict=True)]
    factor = np.array([p[0] for p in plans])
    saving_ns = (cost * (1.0 - 1.0 / factor)).sum()
    saving = per_step(saving_ns, tl)
    if saving <= 0:
        return None
    # Describe the largest copy (it carries the advice).
    top = int(np.argmax(cost * (1.0 - 1.0 / factor)))
    known = bool(np.isfinite(elem[top]))
    evidence = {
        "copies_per_step": round(len(big) / tl.n_steps, 2),
        "mb_per_step": round(size.sum() / tl.n_steps / 1e6, 2),
        "copy_ms_per_step_after_pinning": round(per_step(cost.sum(), tl), 3),
        "share_of_step": round(share, 4),
        "pinned_gbps_assumed": round(pinned_gbps, 1),
        "pinned_gbps_source": bw_source,
        "largest_copy": {
            "bytes": int(size[top]),
            "shape": shapes[top],
            "bytes_per_element": round(float(elem[top]), 2) if known else None,
            "send_instead": plans[top][1],
        },
        "steps": tl.step_numbers(big["ts"].to_numpy(np.int64)),
    }
    ops = big["copy_op"].to_numpy()
    lines = source_lines(ctx.events, tree.ops.iloc[ops[ops >= 0]]) if (ops >= 0).any() else []
    if lines:
        evidence["source"] = lines
    what = plans[top][1] or "a compact type"
    message = (
        f"{evidence['mb_per_step']:.1f} MB/step cross host→device, {per_step(cost.sum(), tl):.2f} ms/step even pinned "
        f"({100 * share:.1f}% of the step); send {what} and convert on the GPU, so fewer bytes cross."
    )
    confidence = "medium" if known else "low"
    # The fix, replayed: each copy moves 1/factor of its bytes (its device time shrinks alike).
    rows = device_rows_of(ctx.events, big["correlation"].to_numpy(np.int64))
    order = pd.Series(1.0 / factor, index=big["correlation"].to_numpy(np.int64))
    per_row = order.groupby(level=0).first().reindex(ctx.events.device["correlation"].to_numpy(np.int64)[rows]).fillna(1.0).to_numpy()
    change = scale_device(rows, per_row)
    return ctx.finding(message, saving, confidence=confidence, evidence=evidence, change=change)
