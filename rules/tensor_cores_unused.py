"""Matrix work runs in fp32, not on fp16/bf16 Tensor Cores.

## What it detects
On an NVIDIA GPU with Tensor Cores (compute capability 7.0 or newer), the kernels of
operators that could use them — convolutions, matmul/linear, RNN cells, attention — run no
fp16/bf16 kernels: less than `max_half_share` (10%) of their kernel time is half precision,
while they hold at least `min_eligible_share` (10%) of the kernel time, and the estimated
saving is at least `min_share` (5%) of the step. TF32 kernels on Ampere and newer use the
Tensor Cores but are not mixed precision: they count as work that bf16 would still speed up.

## Why it is slow
Tensor Cores multiply fp16/bf16 matrices many times faster than the fp32 units (V100: 125
TFLOPS against 15.7; A100: 312 bf16 against 156 TF32 and 19.5 fp32) and half-precision
tensors move half the bytes. Eager PyTorch keeps everything in fp32 unless asked:
`torch.autocast` runs each eligible op in fp16/bf16 and keeps precision-sensitive ops
(softmax, reductions, losses) in fp32.

## Evidence used
- every kernel inside the steps, its launching op, whether that op can use Tensor Cores,
  and the kernel's precision (see "How the precision is decided" below; Volta and Turing
  have no TF32 mode);
- the compute capability (trace device properties, else the facts file, else the
  architecture named in library kernel names, at lower confidence);
- the share of kernel time that is on the timeline (kernels hidden under other streams'
  kernels do not shorten the step);
- from the facts file: whether `autocast` and `GradScaler` were used;
- where the precision came from: a trace without input types and without a facts file is
  judged on kernel names alone, at lower confidence.

## Example
Before:
```python
for x, y in loader:
    loss = loss_fn(model(x.cuda()), y.cuda())
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
```
After:
```python
scaler = torch.amp.GradScaler("cuda")
for x, y in loader:
    with torch.autocast("cuda", dtype=torch.float16):
        loss = loss_fn(model(x.cuda()), y.cuda())
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
```
fp16 needs the GradScaler so small gradients survive. On Ampere and newer use
`dtype=torch.bfloat16` and drop the scaler (bf16 has fp32's range).

## How the saving is estimated
Per step: for each eligible kernel that is not half precision, its time times the drop of
its duration scale factor from TF32 to bf16 (`metrics.precision.precision_speedup`: 1/speed-up
of its family), times the share of kernel time on the timeline. On Hopper the speed-ups are
the ratios measured on an H100 (table below: TF32 → bf16 1.27× for GEMMs, 1.34× for
convolutions, 6.06× for attention, where bf16 reaches cuDNN's flash attention, 3.72× for
LSTMs); elsewhere, and for pairs not measured, this conservative table (on the whole
eligible kernel time, casts and layout changes included):

| architecture | compute capability | fp32 → fp16/bf16 | TF32 → bf16 |
| --- | --- | --- | --- |
| Volta | 7.0 | 2.0× | – |
| Turing | 7.5 | 2.0× | – |
| Ampere A100/A30 | 8.0 | 3.0× | 1.5× |
| Ampere/Ada A10, L4, L40, RTX 30/40 | 8.6 | 1.56× | 1.3× |
| Hopper | 9.0 | 3.0× | 1.5× |
| Blackwell | 10.0 | 3.0× | 1.5× |
| Blackwell RTX 50 | 12.0 | 1.56× | 1.3× |

The datasheet peak ratios are higher (V100 fp16/fp32 8×; A100 bf16/TF32 2×, bf16/fp32 16×):
2.0× on Volta is what matches the ~1.5× throughput autocast gives a GPU-bound ResNet on a
V100 with two thirds of its kernel time in convolutions. On Ampere and newer, plain fp32 kernels are first worth TF32's speed-up (the
`tf32-disabled` rule claims that part); this rule claims only the further TF32 → bf16 part
of them, so the two never count the same time twice. The estimate assumes the host keeps
ahead of the GPU once the kernels are faster. Kernels of unknown precision are not counted.

Reference: https://pytorch.org/docs/stable/amp.html
"""

