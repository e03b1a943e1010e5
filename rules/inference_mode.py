"""An inference run computes with autograd recording a graph no backward pass will use.

## What it detects
A CPU run (no device activity) that does not train (no backward op, no optimizer step; the facts file's `mode` when
recorded) whose steps dispatch their ops through autograd with grad mode on: the profiler
gives such an op autograd's sequence number (`Sequence number` in the trace), and the number
goes up by one for every graph node autograd creates. Ops under `torch.inference_mode()` or
`torch.no_grad()` carry none. It fires when the steps create at least `min_nodes` (4) graph
nodes each and the time the fix saves is at least `min_share` (2%) of the step (the
unprofiled step where the facts record one: the saving is unprofiled time).

## What it needs from the trace
A run with no device activity that does not train (no backward op or optimizer step in the
trace; the facts file's `mode` decides where recorded), whose ops carry autograd's `Sequence
number`. Without sequence numbers (older traces) it says nothing. It is not run where the
host's operators are missing (a device-only trace): the report's warning or note says why.

## Why it is slow
With grad mode on, every op on a tensor that requires grad (the model's parameters do)
goes through autograd's kernel first: it creates a graph node, saves the tensors the
backward would need (keeping the activations alive until the output is dropped), and bumps
the tensors' version counters; the graph is torn down again when the output goes. None of
it is used by an inference loop. `torch.inference_mode()` skips all of it (and the autograd
dispatch itself); `torch.no_grad()` skips the graph. On a small batch, where the ops are short,
this bookkeeping is a real share of the latency. `nn.TransformerEncoderLayer` and
`nn.MultiheadAttention` also take their fused inference path only with grad off: that gain
is not counted here.

## Evidence used
- the host ops inside the steps that carry autograd's sequence number, per step: how many,
  and how many graph nodes they created (the rise of the sequence number, per thread);
- the run's mode (training or inference): the facts file's `mode`, else the trace's ops.

## Example
Before:
```python
model.eval()
for batch in loader:
    out = model(batch)
```
After:
```python
model.eval()
with torch.inference_mode():          # no graph, no saved tensors, no version counters
    for batch in loader:
        out = model(batch)
```
Tensors made under `inference_mode` cannot be used later in autograd; where they must be,
`torch.no_grad()` saves the graph's cost too.

## How the saving is estimated
Each graph node costs `node_us` (2.0 µs by default) of host time, unprofiled: creating the
node, saving its tensors and freeing the graph with the output (measured by
`benchmarks/inference_mode_cost.py`; the figures are in `benchmarks/results/rule_constants.md`).
The fix is replayed: the host's work is made shorter by nodes × `node_us` per step, spread
over all of it (the bookkeeping is in every op that goes through autograd, and a fix that
makes the ops' arithmetic faster, such as more threads, leaves it whole). The rule speaks
of runs without device activity only: on a device run the same host time may overlap the
device's work, and `launch-bound` speaks of the host there. The confidence is medium.

Reference: https://pytorch.org/docs/stable/generated/torch.autograd.grad_mode.inference_mode.html
"""

from __future__ import annotations

import numpy as np

from advisor.engine import Context, is_training
from advisor.metrics.intervals import merge
from advisor.metrics.steps import step_of

ID = "inference-mode"
TITLE = "Inference runs with autograd recording a graph"
GROUP = "host"
TESTED_ON = ("amd", "cpu")  # vendors whose real traces the tests run it on (advisor/metrics/vendors.py)
DOCS = "https://pytorch.org/docs/stable/generated/torch.autograd.grad_mode.inference_mode.html"
DEFAULTS = {"min_share": 0.02, "min_nodes": 4, "node_us": 2.0}
FIX = "Run the inference loop under `with torch.inference_mode():` (or torch.no_grad() where its outputs must enter autograd later)."
AFTER = """model.eval()
with torch.inference_mode():          # no graph, no saved tensors, no version counters
    for batch in loader:
        out = model(batch)
"""


def check(ctx: Context):
    m = ctx.metrics
    if m.has_device or ctx.step_ms <= 0 or len(m.steps) == 0 or is_training(m, ctx.recorded):
        return None
    host = ctx.events.host
    ops = host[(host["sequence"].to_numpy(np.int64) >= 0) & (host["kind"] == "op").to_numpy()]
    if len(ops) == 0:
        return None
    st = m.steps
    step = step_of(st["start"].to_numpy(np.int64), st["end"].to_numpy(np.int64), ops["ts"].to_numpy(np.int64))
    ops = ops[step >= 0].assign(step=step[step >= 0])
    if len(ops) == 0:
        return None
    n = len(st)
    # Autograd's sequence number is per thread and rises by one per node created: a step's
    # nodes are its rise on each thread.
    seq = ops.groupby(["step", ops["tid"].astype(str)], observed=True)["sequence"]
    nodes = float((seq.max() - seq.min()).sum()) / n
    if nodes < ctx.options["min_nodes"]:
        return None
    estimate = nodes * float(ctx.options["node_us"]) / 1e3  # ms per step, unprofiled
    # The estimate is unprofiled time: a share of the unprofiled step (the replay's baseline).
    step_ms = ctx.replay.baseline_ms if ctx.replay.available else ctx.step_ms
    if step_ms <= 0 or estimate / step_ms < ctx.options["min_share"]:
        return None
    s, e = merge(ops["ts"].to_numpy(np.int64), ops["end"].to_numpy(np.int64))  # outermost: nested ops count once
    window_ms = float((e - s).sum()) / 1e6 / n
    change = ctx.replay.host_shorter_by(estimate)
    replayed = ctx.replayed_saving(change) if change is not None else None
    saving = replayed if replayed is not None else min(estimate, step_ms)
    if saving / step_ms < ctx.options["min_share"]:
        return None
    per_op = ops["name"].astype(str).value_counts()
    evidence = {
        "autograd_ops_per_step": round(len(ops) / n, 1),
        "graph_nodes_per_step": round(nodes, 1),
        "node_us": ctx.options["node_us"],
        "estimate_ms": round(estimate, 3),
        "autograd_op_time_ms_per_step": round(window_ms, 3),
        "top_autograd_ops": {k: round(int(v) / n, 1) for k, v in per_op.head(5).items()},
        "steps": sorted(set(int(st["step"].iloc[i]) for i in ops["step"])),
    }
    message = (
        f"The inference steps run with grad mode on: {len(ops) / n:.0f} ops per step go through autograd and record "
        f"{nodes:.0f} graph nodes that no backward pass uses. Under torch.inference_mode() they record none: "
        f"less latency per batch and more throughput, replayed at {ctx.options['node_us']} µs of host time per node."
    )
    return ctx.finding(message, saving, confidence="medium", evidence=evidence, snippet=AFTER, change=change)

