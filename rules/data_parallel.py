"""nn.DataParallel re-copies the model and the batch across GPUs every step.

## What it detects
`DataParallel.forward` spans (the range `nn.DataParallel` records around each forward) and
the backward nodes of its scatter/broadcast/gather (`BroadcastBackward`,
`ReduceAddCoalescedBackward`, `GatherBackward`, `ScatterBackward`) inside the steps, or
`parallel.data_parallel` in the facts file. A `DistributedDataParallel.forward` is not this.
It fires whenever the trace shows several devices (or the facts say DataParallel is used);
with a single device, where DataParallel only scatters the batch, when the estimated saving
is at least `min_share` of the step (1% by default).

## What it needs from the trace
The `DataParallel.forward` spans or the backward nodes of its collectives in the trace, or
`parallel.data_parallel` in the facts file. Without them it says nothing. It is not run where
the launches have no kernel records (the device's activity is missing); where the host's
operators are missing (a device-only trace): the report's warning or note says why.

## Why it is slow
`DataParallel` is one process driving all GPUs. Every step it scatters the batch from GPU 0,
copies (broadcasts) all parameters and buffers to every other GPU, runs the replicas in
Python threads that contend for the GIL, gathers the outputs back on GPU 0 and, in
backward, sums every gradient onto GPU 0 — all of it on the critical path, with GPU 0 doing
more than the others. `DistributedDataParallel` runs one process per GPU: the model is
copied once at start-up, each process loads its own batch, and gradients are all-reduced in
buckets while backward is still running.

## Evidence used
- the `DataParallel.forward` spans and the backward nodes of its collectives;
- inside them: the device idle time before the first and after the last compute kernel
  (replicate + scatter at the head, gather at the tail) and the copies and collectives
  (broadcast, peer-to-peer copies) not hidden behind compute kernels;
- from the facts file, when present: `parallel.data_parallel`, `parallel.ddp`.

## Example
Before:
```python
model = nn.DataParallel(model).cuda()
```
After:
```python
# launched with: torchrun --nproc_per_node=NUM_GPUS train.py
dist.init_process_group("nccl")
local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
model = DDP(model.cuda(local_rank), device_ids=[local_rank])
loader = DataLoader(dataset, batch_size=per_gpu_batch, sampler=DistributedSampler(dataset))
```

## How the saving is estimated
Per `DataParallel.forward`: the device idle time from the span's start to its first compute
kernel and from its last compute kernel to the span's end, plus the time of copies and
collectives inside the span that no compute kernel overlaps; per backward node of the
scatter/broadcast/gather: its exposed copies and collectives. DDP still all-reduces the
gradients once per step, but overlapped with backward, so that is not subtracted; the GIL
contention of the replica threads is not counted either, so this is a lower bound.

Reference: https://pytorch.org/docs/stable/notes/cuda.html#use-nn-parallel-distributeddataparallel-instead-of-multiprocessing-or-nn-dataparallel
"""

from __future__ import annotations

import numpy as np
from advisor.metrics.host_device import (
    DATA_PARALLEL_SPAN,
    candidates,
    data_parallel_spans,
    per_step,
)

from advisor.engine import Context
from advisor.metrics.breakdown import communication_kernels
from advisor.metrics.intervals import merge, overlap_with, subtract
from advisor.metrics.source import source_lines

ID = "data-parallel"
TITLE = "nn.DataParallel replicates the model every step"
GROUP = "distributed"
TESTED_ON = ("nvidia",)  # vendors whose real traces the tests run it on (advisor/metrics/vendors.py)
DOCS = "https://pytorch.org/docs/stable/notes/cuda.html#use-nn-parallel-distributeddataparallel-instead-of-multiprocessing-or-nn-dataparallel"
DEFAULTS = {"min_share": 0.01}
FIX = "Replace nn.DataParallel with DistributedDataParallel, one process per GPU (torchrun)."
AFTER = """# torchrun --nproc_per_node=NUM_GPUS train.py
dist.init_process_group("nccl")
local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
model = DDP(model.cuda(local_rank), device_ids=[local_rank])
loader = DataLoader(dataset, batch_size=per_gpu_batch, sampler=DistributedSampler(dataset))
"""


