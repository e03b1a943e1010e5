"""Matrix work runs in fp32, not on fp16/bf16 Tensor Cores.

## What it detects
On an NVIDIA GPU with Tensor Cores (compute capability 7.0 or newer), the kernels of
operators that could use them — convolutions, matmul/linear, RNN cells, attention — run no
fp16/bf16 kernels: less than `max_half_share` (10%) of their kernel time is half precision,
while they hold at least `min_eligible_share` (10%) of the kernel time, and the estimated
saving is at least `min_share` (5%) of the step. TF32 kernels on Ampere and newer use the
Tensor Cores but are not mixed precision: they count as work that bf16 would still speed up.

## What it needs from the trace
The device's kernel records, on an NVIDIA GPU of compute capability 7.0 or more (named by the
trace's device properties, the facts file, or the kernels' own names); without kernel records
it says nothing. The launching ops' input types (`record_shapes=True`) make each kernel's
precision exact; without them the kernel names decide, and the finding says so and why: the
trace holds no input types at all, or holds them but not on these kernels' ops (evidence
`record_shapes`). Whether the run trains (a backward op or an optimizer step in the trace, or
the facts file's `mode`; evidence `training`) decides the fix: a forward-only run gets
autocast around its forward pass, with no loss, backward or GradScaler in the message. "After
allowing TF32" names the work whose TF32 switch is off and the work that already runs TF32
(evidence `tf32_off_for`, `tf32_ran_for`).

## Why it is slow
Tensor Cores multiply fp16/bf16 matrices many times faster than the fp32 units (the
datasheet peaks are 8× on a V100, 16× bf16 over fp32 on an A100) and half-precision tensors
move half the bytes. Eager PyTorch keeps everything in fp32 unless asked:
`torch.autocast` runs each eligible op in fp16/bf16 and keeps precision-sensitive ops
(softmax, reductions, losses) in fp32.

## Evidence used
- every kernel inside the steps, its launching op, whether that op can use Tensor Cores,
  and the kernel's precision (`advisor.metrics.precision`: the launching op's input types,
  else the kernel's name; Volta and Turing have no TF32 mode);
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

## Fix: `advisor fix --unsafe-fixes` (unsafe: changes numerics)
bf16 autocast around the forward pass and the loss (the assignments before `loss.backward()`):
```diff
-    out = model(x)
-    loss = criterion(out, y)
+    with torch.autocast("cuda", dtype=torch.bfloat16):
+        out = model(x)
+        loss = criterion(out, y)
     loss.backward()
```
An autocast block already there, switched off by a flag, is left to the user with the reason.
Lightning gets `Trainer(precision="bf16-mixed")`, a `transformers` Trainer `TrainingArguments(bf16=True)`.

## How the saving is estimated
The fix is replayed on the run's own step graph (`advisor.whatif`):

1. **The kernels.** Each eligible kernel that is not half precision is scaled by its family's
   duration factor to 16 bit (`metrics.precision.precision_speedup`): fp32 kernels by the
   whole fp32 → 16-bit factor, TF32 kernels by the TF32 → 16-bit part. A GPU with a measured
   ratio table (Hopper) has one factor per family (GEMM, convolution, RNN, attention;
   `benchmarks/results/precision_ratios.txt`); any other uses this conservative table, on the
   whole eligible kernel time (casts and layout changes included):

| architecture | compute capability | fp32 → fp16/bf16 | TF32 → bf16 |
| --- | --- | --- | --- |
| Volta | 7.0 | 2.0× | – |
| Turing | 7.5 | 2.0× | – |
| Ampere A100/A30 | 8.0 | 3.0× | 1.5× |
| Ampere/Ada A10, L4, L40, RTX 30/40 | 8.6 | 1.56× | 1.3× |
| Hopper | 9.0 | 3.0× | 1.5× |
| Blackwell | 10.0 | 3.0× | 1.5× |
| Blackwell RTX 50 | 12.0 | 1.56× | 1.3× |

   The factors are what a training step's kernels reach, well below the datasheet peaks;
   where they come from is in `benchmarks/results/rule_constants.md`. Where TF32 is off for
   fp32 kernels (what `tf32-disabled` finds), allowing TF32 is the first, one-line step: the
   fix says so, and this finding's saving is what autocast adds after it (both fixes replayed
   together run the kernels at the better rate).
2. **The casts autocast adds** (`metrics.autocast`, traces recorded with input types and
   shapes). The forward's top-level ops are followed in order: each op of autocast's 16-bit
   list casts its fp32 inputs (weights and biases always, its activation unless the op before
   left it in 16 bit), each op of its fp32 list (layer_norm, losses) casts a 16-bit input
   back, and each cast of a tensor that needs a gradient adds a backward node. A cast costs
   its bytes at the bandwidth of the run's own device copies, and on the host the run's own
   median cost of a copy op (and, in the backward, of a node that passes its gradient on).
   The message says how much of the saving the casts take.

3. **The promise in its parts** (evidence `promise_parts`, and the message): the **casts**
   (their device time, negative) and their **host cost** (negative), the casts' replayed cost
   split as this run's own copy ops take it, and the **per-op speed-ups**, what the replay
   gives beyond the casts' cost (at most the candidate kernels' time less their time at the
   16-bit rates). They add up to the fix's saving alone. No measured pair confirms the
   speed-ups (the H100 ViT bf16 pair measured 16.18 ms against 27.27 promised,
   `benchmarks/results/promise_accuracy.txt`): they read "up to". The fix changes the recipe,
   so it already ranks behind a speed fix that saves half as much (`RECIPE_MARGIN`).

The rule's first-order estimate (`estimate_ms` in the evidence) is the kernels' arithmetic.
Where the replay leaves the host on the critical path (a fast GPU, an eager loop), the casts
and the host's pace bound what autocast gains, and the replayed saving is below it. Without
input types the casts are not modelled; kernels of unknown precision are not counted.

Reference: https://pytorch.org/docs/stable/amp.html
"""

