"""Much of the kernel time goes to eager elementwise and normalisation kernels, one op at a time.

## What it detects
At least `min_kernel_share` (10%) of the kernel time inside the steps is spent in eager
PyTorch elementwise, reduction, normalisation, softmax and dropout kernels
(`at::native::vectorized_elementwise_kernel`, `reduce_kernel`, cuDNN batch-norm kernels, ...)
outside the optimizer, and no compiled region ran: no Triton kernel in the trace, no host
span of a compiled region (`CompiledFunction`, `CompiledFunctionBackward`,
`Torch-Compiled Region`, Inductor's `## Call CompiledFxGraph ##`), whatever the backend
named its kernels, and `compile.used` is not true in the facts file. It fires when fusing
those kernels' chains (see below) saves at least `min_share` (3%) of the step.

Options: `min_kernel_share` (float, 0.10): the least share of the steps' kernel time in
eager elementwise/normalisation kernels; `min_share` (float, 0.03): the least saving, as a
share of the step, worth a finding; `min_cpu_share` (float, 0.10): the same on a run without a
device.

**On a CPU** (a run without a device) it reads the host's ops instead: chains of at least two
consecutive eager elementwise, reduction and normalisation ops (`aten::mul`, `aten::tanh`,
`aten::relu`, `aten::layer_norm`, their backward formulas, ...) on a thread inside a step,
view ops (`chunk`, `view`, `transpose`, ...) aside, outside the optimizer and the DataLoader
(dropout, whose time is drawing random numbers, and casts and copies are no members). It fires
when fusing them saves at least `min_cpu_share` (10%) of the step; with no chain, no finding.
The CPU floor is higher than the device's: the estimate leaves out what compiled code costs on
a CPU beyond each fused loop's call (its guards, the compiled graph's wrappers), and a control
it promised 6–9% on (`tabular_clean`) ran slower compiled.

## What it needs from the trace
The device's kernel records (GPU or MTIA): the eager elementwise kernels and the chains they
form; on a CPU-only run, the host ops with their input shapes (`record_shapes=True`, as
`advisor profile` records them). A compiled region in the trace (Triton kernels,
compiled-region spans) or `compile.used` in the facts file makes it silent. Each clause of its
message stands on an evidence field: with no chain to fuse (`fusable_chains_per_step` 0, or on
a CPU no chain at all) it promises no fusion.

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

## Fix: `advisor fix --unsafe-fixes` (unsafe: generated kernels round differently)
After the last `model = ...` before the optimizer takes `model.parameters()`:
```diff
 model = model.to(device)
+model = torch.compile(model)
 optimizer = torch.optim.AdamW(model.parameters())
```
A compile behind the script's own condition is left to the user with the reason. A
`transformers` Trainer gets `TrainingArguments(torch_compile=True)`.

## How the saving is estimated
The fix is replayed on the run's own step graph; the saving is how much shorter the replayed
step is. What the replay changes:

- **Fusion.** Inductor fuses each chain of elementwise/normalisation ops that no matmul,
  convolution or attention kernel interrupts. The rule finds those chains in the trace: runs
  of consecutive eager elementwise kernels on a stream inside a step (optimizer kernels
  excluded). Each run becomes one kernel that costs what its costliest member costs (the
  kernels are memory-bound: the fused one moves about what the largest moved), and the other
  members' launches go. A run of one kernel has nothing to fuse with and saves nothing.
- **Batch norm.** A kept cuDNN batch-norm kernel is replaced by Inductor's own, which streams
  at the memory's speed: its passes over the activation (3 forward, 5 backward, from the
  launching op's input shape) at the bandwidth this run's simple elementwise kernels reached
  (their 90th percentile). Without recorded shapes it keeps its time.
- **Layout.** Inductor lays convolutions out channels-last, so cuDNN's NCHW↔NHWC transpose
  kernels around them go (the kernels `channels-last` counts).
- **Host.** The compiled region's kernels are issued by generated code, not eager dispatch:
  in each step the eager host time from the region's first launch to its last goes (the
  optimizer, the DataLoader's wait, collectives and DDP's gradient reducer stay), and each
  kept kernel costs `COMPILED_HOST_NS_PER_KERNEL` (`advisor/whatif/changes.py`) of host time
  instead. The kernels run back to back on their streams.

Device time saved where the host bounds the step does not count, and where the host bounds
the compiled step (a fast device, many small kernels) the generated code's cost does. On a
trace without unprofiled step times the eager host time removed is the window's, the
profiler's own cost included, as for every host-side fix. The rule's own estimate (evidence
`estimate_ms`) is the removed members' kernel time per step times the share of kernel time on
the timeline. The constants and how far the model matched recorded compiled runs are in
`benchmarks/results/rule_constants.md` and `benchmarks/results/compiled_host_cost.txt`.

**The promise in its parts.** The finding's evidence (`promise_parts`) and its message give
each part with its figure and its bound: **fusion** (the chains' other members' kernel time,
at the share of kernel time on the timeline; at most that kernel time), **launches removed**
(what the replay saves beyond the device parts: the eager host time that goes, less the
generated code's; at most the eager host time from the region's first launch to its last),
**layout** (cuDNN's layout transposes; at most their kernel time) and **norms** (the kept
cuDNN batch norms at the run's bandwidth; at most their kernel time). They add up to the
fix's saving alone; where the replay gives less than the device parts, those are scaled down
together. The H100 ViT compile pair (`../shared/whatif/h100_vit`: 6.33 ms promised, 7.99
measured) checked fusion and launches; no measured pair has checked layout or norms (a ViT
has no batch norm and one convolution), so those read "up to". A promise whose "up to" parts
are at least 5% of it ranks behind a fix whose model measured pairs confirm (a rule page's
`CONFIRMED_BY`: `dataloader-stall`, `tf32-disabled`, `single-tensor-optimizer`, `host-sync`)
unless it saves more than twice as much (`advisor.engine.ranking.UNCHECKED_MARGIN`), and its
line then says why it sits below a smaller figure.

**On a CPU.** torch.compile's C++ backend fuses each chain into one vectorised loop. Each chain
member's time is the median of its like ops (same name, input types and shapes) over the
window, so that a call that waited for a core on a busy machine does not count as work; the
host time between members (the model's Python in the forward, the autograd engine's nodes in
the backward) likewise. What fusing a chain removes, in two parts:

- **fusion**: each intermediate written and read back. From the recorded shapes, every member
  reads its tensor inputs and writes an output of its largest input's size (a reduction writes
  next to nothing); a fused loop writes only the chain's last output, so of the members' work
  (their time less their dispatch) the share `2 × (bytes written by all but the last) / (bytes
  read and written by all)` goes. Without shapes, at most all but the costliest member's work.
- **dispatch**: each member's dispatch but one (the run's own figure: the lower quartile of
  the times of its elementwise ops on at most 4096 elements, `dispatch_us_per_op`; none where
  it has fewer than 20), and the host time between members, which compiled code does not run.
  Both are taken at the host's scale the unprofiled steps after the window measured (the
  replay's `host_scale`): the profiler lengthens the ops themselves, not only by the events
  they hold (the chain of one gated block, its ops timed alone, took 394 µs; the same ops
  recorded, 546 µs). Where no unprofiled steps were timed, less the profiler's own cost of the
  events they hold (`PROFILER_NS_PER_EVENT` per op or Python function recorded, as
  `cpu-autocast` does). The earlier figure (the window's op times less that per-event cost)
  promised 45% to 64% on AdvisorBench's `mlp_elementwise`, against 41.4% measured.

Per chain the two together never exceed its time less its costliest member's work (what the
fused loop still does), nor the chain's window as it ran, and the fused loop's call from the
generated code costs `COMPILED_HOST_NS_PER_KERNEL` of host time: a chain of a few small ops
gains nothing (`tabular_clean`, a residual MLP of 128-wide layers, ran 4.1 → 6.6 and 13.0 →
17.8 ms per step compiled: slower). That time is replayed as the host's work that much shorter
per step (`host_shorter_by`): it is the chains' own work at their typical pace, in the
replay's units, and it composes with another fix of the same host time by multiplying rather
than hiding behind the larger removal. A wait for a core inside a chain (a busy machine, a
thread's barrier in each parallel op) is not counted as work that fusing removes: on a busy
machine the compile twins disagree about it (at a load of 7 to 10 on 2 cores,
`transformer_clean` compiled ran 25% and 17% faster in two pairs, `tabular_clean` compiled
1.8× and 4× slower in two of three), so a CPU promise from a busy window is a floor for the
chains' own work, not a measure of the waits.

Before: `h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * self.scale`, then
a gated tanh-GELU written op by op (AdvisorBench's `mlp_elementwise`: 16 ops per block, 12
chains per step with the backward's); after: `model = torch.compile(model)`. The message and
evidence (`promise_parts`) give the two parts, "up to" while no measured pair has checked them
(`CPU_COMPILE_PAIR`); `docs/accuracy.md` has the pairs measured so far. A control that fires
is measured against a compile twin of its own before anyone calls it a false positive.

Reference: https://pytorch.org/tutorials/intermediate/torch_compile_tutorial.html
"""

