"""What an analysis entry's analysis.json and tables hold, as types: an entry whose values do
not fit is a miss."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Annotated, Any

import msgspec

from advisor.cache.seal import BadEntry

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

    from advisor.engine import Finding
    from advisor.whatif.savings import RankWhatIf

else:
    from advisor.cache.lazy import np, pd

NonNegative = Annotated[float, msgspec.Meta(ge=0)]
Share = Annotated[float, msgspec.Meta(ge=0, le=1)]


class _Entry(msgspec.Struct, forbid_unknown_fields=True):
    pass


class CopyEntry(_Entry):
    """A rank's copy totals (metrics.copies.copy_summary): the reports read every field."""

    count: Annotated[int, msgspec.Meta(ge=0)]
    bytes: Annotated[int, msgspec.Meta(ge=0)] | None
    time_ms: NonNegative
    pageable_count: Annotated[int, msgspec.Meta(ge=0)]
    pinned_count: Annotated[int, msgspec.Meta(ge=0)]
    bandwidth_gbps: NonNegative | None
    per_step_time_ms: NonNegative
    per_step_bytes: NonNegative | None


class RankEntry(_Entry):
    rank: int
    file_index: Annotated[int, msgspec.Meta(ge=0)]
    metadata: dict[str, str | int | float | bool]
    distributed: dict[str, Any]
    has_device: bool
    device: dict[str, Any]  # DeviceInfo's fields, converted to it (with their types) on read
    tensor_core_kernel_share: Share | None
    tensor_core_eligible_share: Share | None
    kernel_time_by_precision_ms: dict[str, NonNegative]
    h2d: CopyEntry
    d2h: CopyEntry
    peak_memory: dict[int, dict[str, NonNegative | None]]
    notes: list[str]
    comm: bool = False  # the rank's collectives and compute tables are stored
    measured: dict[str, Any] | None = None  # the window as recorded, where one-time work was taken out (metrics.summary.MeasuredWindow)
    roofline: dict[str, Any] | None = None  # the roofline's figures (its ops are the `roofline` table)
    copy_bandwidth: dict[str, Any] | None = None  # metrics.copies.CopyBandwidth's fields
    modules: dict[str, Any] | None = None  # metrics.modules.ModuleTime's fields


def _within_replay(w: RankWhatIf) -> bool:
    """What the types cannot say: finite times, and neither the step with every fix nor a
    saving beyond the replayed step (savings are rounded to the µs)."""
    times = [w.measured_ms, w.baseline_ms, w.host_scale, w.loader_scale, w.remainder_ms, w.untimed_host_ms, w.unprofiled_ms or 0.0, w.all_fixes_ms or 0.0]
    return (
        all(math.isfinite(t) for t in times)
        and (w.all_fixes_ms is None or w.all_fixes_ms <= w.baseline_ms * (1 + 1e-6) + 1e-6)
        and all(v <= w.baseline_ms + 1e-3 for v in w.savings.values())
    )


class EntryMeta(_Entry):
    key: dict[str, Any]
    key_digest: str
    written: float
    ranks: Annotated[list[RankEntry], msgspec.Meta(min_length=1)]  # an analysis has a rank at least
    findings: list[dict[str, Any]]  # engine.Finding's fields, converted to it on read (typed_results)
    warnings: list[str]
    whatif: list[dict[str, Any]] = []  # each rank's replay summary: whatif.savings.RankWhatIf's fields, converted likewise
    split_job: bool = False  # the run's files held several jobs (advisor.analysis._reduce)


def typed_results(meta: EntryMeta) -> tuple[list[Finding], list[RankWhatIf]]:
    """An entry's findings and replay summaries as the engine's types (msgspec.ValidationError
    when they do not fit): the types are imported here, on reading an analysis, so that a
    warm report, which never reads one, imports neither the engine nor NumPy."""
    from advisor.engine import Finding
    from advisor.whatif.savings import RankWhatIf

    return msgspec.convert(meta.findings, list[Finding]), msgspec.convert(meta.whatif, list[RankWhatIf])


BREAKDOWN_COLUMNS = ["kernel", "memcpy", "memset", "communication", "runtime", "dataloader", "cpu_exec", "other"]
KERNEL_TOTAL_COLUMNS = ["name", "count", "total_ns", "tensor_core", "precision"]  # kernel_totals
STEP_DTYPES = {"step": "int64", "name": "str", "host_start": "int64", "host_end": "int64", "start": "int64", "end": "int64", "device_ops": "int64", "duration": "int64"}


def check_tables(t: dict[str, pd.DataFrame]) -> None:
    """Raise BadEntry unless the rank's tables have their dtypes and add up: durations are
    end - start and non-negative, and each step's breakdown sums to its duration."""
    steps, bd, util, kernels = t["steps"], t["breakdown"], t["utilization"], t["kernels"]
    if {c: str(d) for c, d in steps.dtypes.items()} != STEP_DTYPES:
        raise BadEntry("steps")
    duration = steps["duration"].to_numpy(np.int64)
    if (duration < 0).any() or not np.array_equal(steps["end"].to_numpy(np.int64) - steps["start"].to_numpy(np.int64), duration):
        raise BadEntry("step times")
    if list(bd.columns) != BREAKDOWN_COLUMNS or any(str(d) != "int64" for d in bd.dtypes) or len(bd) != len(steps):
        raise BadEntry("breakdown")
    values = bd.to_numpy(np.int64)
    if (values < 0).any() or not np.array_equal(values.sum(axis=1), duration):
        raise BadEntry("breakdown does not add up")
    u = util["utilization"].to_numpy(np.float64) if list(util.columns) == ["utilization"] else None
    if u is None or len(u) != len(steps) or ((u < 0) | (u > 1)).any():
        raise BadEntry("utilization")
    if list(kernels.columns) != KERNEL_TOTAL_COLUMNS or any(str(kernels[c].dtype) != "int64" for c in ("count", "total_ns")) or str(kernels["tensor_core"].dtype) != "bool":
        raise BadEntry("kernels")
    if (kernels["total_ns"].to_numpy() < 0).any() or (kernels["count"].to_numpy() < 1).any():
        raise BadEntry("kernel times")
