"""Eager elementwise kernels, their chains, and where compiled code ran.

Shared by the rules that price fusing elementwise work: `unfused-elementwise` (nothing was
compiled) and `compile-graph-breaks` (compiled graphs ran, and much elementwise work stayed
eager between them). A chain is a run of consecutive eager elementwise kernels on a stream
inside a step that no other kernel interrupts: Inductor fuses such a run into one kernel that
costs about what its costliest member costs (they are memory-bound).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from advisor.metrics.autocast import DTYPE_BYTES, input_type_names
from advisor.metrics.breakdown import name_matches, row_groups, text_of
from advisor.metrics.shapes import numel
from advisor.metrics.steps import step_of

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


# The spans that hold a compiled graph's own launches, and no eager code: the graph's autograd
# function (forward and backward) and Inductor's call of its generated code. Dynamo's
# `Torch-Compiled Region` marker is left out: it also spans the eager code between graph breaks.
COMPILED_GRAPH = re.compile(
    r"^(CompiledFunction|CompiledFunctionBackward|autograd::engine::evaluate_function: CompiledFunctionBackward|"
    r"## Call CompiledFxGraph)",
    re.IGNORECASE,
)


def compiled_regions_ran(kernels: pd.DataFrame, host: pd.DataFrame) -> bool:
    """Whether the trace shows compiled code: Triton kernels, or the host spans of compiled
    regions (whatever kernels the backend generated, and named)."""
    if len(kernels) and name_matches(kernels["name"], COMPILED_KERNEL).any():
        return True
    return bool(len(host)) and bool(name_matches(host["name"], COMPILED_REGION).any())


def in_chain(k, eligible: np.ndarray) -> np.ndarray:
    """Eligible kernels whose run (see `fused_chain_members`) has at least two members."""
    run = runs(k, eligible)
    sizes = np.bincount(run[eligible]) if eligible.any() else np.zeros(0, dtype=np.int64)
    out = np.zeros(len(k), dtype=bool)
    out[eligible] = sizes[run[eligible]] >= 2
    return out


def runs(k, eligible: np.ndarray) -> np.ndarray:
    """Run number of each kernel in (step, stream, start) order; a run is a maximal stretch of
    eligible kernels, broken by any other kernel, a new stream or a new step. Positional."""
    order = np.lexsort((k["ts"].to_numpy(np.int64), k["stream"].to_numpy(np.int64), k["step_index"].to_numpy(np.int64)))
    e = eligible[order]
    stream = k["stream"].to_numpy(np.int64)[order]
    step = k["step_index"].to_numpy(np.int64)[order]
    brk = np.ones(len(e), dtype=bool)
    brk[1:] = (e[1:] != e[:-1]) | (stream[1:] != stream[:-1]) | (step[1:] != step[:-1])
    run = np.empty(len(e), dtype=np.int64)
    run[order] = np.cumsum(brk) - 1
    return run


def fused_chain_members(k, eligible: np.ndarray) -> np.ndarray:
    """Mask over `k` (step kernels): eligible kernels that a fused chain absorbs, i.e. every
    member of a run of consecutive eligible kernels but its costliest (see `runs`)."""
    out = np.zeros(len(k), dtype=bool)
    if not eligible.any():
        return out
    run = runs(k, eligible)
    pos = np.nonzero(eligible)[0]
    dur = k["dur"].to_numpy(np.float64)[pos]
    frame = {"run": run[pos], "dur": dur, "pos": pos}
    df = pd.DataFrame(frame)
    keep = df.sort_values(["run", "dur"], ascending=[True, False], kind="stable").drop_duplicates("run")["pos"].to_numpy()
    out[pos] = True
    out[keep] = False
    return out


# cuDNN's batch-norm kernels (forward in training, backward), and the passes over the
# activation a bandwidth-bound kernel needs: forward reads it for the statistics and again to
# normalise, and writes the output (3); backward reads the input and the output's gradient
# for the reductions and again for the input's gradient, which it writes (5).
BATCH_NORM_KERNEL = re.compile(r"cudnn::bn_(?:fw|bw)|bn_fw_|bn_bw_")
BATCH_NORM_PASSES = {"forward": 3, "backward": 5}
# Ops whose kernels stream whole tensors once: the trace's own bandwidth is read off them.
BANDWIDTH_PROBE_OP = re.compile(r"^aten::(?:add_?|mul_?|relu_?|clamp_min_?|threshold_backward)$")
MIN_PROBE_BYTES = 1 << 20
MIN_PROBES = 20


def _first_input(types_text: object, dims: object) -> tuple[int, int, int]:
    """(elements, bytes per element, inputs of that many elements) of an op's first input;
    zeros where its shape or dtype is not recorded."""
    types = input_type_names(types_text) if isinstance(types_text, str) else ()
    if not isinstance(dims, list) or not dims or not types:
        return 0, 0, 0
    n = numel(dims[0])
    if n <= 0:
        return 0, 0, 0
    return n, DTYPE_BYTES.get(types[0], 0), sum(1 for d in dims if numel(d) == n)


def _first_inputs(k: pd.DataFrame) -> np.ndarray:
    """_first_input of each kernel's launching op, worked out once per distinct (types,
    shapes): a run repeats the same ops every step, and equal shapes are one object."""
    types = k["op_input_types"].to_numpy()
    dims = k["op_input_dims"].to_numpy()
    if len(k) == 0:
        return np.zeros((0, 3), dtype=np.float64)
    key = row_groups([types, np.fromiter(map(id, dims), dtype=np.int64, count=len(dims))])  # 0, 1, ... by first appearance
    first = np.unique(key, return_index=True)[1]
    worked = np.array([_first_input(types[i], dims[i]) for i in first], dtype=np.float64).reshape(-1, 3)
    return worked[key]


def achieved_bandwidth(k: pd.DataFrame) -> float | None:
    """Bytes per ns the device's memory gave this run's simple elementwise kernels (their 90th
    percentile: the kernels that streamed at full speed), from the launching ops' input
    shapes; None where the trace has too few of them (no shapes recorded)."""
    if "op_input_dims" not in k or len(k) == 0:
        return None
    probe = k[name_matches(k["op"], BANDWIDTH_PROBE_OP) & (k["dur"].to_numpy() > 0)]
    if len(probe) < MIN_PROBES:
        return None
    elems, size, reads = _first_inputs(probe).T
    writes = (~probe["op"].astype(str).str.endswith("_")).to_numpy(np.float64)  # in-place ops write an input
    moved = (reads + writes) * elems * size
    ok = moved >= MIN_PROBE_BYTES
    if np.count_nonzero(ok) < MIN_PROBES:
        return None
    return float(np.percentile(moved[ok] / probe["dur"].to_numpy(np.float64)[ok], 90))


def batch_norm_roofline_share(k: pd.DataFrame, rows: np.ndarray) -> np.ndarray:
    """For the kernels at positions `rows` of `k`: the share of its time a cuDNN batch-norm
    kernel would take at the run's own memory bandwidth (its passes over the activation,
    see BATCH_NORM_PASSES), at most 1; 1 for every other kernel and where shapes are missing.
    A compiler's generated batch norm streams at that speed; cuDNN's NCHW kernels do not."""
    share = np.ones(len(rows), dtype=np.float64)
    bandwidth = achieved_bandwidth(k)
    if bandwidth is None or len(rows) == 0:
        return share
    sub = k.iloc[rows]
    is_bn = np.asarray(name_matches(sub["name"], BATCH_NORM_KERNEL), dtype=bool)
    if not is_bn.any():
        return share
    elems, size, _ = _first_inputs(sub[is_bn]).T
    names = sub["name"][is_bn].astype(str)
    backward = names.str.contains("bw").to_numpy() | sub["op"][is_bn].astype(str).str.contains("backward").to_numpy()
    passes = np.where(backward, BATCH_NORM_PASSES["backward"], BATCH_NORM_PASSES["forward"])
    dur = sub["dur"].to_numpy(np.float64)[is_bn]
    roofline = passes * elems * size / bandwidth
    known = (roofline > 0) & (dur > 0)
    share[np.nonzero(is_bn)[0][known]] = np.minimum(roofline[known] / dur[known], 1.0)
    return share


__all__ = ["CpuChains", "cpu_elementwise_chains", "BATCH_NORM_KERNEL", "achieved_bandwidth", "batch_norm_roofline_share", "COMPILED_GRAPH", "COMPILED_KERNEL", "COMPILED_REGION", "ELEMENTWISE_KERNEL", "compiled_regions_ran", "fused_chain_members", "in_chain", "runs"]


# --- The CPU's elementwise chains (a run without a device) -----------------------------------
#
# On a CPU each eager op is its own pass over memory and its own dispatch: `h * rsqrt(...)`,
# then `* scale`, then `tanh(...)`, each writing its output and the next reading it back.
# torch.compile's C++ backend (Inductor's CPP codegen) fuses such a run into one vectorised
# loop. The chains are read from the host ops: the outermost aten ops of each thread inside
# the steps, as the trace nests them (an op's children are its own dispatch; an autograd node's
# `evaluate_function` span is not an aten op, so the backward's ops count as the forward's).

# Pointwise, reduction and normalisation ops that Inductor's CPU backend fuses with their
# neighbours (their backward formulas too). Dropout is left out (its time is drawing random
# numbers, which a fused loop still does), and so are casts and copies (often the input's own
# preparation, outside the model).
CPU_ELEMENTWISE_OP = re.compile(
    r"^aten::(?:add|sub|rsub|mul|div|pow|neg|abs|sign|reciprocal|exp|exp2|expm1|log|log1p|log2|sqrt|rsqrt|square|"
    r"tanh|sigmoid|relu|relu6|gelu|silu|mish|hardtanh|hardswish|hardsigmoid|leaky_relu|elu|selu|softplus|erf|sin|cos|"
    r"clamp|clamp_min|clamp_max|clip|maximum|minimum|where|masked_fill|lerp|addcmul|addcdiv|fill|zero|"
    r"threshold|threshold_backward|tanh_backward|sigmoid_backward|gelu_backward|silu_backward|hardtanh_backward|"
    r"leaky_relu_backward|elu_backward|mean|sum|amax|amin|var|std|norm|linalg_vector_norm|"
    r"softmax|_softmax|log_softmax|_log_softmax|_softmax_backward_data|_log_softmax_backward_data|"
    r"layer_norm|native_layer_norm|native_layer_norm_backward|rms_norm|_fused_rms_norm|"
    r"batch_norm|_batch_norm_impl_index|native_batch_norm|native_batch_norm_backward|_batch_norm_impl_index_backward|"
    r"group_norm|native_group_norm|native_group_norm_backward)_?$"
)
# Ops that only make a view (no pass over memory): they neither join nor break a chain.
CPU_VIEW_OP = re.compile(
    r"^aten::(?:view|_unsafe_view|reshape|_reshape_alias|flatten|unflatten|squeeze|unsqueeze|t|transpose|permute|"
    r"expand|expand_as|as_strided|slice|select|narrow|chunk|split|split_with_sizes|unbind|detach|alias|"
    r"view_as|unsafe_split|unsafe_chunk|numpy_T|_reshape_copy|empty|empty_like|empty_strided|resize_)_?$"
)
# Reductions write an output much smaller than their input: no intermediate of note.
CPU_REDUCTION_OP = re.compile(r"^aten::(?:mean|sum|amax|amin|var|std|norm|linalg_vector_norm)_?$")
ATEN_OP = re.compile(r"^aten::")
# An op of another library (c10d::allreduce_, torchvision::nms), not autograd's own nodes.
LIBRARY_OP = re.compile(r"^(?!autograd::|torch::autograd::)\w+::")
# An op on at most this many elements does no work worth the name: its time is its dispatch.
DISPATCH_PROBE_ELEMENTS = 4096
MIN_DISPATCH_PROBES = 20


@dataclass(frozen=True)
class CpuChains:
    """The CPU's elementwise chains inside the steps, and what fusing them removes.

    Per chain (runs of at least two consecutive elementwise ops on a thread, view ops aside):
    `start`/`end` (its first member's start, its last member's end), `members`, `ops_ns` (the
    members' own time), `dispatch_ns` (what their dispatch costs beyond one: the members but
    one at `dispatch_ns_per_op`, and the host time between members, the Python or autograd
    glue that compiled code does not run, at its median over like members), `traffic_ns` (the share of the members' work that
    writes each intermediate and reads it back, from the recorded shapes; NaN where not
    recorded), `kept_ns` (the fused loop's least time: its costliest member's work),
    `typical_ns` (the chain's time with each member and each gap at its typical time).
    A member's time is the median of its like ops' (same name, input types and shapes) over
    the window, so that a call that waited for a core does not count as work fusing removes.
    `dispatch_ns_per_op`: the run's own dispatch cost, the lower quartile of the times of its
    elementwise ops on at most DISPATCH_PROBE_ELEMENTS elements (None where it has fewer than
    MIN_DISPATCH_PROBES)."""

    chains: pd.DataFrame
    dispatch_ns_per_op: float | None
    eligible_ops: int
    eligible_ns: float


def _bytes_of(types_text: object, dims: object) -> tuple[float, float, float]:
    """(bytes read, bytes written, elements of the largest input) of a pointwise op from its
    recorded inputs: every tensor input read once, an output of the largest input's size (NaN
    where no shape is recorded; a 0-d tensor or a scalar argument is no tensor read)."""
    types = input_type_names(types_text) if isinstance(types_text, str) else ()
    if not isinstance(dims, list) or not dims:
        return np.nan, np.nan, np.nan
    read, largest, elements = 0.0, 0.0, 0
    for i, d in enumerate(dims):
        if not isinstance(d, list) or not d:
            continue
        n = numel(d)
        size = DTYPE_BYTES.get(types[i] if i < len(types) else "", 4) * n
        read += size
        largest = max(largest, size)
        elements = max(elements, n)
    if read == 0:
        return np.nan, np.nan, np.nan
    return read, largest, float(elements)


def cpu_elementwise_chains(host: pd.DataFrame, steps: pd.DataFrame, exclude: tuple[np.ndarray, np.ndarray], event_cost_ns: float = 0.0) -> CpuChains:
    """The elementwise chains of a CPU run's steps (see CpuChains); ops inside the `exclude`
    windows (the optimizer, the DataLoader) neither join nor break a chain. `event_cost_ns`:
    the profiler's own host cost per event it records (an op, a Python function), taken out of
    each member's time (at most 80% of it) and of the host time between members."""
    empty = CpuChains(pd.DataFrame({c: [] for c in ("start", "end", "members", "ops_ns", "dispatch_ns", "traffic_ns", "kept_ns", "typical_ns")}), None, 0, 0.0)
    if len(host) == 0 or len(steps) == 0:
        return empty
    # an op of any library breaks a chain (a `c10d::allreduce_` between two `div_` is no glue
    # that fusing removes); autograd's nodes only hold the aten ops a backward chain is made of
    host_kind = text_of(host["kind"]) if isinstance(host["kind"].dtype, pd.CategoricalDtype) else host["kind"].astype(str).to_numpy()
    aten = host[np.asarray(name_matches(host["name"], ATEN_OP), dtype=bool) | ((host_kind == "op") & np.asarray(name_matches(host["name"], LIBRARY_OP), dtype=bool))]
    if len(aten) == 0:
        return empty
    tids = text_of(aten["tid"]) if isinstance(aten["tid"].dtype, pd.CategoricalDtype) else aten["tid"].astype(str).to_numpy()
    ops = pd.DataFrame({"tid": tids, "ts": aten["ts"].to_numpy(np.int64), "end": aten["end"].to_numpy(np.int64), "row": np.arange(len(aten))})
    ops = ops.sort_values(["tid", "ts", "end"], ascending=[True, True, False], kind="stable")
    before = ops.groupby("tid", sort=False)["end"].cummax().groupby(ops["tid"], sort=False).shift(1)
    ops = ops[before.isna().to_numpy() | (ops["ts"].to_numpy() >= before.to_numpy(np.float64, na_value=-np.inf))]
    sub = aten.iloc[ops["row"].to_numpy()]
    step = step_of(steps["start"].to_numpy(np.int64), steps["end"].to_numpy(np.int64), ops["ts"].to_numpy(np.int64))
    xs, xe = exclude
    excluded = np.zeros(len(ops), dtype=bool)
    if len(xs):
        order = np.argsort(xs, kind="stable")
        xs, xe = xs[order], np.maximum.accumulate(xe[order])
        j = np.searchsorted(xs, ops["ts"].to_numpy(np.int64), side="right") - 1
        excluded = (j >= 0) & (ops["ts"].to_numpy(np.int64) < xe[np.maximum(j, 0)])
    keep = (step >= 0) & ~excluded & ~np.asarray(name_matches(sub["name"], CPU_VIEW_OP), dtype=bool)
    ops, sub, step = ops[keep], sub[keep], step[keep]
    if len(ops) == 0:
        return empty
    ew = np.asarray(name_matches(sub["name"], CPU_ELEMENTWISE_OP), dtype=bool)
    tid = ops["tid"].to_numpy()
    brk = np.ones(len(ops), dtype=bool)
    brk[1:] = (ew[1:] != ew[:-1]) | (tid[1:] != tid[:-1]) | (step[1:] != step[:-1])
    run = np.cumsum(brk) - 1
    dur = (ops["end"] - ops["ts"]).to_numpy(np.float64)
    kind = text_of(host["kind"]) if isinstance(host["kind"].dtype, pd.CategoricalDtype) else host["kind"].astype(str).to_numpy()
    marks = np.sort(host["ts"].to_numpy(np.int64)[(kind == "op") | (kind == "python")])
    ts_all, end_all = ops["ts"].to_numpy(np.int64), ops["end"].to_numpy(np.int64)
    held = np.searchsorted(marks, end_all, side="left") - np.searchsorted(marks, ts_all, side="left")
    dur = np.maximum(dur - held * event_cost_ns, 0.2 * dur)
    dims = sub["input_dims"].to_numpy(object) if "input_dims" in sub else np.full(len(sub), None, object)
    types = sub["input_types"].to_numpy(object) if "input_types" in sub else np.full(len(sub), None, object)
    # bytes each member reads and writes, worked out once per distinct (types, shapes)
    key = row_groups([types, np.fromiter(map(id, dims), dtype=np.int64, count=len(dims))])
    first = np.unique(key, return_index=True)[1]
    worked = np.array([_bytes_of(types[i], dims[i]) for i in first], dtype=np.float64).reshape(-1, 3)[key]
    read, written, elements = worked[:, 0], worked[:, 1], worked[:, 2]
    # Each op's time as the median of its like (same name, input types and shapes) over the
    # window: a step repeats the same ops, and one call that waited for a core (a busy
    # machine, another thread's barrier) is not what fusing it saves.
    names = text_of(sub["name"]) if isinstance(sub["name"].dtype, pd.CategoricalDtype) else sub["name"].astype(str).to_numpy()
    like = row_groups([names, key])
    dur = pd.Series(dur).groupby(like).transform("median").to_numpy(np.float64)
    reduction = np.asarray(name_matches(sub["name"], CPU_REDUCTION_OP), dtype=bool)
    written = np.where(reduction, 0.0, written)
    probes = dur[ew & np.isfinite(elements) & (elements <= DISPATCH_PROBE_ELEMENTS)]
    # their lower quartile: every call pays its dispatch, a wait for a core only makes it longer
    d = float(np.percentile(probes, 25)) if len(probes) >= MIN_DISPATCH_PROBES else None
    # The host time from each member to the next one of its chain (the Python or autograd glue
    # between them), at its median over like members, as the members' own time.
    gap = np.zeros(len(ops), dtype=np.float64)
    same = np.zeros(len(ops), dtype=bool)
    if len(ops) > 1:
        same[:-1] = ew[:-1] & ew[1:] & (run[:-1] == run[1:])
        between = np.searchsorted(marks, ts_all[1:], side="left") - np.searchsorted(marks, end_all[:-1], side="left")
        gap[:-1] = np.where(same[:-1], np.maximum(ts_all[1:] - end_all[:-1] - between * event_cost_ns, 0), 0.0)
    gap = pd.Series(gap).groupby(like).transform("median").to_numpy(np.float64) * same
    frame = pd.DataFrame({"run": run[ew], "ts": ts_all[ew], "end": end_all[ew],
                          "dur": dur[ew], "gap": gap[ew], "read": read[ew], "written": written[ew]})
    g = frame.groupby("run", sort=True)
    per = pd.DataFrame({"start": g["ts"].min(), "end": g["end"].max(), "members": g.size(), "ops_ns": g["dur"].sum()})
    last_written = g["written"].last()
    per = per[per["members"] >= 2]
    if len(per) == 0:
        return CpuChains(empty.chains, d, int(ew.sum()), float(dur[ew].sum()))
    dispatch = d if d is not None else 0.0
    frame = frame.assign(work=(frame["dur"] - dispatch).clip(lower=0.0), disp=np.minimum(frame["dur"], dispatch))
    g = frame.groupby("run", sort=True)
    work_sum, work_max = g["work"].sum()[per.index], g["work"].max()[per.index]
    moved = (g["read"].sum() + g["written"].sum())[per.index]
    # each member's output but the last is written and read back by a fused loop no more
    saved = 2.0 * (g["written"].sum()[per.index] - last_written[per.index])
    share = (saved / moved).clip(0.0, 1.0)
    traffic = (work_sum * share).where(moved > 0)
    gaps = g["gap"].sum()[per.index]
    per = per.assign(
        dispatch_ns=(g["disp"].sum() - g["disp"].max())[per.index] + gaps.clip(lower=0.0),
        traffic_ns=traffic.to_numpy(np.float64),
        kept_ns=work_max.to_numpy(np.float64),
        typical_ns=per["ops_ns"] + gaps.clip(lower=0.0),
    ).reset_index(drop=True)
    return CpuChains(per[["start", "end", "members", "ops_ns", "dispatch_ns", "traffic_ns", "kept_ns", "typical_ns"]], d, int(ew.sum()), float(dur[ew].sum()))