from __future__ import annotations

import numpy as np

from advisor.engine import Context
from advisor.metrics.compute import (
    device_capability,
    kernel_evidence,
    kernel_exposure,
    step_kernels,
)
from advisor.metrics.precision import FROM_OP, precision_speedup, ratio_table, with_precision_page

__doc__ = with_precision_page(__doc__)

ID = "tensor-cores-unused"
TITLE = "Matrix work runs in fp32, not on fp16/bf16 Tensor Cores"
DOCS = "https://pytorch.org/docs/stable/amp.html"
DEFAULTS = {"min_capability": 7.0, "min_eligible_share": 0.10, "max_half_share": 0.10, "min_share": 0.05}
FIX = "Run the forward pass and the loss under torch.autocast (fp16 with a GradScaler before Ampere, bf16 from Ampere on)."
HALF = ("bf16", "fp16", "fp8", "int8")
AFTER_FP16 = """scaler = torch.amp.GradScaler("cuda")
with torch.autocast("cuda", dtype=torch.float16):
    loss = loss_fn(model(x), y)
scaler.scale(loss).backward()
scaler.step(optimizer)
scaler.update()
"""
AFTER_BF16 = """with torch.autocast("cuda", dtype=torch.bfloat16):
    loss = loss_fn(model(x), y)
loss.backward()
optimizer.step()
"""
AFTER = AFTER_FP16


