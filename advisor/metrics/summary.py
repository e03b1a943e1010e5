"""Metrics of one rank: the step-time picture every rule and renderer reads.

`compute_metrics` is the only place that turns frames into figures; rules never recompute
them. A figure the trace cannot give is None, never a made-up 0.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import msgspec
import numpy as np
import pandas as pd

from advisor.facts import FactsFile, typed_facts
from advisor.load.trace import TraceFrames
from advisor.metrics.breakdown import CATEGORIES, name_matches, step_breakdown, text_of
from advisor.metrics.collectives import RankComm, rank_comm
from advisor.metrics.copies import copies, copy_bandwidth, copy_summary
from advisor.metrics.modules import module_time
from advisor.metrics.device_records import LAUNCH_CALL
from advisor.metrics.intervals import merge, overlap_with
from advisor.metrics.kernels import (
    kernel_table,
    kernel_totals,
    tensor_core_shares,
    top_kernels,
    top_ops,
)
from advisor.metrics.memory import peak_memory
from advisor.metrics.precision import Tf32Switches, precision_time_ms
from advisor.metrics.one_time import without_one_time_work
from advisor.metrics.steps import launches, step_of, step_spans, uneven_steps_note

NS_PER_MS = 1e6


class StepTimeStats(msgspec.Struct, forbid_unknown_fields=True):
    """Step time in ms over the window's steps; all null when no step was found."""

    mean: Optional[float]
    median: Optional[float]
    p90: Optional[float]
    min: Optional[float]
    max: Optional[float]


class Breakdown(msgspec.Struct, forbid_unknown_fields=True):
    """Mean ms per step in each category; each instant counted once, so they add up to the step."""

    kernel: float
    memcpy: float
    memset: float
    communication: float
    runtime: float
    dataloader: float
    cpu_exec: float
    other: float


class HostToDevice(msgspec.Struct, forbid_unknown_fields=True):
    """Host-to-device copies in the window; `bytes` is null when the trace does not record sizes."""

    count: int
    bytes: Optional[int]
    time_ms: float
    pageable_count: int
    pinned_count: int
    bandwidth_gbps: Optional[float]


class ProjectedWindow(msgspec.Struct, forbid_unknown_fields=True):
    """The steps with the one-time work taken out of them (first-call stalls: a library loaded,
    autotuning): a projection, never the headline. The replay, the findings and their savings
    are figured on it, so that none promises one-time work back per step."""

    step_time_ms: StepTimeStats
    breakdown_ms: Breakdown
    gpu_utilization: Optional[float]


class Summary(msgspec.Struct, forbid_unknown_fields=True):
    """A rank's figures, as the JSON report writes them and the renderers read them: the window
    as measured; `projected` holds the steps without one-time work where some was taken out."""

    steps: int
    step_time_ms: StepTimeStats
    breakdown_ms: Breakdown
    gpu_utilization: Optional[float]
    tensor_core_kernel_share: Optional[float]
    tensor_core_eligible_share: Optional[float]
    # Matrix kernel time per step (ms) by precision: fp32-fma, tf32, bf16, fp16, fp8, int8, fp64, unknown.
    kernel_time_by_precision_ms: Optional[dict[str, float]]
    peak_memory_bytes: Optional[float]
    peak_reserved_bytes: Optional[float]
    device_memory_bytes: Optional[float]
    h2d: HostToDevice
    projected: Optional[ProjectedWindow]


def plain(value: Any) -> Any:
    """An output type as the plain values the JSON report writes and the renderers read."""
    return msgspec.to_builtins(value, enc_hook=_plain_scalar)


def _plain_scalar(v: Any) -> Any:
    """A numpy scalar as the Python number it holds."""
    if hasattr(v, "item") and callable(v.item):
        return v.item()
    raise TypeError(f"an output holds a {type(v).__name__}")


@dataclass
class MeasuredWindow:
    """The window's steps as recorded, where the analysis took one-time work out of them: what
    the report's headline states (step times, breakdown, device busy share)."""

    step_ms: list[float]
    breakdown_ms: dict[str, float]
    gpu_utilization: float | None


