"""Kernels: who launched them, which ran on Tensor Cores and in which precision, which ops
could have, and where kernel time goes.

Precision and Tensor Cores are decided by metrics.precision (launching op's input dtypes,
TF32 switches, kernel name tokens, compute capability). The op table below decides "could
this op use Tensor Cores", like the TensorBoard plugin's list, with the newer op names.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from advisor.load.trace import TraceFrames
from advisor.metrics.breakdown import per_name, text_of
from advisor.metrics.hierarchy import op_tree
from advisor.metrics.kernel_taxonomy import UNREAD, read_kernel
from advisor.metrics.precision import Tf32Switches, capability_from_kernels, classify_kernels

# Ops whose work can run on Tensor Cores (forward and backward; old and new names).
TENSOR_CORE_ELIGIBLE_OP = re.compile(
    r"^(aten::(_?convolution|conv[123]d|conv_tbc|conv_transpose[123]d|cudnn_convolution\w*|"
    r"convolution_backward\w*|mkldnn_convolution|miopen_convolution\w*|prelu|addmm_?|addmv_?|addr|matmul|mm|mv|"
    r"linear|addbmm|baddbmm|bmm|chain_matmul|linalg_multi_dot|_thnn_fused_(lstm|gru)_cell|lstm_cell|gru_cell|"
    r"rnn_(tanh|relu)_cell|_cudnn_rnn\w*|lstm|gru|scaled_dot_product_\w*|_scaled_dot_product_\w*|"
    r"_flash_attention\w*|_efficient_attention\w*|_scaled_mm|_int_mm)|"
    r"(Cudnn)?Convolution(Transpose)?Backward\d*|(Bmm|Mm|Addmm|Addmv|Mv|Addbmm|Baddbmm|Linear|Matmul)Backward\d*|"
    r"CudnnRnnBackward\d*|\w*ScaledDotProduct\w*Backward\d*)$"
)


def launching_ops(frames: TraceFrames) -> pd.Series:
    """For each device row, the name of the host op that launched it, or NaN."""
    return launching_op_table(frames)["op"]


def launching_op_table(frames: TraceFrames) -> pd.DataFrame:
    """For each device row, the host op that launched it: `op` (name) and `op_input_types`
    (the op's `Input type` JSON text, record_shapes=True traces only), NaN where unknown.

    By external id when the trace links runtime calls to ops that way; otherwise by time:
    the innermost op on the launching thread that covers the runtime call.
    """
    host = frames.host
    ops = host[(host["kind"] != "python") & (host["external_id"] >= 0)]
    ops = ops.drop_duplicates("external_id", keep="last")  # innermost op carries the id
    rt = frames.runtime[frames.runtime["correlation"] >= 0].drop_duplicates("correlation")
    rt_ext = pd.Series(rt["external_id"].to_numpy(), index=rt["correlation"].to_numpy())
    ext = frames.device["correlation"].map(rt_ext)
    # Some Kineto versions put the correlation id in a device row's own external id.
    ext = ext.where(ext.notna() & (ext >= 0), frames.device["external_id"])
    at = pd.Index(ops["external_id"].to_numpy()).get_indexer(ext.to_numpy())

    def by_op(values: np.ndarray) -> pd.Series:
        # Object columns, not str ones: the kernel table is filtered by every rule, and a str
        # column's rows are copied one string at a time where an object column copies pointers.
        out = np.asarray(values, dtype=object)[np.clip(at, 0, None)] if len(values) else np.full(len(at), np.nan, dtype=object)
        out[at < 0] = np.nan
        return pd.Series(out, index=frames.device.index, dtype=object)

    by_id = by_op(text_of(ops["name"]))
    if by_id.notna().mean() >= 0.5 or len(rt) == 0 or len(host) == 0:
        return pd.DataFrame(
            {"op": by_id, "op_input_types": by_op(_input_types(ops)), "op_input_dims": by_op(_input_dims(ops)), "op_concrete_inputs": by_op(_column(ops, "concrete_inputs"))},
            index=frames.device.index,
        )
    return _launching_ops_by_time(frames, rt)


def _input_types(ops: pd.DataFrame) -> np.ndarray:
    if "input_types" not in ops:  # frames built before the loader read `Input type`
        return np.full(len(ops), np.nan, dtype=object)
    return ops["input_types"].astype(object).to_numpy()


def _column(ops: pd.DataFrame, name: str) -> np.ndarray:
    """An object column of the ops, NaN where the frames do not have it (an older cache entry)."""
    if name not in ops:
        return np.full(len(ops), np.nan, dtype=object)
    return ops[name].astype(object).to_numpy()


def _input_dims(ops: pd.DataFrame) -> np.ndarray:
    if "input_dims" not in ops:
        return np.full(len(ops), np.nan, dtype=object)
    return ops["input_dims"].astype(object).to_numpy()


def _launching_ops_by_time(frames: TraceFrames, rt: pd.DataFrame) -> pd.DataFrame:
    tree = op_tree(frames)
    if len(tree.ops) == 0:  # only step markers on the host: no op can have launched anything
        return pd.DataFrame({"op": np.nan, "op_input_types": np.nan, "op_input_dims": np.nan, "op_concrete_inputs": np.nan}, index=frames.device.index, dtype=object)
    pos = tree.innermost(rt["ts"].to_numpy(np.int64), text_of(rt["tid"]))
    found = pos >= 0
    at = np.clip(pos, 0, None)
    names = text_of(tree.ops["name"])
    op_name = np.where(found, names[at], None)
    op_types = np.where(found, _input_types(tree.ops)[at], None)
    op_dims = np.where(found, _input_dims(tree.ops)[at], None)
    op_concrete = np.where(found, _column(tree.ops, "concrete_inputs")[at], None)
    corr = frames.device["correlation"]
    return pd.DataFrame(
        {
            "op": corr.map(pd.Series(op_name, index=rt["correlation"].to_numpy(), dtype=object)),
            "op_input_types": corr.map(pd.Series(op_types, index=rt["correlation"].to_numpy(), dtype=object)),
            "op_input_dims": corr.map(pd.Series(op_dims, index=rt["correlation"].to_numpy(), dtype=object)),
            "op_concrete_inputs": corr.map(pd.Series(op_concrete, index=rt["correlation"].to_numpy(), dtype=object)),
        },
        index=frames.device.index,
    )


def read_kernel_names(names: pd.Series) -> pd.DataFrame:
    """What each name of a column of kernel names says (metrics.kernel_taxonomy): `library`,
    `kind` (its family), `name_precision`, `matrix_unit`; each distinct name read once."""
    readings = per_name(names, "kernel_taxonomy", read_kernel, missing=UNREAD)
    return pd.DataFrame(
        {
            "library": np.array([r.library for r in readings], dtype=object),
            "kind": np.array([r.family for r in readings], dtype=object),
            "name_precision": np.array([r.precision for r in readings], dtype=object),
            "matrix_unit": np.array([r.matrix_unit for r in readings], dtype=object),
        },
        index=names.index,
    )


def kernel_table(frames: TraceFrames, capability: float | None = None, switches: Tf32Switches | None = None) -> pd.DataFrame:
    """Kernels only, each with its launching op (`op`, `op_input_types`), its `family`,
    `precision` and `tensor_core` (ran on Tensor Cores, see metrics.precision), what its name
    alone says (`library`, `kind`, `name_precision`, `matrix_unit`: metrics.kernel_taxonomy),
    and whether it is Tensor-Core-eligible work. `attrs["compute_capability"]` keeps the capability used."""
    dev = frames.device
    mask = (dev["kind"] == "kernel").to_numpy()
    k = dev.loc[mask, ["name", "ts", "end", "dur", "device", "stream", "external_id", "occupancy", "blocks_per_sm"]].copy()
    launched_by = launching_op_table(frames)[mask]
    for column in ("op", "op_input_types", "op_input_dims", "op_concrete_inputs"):
        k[column] = pd.Series(launched_by[column].to_numpy(), index=k.index, dtype=object)
    if capability is None:
        capability = capability_from_kernels(k["name"]) if len(k) else None
    k[["family", "precision", "tensor_core", "precision_source"]] = classify_kernels(k, capability, switches)
    k[["library", "kind", "name_precision", "matrix_unit"]] = read_kernel_names(k["name"])
    k["fp32_gemm"] = (k["precision"] == "fp32-fma").to_numpy()
    # Matrix work is eligible whatever launched it (compiled regions hide the op).
    codes, ops = pd.factorize(k["op"].astype(object).fillna("").to_numpy())  # matched once per distinct op
    op_eligible = np.fromiter((bool(TENSOR_CORE_ELIGIBLE_OP.match(str(o))) for o in ops), dtype=bool, count=len(ops))[codes] if len(k) else np.zeros(0, dtype=bool)
    k["eligible"] = op_eligible | (k["precision"] != "").to_numpy()
    k.attrs["compute_capability"] = capability
    return k


KERNEL_TOTALS_COLUMNS = ["name", "count", "total_ns", "tensor_core"]


def kernel_totals(kernels: pd.DataFrame) -> pd.DataFrame:
    """Per kernel name: calls, total ns, Tensor Core or not (what top_kernels reads, a few kB
    instead of one row per kernel). A table that is already totals comes back as it is."""
    if "total_ns" in kernels.columns:
        return kernels
    if len(kernels) == 0:
        return pd.DataFrame({"name": pd.Series([], dtype=object), "count": np.zeros(0, np.int64), "total_ns": np.zeros(0, np.int64), "tensor_core": np.zeros(0, bool), "precision": pd.Series([], dtype=object)})
    if "precision" not in kernels:  # an analysis cached before kernels had a precision
        kernels = kernels.assign(precision="")
    name = kernels["name"]
    if isinstance(name.dtype, pd.CategoricalDtype) and not name.hasnans and not kernels["precision"].hasnans and not kernels["tensor_core"].hasnans:
        # the groupby below, by the categories' codes: each name's rows summed in NumPy
        codes = name.array.codes
        order = np.argsort(codes, kind="stable")
        sorted_codes = codes[order]
        starts = np.flatnonzero(np.r_[True, sorted_codes[1:] != sorted_codes[:-1]])
        first = order[starts]  # each name's first row (a stable sort keeps rows in order)
        return pd.DataFrame(
            {
                "name": pd.Categorical.from_codes(sorted_codes[starts], dtype=name.dtype),
                "count": np.diff(np.r_[starts, len(order)]).astype(np.int64),
                "total_ns": np.add.reduceat(kernels["dur"].to_numpy()[order], starts),
                "tensor_core": kernels["tensor_core"].to_numpy()[first],
                "precision": kernels["precision"].to_numpy()[first],
            }
        )
    g = kernels.groupby("name", observed=True).agg(
        count=("dur", "size"), total_ns=("dur", "sum"), tensor_core=("tensor_core", "first"), precision=("precision", "first")
    )
    return g.reset_index()


def top_kernels(kernels: pd.DataFrame, n: int = 10) -> pd.DataFrame:
    """The kernels with the most total time; from the kernel table or its totals."""
    t = kernel_totals(kernels)
    if len(t) == 0:
        return pd.DataFrame(columns=["name", "count", "total_ns", "mean_ns", "share", "tensor_core", "precision"])
    g = t.set_index("name")[["count", "total_ns"]].copy()
    g["mean_ns"] = g["total_ns"] / g["count"]
    g["tensor_core"] = t["tensor_core"].to_numpy()
    g["precision"] = t["precision"].to_numpy()
    g["share"] = g["total_ns"] / max(int(t["total_ns"].sum()), 1)
    return g.sort_values("total_ns", ascending=False).head(n).reset_index()


def tensor_core_shares(kernels: pd.DataFrame) -> tuple[float | None, float | None]:
    """(share of kernel time on Tensor Cores, share launched by Tensor-Core-eligible ops)."""
    total = kernels["dur"].sum()
    if total <= 0:
        return None, None
    tc = float(kernels.loc[kernels["tensor_core"], "dur"].sum() / total)
    el = float(kernels.loc[kernels["eligible"], "dur"].sum() / total)
    return tc, el


def top_ops(frames: TraceFrames, n: int = 10) -> pd.DataFrame:
    """Host ops by total host time (self time is not needed for ranking here)."""
    host = frames.host
    ops = host[host["kind"] == "op"]
    if len(ops) == 0:
        return pd.DataFrame(columns=["name", "count", "total_ns", "mean_ns"])
    g = ops.groupby("name", observed=True)["dur"].agg(count="size", total_ns="sum", mean_ns="mean")
    return g.sort_values("total_ns", ascending=False).head(n).reset_index()


def _step_op_self_times(frames: TraceFrames, steps: pd.DataFrame) -> pd.DataFrame:
    """Host ops inside the steps with their self time (their time less their child ops') and
    their inclusive time, ns: name, self, dur (empty without ops or steps)."""
    from advisor.metrics.hierarchy import op_tree
    from advisor.metrics.steps import step_of

    tree = op_tree(frames)
    ops = tree.ops
    if len(ops) == 0 or len(steps) == 0:
        return pd.DataFrame({"name": pd.Series(dtype=str), "self": pd.Series(dtype=np.int64), "dur": pd.Series(dtype=np.int64)})
    dur = (ops["end"] - ops["ts"]).to_numpy(np.int64)
    child = np.zeros(len(ops), dtype=np.int64)
    has = tree.parent >= 0
    np.add.at(child, tree.parent[has], dur[has])
    self_ns = np.maximum(dur - child, 0)
    inside = step_of(steps["start"].to_numpy(np.int64), steps["end"].to_numpy(np.int64), ops["ts"].to_numpy(np.int64)) >= 0
    is_op = (text_of(ops["kind"]) == "op") & inside
    return pd.DataFrame({"name": text_of(ops["name"])[is_op], "self": self_ns[is_op], "dur": dur[is_op]})


def top_self_ops(frames: TraceFrames, steps: pd.DataFrame, n: int = 10) -> pd.DataFrame:
    """Host ops inside the steps by self time, per step: name, count, self_ms, total_ms
    (inclusive), share (of the steps' summed self time). What a CPU run spends its time in:
    the table the device's kernels would be on a GPU run."""
    cols = ["name", "count", "self_ms", "total_ms", "share"]
    t = _step_op_self_times(frames, steps)
    if len(t) == 0:
        return pd.DataFrame(columns=cols)
    k = len(steps)
    g = t.groupby("name").agg(count=("self", "size"), self_ns=("self", "sum"), total_ns=("dur", "sum"))
    total = float(g["self_ns"].sum()) or 1.0
    g = g.sort_values("self_ns", ascending=False).head(n).reset_index()
    return pd.DataFrame(
        {
            "name": g["name"],
            "count": g["count"] / k,
            "self_ms": g["self_ns"] / 1e6 / k,
            "total_ms": g["total_ns"] / 1e6 / k,
            "share": g["self_ns"] / total,
        }
    )


# An op call whose own work is shorter than this cannot be split over intra-op threads:
# at::parallel_for runs below 32,768 elements (GRAIN_SIZE) on the calling thread, about 10 us
# of fp32 elementwise work, and a parallel region costs a few microseconds to open.
PARALLEL_CALL_MIN_NS = 20_000


def parallel_op_ms(frames: TraceFrames, steps: pd.DataFrame) -> float:
    """Per step, the host ops' self time in calls long enough to run on the intra-op threads
    (PARALLEL_CALL_MIN_NS): the part of a CPU step that thread count speeds up; the rest (the
    Python loop, dispatch, small ops) runs on one thread whatever the setting."""
    t = _step_op_self_times(frames, steps)
    if len(t) == 0:
        return 0.0
    return float(t["self"].to_numpy()[t["self"].to_numpy() >= PARALLEL_CALL_MIN_NS].sum()) / 1e6 / len(steps)


def fp32_gemm_share(kernels: pd.DataFrame) -> float:
    total = kernels["dur"].sum()
    return float(kernels.loc[kernels["fp32_gemm"], "dur"].sum() / total) if total > 0 else 0.0


__all__ = [
    "TENSOR_CORE_ELIGIBLE_OP",
    "kernel_table",
    "top_kernels",
    "top_ops",
    "top_self_ops",
    "parallel_op_ms",
    "tensor_core_shares",
    "fp32_gemm_share",
    "launching_ops",
    "launching_op_table",
    "read_kernel_names",
]
