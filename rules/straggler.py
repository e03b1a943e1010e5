"""One rank holds the job back: the others wait for it in every collective.

## What it detects
A distributed job whose ranks spend different amounts of time in their collectives (NCCL
all-reduce, all-gather, reduce-scatter, send/recv, ...) step after step, because one rank
(or a few) arrives late and the others wait inside the collective for it. It names that rank,
the wait it costs the job per step, and what the rank does differently from the others:
more kernel time (more work, or the same kernels running slower: a slower or throttled
device), more host time between kernels (CPU work, host stalls), more time waiting for the
DataLoader, more copies. It fires when the wait the named ranks cause is at least
`min_share` (a float, 0.02) of the job's step. It needs two ranks or more, each with
collective kernels in its trace.

## What it needs from the trace
Two ranks' traces or more of one job, with collective kernels in their steps. A single trace,
or ranks without collective kernels, gets nothing from it. It is not run where the launches
have no kernel records (the device's activity is missing); where the host's operators are
missing (a device-only trace); where the device's timeline lies outside the host's; where
launched work waited with nothing recorded on the device; on a window whose every step holds
first-call work (a single cold pass): the report's warning or note says why.

## Why it is slow
A collective ends only when every rank has joined it, so a synchronous job runs at the pace of
its slowest rank in every step: one rank with a slower GPU, a busier host, a DataLoader that
falls behind, or a larger share of the work (uneven batches, sequence lengths, a model split
into unequal pipeline stages) makes every other rank idle for the difference. Per-rank views
hide it: the fast ranks look communication-bound (their collectives are long), and the slow
rank looks healthy.

## Evidence used
- per rank and step, the time in collective kernels (durations only: each trace has its own
  clock, so start times are never compared across ranks);
- the rank with the least collective time in a step arrived last; the others' excess is
  their wait for it (`advisor report --format json` lists each rank's wait and overlap;
  `advisor report --collectives` lists each collective kind's time and bus bandwidth, and each
  rank's lag and wait per collective, the clocks aligned on the collectives' ends);
- the straggler's step-time breakdown, compute-kernel count and kernel time against the
  median of the other ranks, and the device each rank names.

## Example
Before:
```python
sampler = DistributedSampler(dataset)                  # ranks may get uneven work per step
loader = DataLoader(dataset, batch_size=64, sampler=sampler, num_workers=2)
```
After:
```python
sampler = DistributedSampler(dataset, drop_last=True)  # the same amount of work on every rank
loader = DataLoader(dataset, batch_size=64, sampler=sampler, num_workers=8,
                    pin_memory=True, persistent_workers=True)
```
For a slower or throttled device the fix is outside the script: check the rank's GPU clocks,
temperature and power limit, and its PCIe/NVLink placement, or exclude the node.

## How the saving is estimated
Per step, the job loses to its last rank the difference between the least and the
second-least collective time: had the last rank arrived with the next-to-last, every
collective would have ended that much sooner. The saving is that loss, averaged over the steps
every rank recorded, summed over the named ranks: the top one, and any other whose loss is at
least `min_rank_share` (a float, 0.5) of the top one's. Comparing step totals (not single collectives)
keeps pipeline send/recv, which pairs ranks rather than syncing them all, from being counted
as waits. Confidence is medium: a rank that arrives last through no fault of its own (its
input arrived late from a previous pipeline stage) is named too.

Reference: https://pytorch.org/docs/stable/notes/ddp.html#internal-design
"""

from __future__ import annotations

import numpy as np

from advisor.engine import JobContext
from advisor.metrics.one_time import had_one_time_work

ID = "straggler"
TITLE = "A slow rank makes the others wait in their collectives"
GROUP = "distributed"
TESTED_ON = ("nvidia", "cpu")  # vendors whose real traces the tests run it on (advisor/metrics/vendors.py)
DOCS = "https://pytorch.org/docs/stable/notes/ddp.html#internal-design"
SCOPE = "job"
DEFAULTS = {"min_share": 0.02, "min_rank_share": 0.5}
FIX = "Give every rank the same work per step; find why this rank is slower (see the evidence) and fix that rank, not the collectives."
AFTER = """sampler = DistributedSampler(dataset, drop_last=True)   # equal shards: the same work on every rank
"""
INPUT_FIX = "Feed this rank as fast as the others: more DataLoader workers, pinned memory, input files on local storage."
INPUT_AFTER = """loader = DataLoader(dataset, batch_size=64, sampler=sampler, num_workers=8,
                    pin_memory=True, persistent_workers=True)
"""
# What a rank can do differently, as (label, breakdown categories).
CAUSES_OF_DELAY = (
    ("kernel time", ("kernel",)),
    ("host time between kernels (CPU work, host stalls)", ("cpu_exec", "runtime", "other")),
    ("waiting for the DataLoader", ("dataloader",)),
    ("copies", ("memcpy", "memset")),
)


def _per_step_ms(m, steps: np.ndarray, columns) -> float:
    b = m.breakdown.reindex(steps)
    return float(b[list(columns)].sum(axis=1).mean() / 1e6)


def _compute(m, steps: np.ndarray) -> tuple[float, float]:
    """(compute kernels per step, their ms per step) over the given steps."""
    c = m.comm.compute.set_index("step").reindex(steps)
    return float(c["kernels"].mean()), float(c["kernel_ns"].mean() / 1e6)