def check(ctx: Context):
    found = candidates(ctx.timeline, data_parallel_spans)
    if found is None:
        return None
    spans, tl, tree = found
    dev = ctx.events.device
    comm = communication_kernels(ctx.events)
    is_kernel = (dev["kind"] == "kernel").to_numpy()
    compute = is_kernel & ~comm
    cs, ce = merge(dev["ts"].to_numpy(np.int64)[compute], dev["end"].to_numpy(np.int64)[compute])
    transfer = (dev["kind"] == "memcpy").to_numpy() | comm
    ts_, te_ = merge(dev["ts"].to_numpy(np.int64)[transfer], dev["end"].to_numpy(np.int64)[transfer])
    xs, xe = subtract(ts_, te_, cs, ce)  # transfers no compute kernel hides

    s = spans["ts"].to_numpy(np.int64)
    e = spans["end"].to_numpy(np.int64)
    is_forward = spans["name"].astype(str).str.match(DATA_PARALLEL_SPAN).to_numpy()
    exposed_transfer = overlap_with(xs, xe, s, e).astype(np.float64)
    # Head and tail of each forward: before its first / after its last compute kernel.
    first = np.searchsorted(cs, s, side="left")
    last = np.searchsorted(ce, e, side="right") - 1
    has_compute = (first < len(cs)) & (last >= 0)
    head_end = np.where(has_compute, np.minimum(cs[np.clip(first, 0, max(len(cs) - 1, 0))] if len(cs) else s, e), e)
    tail_start = np.where(has_compute, np.maximum(ce[np.clip(last, 0, None)] if len(ce) else e, s), e)
    head = tl.idle(s, np.maximum(head_end, s))
    tail = np.where(tail_start > head_end, tl.idle(tail_start, e), 0)
    idle_ns = np.where(is_forward, head + tail, 0)
    saving = per_step(idle_ns.sum() + exposed_transfer.sum(), tl)
    devices = sorted(int(d) for d in dev["device"].unique() if d >= 0)
    used_facts = ctx.recorded.parallel.data_parallel
    several = len(devices) > 1 or bool(used_facts)
    if saving <= 0 or (not several and saving / ctx.step_ms < ctx.options["min_share"]):
        return None  # on one device DataParallel only scatters: flag it only if that costs

    peer = dev[(dev["kind"] == "memcpy") & dev["copy_kind"].isin(["PtoP", "DtoD"])]
    evidence = {
        "data_parallel_spans_per_step": round(int(is_forward.sum()) / tl.n_steps, 2),
        "backward_nodes_per_step": round(int((~is_forward).sum()) / tl.n_steps, 2),
        "forward_ms_per_step": round(per_step(e[is_forward].sum() - s[is_forward].sum(), tl), 3),
        "head_tail_idle_ms_per_step": round(per_step(idle_ns.sum(), tl), 3),
        "exposed_copies_and_collectives_ms_per_step": round(per_step(exposed_transfer.sum(), tl), 3),
        "devices_in_trace": devices,
        "device_to_device_copies_per_step": round(len(peer) / tl.n_steps, 1),
        "steps": tl.step_numbers(s),
    }
    if used_facts is not None:
        evidence["facts_data_parallel"] = used_facts
    lines = source_lines(ctx.events, spans)
    if lines:
        evidence["source"] = lines
    message = (
        f"nn.DataParallel spends {evidence['head_tail_idle_ms_per_step']:.2f} ms/step replicating the model and scattering/"
        f"gathering (GPU idle) and {evidence['exposed_copies_and_collectives_ms_per_step']:.2f} ms/step in exposed copies; "
        "DistributedDataParallel (one process per GPU) does neither."
    )
    return ctx.finding(message, saving, confidence="high" if used_facts or len(devices) > 1 else "medium", evidence=evidence)
