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
backward would need, and bumps the tensors' version counters; the graph is torn down again
when the output goes. None of it is used by an inference loop, and on a CPU it costs in
three ways:

- **the bookkeeping** of each node (creating it, saving its tensors, freeing the graph);
- **the memory the graph holds**: the saved tensors keep the pass's activations alive until
  the output is dropped, so each op writes into memory no earlier op has freed. Without the
  graph the allocator hands the same few buffers back op after op; with it, every step's
  activations take fresh pages from the system (glibc returns the freed block at the step's
  end), each one a page fault and a zeroing. On the 2-core Xeon of AdvisorBench the CNN of
  `cnn_inference` took 110 to 530 minor page faults per step with grad mode on and 0 to 36
  under `inference_mode` (getrusage over 200 steps, 1 and 2 threads), and faulting memory in
  costs 0.46 ms per MB there (a first touch of fresh pages, best of 15);
- **the fused path**: `nn.TransformerEncoderLayer` (and the `nn.MultiheadAttention` in it)
  takes its fused inference path (`aten::_transformer_encoder_layer_fwd`,
  `aten::_native_multi_head_attention`) only in eval mode with grad off; with grad on every
  layer runs as some 120 separate ops (views, transposes, copies, dropouts, adds), each
  dispatched through autograd.

`torch.inference_mode()` skips all of it (and the autograd dispatch itself);
`torch.no_grad()` skips the graph and its memory.

## Evidence used
- the host ops inside the steps that carry autograd's sequence number, per step: how many,
  and how many graph nodes they created (the rise of the sequence number, per thread);