from __future__ import annotations

from advisor.whatif import Change
from advisor.whatif.changes import added_work, scale_device
from advisor.whatif.parts import PromisePart

import numpy as np

from advisor.engine import Context, is_training
from advisor.metrics.compute import (
    device_capability,
    kernel_evidence,
    kernel_exposure,
    precision_table,
)
from advisor.metrics.autocast import autocast_casts
from advisor.metrics.precision import (
    names_only_sentence,
    record_shapes_in_trace,
    FROM_OP,
    Tf32Switches,
    ratio_table,
    tf32_switches_off,
    with_precision_page,
)

__doc__ = with_precision_page(__doc__)

ID = "tensor-cores-unused"
# The fix changes the numerics of what is trained (or of the outputs served), not only its
# speed: the ranking puts it after a fix that changes nothing but speed and saves at least half as much.
RECIPE = "precision"
TITLE = "Matrix work runs in fp32, not on fp16/bf16 Tensor Cores"
GROUP = "compute"
TESTED_ON = ("nvidia", "amd", "mtia", "cpu")  # vendors whose real traces the tests run it on (advisor/metrics/vendors.py)
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
# A forward-only run (inference): no loss, no backward, nothing for a GradScaler to scale.
AFTER_INFERENCE = """with torch.inference_mode(), torch.autocast("cuda", dtype=torch.{dtype}):
    out = model(x)
"""