def check(ctx: JobContext):
    w = ctx.waits
    step_ms = ctx.step_ms
    if w is None or step_ms <= 0:
        return None
    caused = w.mean_caused_ms()
    order = np.argsort(-caused, kind="stable")
    top = caused[order[0]]
    if top <= 0:
        return None
    named = [int(i) for i in order if caused[i] > 0 and caused[i] >= ctx.options["min_rank_share"] * top]
    saving = float(caused[named].sum())
    if saving / step_ms < ctx.options["min_share"]:
        return None

    lead = named[0]
    rank = w.ranks[lead]
    m = ctx.metrics_of(rank)
    if len(w.steps) <= 1 and had_one_time_work(m):
        # one pass, and the late rank did work there that it does once (a library loaded, a
        # context made): the others waited for its cold start, not for a slower rank
        return None
    others = [ctx.metrics_of(r) for i, r in enumerate(w.ranks) if i not in named]
    steps = w.steps
    differences = {}
    for label, cols in CAUSES_OF_DELAY:
        mine = _per_step_ms(m, steps, cols)
        typical = float(np.median([_per_step_ms(o, steps, cols) for o in others])) if others else mine
        differences[label] = round(mine - typical, 3)
    kernels, kernel_ms = _compute(m, steps)
    typical_kernels = float(np.median([_compute(o, steps)[0] for o in others])) if others else kernels
    typical_kernel_ms = float(np.median([_compute(o, steps)[1] for o in others])) if others else kernel_ms
    main_label, main_ms = max(differences.items(), key=lambda kv: kv[1])

    devices = {o.device.name for o in others if o.device.name}
    other_device = m.device.name is not None and devices and m.device.name not in devices
    why = ""
    fix = FIX
    snippet = AFTER
    if other_device:
        why = f"; it runs on a different device ({m.device.name}, the others on {', '.join(sorted(devices))})"
        fix = "Run the job on identical devices, or give the slower device less work (a smaller share of the batch)."
        snippet = ""
    elif main_ms > 0 and main_label == "kernel time":
        if abs(kernels - typical_kernels) <= 0.02 * max(typical_kernels, 1) and kernel_ms > 1.03 * typical_kernel_ms:
            why = (
                f"; it runs as many kernels ({kernels:.0f} per step) as the others but they take "
                f"{kernel_ms - typical_kernel_ms:.1f} ms longer ({kernel_ms / max(typical_kernel_ms, 1e-9) - 1:.0%}): a slower or throttled device"
            )
            fix = "The same work runs slower on this rank's device: check its clocks, temperature and power limit (nvidia-smi -q -d CLOCK,PERFORMANCE) and its PCIe/NVLink placement, or leave the node out."
            snippet = ""
        else:
            why = (
                f"; it spends {main_ms:.1f} ms more per step in kernels than the median rank "
                f"({kernels:.0f} compute kernels per step against {typical_kernels:.0f}): it has more work (uneven batches or sequence lengths, unequal pipeline stages)"
            )
    elif main_ms > 0:
        why = f"; it spends {main_ms:.1f} ms more per step than the median rank {main_label}"
        if main_label.startswith("waiting for the DataLoader"):
            fix, snippet = INPUT_FIX, INPUT_AFTER

    waits = w.mean_wait_ms()
    other_rows = [i for i in range(len(w.ranks)) if i not in named]
    others_wait = float(np.median(waits[other_rows])) if other_rows else 0.0
    who = f"Rank {rank}" if len(named) == 1 else "Ranks " + ", ".join(str(w.ranks[i]) for i in named)
    message = (
        f"{who} {'arrives' if len(named) == 1 else 'arrive'} last at the collectives: the job waits {saving:.1f} ms per step for "
        f"{'it' if len(named) == 1 else 'them'} ({saving / step_ms:.1%} of the {step_ms:.1f} ms step; the other ranks wait "
        f"{others_wait:.1f} ms per step in their collectives){why}. `advisor report --collectives` lists each rank's lag and wait per "
        "collective, and each collective's bus bandwidth."
    )
    evidence = {
        "straggler_ranks": [w.ranks[i] for i in named],
        "wait_caused_ms_per_step": {w.ranks[i]: round(float(caused[i]), 3) for i in named},
        "other_ranks_wait_ms_per_step": round(others_wait, 3),
        "steps_compared": int(len(steps)),
        "collective_ms_per_step": {w.ranks[i]: round(float(w.collective[i].mean() / 1e6), 3) for i in range(len(w.ranks))} if len(w.ranks) <= 16 else None,
        "more_than_median_rank_ms_per_step": differences,
        "compute_kernels_per_step": {"straggler": round(kernels, 1), "median_rank": round(typical_kernels, 1)},
        "compute_kernel_ms_per_step": {"straggler": round(kernel_ms, 3), "median_rank": round(typical_kernel_ms, 3)},
        "see": "advisor report --collectives",
    }
    if evidence["collective_ms_per_step"] is None:
        del evidence["collective_ms_per_step"]
    if m.device.name:
        evidence["device"] = m.device.name
    return ctx.finding(message, saving, rank=rank, confidence="medium", evidence=evidence, fix=fix, snippet=snippet)