@dataclass
class DeviceInfo:
    name: str | None = None
    total_memory_bytes: float | None = None
    compute_capability: str | None = None
    vendor: str | None = None  # "nvidia", "amd", "mtia"; None without device activity

    @property
    def capability(self) -> float | None:
        """The compute capability as a number; None where absent or not a plausible one (a damaged trace)."""
        try:
            value = float(self.compute_capability) if self.compute_capability else None
        except (TypeError, ValueError):
            return None
        return value if value is not None and math.isfinite(value) and 0 < value < 100 else None

    @property
    def kind(self) -> str:
        """What to call the device in a sentence: the run's own vocabulary."""
        return "MTIA accelerator" if self.vendor == "mtia" else "GPU"

    @property
    def short_kind(self) -> str:
        return "MTIA" if self.vendor == "mtia" else "GPU"

    @property
    def has_tensor_cores(self) -> bool:
        """Tensor Cores (and CUDA compute capabilities) are NVIDIA's: not shown for other devices."""
        return self.vendor == "nvidia"

    @property
    def matrix_units(self) -> str | None:
        """The vendor's name for its matrix units, where the kernel taxonomy tells which kernels
        ran on them (`advisor/metrics/kernel_taxonomy`): NVIDIA's Tensor Cores, AMD's Matrix
        Cores (MFMA: Tensile's `_MI` tiles, xdlops convolutions, CK attention)."""
        return {"nvidia": "Tensor Cores", "amd": "Matrix Cores"}.get(self.vendor or "")


@dataclass(frozen=True)
class FramesHeader:
    """What the text, JSON and Markdown reports and the gate read of a rank's frames: all that
    an analysis-cache hit brings back, so the frames themselves need not be loaded."""

    path: Path
    metadata: dict[str, Any]
    distributed: dict[str, Any]
    has_device: bool