from __future__ import annotations

import re

import numpy as np

from advisor.whatif.changes import COMPILED_HOST_NS_PER_KERNEL, compiled, fused
from advisor.whatif.parts import PromisePart
from advisor.whatif.replay import Change
from advisor.whatif.savings import PROFILER_NS_PER_EVENT, dataloader_spans

from advisor.engine import Context
from advisor.metrics.breakdown import COMM_OP_NAME, name_matches
from advisor.metrics.compute import (
    LAYOUT_TRANSPOSE_KERNEL,
    kernel_evidence,
    kernel_exposure,
    launch_ts_of,
    launched_inside,
    step_kernels,
)
from advisor.metrics.elementwise import (
    ELEMENTWISE_KERNEL,
    batch_norm_roofline_share,
    compiled_regions_ran,
    cpu_elementwise_chains,
    fused_chain_members,
    in_chain,
)
from advisor.metrics.host_device import OPTIMIZER_SPAN

ID = "unfused-elementwise"
TITLE = "Eager elementwise kernels dominate: nothing is fused"
GROUP = "compute"
TESTED_ON = ("nvidia", "amd", "mtia", "cpu")  # vendors whose real traces the tests run it on (advisor/metrics/vendors.py)
DOCS = "https://pytorch.org/tutorials/intermediate/torch_compile_tutorial.html"
DEFAULTS = {"min_kernel_share": 0.10, "min_share": 0.03, "min_cpu_share": 0.10}
CPU_FIX = "Compile the model with torch.compile so chains of elementwise ops run as fused loops (its C++ backend on a CPU)."
# The measured pair that checked the CPU model (fusion and dispatch): AdvisorBench's
# mlp_elementwise and its torch.compile twin (benchmarks/results/advisorbench_cpu.txt).
CPU_COMPILE_PAIR = None
FIX = "Compile the model with torch.compile so chains of elementwise ops run as fused kernels."
AFTER = """model = torch.compile(model)
"""
DDP_REDUCER = re.compile(r"^torch\.distributed\.ddp\.reducer::")
# The measured pair that checked the fusion and launch models (the layout and batch-norm ones
# have none: a ViT has neither): benchmarks/results/promise_accuracy.txt.
COMPILE_PAIR = "the H100 ViT compile pair (../shared/whatif/h100_vit)"


