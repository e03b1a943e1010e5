"""torch.compile ran, but graph breaks leave much of the elementwise work eager.

## What it detects
Compiled code ran (Triton kernels, or the host spans of compiled graphs), yet at least
`min_kernel_share` (10%) of the kernel time inside the steps is eager PyTorch elementwise,
reduction, normalisation, softmax and dropout kernels launched outside every compiled graph
(`CompiledFunction`, `CompiledFunctionBackward`, Inductor's `## Call CompiledFxGraph ##`) and
outside the optimizer. It fires when fusing those kernels' chains saves at least `min_share`
(3%) of the step.

Options: `min_kernel_share` (float, 0.10): the least share of the steps' kernel time in eager
elementwise kernels outside compiled graphs; `min_share` (float, 0.03): the least saving, as a
share of the step, worth a finding.

## What it needs from the trace
The device's kernel records and the compiled code's marks: Triton kernels or the host spans of
compiled graphs (`CompiledFunction`, `## Call CompiledFxGraph ##`). A run with no compiled code
is `unfused-elementwise`'s, and this rule says nothing there. It is not run where the launches
have no kernel records (the device's activity is missing); where the host's operators are
missing (a device-only trace); where the device's timeline lies outside the host's: the
report's warning or note says why.

## Why it is slow
Dynamo compiles the Python it can trace into graphs and hands the rest back to eager
PyTorch: a data-dependent branch, `.item()`, `print`, an unsupported module or library call
ends a graph (a graph break) and the code up to the next graph runs op by op. Whatever runs
there gets none of the fusion `torch.compile` was asked for: each elementwise op is its own
kernel again, reading and writing its tensors through memory. A fully compiled model keeps
almost no elementwise kernel outside its graphs, well under `min_kernel_share` (the recorded
runs behind that threshold are in `benchmarks/results/rule_constants.md`).

## Evidence used
- the elementwise/normalisation kernels inside the steps launched outside the compiled graphs'
  host spans and outside `Optimizer.step`/`Optimizer.zero_grad` (compiling the model does not
  touch those), their share of kernel time, number per step and launching ops;
- the compiled graphs that ran per step (distinct `## Call CompiledFxGraph ##` names) and the
  frames Dynamo compiled (`Torch-Compiled Region: F/R`);
- the share of kernel time on the timeline.

## Example
Before:
```python
class Net(nn.Module):
    def forward(self, x):
        x = self.stem(x)
        if x.abs().max().item() > 1e3:   # a Python branch on a tensor's value: a graph break
            x = x / 1e3
        return self.blocks(x)

model = torch.compile(Net().cuda())
```
After:
```python
class Net(nn.Module):
    def forward(self, x):
        x = self.stem(x)
        x = torch.where(x.abs().amax() > 1e3, x / 1e3, x)   # the same, as tensor ops: no break
        return self.blocks(x)

model = torch.compile(Net().cuda(), fullgraph=True)   # a break left is an error naming its line
```
`TORCH_LOGS="graph_breaks" python train.py` prints each break with its reason and line;
`torch._dynamo.explain(model)(x)` counts them.

## Fix
No automatic fix: each break has its own cause in the user's code. Find them with
`TORCH_LOGS="graph_breaks"`, remove them (tensor ops for value-dependent branches, no
`.item()`/`print` in `forward`, `torch.compiler.disable` only around what cannot be traced),
and compile with `fullgraph=True` so that none comes back unnoticed.

## How the saving is estimated
The chains of the eager elementwise kernels outside the compiled graphs are found as
`unfused-elementwise` finds them (`advisor/metrics/elementwise.py`): runs of consecutive such
kernels on a stream inside a step that no other kernel interrupts. With the breaks gone,
Inductor fuses each run into one kernel that costs what its costliest member costs (these
kernels are memory-bound), so the other members and their launch calls go; a kept cuDNN
batch-norm kernel costs its passes over the activation at the run's own memory bandwidth, as
the compiler's generated one does (`unfused-elementwise` says how). That is replayed:
the saving is how much shorter the replayed step is, so device time saved where the host
bounds the step does not count. The host time of the eager code around the kernels that stay
is kept (the generated code would launch them for less): the promise leaves that gain out.
The rule's own estimate (evidence `estimate_ms`) is the removed members' kernel time per step
times the share of kernel time on the timeline.

Reference: https://pytorch.org/docs/stable/torch.compiler_troubleshooting.html
"""

from __future__ import annotations

import re

import numpy as np

