"""Attention runs unfused (SDPA's math fallback or softmax(QKᵀ)V by hand) where a fused kernel exists.

## What it detects
Attention inside the steps that runs as separate matrix products and a softmax:
- **SDPA's math fallback**: `aten::_scaled_dot_product_attention_math`, what
  `F.scaled_dot_product_attention` runs when no fused kernel takes its arguments;
- **eager attention**: a softmax over a 3-D or 4-D input between two matrix products
  (`aten::matmul`, `aten::bmm`, `aten::baddbmm`) on the same thread whose shapes make the
  softmax's input (`q @ k.T`) and take its output (`@ v`), the way attention is written by hand;

where a fused kernel exists for the device and the products' dtype: FlashAttention on NVIDIA
compute capability 8.0 and newer in fp16/bf16, memory-efficient attention on compute
capability 5.0 and newer in fp16/bf16/fp32, the flash and memory-efficient kernels on AMD
Instinct in fp16/bf16/fp32, the flash CPU kernel in fp32/bf16 on a run without a device. The
flash CPU kernel takes no dropout: SDPA with `dropout_p > 0` in training runs the math path on
a CPU whatever the call, so a CPU call that draws a dropout mask (`aten::native_dropout` or
`aten::bernoulli_` inside it, as `nn.TransformerEncoderLayer` and `nn.MultiheadAttention` do
in training with their default dropout of 0.1) has no fused kernel to move to and is not
counted. Nor is attention inside PyTorch's own encoder fast path
(`aten::_native_multi_head_attention`, `aten::_transformer_encoder_layer_fwd`: an
`nn.TransformerEncoderLayer` in eval without grad), whose bmm, softmax, bmm are no code the
user wrote to replace. It fires where the estimated saving is at least `min_share` (2%) of the step.

Options: `min_share` (float, 0.02): the least saving, as a share of the step, worth a finding;
`fused_peak_share` (float, 0.25): the share of the device's peak for the products' precision
that a fused kernel is modelled to reach at best.

## What it needs from the trace
The host ops' nesting and input shapes and types (`record_shapes=True`), from which the
attention's sizes come, and a device and dtype for which PyTorch has a fused kernel
(FlashAttention or memory-efficient attention on an NVIDIA GPU of a known compute capability or
an AMD GPU; the flash CPU kernel for fp32 and bf16 on a CPU run). Without input shapes it says
nothing. It is not run where the launches have no kernel records (the device's activity is
missing); where the host's operators are missing (a device-only trace): the report's warning or
note says why.

## Why it is slow
Unfused attention writes the L×S score matrix to memory, reads it back for the softmax, writes
the probabilities and reads them again for the second product: per head, memory traffic that
grows with the square of the sequence, and a kernel per step of the chain (scale, mask,
softmax, dropout). A fused kernel keeps each tile of scores on chip and streams K and V once;
its time is its FLOPs at the matrix units' rate.

## Evidence used
- the dropout masks drawn inside each call (`aten::native_dropout`, `aten::bernoulli_` on the
  call's thread, between its first product's start and its last one's end): dropout on the
  probabilities, which the flash CPU kernel does not take;
- the host ops, their nesting and their input shapes and types (`record_shapes=True`): the
  math fallback's q, k, v or the two products around the softmax give B, L, S, D and the FLOPs
  of the two products, 2·B·L·S·(D + Dv);
- the kernels launched inside those calls (on a GPU), or the calls' own time (on a CPU);
- the device and its compute capability (trace device properties), the dtype of the products'
  inputs, and the device's peak for that precision (`advisor.metrics.devices`);
- the share of kernel time on the timeline.

## Example
Before:
```python
scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
out = torch.softmax(scores, dim=-1) @ v
```
After:
```python
out = torch.nn.functional.scaled_dot_product_attention(q, k, v)
```
Where SDPA itself falls back to math, the common causes are fp64 inputs, an explicit
`attn_mask` together with dropout on an older release, a head dimension above 256, or
`torch.backends.cuda.enable_flash_sdp(False)`/`sdpa_kernel([SDPBackend.MATH])` left on; a
`need_weights=True` in `nn.MultiheadAttention` asks for the weights and keeps the math path.
On a CPU, `dropout_p > 0` in training keeps the math path too, and the rule says nothing about
such calls: before, `nn.TransformerEncoderLayer(64, 4, dropout=0.1)` in training (AdvisorBench's
`transformer_clean`) runs `_scaled_dot_product_attention_math` with a `bernoulli_` inside; after
`F.scaled_dot_product_attention(q, k, v, dropout_p=0.1)` it runs the same math path.

## How the saving is estimated
Up to the time of the unfused attention's kernels (on a CPU: its calls' time) minus a fused
kernel's modelled time: the calls' FLOPs at `fused_peak_share` of the device's peak for the
products' precision (fp32 peak for memory-efficient attention in fp32), never less than the time
the run's own two products took (a fused kernel does their FLOPs, and the GEMM library's kernels
run them at least as fast: what goes is the softmax, the scaling, masking and dropout and the
score matrix's traffic), and never more than the time it replaces. On a device the table does
not know, and on a CPU, the fused kernel takes the products' time. Real fused kernels reach well
under the datasheet peak: the MI300X's flash kernel ran at 20% of its bf16 peak on 32k-token
sequences (`mi300x_sdpa_rocprofiler_sdk`) and at 3–8% on ViT and chat shapes
(`mi300x_falconsai_vit_infer`, `mi300x_qwen15_05b_chat_infer`), hence the default of 25% as a best case. Only the forward calls are counted: the backward of unfused
attention runs unfused too and gains as well. The fix is replayed as the calls' kernels scaled
to the modelled time (on a CPU, the calls' host time shortened by the same share).

Reference: https://pytorch.org/docs/stable/generated/torch.nn.functional.scaled_dot_product_attention.html
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from advisor.engine import Context
from advisor.metrics.attention import unfused_attention
from advisor.metrics.compute import device_capability, kernel_evidence, kernel_exposure, launched_inside, step_kernels
from advisor.metrics.devices import device_ceiling
from advisor.metrics.intervals import merge
from advisor.metrics.steps import step_of
from advisor.whatif import Change
from advisor.whatif.changes import scale_device

ID = "unfused-attention"
TITLE = "Attention runs unfused where a fused kernel exists"
GROUP = "compute"
TESTED_ON = ("amd", "cpu")  # vendors whose real traces the tests run it on (advisor/metrics/vendors.py)
DOCS = "https://pytorch.org/docs/stable/generated/torch.nn.functional.scaled_dot_product_attention.html"
DEFAULTS = {"min_share": 0.02, "fused_peak_share": 0.25}
FIX = "Call torch.nn.functional.scaled_dot_product_attention(q, k, v) and let it pick a fused kernel."
AFTER = """out = torch.nn.functional.scaled_dot_product_attention(q, k, v)
"""
PATH_NAMES = {"eager": "softmax(QKᵀ)V written out", "sdpa_math": "SDPA's math fallback"}


def fused_kernel(vendor: str | None, capability: float | None, dtype: str | None, dropout: bool = False) -> str | None:
    """The fused attention kernel PyTorch has for this device and dtype (and dropout on the
    probabilities, in training); None where none."""
    if vendor is None:  # a run without a device: the flash CPU kernel, which takes no dropout
        return "the flash attention CPU kernel" if dtype in ("fp32", "bf16") and not dropout else None
    if dtype not in ("fp16", "bf16", "fp32"):
        return None
    if vendor == "amd":
        return "flash attention" if dtype != "fp32" else "memory-efficient attention"
    if vendor != "nvidia" or capability is None:
        return None
    if capability >= 8.0 and dtype in ("fp16", "bf16"):
        return "flash attention"
    return "memory-efficient attention" if capability >= 5.0 else None


def _spans_time(s: np.ndarray, e: np.ndarray) -> float:
    ms, me = merge(s, e)
    return float((me - ms).sum())


def check(ctx: Context):
    m = ctx.metrics
    opts = ctx.options
    step_ms = ctx.step_ms
    if step_ms <= 0 or len(m.steps) == 0:
        return None
    found = unfused_attention(ctx.events.host)
    calls = found.calls
    if len(calls) == 0:
        return None
    st = m.steps
    in_step = step_of(st["start"].to_numpy(np.int64), st["end"].to_numpy(np.int64), calls["ts"].to_numpy(np.int64)) >= 0
    vendor = m.device.vendor if m.has_device else None
    cap = device_capability(m, ctx.recorded.device.compute_capability).value if vendor == "nvidia" else None
    kernel_of = np.array([fused_kernel(vendor, cap, d, bool(p)) is not None for d, p in zip(calls["dtype"], calls["dropout"], strict=True)], dtype=bool)  # a few calls per step
    calls = calls[in_step & kernel_of]
    if len(calls) == 0 or not np.isfinite(calls["flops"].to_numpy(np.float64)).all():
        return None
    n_steps = len(st)
    cs, ce = calls["ts"].to_numpy(np.int64), calls["end"].to_numpy(np.int64)
    ms, me = found.matmul_starts, found.matmul_ends
    inside = np.zeros(len(ms), dtype=bool)
    if len(ms):
        j = np.searchsorted(cs, ms, side="right") - 1
        inside = (j >= 0) & (ms < ce[np.maximum(j, 0)])
    ms, me = ms[inside], me[inside]
    exposure = 1.0
    kernels = None
    if m.has_device:
        k = step_kernels(m)
        rows = k.index.to_numpy()
        in_calls = launched_inside(m, pd.DataFrame({"ts": cs, "end": ce}))[rows]
        in_products = launched_inside(m, pd.DataFrame({"ts": ms, "end": me}))[rows]
        kernels = k[in_calls]
        unfused_ns = float(kernels["dur"].sum())
        products_ns = float(k["dur"].to_numpy()[in_products].sum())
        exposure = kernel_exposure(m, k)
    else:
        unfused_ns = _spans_time(cs, ce)
        products_ns = _spans_time(ms, me)
    if unfused_ns <= 0:
        return None
    ceiling = device_ceiling(m.device.name) if m.has_device else None
    flops = calls.groupby("dtype")["flops"].sum()
    peaks = {d: ceiling.peak_tflops(d) if ceiling else None for d in flops.index}
    if all(p for p in peaks.values()):
        at_peak_ns = float(sum(f / (opts["fused_peak_share"] * peaks[d] * 1e3) for d, f in flops.items()))
        fused_ns = max(at_peak_ns, products_ns)
        model = (f"{opts['fused_peak_share']:.0%} of the {ceiling.name}'s peak" if at_peak_ns >= products_ns
                 else "the rate this run's own products reached (faster than the modelled fused rate)")
    else:
        fused_ns = products_ns
        model = "the rate this run's own products reached"
    fused_ns = min(fused_ns, unfused_ns)
    saving_ms = (unfused_ns - fused_ns) * exposure / n_steps / 1e6
    if saving_ms / step_ms < opts["min_share"]:
        return None
    paths = calls["path"].value_counts()
    main_path = str(paths.index[0])
    dtypes = sorted(flops.index)
    kernel = fused_kernel(vendor, cap, str(calls["dtype"].mode().iat[0]), bool(calls["dropout"].all()))
    per_step = len(calls) / n_steps
    evidence = {
        "paths": {PATH_NAMES[p]: round(int(c) / n_steps, 1) for p, c in paths.items()},
        "calls_per_step": round(per_step, 1),
        "shapes": calls["shape"].value_counts().head(5).to_dict(),
        "dtypes": dtypes,
        "device": m.device.name if m.has_device else "CPU",
        "compute_capability": cap,
        "fused_kernel": kernel,
        "unfused_ms_per_step": round(unfused_ns / n_steps / 1e6, 3),
        "products_ms_per_step": round(products_ns / n_steps / 1e6, 3),
        "gflops_per_step": round(float(flops.sum()) / n_steps / 1e9, 3),
        "fused_modelled_ms_per_step": round(fused_ns / n_steps / 1e6, 3),
        "fused_modelled_at": model,
        "counted": "forward calls only",
    }
    if kernels is not None and len(kernels):
        evidence.update(kernel_evidence(ctx.events, kernels, st, exposure))
    where = "kernels" if m.has_device else "ops"
    message = (
        f"{per_step:.0f} attention call(s) per step run unfused ({', '.join(PATH_NAMES[p] for p in paths.index)}; "
        f"{', '.join(dtypes)}, e.g. {calls['shape'].iat[0]}): their {where} take {unfused_ns / n_steps / 1e6:.2f} ms/step, "
        f"writing and reading the whole score matrix. {kernel[0].upper() + kernel[1:]} exists for this device and dtype: "
        f"F.scaled_dot_product_attention runs it in ~{fused_ns / n_steps / 1e6:.2f} ms/step "
        f"(their {float(flops.sum()) / n_steps / 1e9:.2f} GFLOP at {model}): up to {saving_ms:.2f} ms/step saved, the forward calls only."
    )
    if main_path == "sdpa_math":
        message += " SDPA fell back to math: check the dtype, the head dimension, the mask with dropout and any sdpa_kernel/enable_*_sdp switch."
    factor = fused_ns / unfused_ns
    if kernels is not None:
        change = scale_device(kernels.index.to_numpy(), factor)
    else:
        change = Change(host_remove=[(cs, ce, 1.0 - factor)])
    return ctx.finding(message, saving_ms, confidence="medium", evidence=evidence, fix=FIX, snippet=AFTER, change=change)