@dataclass
class Metrics:
    """Everything measured on one rank's trace.

    Sent back by a worker (`without_frames`) or read from the analysis cache, `frames` is a
    FramesHeader and `kernels` holds totals per kernel name (what top_kernels reads); rank
    rules never see such a rank.
    """

    rank: int
    frames: TraceFrames | FramesHeader
    steps: pd.DataFrame  # step, start, end, duration (ns), device_ops
    breakdown: pd.DataFrame  # ns per category per step
    utilization: pd.Series  # share of each step with any device activity
    kernels: pd.DataFrame
    device: DeviceInfo
    tensor_core_kernel_share: float | None
    tensor_core_eligible_share: float | None
    h2d: dict[str, Any]
    d2h: dict[str, Any]
    peak_memory: dict[int, dict[str, float | None]]
    notes: list[str] = field(default_factory=list)
    # Matrix kernel time per step by precision (ms): fp32-fma, tf32, bf16, fp16, fp8, ...
    kernel_time_by_precision_ms: dict[str, float] = field(default_factory=dict)
    # Collectives and compute kernels per step, for comparing ranks (None: not measured).
    comm: RankComm | None = None
    # Ops against the device's ceilings (metrics.roofline); None: not measured (an older cache entry).
    roofline: Any = None
    # The window as recorded, where one-time work was taken out of `steps` (None: nothing was):
    # the headline figures are these, the rest of the metrics are of the projection.
    measured: Optional[MeasuredWindow] = None
    # Bytes copied and set over the steps, per time bucket and kind (metrics.copies.CopyBandwidth; None: none).
    copy_bandwidth: Any = None
    # Time per nn.Module path over the steps (metrics.modules.ModuleTime; None: no module calls recorded).
    modules: Any = None
    # Intermediate results several rules share (op tree, idle timeline), built once per rank.
    derived: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def shared(self, key: str, build):
        """`build()` once per rank; later callers get the same object (treat it as read-only)."""
        if key not in self.derived:
            self.derived[key] = build()
        return self.derived[key]

    @property
    def launches(self) -> pd.DataFrame:
        """Device rows joined to the runtime calls that launched them (several rules ask: built once)."""
        return self.shared("launches", lambda: launches(self.frames))

    @property
    def has_device(self) -> bool:
        return self.frames.has_device

    @property
    def parallel_op_ms(self) -> float:
        """Per step, host op time in calls long enough for the intra-op threads (see `kernels.parallel_op_ms`)."""
        from advisor.metrics.kernels import parallel_op_ms

        return self.shared("ops.parallel_ms", lambda: parallel_op_ms(self.frames, self.steps))

    @property
    def step_ms(self) -> np.ndarray:
        return self.steps["duration"].to_numpy(np.float64) / NS_PER_MS

    @property
    def mean_step_ns(self) -> float:
        return float(self.steps["duration"].mean()) if len(self.steps) else 0.0

    @property
    def breakdown_mean_ms(self) -> dict[str, float]:
        return {c: float(self.breakdown[c].mean() / NS_PER_MS) for c in CATEGORIES}

    @property
    def gpu_utilization(self) -> float | None:
        if not self.has_device or len(self.steps) == 0:
            return None
        return float(self.utilization.mul(self.steps["duration"].to_numpy()).sum() / max(self.steps["duration"].sum(), 1))

    @property
    def peak_allocated(self) -> float | None:
        vals = [v["allocated"] for v in self.peak_memory.values() if v["allocated"] is not None]
        return max(vals) if vals else None

    @property
    def peak_reserved(self) -> float | None:
        vals = [v["reserved"] for v in self.peak_memory.values() if v["reserved"] is not None]
        return max(vals) if vals else None

    @property
    def headline_step_ms(self) -> np.ndarray:
        """Each step's time as measured (with any one-time work in it): the headline's."""
        return np.asarray(self.measured.step_ms, dtype=np.float64) if self.measured is not None else self.step_ms

    def summary_figures(self) -> Summary:
        """The rank's `summary` (schema advisor/report/v1): the measured window, and the
        projection without one-time work beside it where some was taken out."""
        ms = self.headline_step_ms
        projected = None
        if self.measured is not None:
            projected = ProjectedWindow(step_time_ms=step_stats(self.step_ms), breakdown_ms=Breakdown(**self.breakdown_mean_ms), gpu_utilization=self.gpu_utilization)
        return Summary(
            steps=int(len(ms)),
            step_time_ms=step_stats(ms),
            breakdown_ms=Breakdown(**(self.measured.breakdown_ms if self.measured is not None else self.breakdown_mean_ms)),
            gpu_utilization=self.measured.gpu_utilization if self.measured is not None else self.gpu_utilization,
            tensor_core_kernel_share=self.tensor_core_kernel_share,
            tensor_core_eligible_share=self.tensor_core_eligible_share,
            kernel_time_by_precision_ms=self.kernel_time_by_precision_ms if self.has_device else None,
            peak_memory_bytes=self.peak_allocated,
            peak_reserved_bytes=self.peak_reserved,
            device_memory_bytes=self.device.total_memory_bytes,
            h2d=HostToDevice(**{f: self.h2d[f] for f in HostToDevice.__struct_fields__}),
            projected=projected,
        )

    def summary(self) -> dict[str, Any]:
        """The rank's `summary` as plain values (what the renderers read)."""
        return plain(self.summary_figures())


def step_stats(ms: np.ndarray) -> StepTimeStats:
    if len(ms) == 0:
        return StepTimeStats(None, None, None, None, None)
    return StepTimeStats(
        mean=float(ms.mean()),
        median=float(np.median(ms)),
        p90=float(np.percentile(ms, 90)),
        min=float(ms.min()),
        max=float(ms.max()),
    )


NOT_NVIDIA_NAME = re.compile(r"AMD|Radeon|Instinct|\bMI\d{3}", re.I)
HIP_CALL = re.compile(r"^hip")


def device_vendor(frames: TraceFrames, name: str | None) -> str | None:
    """Whose device ran the work: MTIA (its event categories), AMD (HIP runtime calls, or the
    device's name), else NVIDIA; None when the trace has no device activity."""
    if frames.metadata.get("device_api") == "mtia":
        return "mtia"
    if not frames.has_device:
        return None
    rt = frames.runtime
    if (len(rt) and name_matches(rt["name"], HIP_CALL).any()) or NOT_NVIDIA_NAME.search(name or ""):
        return "amd"
    return "nvidia"