from advisor.engine import Context
from advisor.metrics.breakdown import name_matches
from advisor.metrics.compute import kernel_evidence, kernel_exposure, launched_inside, step_kernels
from advisor.metrics.elementwise import COMPILED_GRAPH, ELEMENTWISE_KERNEL, batch_norm_roofline_share, compiled_regions_ran, fused_chain_members
from advisor.metrics.host_device import OPTIMIZER_SPAN
from advisor.whatif.changes import fused

ID = "compile-graph-breaks"
TITLE = "torch.compile ran, but graph breaks leave the elementwise work eager"
GROUP = "compute"
TESTED_ON = ("nvidia", "amd")  # vendors whose real traces the tests run it on (advisor/metrics/vendors.py)
DOCS = "https://pytorch.org/docs/stable/torch.compiler_troubleshooting.html"
DEFAULTS = {"min_kernel_share": 0.10, "min_share": 0.03}
FIX = (
    "Find the graph breaks (TORCH_LOGS=\"graph_breaks\" python train.py), remove them, and compile with "
    "fullgraph=True so that none comes back unnoticed."
)
AFTER = """model = torch.compile(model, fullgraph=True)   # each graph break left is an error naming its line
"""
FX_GRAPH_CALL = re.compile(r"^## Call CompiledFxGraph (\S+) ##")
DYNAMO_FRAME = re.compile(r"^Torch-Compiled Region: (\d+)/\d+")


def check(ctx: Context):
    m = ctx.metrics
    opts = ctx.options
    step_ms = ctx.step_ms
    host = ctx.events.host
    if step_ms <= 0 or not compiled_regions_ran(m.kernels, host):
        return None
    k = step_kernels(m)
    total = float(k["dur"].sum())
    if total <= 0:
        return None
    rows = k.index.to_numpy()
    in_optimizer = launched_inside(m, host[name_matches(host["name"], OPTIMIZER_SPAN)])[rows]
    in_graph = launched_inside(m, host[name_matches(host["name"], COMPILED_GRAPH)])[rows]
    eligible = np.asarray(name_matches(k["name"], ELEMENTWISE_KERNEL), dtype=bool) & ~in_optimizer & ~in_graph
    eager = k[eligible]
    eager_ns = float(eager["dur"].sum())
    if eager_ns / total < opts["min_kernel_share"]:
        return None
    n_steps = max(len(m.steps), 1)
    exposure = kernel_exposure(m, k)
    fused_away = fused_chain_members(k, eligible)
    gone = k[fused_away]
    kept = np.nonzero(eligible & ~fused_away)[0]
    bn_share = batch_norm_roofline_share(k, kept)  # as unfused-elementwise: generated batch norms
    bn_saved_ns = float((k["dur"].to_numpy(np.float64)[kept] * (1.0 - bn_share)).sum())
    saving_ms = (float(gone["dur"].sum()) + bn_saved_ns) * exposure / n_steps / 1e6
    if saving_ms / step_ms < opts["min_share"]:
        return None
    names = host["name"].astype(str)
    graphs = names.str.extract(FX_GRAPH_CALL, expand=False).dropna().nunique()
    frames = names.str.extract(DYNAMO_FRAME, expand=False).dropna().nunique()
    eager_ms = eager_ns / n_steps / 1e6
    evidence = {
        "eager_elementwise_ms_per_step": round(eager_ms, 3),
        "share_of_kernel_time": round(eager_ns / total, 4),
        "eager_elementwise_kernels_per_step": round(len(eager) / n_steps, 1),
        "compiled_graph_kernels_per_step": round(float(np.count_nonzero(in_graph)) / n_steps, 1),
        "compiled_graphs": int(graphs),
        "compiled_frames": int(frames),
        "fused_away_kernels_per_step": round(len(gone) / n_steps, 1),
        "fused_away_ms_per_step": round(float(gone["dur"].sum()) / n_steps / 1e6, 3),
        "batch_norm_ms_saved_per_step": round(bn_saved_ns / n_steps / 1e6, 3),
    }
    evidence.update(kernel_evidence(ctx.events, eager, m.steps, exposure))
    graphs_text = f"{graphs} compiled graph{'s' if graphs != 1 else ''}" if graphs else "compiled code"
    message = (
        f"torch.compile ran ({graphs_text}), yet {100 * eager_ns / total:.0f}% of kernel time ({eager_ms:.1f} ms/step, "
        f"{len(eager) / n_steps:.0f} kernels) is eager elementwise and normalisation work launched outside them: graph breaks "
        f"hand that code back to eager PyTorch. Without the breaks its chains fuse ({evidence['fused_away_kernels_per_step']:.0f} "
        f"fewer kernels per step). TORCH_LOGS=\"graph_breaks\" names each break and its line."
    )
    change = fused(ctx.events, k, fused_away, kept, bn_share)
    return ctx.finding(message, saving_ms, confidence="medium", evidence=evidence, change=change)
