"""Gradient communication is not hidden behind computation.

## What it detects
Collective kernels (NCCL/RCCL/Gloo: all-reduce, reduce-scatter, all-gather, broadcast,
send/recv; and every communication kernel the kernel taxonomy reads: expert-parallel
all-to-all in Triton or DeepEP, NVSHMEM, symmetric-memory and custom all-reduce) inside the steps that run while no compute kernel runs: the device does nothing
but communicate. It fires when that exposed time, less what cannot be hidden, is at least
`min_share` of the step (5% by default).

## What it needs from the trace
The device's kernel records on every stream: the collective kernels (by name, or launched by a
`nccl:*`/`c10d::*` op) and the compute kernels they could overlap. A trace with no collective
kernel inside the steps (one process, or gloo on the host) gets nothing from it. It is not run
where the launches have no kernel records (the device's activity is missing); where the host's
operators are missing (a device-only trace); where the device's timeline lies outside the
host's; where launched work waited with nothing recorded on the device; on a window whose every
step holds first-call work (a single cold pass): the report's warning or note says why.

## Why it is slow
Data-parallel training exchanges gradients every step. `DistributedDataParallel` splits
them into buckets and all-reduces each bucket as soon as backward has produced it, so the
exchange runs while backward computes the rest. Communication shows up exposed when that
overlap is lost: buckets too large (the first one is ready only late in backward), a manual
all-reduce after `backward()`, gradient accumulation that syncs every micro-batch instead of
the last (`no_sync()`), FSDP without prefetching, or a rank that arrives late so the others
wait inside the collective.

## Evidence used
- the collective kernels (by name, or launched by a `nccl:*`/`c10d::*` op) and the compute
  kernels on all streams, per step;
- the exposed collective time, and the exposed part of each step's last collective (which
  nothing is left to overlap with);
- the collective kinds and the number of ranks.

## Example
Before:
```python
model = DDP(model, device_ids=[rank])
for i, (x, y) in enumerate(loader):
    loss = criterion(model(x), y) / accum
    loss.backward()                        # all-reduces on every micro-batch
    if (i + 1) % accum == 0:
        opt.step(); opt.zero_grad()
```
After:
```python
model = DDP(model, device_ids=[rank], bucket_cap_mb=25, gradient_as_bucket_view=True)
for i, (x, y) in enumerate(loader):
    sync = (i + 1) % accum == 0
    with (contextlib.nullcontext() if sync else model.no_sync()):
        loss = criterion(model(x), y) / accum
        loss.backward()                    # all-reduce only on the last micro-batch
    if sync:
        opt.step(); opt.zero_grad()
```

## The link's bandwidth
Where the collectives carry their message size (the kernel's `In msg nelems` and `dtype`,
recorded by PyTorch 2.x, or the input shapes of the `nccl:*` op around the launch), the rule
reports the bus bandwidth they achieve, computed as the collectives table of `advisor report
--collectives` computes it (one definition, in `advisor.metrics.collectives`): message bytes
(an all-gather's gathered output) over kernel time, times 2(n-1)/n for all-reduce, (n-1)/n for
all-gather, reduce-scatter and all-to-all, 1 for broadcast, reduce and send/recv, as
nccl-tests defines it, n the ranks of each collective's own process group (a tensor-parallel
group of 2 and a data-parallel group of 8 in one job each count with their own). Kernel time includes waiting for the other ranks, so this is a lower
bound. It is set against what the links give between GPUs of the device's generation, as
typical NCCL bus bandwidths: NVLink (V100 ~130, A100 ~230, H100/H200 ~360, B200 ~700 GB/s),
xGMI (MI250 ~150, MI300X ~300 GB/s), PCIe (3: ~10, 4: ~20, 5: ~40 GB/s), InfiniBand (HDR
~23, NDR ~45 GB/s per NIC). Far below the GPU-to-GPU link, the traffic takes a slower path
(PCIe, the network) or waits for a slow rank: the message says so, and which transport to check.
`advisor report --collectives` breaks the collectives down by kind and message size, with
their bus bandwidth against the link's peak and each rank's overlap of communication and
compute.

## How the saving is estimated
Exposed collective time per step (collective kernels minus the time compute kernels run
alongside them), minus the exposed part of the step's last collective: that one follows the
last gradient and can never overlap. The collective time includes waiting for slower ranks;
overlap does not remove that: when `straggler` names the rank the others wait for, its wait
is taken off this saving (it is claimed there). The confidence is medium, and low when most of the exposed
time is point-to-point (send/recv, all-to-all) traffic of model-parallel layers, which
bucketing does not touch.

Reference: https://pytorch.org/docs/stable/notes/ddp.html#internal-design
"""

from __future__ import annotations

