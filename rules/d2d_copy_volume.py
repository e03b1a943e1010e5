"""Device-to-device copies that the code could avoid.

## What it detects
Copies from device memory to device memory inside the steps: `Memcpy DtoD` rows, and the
copy kernels of `aten::copy_` and `aten::cat` (a `.contiguous()`, a dtype conversion, a
concatenation run as kernels, not as memcpy). Each copy is traced back to the op or range
that asked for it, and the causes are named with their fix:

| cause (op or range around the copy) | fix |
| --- | --- |
| `torch.distributed.ddp.reducer::copy_bucket_to_grad` | `DDP(..., gradient_as_bucket_view=True)`: gradients live in the buckets, nothing is copied back |
| `DistributedDataParallel.forward` (buffer broadcast) | `DDP(..., broadcast_buffers=False)` when the ranks may keep their own BatchNorm statistics |
| `aten::contiguous` | keep tensors in the layout the next op wants (no `.transpose()`/`.permute()` then `.contiguous()` in the loop) |
| `aten::cat`, `aten::stack` | write into slices of one preallocated tensor instead of concatenating every step |
| `aten::_to_copy` (`.to(dtype)`, `.float()`, `.half()`) | convert once outside the loop, or let autocast choose the dtype per op |
| `aten::clone` | drop the clone, or clone only what is modified in place |

It fires when the avoidable copy time is at least `min_share` (0.5%) of the step.

## What it needs from the trace
Device activity (device-to-device copy records and copy kernels) and the host's operators,
whose call tree names the cause of each copy. Without the host's operators it says nothing. It
is not run where the launches have no kernel records (the device's activity is missing); where
the host's operators are missing (a device-only trace); where the device's timeline lies
outside the host's; where copy calls have no copy records: the report's warning or note says
why.

## Why it is slow
A device copy reads and writes every byte through device memory: at best half the memory
bandwidth of the chip goes to moving data that already exists, and every copy is one more
launch from the host (a `cudaMemcpyAsync` or a kernel, several microseconds each). Hundreds of
small copies per step cost more in launches than in bytes. Most of them come from a few
habits or defaults that have a one-line fix.

## Evidence used
- the device-to-device memcpy rows and the copy kernels in the steps, with their bytes
  (memcpy rows) and device time;
- the runtime call that launched each one, and the chain of ops open on that thread at the
  time (the op tree), which names the cause;
- the share of each copy's device time not overlapped by compute kernels;
- the user's source lines behind the copies, when stacks were recorded.

## Example
Before:
```python
model = DDP(model, device_ids=[rank])
```
After:
```python
model = DDP(model, device_ids=[rank], gradient_as_bucket_view=True)
```

## How the saving is estimated
Per step, the device time of the copies whose cause is in the table, times the share of
each copy not overlapped by compute kernels: removing a copy removes its device time, and the
host launch it costs is left out (conservative). Copies with no known cause are listed in
the evidence but not counted. Medium confidence: a copy in the table can be necessary
(buffers that must stay in sync across ranks).

Reference: https://pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
from advisor.metrics.breakdown import text_of
from advisor.metrics.host_device import device_exposed_fraction, op_tree_of, per_step, rank_copy_launches
from advisor.metrics.events import rank_events

from advisor.engine import Context
from advisor.metrics.source import source_lines

ID = "d2d-copy-volume"
TITLE = "Avoidable device-to-device copies"
GROUP = "transfer"
TESTED_ON = ("nvidia",)  # vendors whose real traces the tests run it on (advisor/metrics/vendors.py)
DOCS = "https://pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html"
DEFAULTS = {"min_share": 0.005}
FIX = "Remove the copies at their cause (see the causes in the evidence)."
COPY_KERNEL_OPS = re.compile(r"^aten::(copy_|cat|_cat)$")
# Ordered: the innermost op or range of the copy's chain that matches names its cause.
COPY_CAUSES: list[tuple[re.Pattern, str, str, str]] = [
    (re.compile(r"reducer::copy_bucket_to_grad"), "DDP copies each gradient bucket back into .grad",
     "DDP(model, gradient_as_bucket_view=True): gradients become views of the buckets, nothing is copied back.",
     "model = DDP(model, device_ids=[rank], gradient_as_bucket_view=True)"),
    (re.compile(r"^DistributedDataParallel\.forward$"), "DDP broadcasts the module buffers (BatchNorm statistics) every forward",
     "DDP(model, broadcast_buffers=False) when the ranks may keep their own buffers (or sync them less often).",
     "model = DDP(model, device_ids=[rank], broadcast_buffers=False)"),
    (re.compile(r"^aten::contiguous$"), ".contiguous() on a transposed/permuted view",
     "Keep tensors in the layout the next op wants instead of .permute()/.transpose() then .contiguous() every step.",
     "x = x.permute(0, 2, 3, 1)   # and let the consumer take this layout, no .contiguous()"),
    (re.compile(r"^aten::(cat|_cat|stack)$"), "torch.cat / torch.stack copy every input",
     "Preallocate the result once and write into its slices instead of concatenating every step.",
     "out = torch.empty(total, dim, device=device)   # once\nout[start:end].copy_(part)               # per piece"),
    (re.compile(r"^aten::_to_copy$"), "dtype conversions on the device (.to(dtype), .float(), .half())",
     "Convert once outside the loop, or let autocast pick the dtype per op.",
     "with torch.autocast('cuda', dtype=torch.bfloat16):\n    loss = criterion(model(x), y)"),
    (re.compile(r"^aten::clone$"), ".clone()",
     "Drop the clone, or clone only the tensor that is modified in place.",
     ""),
]

DIRECT_ONLY = 1  # the DDP forward range: see d2d_copies


def d2d_copies(m, tree) -> pd.DataFrame:
    """Device-to-device copies in the profiled steps, each with its cause (index into COPY_CAUSES, -1 if none).

    Columns: ts, end, dur, bytes (NaN for kernels), kind (memcpy/kernel), op (position of the
    innermost host op around the launch in `tree`, -1 if lost), cause, label.
    """
    memcpy = rank_copy_launches(m, "DtoD")
    rows = [pd.DataFrame({
        "ts": memcpy["ts"].to_numpy(np.int64), "end": memcpy["end"].to_numpy(np.int64),
        "dur": memcpy["dur"].to_numpy(np.int64), "bytes": memcpy["bytes"].to_numpy(np.float64),
        "kind": "memcpy", "call_ts": memcpy["call_ts"].to_numpy(np.float64), "call_tid": text_of(memcpy["call_tid"]),
    })]
    launches = m.launches
    kernels = launches[(launches["kind"] == "kernel")]
    if len(kernels):
        dev = rank_events(m).device
        rows.append(pd.DataFrame({
            "ts": kernels["ts"].to_numpy(np.int64), "end": kernels["end"].to_numpy(np.int64),
            "dur": dev["dur"].to_numpy(np.int64)[kernels["device_row"].to_numpy()],
            "bytes": np.nan, "kind": "kernel", "call_ts": kernels["launch_ts"].to_numpy(np.float64),
            "call_tid": text_of(kernels["launch_tid"]),
        }))
    c = pd.concat(rows, ignore_index=True)
    c = c[np.isfinite(c["call_ts"].to_numpy())].reset_index(drop=True)
    steps_s = m.steps["start"].to_numpy(np.int64)
    steps_e = m.steps["end"].to_numpy(np.int64)
    ts = c["ts"].to_numpy(np.int64)
    idx = np.searchsorted(steps_s, ts, side="right") - 1
    c = c[(idx >= 0) & (ts < steps_e[np.clip(idx, 0, None)])].reset_index(drop=True)
    op = tree.innermost(c["call_ts"].to_numpy(np.int64), c["call_tid"].to_numpy())
    c["op"] = op
    # Kernels count only when the op that launched them is a copy or a concatenation.
    copy_op = np.zeros(len(tree.ops) + 1, dtype=bool)
    copy_op[:-1] = tree.mask(COPY_KERNEL_OPS)
    c = c[(c["kind"] == "memcpy").to_numpy() | copy_op[op]].reset_index(drop=True)
    # The nearest matching op or range names the cause. The DDP forward range holds the whole
    # model's forward: it is the cause only of copies made directly in it (the buffer broadcast).
    cause = np.full(len(c), -1, dtype=np.int64)
    best_depth = np.full(len(c), -1, dtype=np.int64)
    pos = c["op"].to_numpy()
    parent_of = np.where(pos >= 0, tree.parent[np.clip(pos, 0, None)], -1)
    for i, (pattern, *_rest) in enumerate(COPY_CAUSES):
        hit = tree.nearest_ancestor(pos, tree.mask(pattern))
        if i == DIRECT_ONLY:
            hit = np.where(hit == parent_of, hit, -1)
        depth = np.where(hit >= 0, tree.depth[np.clip(hit, 0, None)], -1)
        better = (hit >= 0) & (depth > best_depth)
        cause = np.where(better, i, cause)
        best_depth = np.where(better, depth, best_depth)
    c["cause"] = cause
    names = text_of(tree.ops["name"])
    c["label"] = np.where(cause >= 0, [COPY_CAUSES[i][1] if i >= 0 else "" for i in cause],
                          [names[p] if p >= 0 else "unknown op" for p in pos])
    return c


def check(ctx: Context):
    m = ctx.metrics
    if not m.has_device or ctx.step_ms <= 0 or len(m.steps) == 0:
        return None
    tree = op_tree_of(m)
    if len(tree.ops) == 0:  # no host operator recorded: nothing says which op made a copy
        return None
    copies = d2d_copies(m, tree)
    if len(copies) == 0:
        return None
    tl = ctx.timeline
    exposed = device_exposed_fraction(tl, copies["ts"].to_numpy(np.int64), copies["end"].to_numpy(np.int64))
    cost = copies["dur"].to_numpy(np.float64) * exposed
    known = (copies["cause"] >= 0).to_numpy()
    saving = per_step(float(cost[known].sum()), tl)
    if saving / ctx.step_ms < ctx.options["min_share"]:
        return None
    n = tl.n_steps
    copies["cost"] = cost
    groups = (
        copies.groupby("label", sort=False)
        .agg(copies=("dur", "size"), bytes=("bytes", "sum"), ms=("dur", "sum"), cost=("cost", "sum"), cause=("cause", "first"))
        .sort_values("cost", ascending=False)
    )
    causes = [
        {
            "cause": label,
            "copies_per_step": round(g.copies / n, 1),
            "mb_per_step": round(g.bytes / n / 1e6, 3),
            "ms_per_step": round(g.ms / n / 1e6, 3),
            "fix": COPY_CAUSES[int(g.cause)][2] if g.cause >= 0 else None,
        }
        for label, g in groups.iterrows()
    ]
    evidence = {
        "copies_per_step": round(len(copies) / n, 1),
        "mb_per_step": round(float(np.nansum(copies["bytes"].to_numpy())) / n / 1e6, 3),
        "copy_ms_per_step": round(per_step(float(copies["dur"].sum()), tl), 3),
        "avoidable_ms_per_step": round(saving, 3),
        "causes": causes,
        "steps": tl.step_numbers(copies["ts"].to_numpy(np.int64)),
    }
    ops = copies["op"].to_numpy()
    lines = source_lines(ctx.events, tree.ops.iloc[ops[known & (ops >= 0)]]) if (known & (ops >= 0)).any() else []
    if lines:
        evidence["source"] = lines
    named = [c for c in causes if c["fix"]]
    parts = [f"{c['copies_per_step']:g}/step: {c['cause']} ({c['mb_per_step']:.1f} MB, {c['ms_per_step']:.2f} ms)" for c in named[:3]]
    message = (
        f"{evidence['copies_per_step']:g} device-to-device copies per step ({evidence['mb_per_step']:.1f} MB, "
        f"{evidence['copy_ms_per_step']:.2f} ms of device time): " + "; ".join(parts) + ". Removing them takes their device time off the step."
    )
    fix = " ".join(c["fix"] for c in named)
    snippet = "\n".join(dict.fromkeys(COPY_CAUSES[int(g.cause)][3] for _, g in groups.iterrows() if g.cause >= 0 and COPY_CAUSES[int(g.cause)][3]))
    return ctx.finding(message, saving, confidence="medium", evidence=evidence, fix=fix, snippet=snippet)