def check(ctx: Context):
    m = ctx.metrics
    opts = ctx.options
    cap = device_capability(m, ctx.fact("device", "compute_capability"))
    if not cap.nvidia or cap.value is None or cap.value < opts["min_capability"]:
        return None
    table = ratio_table(cap.value)
    arch = table.arch
    k = step_kernels(m)
    total = float(k["dur"].sum())
    step_ms = ctx.step_ms
    if arch is None or total <= 0 or step_ms <= 0:
        return None
    precision = k["precision"].astype(str).to_numpy()
    eligible = k["eligible"].to_numpy(bool)
    dur = k["dur"].to_numpy(np.float64)
    eligible_ns = dur[eligible].sum()
    if eligible_ns <= 0 or eligible_ns / total < opts["min_eligible_share"]:
        return None
    half_ns = dur[eligible & np.isin(precision, HALF)].sum()
    if half_ns / eligible_ns > opts["max_half_share"]:
        return None  # mixed precision is in use

    fp32_mask = eligible & (precision == "fp32-fma")
    tf32_mask = eligible & (precision == "tf32")
    fp32_ns, tf32_ns = dur[fp32_mask].sum(), dur[tf32_mask].sum()
    target = "bf16" if cap.value >= 8.0 else "fp16"
    to_half = precision_speedup(k, target, cap.value).to_numpy()
    if arch.tf32_over_fp32 is None:
        # No TF32 before Ampere: the whole fp32 → fp16 step is this rule's.
        per_kernel = dur * (1 - to_half)
        method = f"{arch.half_over_fp32:g}× fp32 → fp16, {arch.name}"
    else:
        # tf32-disabled claims fp32 → TF32; this rule the rest, TF32 → bf16.
        to_tf32 = precision_speedup(k, "tf32", cap.value).to_numpy()
        per_kernel = dur * np.maximum(to_tf32 - to_half, 0.0)
        method = _method(k, fp32_mask | tf32_mask, dur, table)
    candidates_mask = fp32_mask | tf32_mask
    saved_ns = float(per_kernel[candidates_mask].sum())
    exposure = kernel_exposure(m, k)
    n_steps = max(len(m.steps), 1)
    saving_ms = saved_ns * exposure / n_steps / 1e6
    if saving_ms / step_ms < opts["min_share"]:
        return None

    bf16 = cap.value >= 8.0
    dtype = "bfloat16" if bf16 else "float16"
    autocast_used = ctx.fact("autocast", "used")
    candidates = k[candidates_mask]
    from_op = float(dur[candidates_mask & (k["precision_source"].astype(str).to_numpy() == FROM_OP)].sum() / max(fp32_ns + tf32_ns, 1))
    names_only = from_op == 0 and ctx.facts is None
    eligible_ms = eligible_ns / n_steps / 1e6
    where = "TF32" if tf32_ns > fp32_ns else "fp32"
    evidence = {
        "compute_capability": cap.value,
        "compute_capability_source": cap.source,
        "architecture": arch.name,
        "tensor_core_kernel_share": round(m.tensor_core_kernel_share or 0.0, 4),
        "eligible_share_of_kernel_time": round(eligible_ns / total, 4),
        "half_precision_share_of_eligible": round(half_ns / eligible_ns, 4),
        "fp32_eligible_ms_per_step": round(fp32_ns / n_steps / 1e6, 3),
        "tf32_eligible_ms_per_step": round(tf32_ns / n_steps / 1e6, 3),
        "speedup_used": method,
        "kernel_time_by_precision_ms": m.kernel_time_by_precision_ms,
        "precision_from_op_input_types": round(from_op, 4),
    }
    evidence.update(kernel_evidence(ctx.frames, candidates, m.steps, exposure, by_eligible_op=True))
    evidence["autocast"] = (
        {"used": autocast_used, "dtypes": ctx.fact("autocast", "dtypes"), "grad_scaler": ctx.fact("grad_scaler")}
        if autocast_used is not None
        else "not recorded (no facts file); the kernel names show the precision"
    )

    half_pct = 100 * half_ns / eligible_ns
    state = f"it runs in TF32 ({half_pct:.0f}% fp16/bf16)" if where == "TF32" else f"{half_pct:.0f}% of it runs in fp16/bf16"
    gpu = f"{m.device.name or arch.name + ' GPU'} (cc {cap.value:.1f})"
    if autocast_used:
        fix = (
            f"autocast is on, yet these ops still run in {where}: run the forward pass and the loss inside "
            f"torch.autocast('cuda', dtype=torch.{dtype}) and do not cast inputs back to float32."
        )
        how = "Autocast covering them"
    elif bf16:
        fix = "Run the forward pass and the loss under torch.autocast('cuda', dtype=torch.bfloat16); bf16 needs no GradScaler."
        how = "Autocast to bfloat16"
    else:
        fix = "Run the forward pass and the loss under torch.autocast('cuda', dtype=torch.float16) and scale the loss with torch.amp.GradScaler."
        how = "Autocast to float16 with a GradScaler"
    message = (
        f"{100 * eligible_ns / total:.0f}% of kernel time ({eligible_ms:.1f} ms/step) is convolution/matmul work that can use "
        f"Tensor Cores, yet {state} on {gpu}. {how}: ~{saving_ms:.1f} ms/step ({method})."
    )
    if names_only:
        message += " The precision is read from kernel names alone (the trace has no input types: record_shapes=False)."
    confidence = "high" if cap.source in ("trace", "facts") else "medium"
    if names_only and cap.value >= 8.0:
        confidence = "medium" if confidence == "high" else "low"  # TF32 or fp32 is then a guess from names
    return ctx.finding(message, saving_ms, confidence=confidence, evidence=evidence, fix=fix, snippet=AFTER_BF16 if bf16 else AFTER_FP16)


def _method(k, mask, dur, table) -> str:
    """The TF32 → bf16 speed-ups used, per family, weighted by the time they apply to."""
    family = k["family"].astype(str).to_numpy()
    parts = []
    for f in ("gemm", "attention", "conv", "rnn"):
        if (mask & (family == f)).any():
            ratio, source = table.ratio(f, "tf32", "bf16")
            parts.append((dur[mask & (family == f)].sum(), f"{f} {ratio:g}×", source))
    parts.sort(key=lambda p: -p[0])
    where = f"measured on an {table.measured_on}" if any(p[2] == "measured" for p in parts) else f"conservative, {table.arch.name}"
    return "TF32 → bf16 " + ", ".join(p[1] for p in parts) + f", {where}"