import numpy as np
from advisor.metrics.host_device import per_step

from advisor.engine import Context
from advisor.metrics.breakdown import communication_kernels
from advisor.metrics.collectives import collective_calls, group_size_of, process_groups_of
from advisor.metrics.kernels import read_kernel_names
from advisor.metrics.intervals import intersect, merge, subtract

ID = "communication-exposed"
TITLE = "Communication is not overlapped with computation"
GROUP = "distributed"
TESTED_ON = ("nvidia",)  # vendors whose real traces the tests run it on (advisor/metrics/vendors.py)
DOCS = "https://pytorch.org/docs/stable/notes/ddp.html#internal-design"
DEFAULTS = {"min_share": 0.05}
TRAINING_ONLY = True  # gradients and optimizers: silent on inference runs
CAUSES = ("straggler",)
FIX = "Overlap communication with backward: DDP with smaller buckets (bucket_cap_mb), no_sync() for all but the last micro-batch, no manual all-reduce after backward; FSDP with backward_prefetch."
AFTER = """model = DDP(model, device_ids=[rank], bucket_cap_mb=25, gradient_as_bucket_view=True)
for i, (x, y) in enumerate(loader):
    sync = (i + 1) % accum == 0
    with (contextlib.nullcontext() if sync else model.no_sync()):
        loss = criterion(model(x), y) / accum
        loss.backward()
    if sync:
        opt.step(); opt.zero_grad()
"""
POINT_TO_POINT = r"SendRecv|AllToAll|all_to_all|Send|Recv"
# Typical NCCL bus bandwidth (GB/s) between two GPUs of a generation over its fastest link,
# and of the slower paths the traffic may take instead.
GPU_LINK_GBPS = (
    (r"B200|B100|GB200", "NVLink 5", 700.0),
    (r"H100|H200|H800|GH200", "NVLink 4", 360.0),
    (r"A100|A800", "NVLink 3", 230.0),
    (r"V100", "NVLink 2", 130.0),
    (r"MI300", "xGMI", 300.0),
    (r"MI250|MI210", "xGMI", 150.0),
)
PCIE_GBPS = {"NVLink 5": ("PCIe 5", 40.0), "NVLink 4": ("PCIe 5", 40.0), "NVLink 3": ("PCIe 4", 20.0), "NVLink 2": ("PCIe 3", 10.0), "xGMI": ("PCIe 4", 20.0)}
INFINIBAND = "InfiniBand ~23 GB/s (HDR) to ~45 GB/s (NDR) per NIC"


def link_bandwidth(calls, groups: dict[str, int], world: int | None, device_name: str | None) -> dict | None:
    """Achieved bus bandwidth of the collectives (collective_calls) that carry a message size,
    by the collectives table's definitions (advisor.metrics.collectives: each collective's own
    process group size, an all-gather's size its gathered output), against the links of the
    device's generation; None when no collective carries a size."""
    import re

    from advisor.metrics.collectives import collective_bandwidth

    if len(calls) == 0:
        return None
    b = collective_bandwidth(calls, groups, world)
    sized = (np.isfinite(b["bus_bytes"].to_numpy(np.float64)) & (b["n"].to_numpy(np.float64) >= 2) & (b["dur"] > 0).to_numpy())
    if not sized.any():
        return None
    b = b[sized]
    gbps = float(b["bus_bytes"].sum()) / float(b["dur"].sum())  # bytes/ns == GB/s
    by_kind = []
    for (group, kind, n), g in b.groupby([b["group"].fillna(""), "kind", "n"], sort=True):
        by_kind.append({"kind": kind, "group": group or None, "group_size": int(n), "count": int(len(g)),
                        "busbw_gbps": round(float(g["bus_bytes"].sum()) / float(g["dur"].sum()), 3)})
    out = {"bus_gbps": round(gbps, 2), "collectives_sized": int(sized.sum()), "ranks": int(b["n"].max()), "by_kind": by_kind}
    for pattern, link, expect in GPU_LINK_GBPS:
        if device_name and re.search(pattern, device_name):
            pcie, pcie_gbps = PCIE_GBPS[link]
            out.update(link=link, link_gbps=expect, pcie=pcie, pcie_gbps=pcie_gbps)
            break
    return out


