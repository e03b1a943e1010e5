"""Eager elementwise kernels, their chains, and where compiled code ran.

Shared by the rules that price fusing elementwise work: `unfused-elementwise` (nothing was
compiled) and `compile-graph-breaks` (compiled graphs ran, and much elementwise work stayed
eager between them). A chain is a run of consecutive eager elementwise kernels on a stream
inside a step that no other kernel interrupts: Inductor fuses such a run into one kernel that
costs about what its costliest member costs (they are memory-bound).
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from advisor.metrics.autocast import DTYPE_BYTES, input_type_names
from advisor.metrics.shapes import numel
from advisor.metrics.breakdown import name_matches, row_groups

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


__all__ = ["BATCH_NORM_KERNEL", "achieved_bandwidth", "batch_norm_roofline_share", "COMPILED_GRAPH", "COMPILED_KERNEL", "COMPILED_REGION", "ELEMENTWISE_KERNEL", "compiled_regions_ran", "fused_chain_members", "in_chain", "runs"]
