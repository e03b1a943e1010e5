"""Convolutions pay for layout transposes: the tensors are NCHW, the fast kernels want NHWC.

## What it detects
Layout-transposing kernels (`nchwToNhwcKernel`, `nhwcToNchwKernel`; cuDNN's
`convertTensor_kernel` and MIOpen's `batched_transpose_*` when a convolution launches them)
launched around convolutions that take at least `min_share` (2%) of the step.

## What it needs from the trace
The device's kernel records: the layout-transpose kernels and the convolution ops that launched
them (the host's operators, linked by correlation id). Without transposes around convolutions
it says nothing; a CPU-only run has no kernels and gets nothing from it. It is not run where
the launches have no kernel records (the device's activity is missing); where the host's
operators are missing (a device-only trace); where the device's timeline lies outside the
host's: the report's warning or note says why.

## Why it is slow
Tensor Core convolution kernels (fp16/bf16 on Volta and newer, TF32 on Ampere and newer)
work on channels-last (NHWC) data. PyTorch tensors are channels-first (NCHW) by default, so
cuDNN converts the input, the weights and the output of every convolution, forward and
backward: extra kernels that only move memory. With the model and the input in
`torch.channels_last`, the convolutions read and write NHWC directly and the conversions
disappear (and the other ops keep the layout).

## Evidence used
- the transpose kernels inside the steps, their time per step and how often they run;
- the ops that launched them (convolutions and their backward) and, where the trace has
  stacks, the user's line that calls the model;
- the share of kernel time on the timeline (kernels hidden under other streams do not count).

## Example
Before:
```python
model = torchvision.models.resnet50().cuda()
out = model(images.cuda())
```
After:
```python
model = torchvision.models.resnet50().cuda().to(memory_format=torch.channels_last)
out = model(images.cuda().to(memory_format=torch.channels_last))
```
Pair it with mixed precision (`torch.autocast`) or TF32: NHWC pays off with Tensor Core
kernels.

## Fix: `advisor fix --unsafe-fixes` (unsafe: other convolution algorithms)
```diff
 model = model.to(device)
+model = model.to(memory_format=torch.channels_last)
 optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
```

## How the saving is estimated
The transpose kernels and their launch calls go, and the step is replayed without them: the
saving is how much shorter the replayed step is, so device time saved where the host bounds
the step does not count. The rule's own estimate (evidence `estimate_ms`) is the transposes'
time per step times the share of kernel time on the timeline. The NHWC convolution kernels
are often faster too; that is not counted.

Reference: https://pytorch.org/tutorials/intermediate/memory_format_tutorial.html
"""

from __future__ import annotations

import numpy as np

from advisor.engine import Context
from advisor.metrics.compute import kernel_evidence, kernel_exposure, layout_transposes, step_kernels
from advisor.whatif.changes import remove_launches

ID = "channels-last"
TITLE = "Convolutions pay for NCHW ↔ NHWC layout transposes"
GROUP = "compute"
TESTED_ON = ("nvidia", "mtia", "cpu")  # vendors whose real traces the tests run it on (advisor/metrics/vendors.py)
DOCS = "https://pytorch.org/tutorials/intermediate/memory_format_tutorial.html"
DEFAULTS = {"min_share": 0.02}
FIX = "Put the model and its input in channels-last memory format: model.to(memory_format=torch.channels_last), x.to(memory_format=torch.channels_last)."
AFTER = """model = model.to(memory_format=torch.channels_last)
for x, y in loader:
    x = x.cuda(non_blocking=True).to(memory_format=torch.channels_last)
    ...
"""


def check(ctx: Context):
    m = ctx.metrics
    step_ms = ctx.step_ms
    k = step_kernels(m)
    if len(k) == 0 or step_ms <= 0:
        return None
    transposes = k[layout_transposes(k)]
    if len(transposes) == 0:
        return None
    n_steps = max(len(m.steps), 1)
    exposure = kernel_exposure(m, k)
    transpose_ms = float(transposes["dur"].sum()) / 1e6 / n_steps
    saving_ms = transpose_ms * exposure
    if saving_ms / step_ms < ctx.options["min_share"]:
        return None
    kernel_ms = float(k["dur"].sum()) / 1e6 / n_steps
    evidence = {
        "transpose_ms_per_step": round(transpose_ms, 3),
        "transposes_per_step": round(len(transposes) / n_steps, 1),
        "share_of_kernel_time": round(transpose_ms / kernel_ms, 4) if kernel_ms else None,
    }
    evidence.update(kernel_evidence(ctx.events, transposes, m.steps, exposure, by_eligible_op=True))
    message = (
        f"{len(transposes) / n_steps:.0f} NCHW↔NHWC transposes per step around convolutions take {transpose_ms:.1f} ms/step "
        f"({100 * transpose_ms / kernel_ms:.0f}% of kernel time). Model and input in torch.channels_last remove them."
    )
    change = remove_launches(ctx.events, ctx.events.device["correlation"].to_numpy(np.int64)[transposes.index.to_numpy()])
    return ctx.finding(message, saving_ms, confidence="high", evidence=evidence, change=change)
