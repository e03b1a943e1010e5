"""Compute-side figures the precision and fusion rules share: which architecture ran the
trace, how much of the kernel time inside the steps is on the critical path, and the
evidence a kernel rule shows. Precision, Tensor Cores and the speed-up tables live in
metrics.precision.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from advisor.metrics.breakdown import name_matches, communication_kernels, text_of
from advisor.metrics.intervals import covers, merge
from advisor.metrics.kernels import TENSOR_CORE_ELIGIBLE_OP
from advisor.metrics.precision import (
    ARCH_SPEEDUPS,
    TF32_SWITCH_OF_FAMILY,
    ArchSpeedup,
    arch_speedup,
    capability_from_kernels,
    precision_speedup,
)
from advisor.metrics.source import source_lines
from advisor.metrics.steps import step_of


# --- which device ------------------------------------------------------------------------
NOT_NVIDIA_DEVICE = re.compile(r"AMD|Radeon|Instinct|\bMI\d{3}|ARTEMIS|MTIA|Gaudi|Intel", re.I)
ROCM_KERNEL = re.compile(r"^Cijk_|rocblas|miopen|hipLaunch", re.I)


@dataclass(frozen=True)
class Capability:
    value: float | None
    source: str  # "trace", "facts", "kernel names" or "unknown"
    nvidia: bool


# cuDNN's transposes between NCHW tensors and the NHWC layout its convolution kernels use
LAYOUT_TRANSPOSE_KERNEL = re.compile(r"nchwToNhwc|nhwcToNchw|NchwToNhwc|NhwcToNchw|nchw2nhwc|nhwc2nchw")
# The libraries' generic layout kernels: a layout change when a convolution launches them
# (cuDNN's `convertTensor_kernel`, MIOpen's `batched_transpose_*` around its NHWC solvers).
LIBRARY_LAYOUT_KERNEL = re.compile(r"convertTensor_kernel|batched_transpose", re.IGNORECASE)
CONV_OP = re.compile(r"conv", re.IGNORECASE)


def layout_transposes(k: pd.DataFrame) -> np.ndarray:
    """Which kernels of `k` transpose a convolution's layout (NCHW <-> NHWC): named so
    (cuDNN's nchwToNhwc kernels), or a library's layout kernel launched by a convolution."""
    named = name_matches(k["name"], LAYOUT_TRANSPOSE_KERNEL)
    if "op" not in k.columns:
        return named
    library = name_matches(k["name"], LIBRARY_LAYOUT_KERNEL)
    if not library.any():
        return named
    by_conv = name_matches(k["op"], CONV_OP)
    return named | (library & by_conv)

def device_capability(metrics, facts_capability: str | float | None = None) -> Capability:
    """Compute capability of the rank's device: trace properties, else facts, else kernel names.

    Non-NVIDIA devices (ROCm reports a 'compute capability' too, MTIA none) are flagged, so
    rules about NVIDIA Tensor Cores stay silent on them.
    """
    name = metrics.device.name or ""
    kernels = metrics.kernels
    rocm = bool(len(kernels)) and bool(name_matches(kernels["name"], ROCM_KERNEL).any())
    nvidia = not (NOT_NVIDIA_DEVICE.search(name) or rocm)
    if metrics.device.capability is not None:
        return Capability(metrics.device.capability, "trace", nvidia)
    try:
        if facts_capability is not None:
            return Capability(float(facts_capability), "facts", nvidia)
    except (TypeError, ValueError):
        pass
    inferred = capability_from_kernels(kernels["name"]) if len(kernels) else None
    if inferred is not None:
        return Capability(inferred, "kernel names", nvidia)
    return Capability(None, "unknown", nvidia)


# --- precision of each kernel -------------------------------------------------------------
CONV_KERNEL = re.compile(r"conv|scudnn|winograd|fft2d|fprop|dgrad|wgrad|implicit_gemm|nchwToNhwc|nhwcToNchw", re.I)
# A launching op that is convolution work (by name, as the trace writes it).
CONV_LAUNCH_OP = re.compile(r"conv|Conv")


def kernel_precision(kernels: pd.DataFrame, capability: float | None = None) -> np.ndarray:
    """Per kernel row, coarsely: 'half' (fp16/bf16/fp8/int8), 'tf32', or 'fp32' (the rest).

    The precision itself is decided once, in metrics.precision (kernel_table's `precision`)."""
    precision = text_of(kernels["precision"])
    out = np.full(len(precision), "fp32", dtype=object)
    out[np.isin(precision, ("bf16", "fp16", "fp8", "int8"))] = "half"
    out[precision == "tf32"] = "tf32"
    return out


def is_conv(kernels: pd.DataFrame) -> np.ndarray:
    """Per kernel row: convolution work (by launching op when known, else by kernel name)."""
    has_op = kernels["op"].notna().to_numpy()
    by_op = has_op & name_matches(kernels["op"], CONV_LAUNCH_OP)
    by_name = name_matches(kernels["name"], CONV_KERNEL)
    return np.where(has_op, by_op | by_name, by_name)


# --- kernel time inside the steps ---------------------------------------------------------
def step_kernels(metrics) -> pd.DataFrame:
    """Compute kernels (collectives excluded) that start inside a step, with a `step_index` column.

    Most kernel rules start from these: built once per rank (treat the frame as read-only)."""
    return metrics.shared("compute.step_kernels", lambda: _step_kernels(metrics))


def _step_kernels(metrics) -> pd.DataFrame:
    k = metrics.kernels
    steps = metrics.steps
    if len(k) == 0 or len(steps) == 0:
        return k.iloc[0:0].assign(step_index=pd.Series(dtype=np.int64))
    comm = communication_kernels(metrics.frames)[k.index.to_numpy()]
    idx = step_of(steps["start"].to_numpy(np.int64), steps["end"].to_numpy(np.int64), k["ts"].to_numpy(np.int64))
    keep = (idx >= 0) & ~comm
    return k[keep].assign(step_index=idx[keep])


@dataclass
class KernelPrecision:
    """The step kernels' precision, per kernel, as both precision rules read it (tf32-disabled
    and tensor-cores-unused): built once per rank and capability, with the duration scale of
    each kernel's matrix work moved to TF32, bf16 or fp16 worked out once per target.
    Arrays are aligned with `kernels` (step_kernels); treat them as read-only."""

    kernels: pd.DataFrame
    capability: float | None
    family: np.ndarray  # gemm, attention, conv, rnn, or ""
    precision: np.ndarray  # fp32-fma, tf32, bf16, fp16, ...
    source: np.ndarray  # where the precision was read (precision_source)
    eligible: np.ndarray  # matrix work Tensor Cores can run
    dur: np.ndarray  # ns, float64
    switch_of: np.ndarray  # the TF32 switch governing the kernel's family ("" for none)
    _scales: dict[str, np.ndarray] = field(default_factory=dict, repr=False)

    def scale_to(self, target: str) -> np.ndarray:
        """Per kernel, precision_speedup's duration factor to `target` (computed once)."""
        if target not in self._scales:
            self._scales[target] = precision_speedup(self.kernels, target, self.capability).to_numpy()
        return self._scales[target]


def precision_table(metrics, capability: float | None) -> KernelPrecision:
    """The rank's KernelPrecision at this compute capability (Metrics.shared)."""
    return metrics.shared(f"compute.precision_table.{capability}", lambda: _precision_table(metrics, capability))


def _switch_of(family: np.ndarray) -> np.ndarray:
    """The TF32 switch of each kernel's family ("" for none), looked up once per family."""
    codes, families = pd.factorize(family, use_na_sentinel=False)
    table = np.empty(len(families), dtype=object)
    table[:] = [TF32_SWITCH_OF_FAMILY.get(f, "") for f in families]
    return table[codes]


def _precision_table(metrics, capability: float | None) -> KernelPrecision:
    k = step_kernels(metrics)
    family = text_of(k["family"])
    return KernelPrecision(
        kernels=k,
        capability=capability,
        family=family,
        precision=text_of(k["precision"]),
        source=text_of(k["precision_source"]) if "precision_source" in k else np.full(len(k), "", dtype=object),
        eligible=k["eligible"].to_numpy(bool),
        dur=k["dur"].to_numpy(np.float64),
        switch_of=_switch_of(family),
    )


def kernel_exposure(metrics, kernels: pd.DataFrame | None = None) -> float:
    """Share of the steps' kernel time that lies on the timeline (not hidden under other kernels).

    The `kernel` slice of the breakdown is the union of kernel time; divided by the sum of the
    kernel durations it is 1 on a single stream and below 1 where streams overlap, so a
    kernel's time saved is counted only as far as it shortens the step.
    """
    k = step_kernels(metrics) if kernels is None else kernels
    total = float(k["dur"].sum())
    if total <= 0:
        return 0.0
    union = float(metrics.breakdown["kernel"].sum())
    return min(1.0, union / total)


def launched_inside(metrics, spans: pd.DataFrame) -> np.ndarray:
    """Mask over device rows: launched (runtime call start) inside any of the given host spans."""
    frames = metrics.frames
    dev = frames.device
    out = np.zeros(len(dev), dtype=bool)
    if len(spans) == 0 or len(dev) == 0 or len(frames.runtime) == 0:
        return out
    s, e = merge(spans["ts"].to_numpy(np.int64), spans["end"].to_numpy(np.int64))
    lts = launch_ts_of(metrics, np.arange(len(dev)))
    ok = ~np.isnan(lts)
    out[ok] = covers(s, e, lts[ok].astype(np.int64))
    return out


def launch_ts_of(metrics, device_rows) -> np.ndarray:
    """Host time (ns) of the runtime call that launched each of these device rows; NaN where
    the trace does not link them."""
    lk = metrics.launches
    out = np.full(len(metrics.frames.device), np.nan)
    if len(lk):
        out[lk["device_row"].to_numpy(np.int64)] = lk["launch_ts"].to_numpy(np.float64)
    return out[np.asarray(device_rows, dtype=np.int64)]


def short_kernel_name(name: str, limit: int = 110) -> str:
    """A kernel name cut to fit one line (template arguments make them very long)."""
    name = str(name)
    return name if len(name) <= limit else name[: limit - 1] + "…"


def top_by_time(kernels: pd.DataFrame, n_steps: int, by: str = "name", n: int = 5) -> list[dict]:
    """The kernels (or ops) that hold most of the given kernel time: name, count, ms per step."""
    if len(kernels) == 0:
        return []
    g = kernels.groupby(by, observed=True)["dur"].agg(["size", "sum"]).sort_values("sum", ascending=False).head(n)
    n_steps = max(n_steps, 1)
    return [
        {by: str(i), "count": int(r["size"]), "ms_per_step": round(float(r["sum"]) / 1e6 / n_steps, 3)}
        for i, r in g.iterrows()
    ]




def launching_host_rows(frames, kernels: pd.DataFrame, limit: int | None = None) -> pd.DataFrame:
    """Host op rows that launched the given kernel rows (runtime call's external id), so a
    finding can name the user's line; empty where the trace does not link them by id. With
    `limit`, the first that many (the rows are not copied whole to be cut)."""
    host = frames.host
    corr = frames.device.loc[kernels.index, "correlation"]
    rt = frames.runtime
    ext = rt.loc[rt["correlation"].isin(corr[corr >= 0]) & (rt["external_id"] >= 0), "external_id"].unique()
    if len(ext) == 0:
        return host.iloc[0:0]
    return _first_rows(host, (host["kind"] != "python").to_numpy() & host["external_id"].isin(ext).to_numpy(), limit)


def _first_rows(frame: pd.DataFrame, mask: np.ndarray, limit: int | None) -> pd.DataFrame:
    return frame[mask] if limit is None else frame.iloc[np.flatnonzero(mask)[:limit]]


def eligible_op_rows(frames, kernels: pd.DataFrame, limit: int | None = None) -> pd.DataFrame:
    """Host rows of the ops that launched the kernels (by id), else of Tensor-Core-eligible ops
    by name (the first `limit` of them, where given)."""
    rows = launching_host_rows(frames, kernels, limit)
    if len(rows):
        return rows
    host = frames.host
    names = set(kernels["op"].dropna().astype(str).unique())
    return _first_rows(host, (host["name"].astype(str).isin(names) & host["name"].astype(str).str.match(TENSOR_CORE_ELIGIBLE_OP)).to_numpy(dtype=bool), limit)


# The launching ops whose call stacks a finding's source lines are read from.
SOURCE_ROWS = 300


def kernel_evidence(frames, kernels: pd.DataFrame, steps: pd.DataFrame, exposure: float, by_eligible_op: bool = False) -> dict:
    """What every kernel rule shows for the kernels it blames: how much of their time is on the
    timeline, the top kernels and ops, the steps, and the user's lines that launched them."""
    n_steps = max(len(steps), 1)
    evidence = {
        "kernel_time_on_timeline": round(exposure, 4),
        "kernels": top_by_time(kernels, n_steps),
        "ops": top_by_time(kernels.dropna(subset=["op"]), n_steps, by="op"),
        "steps": steps["step"].tolist(),
    }
    rows = eligible_op_rows(frames, kernels, SOURCE_ROWS) if by_eligible_op else launching_host_rows(frames, kernels, SOURCE_ROWS)
    lines = source_lines(frames, rows)
    if lines:
        evidence["source"] = lines
    return evidence


__all__ = [
    "ArchSpeedup",
    "ARCH_SPEEDUPS",
    "arch_speedup",
    "Capability",
    "device_capability",
    "capability_from_kernels",
    "kernel_precision",
    "precision_table",
    "KernelPrecision",
    "is_conv",
    "step_kernels",
    "kernel_exposure",
    "LAYOUT_TRANSPOSE_KERNEL",
    "launched_inside",
    "short_kernel_name",
    "eligible_op_rows",
    "kernel_evidence",
    "top_by_time",
    "launching_host_rows",
]