def check(ctx: Context):
    m = ctx.metrics
    if not m.has_device or ctx.step_ms <= 0:
        return None
    dev = ctx.events.device
    comm = communication_kernels(ctx.events)
    if not comm.any():
        return None
    tl = ctx.timeline
    is_kernel = (dev["kind"] == "kernel").to_numpy()
    ts, te = dev["ts"].to_numpy(np.int64), dev["end"].to_numpy(np.int64)
    cs, ce = merge(ts[comm], te[comm])
    ks, ke = merge(ts[is_kernel & ~comm], te[is_kernel & ~comm])
    xs, xe = subtract(cs, ce, ks, ke)
    ss, se = merge(tl.step_s, tl.step_e)
    xs, xe = intersect(xs, xe, ss, se)
    if len(xs) == 0:
        return None
    exposed = xe - xs
    step_of = tl.step_index(xs)
    # The last exposed stretch of each step's last collective cannot overlap with anything.
    last_comm_start = np.full(tl.n_steps, -1, dtype=np.int64)
    ci = tl.step_index(cs)
    for i in np.unique(ci[ci >= 0]):
        last_comm_start[i] = cs[ci == i].max()
    in_last = (step_of >= 0) & (xs >= last_comm_start[np.clip(step_of, 0, None)])
    total_ns = float(exposed[step_of >= 0].sum())
    tail_ns = float(exposed[in_last].sum())
    saving = per_step(total_ns - tail_ns, tl)
    if saving / ctx.step_ms < ctx.options["min_share"]:
        return None

    kernels = dev[comm & tl.in_steps(ts)]
    names = kernels["name"].astype(str)
    kinds = names.str.extract(r"ncclKernel_([A-Za-z]+)|nccl[A-Za-z]*?(AllReduce|ReduceScatter|AllGather|Broadcast|SendRecv|AllToAll)", expand=True)
    by_taxonomy = read_kernel_names(kernels["name"])["kind"].str.replace("communication:", "", regex=False)
    kind = kinds[0].fillna(kinds[1]).fillna(by_taxonomy.where(by_taxonomy.ne("other"))).fillna("other")
    p2p_share = float(kernels.loc[names.str.contains(POINT_TO_POINT).to_numpy(), "dur"].sum() / max(kernels["dur"].sum(), 1))
    world = ctx.recorded.world_size or ctx.events.distributed.get("world_size")
    d = ctx.events.distributed
    calls = collective_calls(ctx.events)
    calls = calls[tl.in_steps(calls["start"].to_numpy(np.int64))]
    evidence = {
        "collective_ms_per_step": round(per_step(float((ce - cs)[tl.in_steps(cs)].sum()), tl), 3),
        "exposed_ms_per_step": round(per_step(total_ns, tl), 3),
        "unavoidable_tail_ms_per_step": round(per_step(tail_ns, tl), 3),
        "exposed_share_of_step": round(per_step(total_ns, tl) / ctx.step_ms, 4),
        "collectives": kind.value_counts().to_dict(),
        "point_to_point_share": round(p2p_share, 3),
        "streams": sorted(int(s) for s in kernels["stream"].unique() if s >= 0),
        "steps": tl.step_numbers(xs),
    }
    if world:
        evidence["world_size"] = world
    default = group_size_of(d) or (int(world) if isinstance(world, (int, float)) and not isinstance(world, bool) else None)
    link = link_bandwidth(calls, process_groups_of(d), default, m.device.name)
    confidence = "low" if p2p_share > 0.5 else "medium"
    snippet = AFTER
    if p2p_share > 0.5:
        snippet = ""
        fix = "Most exposed time is send/recv or all-to-all (model-parallel traffic): overlap it with compute (pipeline the next batch's input distribution, as TorchRec's train pipelines do) or check for a slow rank; bucket sizes do not apply."
    else:
        fix = FIX
    message = (
        f"{evidence['exposed_ms_per_step']:.1f} ms/step of collectives run with no compute beside them "
        f"({100 * evidence['exposed_share_of_step']:.0f}% of the step); overlapping all but the last one "
        f"({evidence['unavoidable_tail_ms_per_step']:.1f} ms, which follows the last gradient and cannot overlap) hides the rest behind the backward pass."
    )
    if link is not None:
        evidence["link"] = link
        message += (f" The collectives reach {link['bus_gbps']:.1f} GB/s of bus bandwidth over {link['ranks']} ranks (message bytes over kernel time, waits included; "
                    "`advisor report --collectives` lists them by process group, kind and size)")
        if "link_gbps" in link:
            message += (
                f", where {link['link']} between {m.device.name} GPUs gives about {link['link_gbps']:.0f} GB/s, "
                f"{link['pcie']} about {link['pcie_gbps']:.0f} GB/s and {INFINIBAND}"
            )
            if link["bus_gbps"] < 0.25 * link["link_gbps"]:
                message += (
                    f": at {link['bus_gbps'] / link['link_gbps']:.0%} of {link['link']} the traffic takes a slower path or waits for a rank "
                    "(check the transport with NCCL_DEBUG=INFO and the topology with nvidia-smi topo -m)"
                )
        message += "."
    return ctx.finding(message, saving, confidence=confidence, evidence=evidence, fix=fix, snippet=snippet)
