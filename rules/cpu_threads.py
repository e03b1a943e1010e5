"""A CPU run computes on fewer intra-op threads than it has cores to spare.

## What it detects
A run with no device activity (the model runs on the CPU) whose facts file records
`torch_threads.intra_op` below the cores the process can use for its ops: the machine's
CPU count per rank (`cpu_count / world_size`), less the DataLoader's worker processes (each
takes a core while it loads). The ops that split their work over the intra-op threads
(convolutions, matrix products, attention, normalisation, and their backward) must take at
least `min_share` (5%) of the step. Without a facts file the thread count is not in the
trace, and the rule stays silent.

## What it needs from the trace
A run with no device activity and the facts file of `advisor profile`: the intra-op thread
count, the CPU count, the world size and the DataLoader's workers. The trace does not record
the thread count: without the facts file it says nothing. It is not run where the host's
operators are missing (a device-only trace): the report's warning or note says why.

## Why it is slow
PyTorch runs each CPU op's inner loops on its intra-op thread pool (OpenMP or the native
pool). With `torch.set_num_threads(1)`, `OMP_NUM_THREADS=1` in the environment (set by some
launchers and job schedulers) or a container's CPU limit read wrongly, one core does all
the arithmetic while the others idle. More threads than free cores is no better: the
threads then fight the DataLoader's workers for the same cores.

## Evidence used
- from the facts file: `torch_threads` (intra-op, inter-op, `OMP_NUM_THREADS`), `cpu_count`,
  `world_size`, the DataLoader's `num_workers`;
- the host time per step inside the ops that run on the intra-op pool (outermost matches of
  convolution, matmul, linear, attention, normalisation ops and their backward).

## Example
Before:
```python
torch.set_num_threads(1)            # or OMP_NUM_THREADS=1 in the job's environment
```
After:
```python
torch.set_num_threads(2)            # the cores left after the DataLoader's workers
```

## How the saving is estimated
The fix is replayed: the host time inside the pooled ops shrinks by 1 - threads/target (the
ops are taken to scale linearly with threads, an upper bound: memory-bound ops and small
tensors scale less), everything else stays. The confidence is medium.

Reference: https://pytorch.org/docs/stable/notes/cpu_threading_torchscript_inference.html
"""

from __future__ import annotations

import re

import numpy as np

from advisor.engine import Context
from advisor.metrics.breakdown import name_matches
from advisor.metrics.intervals import merge
from advisor.metrics.steps import step_of
from advisor.whatif import Change

ID = "cpu-threads"
TITLE = "CPU ops run on fewer threads than the free cores"
GROUP = "host"
TESTED_ON = ("cpu",)  # vendors whose real traces the tests run it on (advisor/metrics/vendors.py)
DOCS = "https://pytorch.org/docs/stable/notes/cpu_threading_torchscript_inference.html"
DEFAULTS = {"min_share": 0.05}
FIX = "Give the intra-op pool the free cores: torch.set_num_threads(N), or OMP_NUM_THREADS=N in the environment."
AFTER = """torch.set_num_threads(N)   # cores per rank, less the DataLoader's workers
"""
POOLED_OP = re.compile(
    r"^aten::(conv\w*|_convolution\w*|mkldnn_convolution\w*|convolution_backward\w*|mm|bmm|addmm|addbmm|baddbmm|matmul|linear|"
    r"_scaled_dot_product\w*|scaled_dot_product\w*|native_batch_norm\w*|native_layer_norm\w*|layer_norm|batch_norm|"
    r"max_pool2d\w*|avg_pool2d\w*|softmax|_softmax\w*|gelu\w*)$"
)


def _int(v) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def check(ctx: Context):
    m = ctx.metrics
    if m.has_device or ctx.step_ms <= 0 or len(m.steps) == 0:
        return None
    threads = _int(ctx.recorded.torch_threads.intra_op)
    cores = _int(ctx.recorded.cpu_count)
    if threads is None or cores is None:
        return None
    world = _int(ctx.recorded.world_size) or 1
    loaders = ctx.recorded.dataloaders or []
    workers = sum(_int(dl.num_workers) or 0 for dl in loaders)
    target = max(1, cores // world - workers)
    if threads >= target:
        return None
    host = ctx.events.host
    ops = host[name_matches(host["name"], POOLED_OP)]
    if len(ops) == 0:
        return None
    s, e = merge(ops["ts"].to_numpy(np.int64), ops["end"].to_numpy(np.int64))  # outermost: nested ops count once
    steps = m.steps
    inside = step_of(steps["start"].to_numpy(np.int64), steps["end"].to_numpy(np.int64), s, e) >= 0
    s, e = s[inside], e[inside]
    pooled_ms = float((e - s).sum()) / 1e6 / len(steps)
    estimate = pooled_ms * (1 - threads / target)
    if estimate / ctx.step_ms < ctx.options["min_share"]:
        return None
    change = Change(host_remove=[(s, e, 1 - threads / target)])
    replayed = ctx.replayed_saving(change)
    saving = replayed if replayed is not None else estimate
    if saving / ctx.step_ms < ctx.options["min_share"]:
        return None
    top = ops.groupby(ops["name"].astype(str))["dur"].sum().sort_values(ascending=False).head(3)
    omp = ctx.recorded.torch_threads.omp_num_threads_env
    evidence = {
        "intra_op_threads": threads,
        "cpu_count": cores,
        "world_size": world,
        "dataloader_workers": workers,
        "target_threads": target,
        "omp_num_threads_env": omp,
        "pooled_ops_ms_per_step": round(pooled_ms, 3),
        "top_pooled_ops": {k: round(float(v) / 1e6 / len(steps), 3) for k, v in top.items()},
        "estimate_ms": round(estimate, 3),
        "steps": steps["step"].tolist(),
    }
    why = f" (OMP_NUM_THREADS={omp} in the environment)" if omp else ""
    loader = f", less {workers} DataLoader worker(s)" if workers else ""
    message = (
        f"The CPU ops run on {threads} intra-op thread(s){why} on a {cores}-core machine{loader}: "
        f"{pooled_ms:.1f} ms/step in ops that split their work over the intra-op pool ({', '.join(top.index[:3])}) could use {target}. "
        f"torch.set_num_threads({target}) spreads them over those cores, replayed with these ops scaling linearly with threads (an upper bound)."
    )
    fix = f"torch.set_num_threads({target}) (or OMP_NUM_THREADS={target}): the cores per rank, less the DataLoader's workers."
    snippet = f"torch.set_num_threads({target})   # {cores} cores / {world} rank(s){loader}\n"
    return ctx.finding(message, saving, confidence="medium", evidence=evidence, fix=fix, snippet=snippet, change=change)