def _device_info(frames: TraceFrames) -> DeviceInfo:
    info = _device_properties(frames)
    info.vendor = device_vendor(frames, info.name)
    if info.vendor != "nvidia":
        info.compute_capability = None  # ROCm fills CUDA's fields with its own numbers (gfx90a reads as "9.0")
    return info


def _device_properties(frames: TraceFrames) -> DeviceInfo:
    props = frames.device_properties
    if len(props) == 0:
        return DeviceInfo()
    used = frames.device["device"]
    used_ids = set(used[used >= 0].unique().tolist())
    row = props[props["id"].isin(used_ids)].head(1)
    if len(row) == 0:
        row = props.head(1)
    r = row.iloc[0]
    mem = r["total_memory_bytes"]
    return DeviceInfo(
        name=r["name"] or None,
        total_memory_bytes=float(mem) if pd.notna(mem) else None,
        compute_capability=r["compute_capability"],
    )


def _inside(rows: pd.DataFrame, steps: pd.DataFrame) -> np.ndarray:
    """Which rows start inside one of the steps."""
    s, e = steps["start"].to_numpy(np.int64), steps["end"].to_numpy(np.int64)
    return step_of(s, e, rows["ts"].to_numpy(np.int64)) >= 0


IDLE_DEVICE_NOTE = "is listed in the trace but no kernel, copy or launch is recorded on it"


def idle_device_note(frames: TraceFrames, name: str | None) -> str | None:
    """The trace lists a device that ran nothing (a CPU run on a GPU host, every op on the
    CPU): the run is read as a CPU run, and the report says so rather than naming the device
    as if it did the work. Launches without device records are another case (the device's
    records are missing, advisor.metrics.device_records), not this one."""
    if not name or len(frames.device_properties) == 0 or len(frames.device):
        return None
    if len(frames.runtime) and name_matches(frames.runtime["name"], LAUNCH_CALL).any():
        return None
    return f"{name} {IDLE_DEVICE_NOTE}: every op ran on the CPU, and the run is read as a CPU run"


NO_KERNEL_NOTE = "ran no kernel"
COMPUTE_OP = re.compile(r"^aten::(?:\w*conv\w*|mm|addmm|bmm|baddbmm|matmul|linear)$")


def kernelless_device_note(frames: TraceFrames, name: str | None) -> str | None:
    """The trace lists a device whose only records are copies or memsets, with no kernel and no
    kernel launch (a CPU run that moved a batch to the GPU and computed on the CPU): said so,
    with the convolutions and matrix products the host ran itself. Launches without kernel
    records are the device's records missing (advisor.metrics.device_records), not this."""
    dev = frames.device
    if not name or len(frames.device_properties) == 0 or len(dev) == 0:
        return None
    if (dev["kind"].astype(str) == "kernel").any():
        return None
    if len(frames.runtime) and name_matches(frames.runtime["name"], LAUNCH_CALL).any():
        return None
    kinds = dev["kind"].astype(str)
    n_copy, n_set = int((kinds == "memcpy").sum()), int((kinds == "memset").sum())
    what = " and ".join(x for x in (f"{n_copy} cop{'y' if n_copy == 1 else 'ies'}" if n_copy else "", f"{n_set} memset{'s' if n_set != 1 else ''}" if n_set else "") if x)
    ms = float((dev["end"] - dev["ts"]).sum()) / NS_PER_MS
    note = f"{name} {NO_KERNEL_NOTE}: its only records are {what or 'device records of no kernel'} ({ms:,.2f} ms in all)"
    host = frames.host
    if len(host):
        ops = host[(host["kind"].astype(str) == "op").to_numpy() & name_matches(host["name"], COMPUTE_OP)]
        if len(ops):
            counts = ops["name"].astype(str).value_counts()
            convs = bool(counts.index.str.contains("conv").any())
            products = bool((~counts.index.str.contains("conv")).any())
            what = " and ".join(w for w, has in (("convolutions", convs), ("matrix products", products)) if has)
            note += f"; its {what} ran on the CPU ({', '.join(counts.index[:3])})"
    return note + ": the device was idle for the compute"