def check(ctx: Context):
    m = ctx.metrics
    opts = ctx.options
    cap = device_capability(m, ctx.recorded.device.compute_capability)
    if not cap.nvidia or cap.value is None or cap.value < opts["min_capability"]:
        return None
    table = ratio_table(cap.value)
    arch = table.arch
    kp = precision_table(m, cap.value)  # the per-kernel precision table tf32-disabled reads too
    k = kp.kernels
    total = float(kp.dur.sum())
    step_ms = ctx.step_ms
    if arch is None or total <= 0 or step_ms <= 0:
        return None
    precision, eligible, dur = kp.precision, kp.eligible, kp.dur
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
    # The kernels autocast moves to 16 bit: fp32 ones all the way, TF32 ones the rest. Where TF32
    # is off for them (tf32-disabled's finding), allowing TF32 is the first, one-line step, and
    # this promise is what autocast adds after it: their TF32 -> 16 bit part.
    to_half = kp.scale_to(target)
    after_tf32 = np.zeros(len(k), dtype=bool)
    kept = to_half.copy()
    if arch.tf32_over_fp32 is not None:
        off = tf32_switches_off(k, Tf32Switches.from_facts(ctx.recorded))
        after_tf32 = fp32_mask & np.isin(kp.switch_of, list(off))
        to_tf32 = kp.scale_to("tf32")
        kept = np.where(after_tf32, 1.0 - np.maximum(to_tf32 - to_half, 0.0), to_half)  # the time TF32 -> bf16 takes off
    per_kernel = dur * (1 - kept)
    if arch.tf32_over_fp32 is None:
        method = f"{arch.half_over_fp32:g}× fp32 → fp16, {arch.name}"
    else:
        method = _method(kp.family, fp32_mask & ~after_tf32, tf32_mask | after_tf32, dur, table, target)
    candidates_mask = fp32_mask | tf32_mask
    saved_ns = float(per_kernel[candidates_mask].sum())
    exposure = kernel_exposure(m, k)
    n_steps = max(len(m.steps), 1)
    saving_ms = saved_ns * exposure / n_steps / 1e6
    if saving_ms / step_ms < opts["min_share"]:
        return None

    bf16 = cap.value >= 8.0
    dtype = "bfloat16" if bf16 else "float16"
    training = is_training(m, ctx.recorded)
    autocast_used = ctx.recorded.autocast.used
    candidates = k[candidates_mask]
    from_op = float(dur[candidates_mask & (kp.source == FROM_OP)].sum() / max(fp32_ns + tf32_ns, 1))
    names_only = from_op == 0 and ctx.recorded.schema is None
    eligible_ms = eligible_ns / n_steps / 1e6
    where = "TF32" if tf32_ns > fp32_ns else "fp32"
    evidence = {
        "record_shapes": record_shapes_in_trace(m),  # the names-only sentence says why from this
        "compute_capability": cap.value,
        "compute_capability_source": cap.source,
        "architecture": arch.name,
        "tensor_core_kernel_share": round(m.tensor_core_kernel_share or 0.0, 4),
        "eligible_share_of_kernel_time": round(eligible_ns / total, 4),
        "half_precision_share_of_eligible": round(half_ns / eligible_ns, 4),
        "fp32_eligible_ms_per_step": round(fp32_ns / n_steps / 1e6, 3),
        "tf32_eligible_ms_per_step": round(tf32_ns / n_steps / 1e6, 3),
        "promised_after_tf32_ms_per_step": round(float(dur[after_tf32].sum()) / n_steps / 1e6, 3),
        # which switches "after allowing TF32" means, and which families already ran TF32 kernels
        "tf32_off_for": sorted({SWITCH_WORK[w] for w in np.unique(kp.switch_of[after_tf32]) if w in SWITCH_WORK}),
        "tf32_ran_for": sorted({SWITCH_WORK[w] for w in np.unique(kp.switch_of[tf32_mask]) if w in SWITCH_WORK}),
        "speedup_used": method,
        "kernel_time_by_precision_ms": m.kernel_time_by_precision_ms,
        "precision_from_op_input_types": round(from_op, 4),
        "training": training,  # a forward-only run: no backward, no loss, no GradScaler in the message
    }
    evidence.update(kernel_evidence(ctx.events, candidates, m.steps, exposure, by_eligible_op=True))
    evidence["autocast"] = (
        {"used": autocast_used, "dtypes": ctx.recorded.autocast.dtypes, "grad_scaler": ctx.recorded.grad_scaler}
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
        if after_tf32.any():
            fix = "First allow TF32 (see tf32-disabled); then run the forward pass and the loss under torch.autocast('cuda', dtype=torch.bfloat16); bf16 needs no GradScaler."
            how = "Autocast to bfloat16, " + _after_tf32(evidence)
    else:
        fix = "Run the forward pass and the loss under torch.autocast('cuda', dtype=torch.float16) and scale the loss with torch.amp.GradScaler."
        how = "Autocast to float16 with a GradScaler"
    if not evidence["training"] and not autocast_used:
        fix = f"Run the forward pass under torch.autocast('cuda', dtype=torch.{dtype}) (a forward-only run: no loss to scale)."
        how = f"Autocast to {dtype}" + (", " + _after_tf32(evidence) if after_tf32.any() else "")
        if after_tf32.any():
            fix = "First allow TF32 (see tf32-disabled); then " + fix[0].lower() + fix[1:]
    # The fix, replayed: these kernels at the 16-bit rate, plus the casts autocast adds.
    kernels_change = scale_device(k.index.to_numpy()[candidates_mask], kept[candidates_mask])
    change, casts_note = kernels_change, ""
    casts = None if autocast_used else autocast_casts(m)
    if casts is not None and not evidence["training"]:
        casts = casts.forward_only()  # a forward-only run casts nothing back in a backward it never runs
    if casts is not None and len(casts.casts):
        c = casts.casts
        cast_change = added_work(ctx.events, c["ts"].to_numpy(), casts.host_ns(), casts.device_ns())
        change = Change.merge([kernels_change, cast_change])
        # the casts' cost: the replayed step with them minus without them (unclamped: where the
        # casts outweigh the kernels' gain, the finding states the whole of what they add)
        r = ctx.replay
        cost_ms = max(r.replayed_ms(change) - r.replayed_ms(kernels_change), 0.0) if r.available else None
        if after_tf32.any():  # autocast alone, TF32 left off: every candidate kernel at the 16-bit rate
            alone = ctx.replayed_saving(Change.merge([scale_device(k.index.to_numpy()[candidates_mask], to_half[candidates_mask]), cast_change]))
            if alone is not None:
                evidence["autocast_without_tf32_replayed_ms"] = round(alone, 3)
        evidence["autocast_casts"] = {
            "per_step": round(casts.per_step(), 1),
            "forward_per_step": round(casts.per_step("forward"), 1),
            "backward_per_step": round(casts.per_step("backward") + casts.per_step("promote"), 1),
            "mb_per_step": round(float(c["bytes"].sum()) / casts.n_steps / 1e6, 1),
            "device_ms_per_step": round(float(casts.device_ns().sum()) / casts.n_steps / 1e6, 3),
            "copy_bandwidth_gbps": round(casts.bandwidth, 1),
            "host_ms_per_step_in_window": round(float(casts.host_ns().sum()) / casts.n_steps / 1e6, 3),
            "host_cost_per_cast_us": {"copy_op": round(casts.copy_ns / 1e3, 1), "backward_node": round(casts.node_ns / 1e3, 1)},
            "replayed_cost_ms_per_step": None if cost_ms is None else round(cost_ms, 3),
        }
        if cost_ms is not None:
            evidence["promise_parts"] = _parts(k, candidates_mask, kept, casts, cost_ms)
        cost = f"~{cost_ms:.1f} ms/step of" if cost_ms is not None else "the cost of"
        counts = evidence["autocast_casts"]
        where_casts = (
            f"{counts['forward_per_step']:.0f} in the forward pass, {counts['backward_per_step']:.0f} in the backward"
            if counts["backward_per_step"] > 0
            else "all in the forward pass"
        )
        casts_note = (
            f" The promise is net of {cost} the {counts['per_step']:.0f} casts per step autocast adds "
            f"({where_casts}), replayed at this run's own cost of a copy op."
        )
    message = (
        f"{100 * eligible_ns / total:.0f}% of kernel time ({eligible_ms:.1f} ms/step) is convolution/matmul work that can use "
        f"Tensor Cores, yet {state} on {gpu}. {how} moves them onto the Tensor Cores ({method}).{casts_note}"
    )
    if evidence["training"]:
        message += " It changes the numerics of what is trained, not only its speed: check that the loss follows the fp32 run's."
    else:
        message += " It changes the numerics of the outputs, not only their speed: check the accuracy against the fp32 outputs."
    if names_only:
        message += names_only_sentence(evidence["record_shapes"])
    confidence = "high" if cap.source in ("trace", "facts") else "medium"
    if names_only and cap.value >= 8.0:
        confidence = "medium" if confidence == "high" else "low"  # TF32 or fp32 is then a guess from names
    snippet = (AFTER_BF16 if bf16 else AFTER_FP16) if evidence["training"] else AFTER_INFERENCE.format(dtype=dtype)
    return ctx.finding(message, saving_ms, confidence=confidence, evidence=evidence, fix=fix, snippet=snippet, change=change)


SWITCH_WORK = {"matmul": "matmuls", "cudnn": "convolutions"}


def _after_tf32(evidence: dict) -> str:
    """"after allowing TF32", naming the work whose switch is off, and the work that already
    runs TF32 (never a plain "after allowing TF32" on a run whose convolutions ran TF32)."""
    off = evidence["tf32_off_for"]
    ran = [w for w in evidence["tf32_ran_for"] if w not in off]
    out = f"after allowing TF32 for {' and '.join(off)}"
    return out + (f" ({' and '.join(ran)} already run TF32)" if ran else "")


def _method(family, fp32_mask, tf32_mask, dur, table, target: str) -> str:
    """The speed-ups used, per source precision and family, largest time first."""
    groups = []
    sources = []
    for source, mask, label in (("fp32-fma", fp32_mask, "fp32"), ("tf32", tf32_mask, "TF32")):
        parts = []
        for f in ("gemm", "attention", "conv", "rnn"):
            sel = mask & (family == f)
            if sel.any():
                ratio, how = table.ratio(f, source, target)
                parts.append((dur[sel].sum(), f"{f} {ratio:g}×"))
                sources.append(how)
        if parts:
            parts.sort(key=lambda p: -p[0])
            groups.append((sum(p[0] for p in parts), f"{label} → {target} " + ", ".join(p[1] for p in parts)))
    groups.sort(key=lambda g: -g[0])
    where = f"measured on an {table.measured_on}" if "measured" in sources else f"conservative, {table.arch.name}"
    return "; ".join(g[1] for g in groups) + f", {where}"


def _parts(k, candidates_mask, kept, casts, cost_ms: float) -> list[dict]:
    """Autocast's promise in its parts (advisor.whatif.parts): the casts' replayed cost, split
    between device and host as this run's own copy ops take them, and the per-op speed-ups,
    which take the rest of the replayed saving. No measured pair confirms the speed-ups (the
    H100 ViT bf16 pair measured 16.18 ms against 27.27 promised), so they are an "up to"."""
    dur = k["dur"].to_numpy(np.float64)[candidates_mask]
    n_steps = casts.n_steps
    device_ms = float(casts.device_ns().sum()) / n_steps / 1e6
    host_ms = float(casts.host_ns().sum()) / n_steps / 1e6
    device_share = device_ms / (device_ms + host_ms) if device_ms + host_ms > 0 else 0.0
    sped_up_bound = float((dur * (1.0 - np.asarray(kept, dtype=np.float64)[candidates_mask])).sum()) / n_steps / 1e6
    return [
        PromisePart("per-op speed-ups", 0.0, sped_up_bound, "the candidate kernels' time less their time at the 16-bit rates",
                    rest=True).as_evidence(),
        PromisePart("casts", -cost_ms * device_share, device_ms, "the casts' device time, at this run's copy bandwidth",
                    "this run's own copy ops").as_evidence(),
        PromisePart("host cost", -cost_ms * (1.0 - device_share), host_ms, "the casts' host time, at this run's cost of a copy op",
                    "this run's own copy ops").as_evidence(),
    ]