def _count(x: float) -> str:
    """A count per step as the evidence holds it: whole from 1 up, one decimal below (never a 0
    standing for a few)."""
    return f"{x:.0f}" if x >= 1 else f"{x:.1f}"


def check(ctx: Context):
    m = ctx.metrics
    opts = ctx.options
    step_ms = ctx.step_ms
    if ctx.recorded.compile.used is True or step_ms <= 0:
        return None
    if compiled_regions_ran(ctx.metrics.kernels, ctx.events.host):
        return None  # compiled regions ran: the compiler already fuses what it can
    if not m.has_device:
        return _check_cpu(ctx)
    k = step_kernels(m)
    total = float(k["dur"].sum())
    if total <= 0:
        return None
    host = ctx.events.host
    in_optimizer = launched_inside(ctx.metrics, host[name_matches(host["name"], OPTIMIZER_SPAN)])[k.index.to_numpy()]
    eligible = np.asarray(name_matches(k["name"], ELEMENTWISE_KERNEL), dtype=bool) & ~in_optimizer
    ew = k[eligible]
    ew_ns = float(ew["dur"].sum())
    if ew_ns / total < opts["min_kernel_share"]:
        return None
    n_steps = max(len(m.steps), 1)
    exposure = kernel_exposure(m, k)
    # Inductor also lays convolutions out channels-last (its layout optimisation): cuDNN's
    # NCHW <-> NHWC transposes around them go with the eager kernels.
    transposes = np.asarray(name_matches(k["name"], LAYOUT_TRANSPOSE_KERNEL), dtype=bool) & ~in_optimizer
    fused_away = fused_chain_members(k, eligible) | transposes
    gone = k[fused_away]
    # The batch norms the compiler generates stream at the memory's speed: a kept cuDNN one
    # costs its passes over the activation at the run's own bandwidth.
    kept = np.nonzero(eligible & ~fused_away)[0]
    bn_share = batch_norm_roofline_share(k, kept)
    kept_dur = k["dur"].to_numpy(np.float64)[kept]
    bn_saved_ns = float((kept_dur * (1.0 - bn_share)).sum())
    saving_ms = (float(gone["dur"].sum()) + bn_saved_ns) * exposure / n_steps / 1e6
    if saving_ms / step_ms < opts["min_share"]:
        return None
    ew_ms = ew_ns / n_steps / 1e6
    per_step = len(ew) / n_steps
    chains = int(np.count_nonzero(eligible & ~fused_away & in_chain(k, eligible)))
    evidence = {
        "elementwise_ms_per_step": round(ew_ms, 3),
        "share_of_kernel_time": round(ew_ns / total, 4),
        "elementwise_kernels_per_step": round(per_step, 1),
        "excluded_optimizer_kernels_per_step": round(float(np.count_nonzero(in_optimizer)) / n_steps, 1),
        "fusable_chains_per_step": round(chains / n_steps, 1),
        "fused_away_kernels_per_step": round(len(gone) / n_steps, 1),
        "fused_away_ms_per_step": round(float(gone["dur"].sum()) / n_steps / 1e6, 3),
        "layout_transposes_per_step": round(float(np.count_nonzero(transposes)) / n_steps, 1),
        "layout_transpose_ms_per_step": round(float(k["dur"].to_numpy()[transposes].sum()) / n_steps / 1e6, 3),
        "batch_norm_ms_saved_per_step": round(bn_saved_ns / n_steps / 1e6, 3),
        "compiled_kernels_seen": False,
    }
    evidence.update(kernel_evidence(ctx.events, ew, m.steps, exposure))
    compile_fact = ctx.recorded.compile.used
    # Each clause of what compiling does stands on its own evidence field: no chain to fuse, no
    # clause about fusing (a "fuses its 0 chains" promises what the trace does not hold).
    kernel_side = []
    if evidence["fusable_chains_per_step"] > 0:
        kernel_side.append(f"fuses its {_count(evidence['fusable_chains_per_step'])} chains per step into one kernel each")
    if evidence["layout_transposes_per_step"] > 0:
        kernel_side.append(f"lays its convolutions out channels-last ({_count(evidence['layout_transposes_per_step'])} layout transposes go)")
    does = " and ".join(kernel_side)
    if does and evidence["fused_away_kernels_per_step"] > 0:
        does += f" ({_count(evidence['fused_away_kernels_per_step'])} fewer kernels, {evidence['fused_away_ms_per_step']:.1f} ms/step less kernel time)"
    if evidence["batch_norm_ms_saved_per_step"] > 0:
        bn = f"its batch norms stream at this run's memory bandwidth ({evidence['batch_norm_ms_saved_per_step']:.1f} ms/step less than cuDNN's)"
        does = f"{does}, {bn}" if does else f"makes {bn}"
    message = (
        f"{100 * ew_ns / total:.0f}% of kernel time ({ew_ms:.1f} ms/step, {per_step:.0f} kernels) is eager elementwise, "
        "reduction and normalisation work, and no compiled region ran (no Triton kernel, no CompiledFunction span). torch.compile(model) "
        + (f"{does}, and its generated code launches the kernels it keeps" if does else "issues its kernels from generated code")
        + f" at ~{COMPILED_HOST_NS_PER_KERNEL / 1e3:.0f} µs of host time each instead of eager dispatch."
    )
    evidence["compile"] = compile_fact if compile_fact is not None else "not recorded (no facts file); judged from the kernel names"
    # The fix, replayed: each chain's other members go, and the compiled region's kernels
    # (everything outside the optimizer) are issued by generated code at its own host cost.
    region = k[~in_optimizer]
    # Host work the compiled model does not take over stays: the optimizer, the DataLoader's
    # wait, collectives and DDP's gradient reducer (its hooks run eager around compiled code).
    kept_host = host[name_matches(host["name"], OPTIMIZER_SPAN) | name_matches(host["name"], COMM_OP_NAME) | name_matches(host["name"], DDP_REDUCER)]
    dl_s, dl_e = dataloader_spans(ctx.events)
    exclude = (np.concatenate([kept_host["ts"].to_numpy(np.int64), dl_s]), np.concatenate([kept_host["end"].to_numpy(np.int64), dl_e]))
    generated = compiled(ctx.events, region.index.to_numpy(), launch_ts_of(m, region.index.to_numpy()), region["step_index"].to_numpy(np.int64),
                         ~fused_away[~in_optimizer], exclude)
    change = Change.merge([fused(ctx.events, k, fused_away, kept, bn_share), generated])
    evidence["promise_parts"] = _parts(k, fused_away & ~transposes, transposes, kept_dur[np.asarray(bn_share) < 1.0], bn_saved_ns, generated, exposure, n_steps)
    evidence["compiled_kernels_per_step"] = round(float(np.count_nonzero(~fused_away[~in_optimizer])) / n_steps, 1)
    evidence["compiled_host_us_per_kernel"] = round(COMPILED_HOST_NS_PER_KERNEL / 1e3, 1)
    return ctx.finding(message, saving_ms, confidence="medium", evidence=evidence, change=change)