def device_ran_no_kernel(metrics: Metrics) -> str:
    """Where the rank's listed device ran copies or memsets only (its note is among the rank's
    notes), the words the reports put after its name; else ""."""
    note = next((n for n in metrics.notes if f" {NO_KERNEL_NOTE}: its only records are" in n), None)
    if note is None:
        return ""
    return " (listed; ran no kernel, copies only" + (": the compute ran on the CPU)" if "ran on the CPU" in note else ")")


def device_idle(metrics: Metrics) -> bool:
    """Whether the rank's listed device ran nothing (its note is among the rank's notes)."""
    return any(IDLE_DEVICE_NOTE in n for n in metrics.notes)


def _utilization(frames: TraceFrames, steps: pd.DataFrame) -> pd.Series:
    """Per step, the share of it with any device activity."""
    dev = frames.device
    ms, me = merge(dev["ts"].to_numpy(np.int64), dev["end"].to_numpy(np.int64))
    busy = overlap_with(ms, me, steps["start"].to_numpy(np.int64), steps["end"].to_numpy(np.int64))
    return pd.Series(busy / np.maximum(steps["duration"].to_numpy(np.float64), 1), index=steps["step"].to_numpy())


def _measured_window(frames: TraceFrames, steps: pd.DataFrame) -> MeasuredWindow:
    """The headline's figures of the steps as recorded, before one-time work is taken out."""
    duration = steps["duration"].to_numpy(np.float64)
    breakdown = step_breakdown(frames, steps)
    busy = None
    if frames.has_device and len(steps):
        busy = float((_utilization(frames, steps).to_numpy() * duration).sum() / max(duration.sum(), 1))
    return MeasuredWindow(
        step_ms=(duration / NS_PER_MS).tolist(),
        breakdown_ms={c: float(breakdown[c].mean() / NS_PER_MS) for c in CATEGORIES},
        gpu_utilization=busy,
    )


def compute_metrics(frames: TraceFrames, rank: int = 0, facts: dict[str, Any] | None = None) -> Metrics:
    """The rank's metrics; `facts` (the run's advisor_facts.json, if any) gives the TF32
    switches and the compute capability that decide each kernel's precision."""
    steps, notes = step_spans(frames)
    cut, once = without_one_time_work(frames, steps)
    measured = None
    if once:  # the steps again, on the timeline without the one-time work; the headline stays the window's
        measured = _measured_window(frames, steps)
        frames = cut
        steps, notes = step_spans(frames)
        notes += once
    uneven = uneven_steps_note(steps["duration"].to_numpy(np.float64) / NS_PER_MS)
    if uneven:
        notes.append(uneven)
    breakdown = step_breakdown(frames, steps)
    util = _utilization(frames, steps)
    device = _device_info(frames)
    idle = idle_device_note(frames, device.name) or kernelless_device_note(frames, device.name)
    if idle:
        notes.append(idle)
    recorded = typed_facts(facts)
    kernels = kernel_table(frames, device.capability or _facts_capability(recorded), Tf32Switches.from_facts(recorded))
    comm = rank_comm(frames, steps)
    # Restrict kernel shares to the steps (warm-up kernels outside them would skew them).
    in_steps = _inside(kernels, steps)
    tc, eligible = tensor_core_shares(kernels[in_steps]) if in_steps.any() else tensor_core_shares(kernels)
    by_precision = precision_time_ms(kernels[in_steps], len(steps)) if in_steps.any() else precision_time_ms(kernels, 1)
    n = len(steps)
    h2d = copies(frames, "HtoD")
    d2h = copies(frames, "DtoH")
    if device.matrix_units is None:
        tc = eligible = None  # no kernel names that say which ran on matrix units
        by_precision = {}
    roof, roof_rows, roof_table = _roofline(frames, kernels, steps, device)
    notes = notes + beyond_ceiling_notes(roof)  # shapes left out of the roofline: said with the run's notes
    out = Metrics(
        rank=rank,
        frames=frames,
        steps=steps,
        breakdown=breakdown,
        utilization=util,
        kernels=kernels,
        device=device,
        tensor_core_kernel_share=tc,
        tensor_core_eligible_share=eligible,
        h2d=copy_summary(h2d[_inside(h2d, steps)], n),
        d2h=copy_summary(d2h[_inside(d2h, steps)], n),
        peak_memory=peak_memory(frames),
        notes=notes,
        measured=measured,
        kernel_time_by_precision_ms=by_precision,
        comm=comm,
        roofline=roof,
        copy_bandwidth=copy_bandwidth(frames, steps),
        modules=module_time(frames, steps),
    )
    out.derived["roofline.kernel_row"] = roof_rows  # each kernel's row of roofline.table (-1: not costed)
    out.derived["roofline.table"] = roof_table  # every costed group, not only the stored ones
    return out


