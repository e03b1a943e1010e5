"""Kernels: which ran on Tensor Cores, which ops could have, and where kernel time goes.

The two pattern tables below are the single place that decides "is this a Tensor Core
kernel" and "could this op use Tensor Cores". They extend the TensorBoard plugin's 18
substrings with the names Ampere and Hopper libraries use (cutlass tensorop, xmma/sm80/sm90
implicit GEMM, wgmma, nvjet, flash attention, tf32/bf16/fp16 GEMMs).
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from advisor.load.trace import TraceFrames
from advisor.metrics.breakdown import _matches
from advisor.metrics.hierarchy import op_tree

# Kernel names that run on Tensor Cores (substring, case-sensitive as the libraries emit them).
TENSOR_CORE_KERNEL_PATTERNS: list[str] = [
    # Volta/Turing cuDNN and cuBLAS HMMA kernels (the plugin's table)
    "h884", "s884", "h1688", "s1688", "c1688", "i8816", "16816", "hmma", "i8832",
    "dgrad_1x1_stride_2x2", "first_layer_wgrad_kernel", "conv1x1", "conv2d_c1_k1", "direct_group",
    "xmma_implicit_gemm", "xmma_sparse_conv", "xmma_warp_specialized_implicit_gemm",
    "xmma_gemm", "xmma_sparse_gemm", "xmma_fprop", "xmma_dgrad", "xmma_wgrad",
    # Ampere/Hopper: cutlass tensor-op GEMMs, sm80/sm90 kernels, wgmma, nvjet (cuBLASLt), tf32 paths
    "tensorop", "wmma", "wgmma", "nvjet", "_tf32", "tf32_", "bf16_s16816", "f16_s16816",
    "sm80_xmma", "sm86_xmma", "sm89_xmma", "sm90_xmma", "sm100_xmma", "s16816gemm", "h16816gemm",
    "gemm_bf16", "gemm_f16", "cutlass_80", "cutlass_90", "flash_fwd", "flash_bwd", "fmha",
    "sm90_gemm", "sm80_gemm", "_tensor16x8x", "_mma_",
    # cutlass kernels that CUPTI reports by their mangled C++ name (cuDNN's runtime-fused convs)
    "MmaTensorOp",
]
TENSOR_CORE_KERNEL = re.compile("|".join(re.escape(p) for p in TENSOR_CORE_KERNEL_PATTERNS))

# Kernels that are fp32 without Tensor Cores (the ones `tf32-disabled` and `tensor-cores-unused` look for).
FP32_GEMM_KERNEL = re.compile(r"(sgemm|scudnn|implicit_convolve_sgemm|explicit_convolve_sgemm|gemv2?T?_kernel|gemmSN|fft2d|winograd(?!.*h884))", re.I)

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
    """For each device row, the name of the host op that launched it, or NaN.

    By external id when the trace links runtime calls to ops that way; otherwise by time:
    the innermost op on the launching thread that covers the runtime call.
    """
    host = frames.host
    ops = host[(host["kind"] != "python") & (host["external_id"] >= 0)]
    ops = ops.drop_duplicates("external_id", keep="last")  # innermost op carries the id
    names = pd.Series(ops["name"].astype(str).to_numpy(), index=ops["external_id"].to_numpy())
    rt = frames.runtime[frames.runtime["correlation"] >= 0].drop_duplicates("correlation")
    rt_ext = pd.Series(rt["external_id"].to_numpy(), index=rt["correlation"].to_numpy())
    ext = frames.device["correlation"].map(rt_ext)
    # Some Kineto versions put the correlation id in a device row's own external id.
    ext = ext.where(ext.notna() & (ext >= 0), frames.device["external_id"])
    by_id = ext.map(names)
    if by_id.notna().mean() >= 0.5 or len(rt) == 0 or len(host) == 0:
        return by_id
    return _launching_ops_by_time(frames, rt)


def _launching_ops_by_time(frames: TraceFrames, rt: pd.DataFrame) -> pd.Series:
    tree = op_tree(frames)
    if len(tree.ops) == 0:  # only step markers on the host: no op can have launched anything
        return pd.Series(np.nan, index=frames.device.index, dtype=object)
    pos = tree.innermost(rt["ts"].to_numpy(np.int64), rt["tid"].astype(str).to_numpy())
    names = tree.ops["name"].astype(str).to_numpy()
    op_name = np.where(pos >= 0, names[np.clip(pos, 0, None)], None)
    return frames.device["correlation"].map(pd.Series(op_name, index=rt["correlation"].to_numpy()))


def kernel_table(frames: TraceFrames) -> pd.DataFrame:
    """Kernels only, with tensor_core, eligible (launching op) and fp32_gemm flags."""
    dev = frames.device
    mask = (dev["kind"] == "kernel").to_numpy()
    k = dev.loc[mask, ["name", "ts", "end", "dur", "device", "stream", "external_id", "occupancy", "blocks_per_sm"]].copy()
    k["tensor_core"] = _matches(k["name"], TENSOR_CORE_KERNEL)
    k["fp32_gemm"] = _matches(k["name"], FP32_GEMM_KERNEL) & ~k["tensor_core"]
    op = launching_ops(frames)[mask]
    k["op"] = op.to_numpy()
    # A GEMM/conv kernel is eligible whatever launched it (compiled regions hide the op).
    k["eligible"] = op.astype(object).fillna("").astype(str).str.match(TENSOR_CORE_ELIGIBLE_OP).to_numpy() | k["tensor_core"] | k["fp32_gemm"]
    return k


KERNEL_TOTALS_COLUMNS = ["name", "count", "total_ns", "tensor_core"]


def kernel_totals(kernels: pd.DataFrame) -> pd.DataFrame:
    """Per kernel name: calls, total ns, Tensor Core or not (what top_kernels reads, a few kB
    instead of one row per kernel). A table that is already totals comes back as it is."""
    if "total_ns" in kernels.columns:
        return kernels
    if len(kernels) == 0:
        return pd.DataFrame({"name": pd.Series([], dtype=object), "count": np.zeros(0, np.int64), "total_ns": np.zeros(0, np.int64), "tensor_core": np.zeros(0, bool)})
    g = kernels.groupby("name", observed=True).agg(count=("dur", "size"), total_ns=("dur", "sum"), tensor_core=("tensor_core", "first"))
    return g.reset_index()


def top_kernels(kernels: pd.DataFrame, n: int = 10) -> pd.DataFrame:
    """The kernels with the most total time; from the kernel table or its totals."""
    t = kernel_totals(kernels)
    if len(t) == 0:
        return pd.DataFrame(columns=["name", "count", "total_ns", "mean_ns", "share", "tensor_core"])
    g = t.set_index("name")[["count", "total_ns"]].copy()
    g["mean_ns"] = g["total_ns"] / g["count"]
    g["tensor_core"] = t["tensor_core"].to_numpy()
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


def fp32_gemm_share(kernels: pd.DataFrame) -> float:
    total = kernels["dur"].sum()
    return float(kernels.loc[kernels["fp32_gemm"], "dur"].sum() / total) if total > 0 else 0.0


__all__ = [
    "TENSOR_CORE_KERNEL_PATTERNS",
    "TENSOR_CORE_ELIGIBLE_OP",
    "kernel_table",
    "top_kernels",
    "top_ops",
    "tensor_core_shares",
    "fp32_gemm_share",
    "launching_ops",
]