def _parts(k, chained, transposes, kept_bn_dur, bn_saved_ns: float, generated: Change, exposure: float, n_steps: int) -> list[dict]:
    """The promise in its parts (advisor.whatif.parts): the device time each model removes, at
    the share of kernel time on the timeline; the host's part is what the replay adds on top."""
    dur = k["dur"].to_numpy(np.float64)
    per_step = lambda ns: float(ns) * exposure / n_steps / 1e6
    host_ns = sum(float((we - ws).sum()) for ws, we, _ in generated.host_remove)
    return [
        PromisePart("fusion", per_step(dur[chained].sum()), per_step(dur[chained].sum()),
                    "the chains' other members' kernel time", COMPILE_PAIR).as_evidence(),
        PromisePart("launches removed", 0.0, host_ns / n_steps / 1e6,
                    "the eager host time from the region's first launch to its last", COMPILE_PAIR, rest=True).as_evidence(),
        PromisePart("layout", per_step(dur[transposes].sum()), per_step(dur[transposes].sum()),
                    "cuDNN's layout transposes' kernel time").as_evidence(),
        PromisePart("norms", per_step(bn_saved_ns), per_step(kept_bn_dur.sum()), "the kept cuDNN batch norms' kernel time").as_evidence(),
    ]


def _check_cpu(ctx: Context):
    """A run without a device: the host's elementwise chains (advisor.metrics.elementwise), each
    fused into one vectorised loop by torch.compile's C++ backend."""
    m = ctx.metrics
    host = ctx.events.host
    n_steps = max(len(m.steps), 1)
    # The optimizer and the DataLoader are not the model's: compiling it leaves them eager.
    kept_host = host[name_matches(host["name"], OPTIMIZER_SPAN)]
    dl_s, dl_e = dataloader_spans(ctx.events)
    exclude = (np.concatenate([kept_host["ts"].to_numpy(np.int64), dl_s]), np.concatenate([kept_host["end"].to_numpy(np.int64), dl_e]))
    # The chains' time in the replay's units: where the unprofiled steps measured the host's
    # scale, the window's op times at that scale (the profiler lengthens the ops themselves,
    # not only by the events they hold); else less the profiler's estimated cost per event.
    measured_scale = ctx.replay.measured_host_scale if ctx.replay.available else None
    unit = measured_scale if measured_scale is not None else 1.0
    found = cpu_elementwise_chains(host, m.steps, exclude, 0.0 if measured_scale is not None else PROFILER_NS_PER_EVENT[1])
    chains = found.chains
    if len(chains) == 0:
        return None  # no chain, nothing to fuse: no finding
    ops_ns = float(chains["ops_ns"].sum())
    window_ns = float((chains["end"] - chains["start"]).sum())
    dispatch_ns = float(chains["dispatch_ns"].sum())
    shapes = bool(np.isfinite(chains["traffic_ns"].to_numpy(np.float64)).all())
    # Without recorded shapes the fused loop is bounded only: it costs at least its costliest
    # member's work, so the rest of the members' work is what fusing removes at most.
    bound_traffic = (chains["ops_ns"] - chains["kept_ns"] - (chains["members"] - 1) * (found.dispatch_ns_per_op or 0.0)).clip(lower=0.0)
    traffic_ns = float(chains["traffic_ns"].sum()) if shapes else float(bound_traffic.sum())
    # Never more than the chains take beside the fused loop's own work.
    # The fused loop is called from the compiled graph's generated code at that code's own host
    # cost per kernel (COMPILED_HOST_NS_PER_KERNEL): a chain whose ops cost less than that to run
    # one by one gains nothing from fusing (AdvisorBench's tabular MLP, of 128-wide layers, ran
    # slower compiled).
    saved = (np.minimum(chains["dispatch_ns"] + (chains["traffic_ns"] if shapes else bound_traffic), chains["typical_ns"] - chains["kept_ns"]) * unit
             - COMPILED_HOST_NS_PER_KERNEL).clip(lower=0.0)
    saved_ns = float(saved.sum())
    typical_ns = float(chains["typical_ns"].sum())
    if saved_ns <= 0 or window_ns <= 0 or typical_ns <= 0:
        return None
    # Each chain loses what fusing removes of its typical time, at most its window as it ran.
    # A wait for a core inside a chain (a busy machine) is not counted as work fusing removes:
    # a compiled model waits too (AdvisorBench's tabular MLP compiled ran slower on a busy machine).
    s, e = chains["start"].to_numpy(np.int64), chains["end"].to_numpy(np.int64)
    removed_ns = np.minimum(saved.to_numpy(np.float64), (e - s).astype(np.float64) * unit)
    estimate_ms = float(removed_ns.sum()) / n_steps / 1e6
    # Replayed as the host's work that much shorter per step: the time is the chains' own, at
    # their typical pace and in the replay's units, and a CPU step is one stretch of host
    # work in which another fix's removal would otherwise hide it (the larger removal wins).
    change = ctx.replay.host_shorter_by(estimate_ms) if ctx.replay.available else None
    if change is None:
        change = Change(host_remove=[(s, e, float(np.clip(removed_ns.sum() / max(window_ns * unit, 1.0), 0.0, 1.0)))])
    replayed = ctx.replayed_saving(change)
    saving_ms = replayed if replayed is not None else estimate_ms
    base_ms = ctx.replay.baseline_ms if replayed is not None else ctx.step_ms
    if base_ms <= 0 or saving_ms / base_ms < ctx.options["min_cpu_share"]:
        return None
    per_step = lambda ns: float(ns) / n_steps / 1e6
    ran = window_ns / typical_ns  # the chains as they ran over their typical time
    scale = min(1.0, saved_ns / max((dispatch_ns + traffic_ns) * unit, 1.0))
    evidence = {
        "device": "CPU",
        "chains_per_step": round(len(chains) / n_steps, 1),
        "chain_ops_per_step": round(float(chains["members"].sum()) / n_steps, 1),
        "chain_ops_ms_per_step": round(per_step(ops_ns), 3),
        "chain_window_ms_per_step": round(per_step(window_ns), 3),
        "elementwise_ops_per_step": round(found.eligible_ops / n_steps, 1),
        "elementwise_ms_per_step": round(per_step(found.eligible_ns), 3),
        "dispatch_us_per_op": None if found.dispatch_ns_per_op is None else round(found.dispatch_ns_per_op / 1e3, 2),
        "intermediates_from_shapes": shapes,
        "removed_ms_per_step": round(estimate_ms, 3),
        "unprofiled_scale": None if measured_scale is None else round(measured_scale, 4),
        "compile": ctx.recorded.compile.used if ctx.recorded.compile.used is not None else "not recorded (no facts file); judged from the op names",
    }
    checked = CPU_COMPILE_PAIR
    evidence["promise_parts"] = [
        PromisePart("fusion", per_step(traffic_ns * scale * unit), per_step(ops_ns * ran * unit),
                    "the chains' ops' own time" if shapes else "the chains' ops' work beside their costliest member's",
                    checked if shapes else None).as_evidence(),
        PromisePart("dispatch", per_step(dispatch_ns * scale * unit), per_step(window_ns * unit),
                    "the chains' time as they ran (their dispatch but one each, and the host time between their ops)", checked, rest=True).as_evidence(),
    ]
    chains_n = len(chains) / n_steps
    message = (
        f"{_count(chains_n)} chains of eager elementwise ops per step ({float(chains['members'].sum()) / n_steps:.0f} ops, "
        f"{per_step(ops_ns):.1f} ms/step) run one op at a time on the CPU, each writing its output and the next reading it back, "
        f"and no compiled region ran. torch.compile(model) fuses each chain into one vectorised loop (its C++ backend): "
        + ("the intermediates' write and read-back go (from the recorded shapes)" if shapes else "up to all but each chain's costliest op's work goes (no shapes recorded)")
        + (f", and each chain's dispatch but one (~{found.dispatch_ns_per_op / 1e3:.0f} µs per op in this run) with the host time between its ops"
           if found.dispatch_ns_per_op is not None else ", and the host time between its ops")
        + "."
    )
    return ctx.finding(message, saving_ms, confidence="medium", evidence=evidence, change=change, fix=CPU_FIX, snippet=AFTER)