def beyond_ceiling_notes(roof) -> list[str]:
    from advisor.metrics.roofline import BEYOND_CEILING_NOTE

    head = BEYOND_CEILING_NOTE.split("{", 1)[0]
    return [n for n in roof.notes if n.startswith(head)]


def _roofline(frames: TraceFrames, kernels: pd.DataFrame, steps: pd.DataFrame, device: DeviceInfo):
    from advisor.metrics.elementwise import achieved_bandwidth
    from advisor.metrics.roofline import roofline, shapes_recorded

    recorded = shapes_recorded(frames)
    bandwidth = achieved_bandwidth(kernels) if recorded and len(kernels) else None
    props = frames.device_properties
    sms = pd.to_numeric(props["num_sms"], errors="coerce").dropna() if "num_sms" in props and len(props) else pd.Series(dtype=float)
    return roofline(kernels, steps, device.name, recorded, bandwidth, int(sms.iloc[0]) if len(sms) and sms.iloc[0] > 0 else None,
                    _known_convs(frames) if recorded else None)


def _known_convs(frames: TraceFrames) -> dict:
    """Convolution shapes the backward ops give (op_cost.conv_shapes), one per distinct shape set."""
    from advisor.metrics.op_cost import conv_shapes

    host = frames.host
    if "input_dims" not in host or len(host) == 0:
        return {}
    names = host["name"].astype(str) if not isinstance(host["name"].dtype, pd.CategoricalDtype) else host["name"]
    rows = host[names.isin(["aten::convolution_backward", "aten::cudnn_convolution_backward", "aten::miopen_convolution_backward"]).to_numpy()]
    if len(rows) == 0:
        return {}
    dims = rows["input_dims"].to_numpy(dtype=object)
    first = pd.Series(np.fromiter(map(id, dims), dtype=np.int64, count=len(dims))).drop_duplicates().index.to_numpy()
    return conv_shapes(zip(text_of(rows["name"])[first], dims[first], strict=True))


def _facts_capability(recorded: FactsFile) -> float | None:
    capability = recorded.device.compute_capability  # "9.0": checked against its pattern when read
    return float(capability) if capability else None


def without_frames(m: Metrics) -> Metrics:
    """What the reports and the cross-rank analysis read of a rank, without its frames: a
    FramesHeader, kernel totals per name instead of every kernel, no shared intermediates.
    A few kB: what a worker sends back."""
    header = m.frames if isinstance(m.frames, FramesHeader) else FramesHeader(m.frames.path, m.frames.metadata, m.frames.distributed, m.frames.has_device)
    return Metrics(
        rank=m.rank,
        frames=header,
        steps=m.steps,
        breakdown=m.breakdown,
        utilization=m.utilization,
        kernels=kernel_totals(m.kernels),
        device=m.device,
        tensor_core_kernel_share=m.tensor_core_kernel_share,
        tensor_core_eligible_share=m.tensor_core_eligible_share,
        h2d=m.h2d,
        d2h=m.d2h,
        peak_memory=m.peak_memory,
        notes=m.notes,
        measured=m.measured,
        kernel_time_by_precision_ms=m.kernel_time_by_precision_ms,
        comm=m.comm,
        roofline=m.roofline,
        copy_bandwidth=m.copy_bandwidth,
        modules=m.modules,
    )


__all__ = ["Metrics", "DeviceInfo", "FramesHeader", "compute_metrics", "without_frames", "top_kernels", "top_ops", "NS_PER_MS"]
