"""Much of the kernel time goes to eager elementwise and normalisation kernels, one op at a time.

## What it detects
At least `min_kernel_share` (20%) of the kernel time inside the steps is spent in eager
PyTorch elementwise, reduction, normalisation, softmax and dropout kernels
(`at::native::vectorized_elementwise_kernel`, `reduce_kernel`, cuDNN batch-norm kernels, ...)
outside the optimizer, and no compiled region ran: no Triton kernel in the trace, no host
span of a compiled region (`CompiledFunction`, `CompiledFunctionBackward`,
`Torch-Compiled Region`, Inductor's `## Call CompiledFxGraph ##`), whatever the backend
named its kernels, and `compile.used` is not true in the facts file.

## Why it is slow
Each eager op reads its inputs from GPU memory and writes its output back; a chain like
`bn → relu → add` moves the activation tensor through memory several times and launches a
kernel per op. These kernels are memory-bound: their time is bytes moved. `torch.compile`
fuses such chains into one generated kernel that reads once and writes once, and launches
fewer kernels.

## Evidence used
- the elementwise/normalisation kernels inside the steps, excluding those launched inside
  `Optimizer.step`/`Optimizer.zero_grad` (compiling the model does not touch them);
- their share of kernel time and their number per step, the ops that launched them, the
  user's line where the trace has stacks;
- Triton kernels (`triton_*`) and compiled-region spans in the trace, and `compile.used`
  from the facts file;
- the share of kernel time on the timeline.

## Example
Before:
```python
model = build_model().cuda()
```
After:
```python
model = torch.compile(build_model().cuda())
```
The first steps compile (seconds to minutes); profile after them.

## How the saving is estimated
The eager elementwise/normalisation kernel time per step × (1 − 1/1.5), times the share of
kernel time on the timeline: fused chains move at least a third fewer bytes. The figure is
conservative: on the reference ResNet-18 scenario `torch.compile` took throughput from 2,477
to 3,268 samples/s (1.32× on the whole step), which is about 2× on those kernels.

Reference: https://pytorch.org/tutorials/intermediate/torch_compile_tutorial.html
"""

from __future__ import annotations

from advisor.whatif.changes import scale_device

import re

import numpy as np

from advisor.engine import Context
from advisor.metrics.breakdown import _matches
from advisor.metrics.compute import (
    kernel_evidence,
    kernel_exposure,
    launched_inside,
    step_kernels,
)
from advisor.metrics.host_device import OPTIMIZER_SPAN

ID = "unfused-elementwise"
TITLE = "Eager elementwise kernels dominate: nothing is fused"
DOCS = "https://pytorch.org/tutorials/intermediate/torch_compile_tutorial.html"
DEFAULTS = {"min_kernel_share": 0.20, "min_share": 0.03, "fusion_speedup": 1.5}
FIX = "Compile the model with torch.compile so chains of elementwise ops run as fused kernels."
AFTER = """model = torch.compile(model)
"""
ELEMENTWISE_KERNEL = re.compile(
    r"at::native::.*(elementwise_kernel|reduce_kernel|_norm_|norm_kernel|[Ss]oft[Mm]ax|dropout|LayerNorm|GroupNorm|"
    r"batch_norm|BatchNorm|welford|Welford)|cunn_\w*SoftMax|cudnn::bn_(fw|bw)|bn_fw_|bn_bw_"
)
COMPILED_KERNEL = re.compile(r"^triton_|^triton__|^Torch-Compiled|^CompiledFunction")
# Host spans of compiled regions: the compiled graph's autograd function (forward and
# backward), Dynamo's region marker, Inductor's call of its generated graph.
COMPILED_REGION = re.compile(
    r"^(CompiledFunction|CompiledFunctionBackward|autograd::engine::evaluate_function: CompiledFunctionBackward|"
    r"Torch-Compiled Region|torch-compiled region|## Call CompiledFxGraph)",
    re.IGNORECASE,
)


def compiled_regions_ran(ctx: Context) -> bool:
    """Whether the trace shows compiled code: Triton kernels, or the host spans of compiled
    regions (whatever kernels the backend generated, and named)."""
    m = ctx.metrics
    if len(m.kernels) and _matches(m.kernels["name"], COMPILED_KERNEL).any():
        return True
    host = ctx.frames.host
    return bool(len(host)) and bool(_matches(host["name"], COMPILED_REGION).any())


def check(ctx: Context):
    m = ctx.metrics
    opts = ctx.options
    step_ms = ctx.step_ms
    if ctx.fact("compile", "used") is True or step_ms <= 0:
        return None
    if compiled_regions_ran(ctx):
        return None  # compiled regions ran: the compiler already fuses what it can
    k = step_kernels(m)
    total = float(k["dur"].sum())
    if total <= 0:
        return None
    host = ctx.frames.host
    in_optimizer = launched_inside(ctx.metrics, host[_matches(host["name"], OPTIMIZER_SPAN)])[k.index.to_numpy()]
    ew = k[_matches(k["name"], ELEMENTWISE_KERNEL) & ~in_optimizer]
    ew_ns = float(ew["dur"].sum())
    if ew_ns / total < opts["min_kernel_share"]:
        return None
    n_steps = max(len(m.steps), 1)
    exposure = kernel_exposure(m, k)
    speedup = float(opts["fusion_speedup"])
    saving_ms = ew_ns * (1 - 1 / speedup) * exposure / n_steps / 1e6
    if saving_ms / step_ms < opts["min_share"]:
        return None
    ew_ms = ew_ns / n_steps / 1e6
    per_step = len(ew) / n_steps
    evidence = {
        "elementwise_ms_per_step": round(ew_ms, 3),
        "share_of_kernel_time": round(ew_ns / total, 4),
        "elementwise_kernels_per_step": round(per_step, 1),
        "excluded_optimizer_kernels_per_step": round(float(np.count_nonzero(in_optimizer)) / n_steps, 1),
        "compiled_kernels_seen": False,
        "fusion_speedup_used": speedup,
    }
    evidence.update(kernel_evidence(ctx.frames, ew, m.steps, exposure))
    compile_fact = ctx.fact("compile", "used")
    message = (
        f"{100 * ew_ns / total:.0f}% of kernel time ({ew_ms:.1f} ms/step, {per_step:.0f} kernels) is eager elementwise, "
        "reduction and normalisation work, and no compiled region ran (no Triton kernel, no CompiledFunction span). torch.compile(model) fuses these chains: "
        f"~{saving_ms:.1f} ms/step ({speedup:g}× on those kernels)."
    )
    evidence["compile"] = compile_fact if compile_fact is not None else "not recorded (no facts file); judged from the kernel names"
    change = scale_device(ew.index.to_numpy(), 1 / speedup)  # the fix, replayed: fused chains run `speedup`x faster
    return ctx.finding(message, saving_ms, confidence="medium", evidence=evidence, change=change)