- the CPU allocator's memory events (`profile_memory=True`, as `advisor profile` records):
  per step, the rise of the allocated total over the step less the two largest allocations
  (an op's input and output: what a pass without a graph holds at its peak) is the memory
  the graph keeps alive (`held_mb_per_step`);
- with Python stacks recorded, the `nn.Module: TransformerEncoderLayer` spans whose ops went
  through autograd, and in them the outermost products, attention core and layer norms
  (what the fused path still computes);
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
Three parts, each in unprofiled ms per step (evidence `graph_ms`, `held_ms`, `fast_path_ms`,
their sum `estimate_ms`):

- **nodes**: each graph node costs `node_us` (2.0 µs by default) of host time: creating the
  node, saving its tensors and freeing the graph with the output (measured by
  `benchmarks/inference_mode_cost.py`; the figures are in `benchmarks/results/rule_constants.md`);
- **held memory**: the MB the graph keeps alive per step at `held_mb_us` (100 µs per MB by
  default). Not every held page is faulted in every step (110 to 530 faults per step for the
  1.5 MB `cnn_inference` holds), so the figure is below the 0.46 ms per MB a fault-in costs:
  it is what the `cnn_inference` pair measured on an idle 2-core Xeon (0.9 -> 0.7 ms, 0.16 ms
  saved, of which 0.03 ms the 16 nodes: 0.13 ms for 1.5 MB held, rounded to 100 µs per MB;
  `benchmarks/results/advisorbench_cpu.txt`). That pair fitted the constant: it does not check it;
- **fused path**: the time of the `TransformerEncoderLayer` calls that their outermost
  products, attention core and layer norms do not cover goes: the fused path runs the same
  products and norms in one op. It is window time, brought to the unprofiled step's pace
  (times the unprofiled over the window step). Without Python stacks there are no module
  spans and this part is 0 (the message says what it counts).

The fix is replayed: the host's work is made shorter by the estimate per step, spread over
all of it (the bookkeeping is in every op that goes through autograd, and a fix that makes
the ops' arithmetic faster, such as more threads, leaves it whole). It fires when the replayed
saving is at least `min_share` of the unprofiled step (the replay's baseline: the steps after
the window where the facts record them, else the window less the profiler's estimated cost),
never of the profiled step, which the profiler inflates. The rule speaks of runs without
device activity only: on a device run the same host time may overlap the device's work, and
`launch-bound` speaks of the host there. The confidence is medium.

## Measured pairs that confirm the model
AdvisorBench's `inference_threads` (the `cnn_inference` CNN on one thread; the constant was
fitted on `cnn_inference` at two threads, not on it): 16 nodes and 1.5 MB held per step make
0.18 ms (`tests/data/advisorbench_cpu/inference_threads`); the same script under
`torch.inference_mode()` measured 0.23 ms faster (1.52 -> 1.27 ms, median of 6 paired
fresh-process runs, paired savings 0.14 to 0.51 ms, load average 6.5 to 6.8 with the pair run
at a higher scheduling priority), within ±30%. Its `CONFIRMED_BY` says so to the ranking: an
"up to" promise no measured pair checked (`cpu-autocast`'s speed-ups) ranks above this fix only
where it saves more than twice as much. The transformer's fused-path part has no such pair.

Reference: https://pytorch.org/docs/stable/generated/torch.autograd.grad_mode.inference_mode.html
"""

from __future__ import annotations

import re

import numpy as np

from advisor.engine import Context, is_training
from advisor.metrics.breakdown import name_matches, text_of
from advisor.metrics.intervals import merge, overlap_with
from advisor.metrics.steps import step_of

ID = "inference-mode"
TITLE = "Inference runs with autograd recording a graph"
GROUP = "host"
# Measured pairs that confirm the saving model (advisor.engine.ranking.UNCHECKED_MARGIN).
CONFIRMED_BY = "AdvisorBench's inference_threads pair, grad mode -> torch.inference_mode() (0.18 ms promised, 0.23 ms measured)"
TESTED_ON = ("amd", "cpu")  # vendors whose real traces the tests run it on (advisor/metrics/vendors.py)
DOCS = "https://pytorch.org/docs/stable/generated/torch.autograd.grad_mode.inference_mode.html"
DEFAULTS = {"min_share": 0.02, "min_nodes": 4, "node_us": 2.0, "held_mb_us": 100.0}
# The modules whose eval-mode forward takes a fused inference path once grad is off.
FAST_PATH_MODULE = re.compile(r"^nn\.Module: TransformerEncoderLayer(_\d+)?$")
# What the fused path still computes: the products, the attention core and the norms.
FAST_PATH_KEEPS = re.compile(
    r"^aten::(addmm|mm|bmm|baddbmm|_addmm_activation|_scaled_dot_product\w*|native_layer_norm|_native_multi_head_attention|"
    r"_transform_bias_rescale_qkv|_transformer_encoder_layer_fwd)$"
)
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
    # Three parts, each unprofiled ms per step (see "How the saving is estimated"):
    graph_ms = nodes * float(ctx.options["node_us"]) / 1e3  # the nodes' bookkeeping
    held_mb = held_megabytes(ctx.events.memory, st)  # activations the graph keeps alive
    held_ms = (held_mb or 0.0) * float(ctx.options["held_mb_us"]) / 1e3
    # The estimate is unprofiled time: a share of the unprofiled step (the replay's baseline).
    step_ms = ctx.replay.baseline_ms if ctx.replay.available else ctx.step_ms
    pace = min(step_ms / ctx.step_ms, 1.0) if ctx.step_ms > 0 else 1.0
    if step_ms <= 0:
        return None
    fused_window_ms, layers = fast_path_ms(host, ops, st)
    fused_ms = fused_window_ms * pace  # window time, brought to the unprofiled step's pace
    estimate = graph_ms + held_ms + fused_ms
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
        "graph_ms": round(graph_ms, 3),
        "held_mb_per_step": None if held_mb is None else round(held_mb, 3),
        "held_mb_us": ctx.options["held_mb_us"],
        "held_ms": round(held_ms, 3),
        "fast_path_layers_per_step": round(layers / n, 1),
        "fast_path_window_ms": round(fused_window_ms, 3),
        "fast_path_ms": round(fused_ms, 3),
        "estimate_ms": round(estimate, 3),
        "autograd_op_time_ms_per_step": round(window_ms, 3),
        "top_autograd_ops": {k: round(int(v) / n, 1) for k, v in per_op.head(5).items()},
        "steps": sorted(set(int(st["step"].iloc[i]) for i in ops["step"])),
    }
    parts = [f"{graph_ms:.2f} ms for the nodes at {ctx.options['node_us']} µs each"]
    if held_ms > 0:
        parts.append(
            f"{held_ms:.2f} ms for the {held_mb:.1f} MB of activations per step the graph keeps alive until the output goes "
            f"(fresh pages every step, at {ctx.options['held_mb_us']:.0f} µs per MB)"
        )
    if fused_ms > 0:
        parts.append(
            f"{fused_ms:.2f} ms of the {layers / n:.0f} nn.TransformerEncoderLayer calls per step outside their products and norms, "
            "which the fused inference path (aten::_transformer_encoder_layer_fwd) runs in one op once grad is off"
        )
    message = (
        f"The inference steps run with grad mode on: {len(ops) / n:.0f} ops per step go through autograd and record "
        f"{nodes:.0f} graph nodes that no backward pass uses. Under torch.inference_mode() they record none: "
        f"less latency per batch and more throughput, about {estimate:.2f} ms per step: " + "; ".join(parts) + "."
    )
    return ctx.finding(message, saving, confidence="medium", evidence=evidence, snippet=AFTER, change=change)



def held_megabytes(memory, steps) -> float | None:
    """MB per step the autograd graph keeps alive: the rise of the CPU allocator's total over the
    step (its peak less its level before the step's first allocation), less the two largest
    allocations (an op's input and output, what a pass without a graph holds at its peak).
    None without the profiler's memory events (`profile_memory=True`)."""
    if memory is None or len(memory) == 0 or "total_allocated" not in memory:
        return None
    mem = memory[memory["device_type"].to_numpy(np.int64) == 0]
    if len(mem) == 0:
        return None
    ts = mem["ts"].to_numpy(np.int64)
    order = np.argsort(ts, kind="stable")
    ts = ts[order]
    nbytes = mem["bytes"].to_numpy(np.float64)[order]
    total = mem["total_allocated"].to_numpy(np.float64)[order]
    held = []
    for start, end in zip(steps["start"].to_numpy(np.int64), steps["end"].to_numpy(np.int64), strict=True):
        lo, hi = np.searchsorted(ts, start), np.searchsorted(ts, end)
        if hi <= lo:
            continue
        b, t = nbytes[lo:hi], total[lo:hi]
        if not np.isfinite(t).all() or not np.isfinite(b).all():
            continue
        base = t[0] - b[0]
        allocs = np.sort(b[b > 0])
        held.append(max(float(t.max() - base - allocs[-2:].sum()), 0.0))
    return float(np.mean(held)) / 1e6 if held else None


def fast_path_ms(host, ops, steps) -> tuple[float, int]:
    """Window ms per step that nn.TransformerEncoderLayer's fused inference path removes, and
    how many layer calls it is in: the time inside the layers' module spans (recorded with
    Python stacks) that their outermost products, attention core and norms do not cover,
    counted only in layer calls whose ops went through autograd (grad mode on: the fused path
    was not taken)."""
    n = max(len(steps), 1)
    layer = host[name_matches(host["name"], FAST_PATH_MODULE)]
    if len(layer) == 0:
        return 0.0, 0
    ls, le = layer["ts"].to_numpy(np.int64), layer["end"].to_numpy(np.int64)
    # only calls inside the steps that ran autograd's ops (the fused path not taken)
    seq_ts = np.sort(ops["ts"].to_numpy(np.int64))
    graded = np.searchsorted(seq_ts, le) > np.searchsorted(seq_ts, ls)
    ls, le = merge(ls[graded], le[graded])
    if len(ls) == 0:
        return 0.0, 0
    is_op = text_of(host["kind"]) == "op"
    keep = host[is_op & name_matches(host["name"], FAST_PATH_KEEPS)]
    ks, ke = merge(keep["ts"].to_numpy(np.int64), keep["end"].to_numpy(np.int64))
    kept = float(overlap_with(ks, ke, ls, le).sum()) if len(ks) else 0.0
    total = float((le - ls).sum())
    return max(total - kept, 0.0) / 1e6 / n, int(graded.sum())
