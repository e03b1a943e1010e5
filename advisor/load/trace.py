"""Parse one torch.profiler (Kineto) Chrome trace into typed pandas frames.

Both trace generations are understood: the 2021 schema (`cat` = Operator, Runtime, Kernel,
Memcpy, Memset) and the current one (cpu_op, user_annotation, python_function,
cuda_runtime, cuda_driver, kernel, gpu_memcpy, gpu_memset, ...). ROCm traces use the same
categories; MTIA's `mtia_*` categories count as runtime and device activity.

Speed and memory matter here (traces reach gigabytes). `advisor.load.decode` turns the
bytes into batches of small typed structs (no dict per event); each batch is turned into
columns at once: one C-level transpose (`zip(*map(attrgetter(...)))`) per field group,
numbers converted by numpy in one call per column, strings factorized into categorical
codes. Per-event Python work happens only for events whose values have odd types. The
cyclic GC is paused for the whole build: it would otherwise rescan the growing heap
again and again. Times become int64 nanoseconds relative to the trace's first event.

The parts: what each category is (advisor.load.categories), columns from decoded values
(advisor.load.columns), one batch of events to column pieces (advisor.load.batches); this
module joins the pieces of all batches into the frames and checks what they hold.
"""

from __future__ import annotations

import gc
import hashlib
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from pandas.api.types import union_categoricals

from advisor.errors import InputError
from advisor.load.decode import (
    TRACE_FILE_HINT,
    decode_trace,
    read_trace_bytes,
)
from advisor.load.batches import _Part, _batch
from advisor.load.categories import COPY_NAME, DEVICE_CATS, DEVICE_KINDS, HOST_CATS, HOST_KINDS, MAX_BYTES, MAX_COPY_GBPS, MAX_SPAN_US, RANGE_PROFILER_CAT, RUNTIME_CATS, SCHEMA_2021_CATS, STEP_NAME, SYNC_CATS
from advisor.load.columns import _num, categorical

__all__ = ["DEVICE_CATS", "DEVICE_KINDS", "HOST_CATS", "HOST_KINDS", "RUNTIME_CATS", "SYNC_CATS", "TRACE_FILE_HINT", "TraceFrames", "load_trace"]


@dataclass
class TraceFrames:
    """Everything one trace file says, as frames. Times are int64 ns from `base_us`."""

    path: Path
    schema: str  # "2021" or "current"
    base_us: float
    host: pd.DataFrame  # ops, annotations, python functions
    runtime: pd.DataFrame  # cudaLaunchKernel, cudaMemcpyAsync, ... (host side of launches)
    device: pd.DataFrame  # kernels, memcpy, memset on the device
    memory: pd.DataFrame  # [memory] instant events
    steps: pd.DataFrame  # ProfilerStep#N spans on the host
    device_properties: pd.DataFrame
    distributed: dict[str, Any]
    window: tuple[int, int]  # first and last timestamp of any event (ns)
    metadata: dict[str, Any] = field(default_factory=dict)
    syncs: pd.DataFrame | None = None  # cuda_sync events, where the trace has them
    content_sha256: str | None = None  # of the file's bytes as read (the caches' key)
    load_warnings: list[str] = field(default_factory=list)  # impossible values left out, for the report

    @property
    def rank(self) -> int | None:
        rank = self.distributed.get("rank")
        if not isinstance(rank, (int, float)) or isinstance(rank, bool) or not math.isfinite(rank):
            return None
        return int(rank) if rank == int(rank) and 0 <= rank < 2**31 else None

    @property
    def event_count(self) -> int:
        """Host, runtime, device and memory events (the rows the metrics and rules read)."""
        return len(self.host) + len(self.runtime) + len(self.device) + len(self.memory)

    @property
    def has_device(self) -> bool:
        return len(self.device) > 0

    @property
    def range_profiled(self) -> bool:
        """Recorded with CUPTI's range profiler: kernels were replayed for counters, so the
        trace's times (launch calls, steps) are not those of the run."""
        return bool(self.metadata.get("range_profiler"))


# --- pieces of all batches to frames --------------------------------------------------------
def _concat_cat(pieces: list[pd.Categorical]) -> pd.Categorical:
    if len(pieces) == 1:
        return pieces[0]
    first = pieces[0].categories
    if all(p.categories.equals(first) for p in pieces[1:]):  # fixed sets (kind) keep their order
        return pd.Categorical.from_codes(np.concatenate([p.codes for p in pieces]), categories=first, validate=False)
    return union_categoricals(pieces, sort_categories=True)


def _concat(pieces: list[Any]) -> Any:
    if len(pieces) == 1:
        return pieces[0]
    if isinstance(pieces[0], pd.Categorical):
        return _concat_cat(pieces)
    return np.concatenate(pieces)


def _times(ts: np.ndarray, dur: np.ndarray, base_us: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ts, dur, keep): ns relative to base; keep drops events without a usable time (not a
    number, a negative duration, or further than MAX_SPAN_US from the base: int64 ns and
    their sums cannot overflow)."""
    with np.errstate(invalid="ignore"):
        keep = np.isfinite(ts) & np.isfinite(dur) & (dur >= 0) & (np.abs(ts - base_us) <= MAX_SPAN_US) & (dur <= MAX_SPAN_US)
    ts_ns = np.zeros(len(ts), dtype=np.int64)
    dur_ns = np.zeros(len(ts), dtype=np.int64)
    ts_ns[keep] = np.rint((ts[keep] - base_us) * 1000.0).astype(np.int64)
    dur_ns[keep] = np.rint(dur[keep] * 1000.0).astype(np.int64)
    return ts_ns, dur_ns, keep


def _frame_columns(parts: list[_Part], base_us: float, order: str, dropped: list[int] | None = None) -> dict[str, Any]:
    """Columns of one frame from its pieces: times in ns from base_us, rows sorted, timeless
    rows dropped (their count appended to `dropped`, for the report's warning)."""
    ts_us = _concat([p.ts for p in parts])
    dur_us = _concat([p.dur for p in parts])
    ts, dur, keep = _times(ts_us, dur_us, base_us)
    if dropped is not None:
        dropped.append(int(len(keep) - np.count_nonzero(keep)))
    cols: dict[str, Any] = {"name": _concat([p.name for p in parts]), "tid": _concat([p.tid for p in parts]), "ts": ts, "dur": dur}
    for key in parts[0].cols:
        cols[key] = _concat([p.cols[key] for p in parts])
    cols["end"] = ts + dur
    rank = _concat([p.cat_rank for p in parts])
    if order == "ts_dur":  # parents before children: by start, longer first
        sort = np.lexsort((rank, -dur, ts))
    else:
        sort = np.lexsort((rank, ts))
    if not keep.all():
        sort = sort[keep[sort]]
    return {k: (v.take(sort) if isinstance(v, pd.Categorical) else v[sort]) for k, v in cols.items()}


def _frame(parts: list[_Part], base_us: float, order: str, dropped: list[int] | None = None) -> pd.DataFrame:
    return pd.DataFrame(_frame_columns(parts, base_us, order, dropped), copy=False)


def _copy_parts(name: str) -> tuple[str | None, str | None, str | None]:
    m = COPY_NAME.match(name)
    return (m.group(1), m.group(2), m.group(3)) if m else (None, None, None)


def _device_frame(parts: list[_Part], base_us: float, dropped: list[int] | None = None, too_fast: list[int] | None = None) -> tuple[pd.DataFrame, int]:
    """The device frame, and how many rows had a byte count no copy can have (made NaN); a copy
    faster than MAX_COPY_GBPS has its bytes made NaN too (counted in `too_fast`)."""
    cols = _frame_columns(parts, base_us, "ts", dropped)
    # Copy direction and memory kinds come from the name: "Memcpy HtoD (Pageable -> Device)".
    names = cols["name"]
    copy = np.array([_copy_parts(c) for c in names.categories] + [(None, None, None)], dtype=object).reshape(-1, 3)
    for i, col in enumerate(("copy_kind", "copy_src", "copy_dst")):
        codes, uniques = pd.factorize(copy[:, i])
        cols[col] = categorical(codes[names.codes], uniques)
    with np.errstate(invalid="ignore"):
        impossible = ~np.isnan(cols["bytes"]) & ~((cols["bytes"] >= 0) & (cols["bytes"] < MAX_BYTES))
    cols["bytes"] = np.where(impossible, np.nan, cols["bytes"])
    with np.errstate(divide="ignore", invalid="ignore"):
        cols["bandwidth_gbps"] = np.where(cols["dur"] > 0, cols["bytes"] / cols["dur"], np.nan)  # bytes/ns == GB/s
        fast = cols["bandwidth_gbps"] > MAX_COPY_GBPS
    if fast.any():
        cols["bytes"] = np.where(fast, np.nan, cols["bytes"])
        cols["bandwidth_gbps"] = np.where(fast, np.nan, cols["bandwidth_gbps"])
    if too_fast is not None:
        too_fast.append(int(fast.sum()))
    frame = pd.DataFrame(cols, copy=False)
    return frame, int(impossible.sum())


def _memory_frame(parts: list[_Part], base_us: float) -> pd.DataFrame:
    ts = _concat([p.ts for p in parts])
    with np.errstate(invalid="ignore"):
        keep = np.isfinite(ts) & (np.abs(ts - base_us) <= MAX_SPAN_US)
    cols = {"ts": np.rint((np.where(keep, ts, base_us) - base_us) * 1000.0).astype(np.int64)}
    for key in parts[0].cols:
        cols[key] = _concat([p.cols[key] for p in parts])
    for key in ("total_allocated", "total_reserved"):  # totals are never negative
        cols[key] = np.where(cols[key] >= 0, cols[key], np.nan)
    for key in ("bytes", "total_allocated", "total_reserved"):
        cols[key] = np.where(np.abs(cols[key]) < MAX_BYTES, cols[key], np.nan)
    sort = np.argsort(cols["ts"], kind="stable")
    sort = sort[keep[sort]]
    return pd.DataFrame({k: v[sort] for k, v in cols.items()})


def _step_number(name: str) -> float:
    m = STEP_NAME.match(name)
    return float(m.group(1)) if m else math.nan


def _sequential(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Which step spans (sorted by start) to keep so that none overlaps another: a span that
    starts before the last kept one ends (nested in it, or overlapping it with another step
    number) is left out; steps are consecutive, and each instant belongs to one step."""
    keep = np.zeros(len(starts), dtype=bool)
    if len(starts) == 0:
        return keep
    running_end = np.maximum.accumulate(ends)
    keep[0] = True
    keep[1:] = starts[1:] >= running_end[:-1]
    if keep.all():
        return keep
    # A left-out span's end must not shadow the spans after it: walk only the conflicts.
    last_end = ends[0]
    for i in range(1, len(starts)):
        keep[i] = starts[i] >= last_end
        if keep[i]:
            last_end = ends[i]
    return keep


def _step_numbers(host: pd.DataFrame) -> np.ndarray:
    """N of each host row that is a ProfilerStep#N span (never a Python function of that
    name, nor a number too large for int64), else NaN."""
    names = host["name"].array
    per_cat = np.array([_step_number(c) for c in names.categories] + [math.nan], dtype=np.float64)
    step_no = per_cat[names.codes]
    with np.errstate(invalid="ignore"):
        is_step = np.isfinite(step_no) & (step_no < 2**62) & (host["kind"].array.codes != HOST_KINDS.index("python"))
    return np.where(is_step, step_no, np.nan)


def _steps_frame(host: pd.DataFrame) -> pd.DataFrame:
    """ProfilerStep#N spans on the host (never the GPU-side annotation of the same name)."""
    names = host["name"].array
    step_no = _step_numbers(host)
    is_step = np.isfinite(step_no)
    rows = np.flatnonzero(is_step)  # host rows are sorted by start already
    numbers = step_no[rows].astype(np.int64)
    _, first = np.unique(numbers, return_index=True)  # a step seen twice keeps its first span
    rows = rows[np.sort(first)]
    rows = rows[_sequential(host["ts"].to_numpy()[rows], host["end"].to_numpy()[rows])]
    return pd.DataFrame(
        {
            "step": step_no[rows].astype(np.int64),
            "name": names.take(rows).remove_unused_categories(),
            "start": host["ts"].to_numpy()[rows],
            "end": host["end"].to_numpy()[rows],
            "tid": host["tid"].array.take(rows).remove_unused_categories(),
        }
    )


def _property_number(v: Any) -> int | float:
    """An int property stays int (exact byte counts); anything not a number is NaN."""
    return v if type(v) is int and abs(v) < 2**63 else _num(v)


def _count_or_nan(v: Any) -> int | float:
    """A device's byte or unit count: NaN unless a number in [0, 2**53) (negative memory is impossible)."""
    n = _property_number(v)
    return n if 0 <= n < MAX_BYTES else math.nan


def _device_properties(props: Any) -> pd.DataFrame:
    rows = []
    if isinstance(props, list):
        for p in props:
            if not isinstance(p, dict):
                continue
            major, minor = _num(p.get("computeMajor")), _num(p.get("computeMinor"))
            rows.append(
                {
                    "id": int(p["id"]) if type(p.get("id")) is int and abs(p["id"]) < 2**63 else len(rows),
                    "name": str(p.get("name", "")),
                    "total_memory_bytes": _count_or_nan(p.get("totalGlobalMem")),
                    "compute_capability": f"{int(major)}.{int(minor)}" if 0 < major < 100 and 0 <= minor < 100 else None,
                    "num_sms": _count_or_nan(p.get("numSms")),
                }
            )
    return pd.DataFrame(rows, columns=["id", "name", "total_memory_bytes", "compute_capability", "num_sms"])


def _base_time(profiler_ts: np.ndarray) -> tuple[float, int]:
    """The trace's base time (µs): the first start of a profiler span, among the spans within
    MAX_SPAN_US of their median; and how many spans lie beyond (left out of every frame)."""
    if len(profiler_ts) == 0:
        return 0.0, 0
    center = float(np.median(profiler_ts))
    plausible = np.abs(profiler_ts - center) <= MAX_SPAN_US / 2
    return float(math.floor(profiler_ts[plausible].min())), int((~plausible).sum())


def _impossible_memory(memory: pd.DataFrame, properties: pd.DataFrame) -> list[str]:
    """Memory figures larger than the device that holds them (a 5 TB peak on an 80 GB device):
    made NaN in place (unknown, never a measured peak), with one warning that counts them.
    Only devices whose memory the trace states are checked."""
    if not len(memory) or not len(properties) or "device_id" not in memory:
        return []
    sizes = properties.dropna(subset=["total_memory_bytes"])
    sizes = sizes[sizes["total_memory_bytes"] > 0]
    if not len(sizes):
        return []
    cap = memory["device_id"].map(pd.Series(sizes["total_memory_bytes"].to_numpy(np.float64), index=sizes["id"].to_numpy())).to_numpy(np.float64)
    gpu = memory["device_type"].to_numpy() > 0  # type 0 is the host's memory
    bad = 0
    for key in ("total_allocated", "total_reserved", "bytes"):
        if key not in memory:
            continue
        values = memory[key].to_numpy(np.float64)
        with np.errstate(invalid="ignore"):
            over = gpu & (np.abs(values) > cap)  # NaN cap (a device not listed): never over
        if over.any():
            memory[key] = np.where(over, np.nan, values)
            bad += int(over.sum())
    if not bad:
        return []
    largest = float(sizes["total_memory_bytes"].max())
    return [f"{bad} memory figure(s) larger than the device's own memory ({largest / 2**30:.0f} GiB): impossible, read as unknown"]


def _unlinked_if_not_unique(runtime: pd.DataFrame, device: pd.DataFrame) -> list[str]:
    """Correlation ids link each runtime call to the device work it launched, one id per call
    (a CUDA graph's launch has several kernels under one id, never one id for many calls). When
    fewer than half the calls have an id of their own (a damaged or rewritten trace: every id
    set to 1), linking by them would charge every kernel to the first call and merge the steps:
    the ids are dropped (-1, in place) and the warning says so; steps and device work are then
    placed by time alone. A few shared ids (MTIA traces reuse some) are kept."""
    ids = runtime["correlation"].to_numpy()
    ids = ids[ids >= 0]
    if len(ids) < 4:
        return []
    distinct = len(np.unique(ids))
    if 2 * distinct >= len(ids):
        return []
    runtime["correlation"] = np.int64(-1)
    device["correlation"] = np.int64(-1)
    return [
        f"correlation ids are not unique ({distinct} distinct among {len(ids)} runtime calls): device work is not matched "
        "to the calls that launched it, and steps and kernels are placed by time alone"
    ]


def _impossible_values(props: Any, bad_bytes: int) -> list[str]:
    """Warnings for values the loader refused (read as unknown): negative or huge sizes."""
    out = []
    if isinstance(props, list):
        bad = [p.get("id") for p in props if isinstance(p, dict) and "totalGlobalMem" in p and not 0 <= _num(p.get("totalGlobalMem")) < MAX_BYTES]
        if bad:
            out.append(f"device memory (totalGlobalMem) of device(s) {bad} is not a possible size: read as unknown")
        bad = [p.get("id") for p in props if isinstance(p, dict) and "computeMajor" in p and not 0 < _num(p.get("computeMajor")) < 100]
        if bad:
            out.append(f"compute capability of device(s) {bad} is not a possible version: read as unknown")
    if bad_bytes:
        out.append(f"{bad_bytes} device event(s) have a byte count no copy can have (negative, or 2**53 and more): read as unknown")
    return out


def _marked_metadata(metadata: dict[str, Any], cats: set[str], session_end: float = math.nan, base_us: float = 0.0) -> dict[str, Any]:
    """The trace's metadata, plus what its event categories alone tell: a range-profiler
    trace (`range_profiler`), an MTIA device (`device_api`), and where the profiler's own
    span ends (`profiler_session_end_ns`, ns from the base time)."""
    out = dict(metadata)
    if math.isfinite(session_end) and abs(session_end - base_us) < MAX_SPAN_US:
        out["profiler_session_end_ns"] = int(round((session_end - base_us) * 1000))
    if RANGE_PROFILER_CAT in cats:
        out["range_profiler"] = True
    if any(c.startswith("mtia_") for c in cats):
        out["device_api"] = "mtia"
    return out


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic GC: building millions of objects would trigger it again and again,
    and it would rescan the whole growing heap each time for cycles that do not exist."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def frames_from_bytes(path: Path, data: bytes | bytearray | memoryview, **batching: int) -> TraceFrames:
    """Decode and frame a trace document held in memory (batching: see decode_trace)."""
    with gc_paused():
        decoded = decode_trace(path, data, **batching)
        del data  # from here the raw event slices alone keep the buffer, until the last batch is decoded
        cat_order: dict[Any, int] = {}
        batches = []
        for events in decoded.batches:
            batches.append(_batch(events, cat_order))
            del events  # free this batch's structs before the next batch is decoded
        if not batches:
            batches = [_batch([], cat_order)]
        total = sum(b.events for b in batches)
        if not any(b.durational for b in batches) and not any(len(b.memory.ts) for b in batches):
            if total == 0:
                raise InputError(path, "trace has no events")
            raise InputError(path, "trace has no profiler events (no ops, kernels or runtime calls)")
        base_us, outliers = _base_time(np.concatenate([b.profiler_ts for b in batches]))
        load_warnings = list(decoded.notes)
        if outliers:
            load_warnings.append(
                f"left out {outliers} event(s) timed more than {MAX_SPAN_US / 86400e6:.1f} days away from the rest of the trace (impossible timestamps)"
            )
        cats = set().union(*(b.cats for b in batches))
        session_end = max((b.session_end for b in batches if math.isfinite(b.session_end)), default=math.nan)
        schema = "2021" if any(c in cats for c in SCHEMA_2021_CATS) else "current"

        timeless: list[int] = []  # rows left out of host, runtime, device: no usable ts/dur
        host = _frame([b.host for b in batches], base_us, "ts_dur", timeless)
        runtime = _frame([b.runtime for b in batches], base_us, "ts", timeless)
        too_fast: list[int] = []
        device, bad_bytes = _device_frame([b.device for b in batches], base_us, timeless, too_fast)
        _refuse_empty_window(path, host, runtime, device, batches)
        if too_fast and too_fast[0]:
            load_warnings.append(
                f"{too_fast[0]} copy event(s) move more bytes than any link can in their recorded time (over {MAX_COPY_GBPS / 1000:.0f} TB/s): "
                "impossible, their bytes and bandwidth read as unknown"
            )
        load_warnings += _unlinked_if_not_unique(runtime, device)
        unusable = sum(timeless) - outliers  # those timed far away are said above
        if unusable > 0 and (len(host) or len(runtime) or len(device)):
            load_warnings.append(
                f"left out {unusable} event(s) with a time no event can have ({min(timeless[2], unusable)} of them on the device): "
                "a negative, not-a-number or impossibly large ts or dur"
            )
        memory = _memory_frame([b.memory for b in batches], base_us)
        properties = _device_properties(decoded.device_properties)
        load_warnings += _impossible_memory(memory, properties)
        syncs = _frame([b.sync for b in batches], base_us, "ts")[["name", "tid", "ts", "dur", "end"]] if any(len(b.sync.ts) for b in batches) else None
        if not (len(host) or len(runtime) or len(device) or len(memory)):
            raise InputError(path, "trace has no events with a usable time (every ts/dur is missing, negative or not a number)")
        steps = _steps_frame(host)
        overlapping = int(np.isfinite(_step_numbers(host)).sum()) - len(steps)
        if overlapping > 0:
            load_warnings.append(f"left out {overlapping} ProfilerStep span(s) repeated, nested in or overlapping another step: each instant counts in one step")
        starts = [f["ts"].min() for f in (host, runtime, device) if len(f)]
        ends = [f["end"].max() for f in (host, runtime, device) if len(f)]
        window = (int(min(starts)), int(max(ends))) if starts else (0, 0)
        dist = decoded.distributed
        return TraceFrames(
            path=path,
            schema=schema,
            base_us=base_us,
            host=host,
            runtime=runtime,
            device=device,
            memory=memory,
            steps=steps,
            device_properties=properties,
            distributed=dist if isinstance(dist, dict) else {},
            window=window,
            metadata=_marked_metadata(decoded.metadata, {str(c).lower() for c in cats}, session_end, base_us),
            syncs=syncs,
            load_warnings=load_warnings + _impossible_values(decoded.device_properties, bad_bytes),
        )


def _refuse_empty_window(path: Path, host: pd.DataFrame, runtime: pd.DataFrame, device: pd.DataFrame, batches: list[Any]) -> None:
    """A window that recorded no op, kernel or runtime call (only step marks, annotations or
    Python frames) has no work to measure: said so plainly, never reported as a step."""
    if len(runtime) or len(device) or any(len(b.memory.ts) for b in batches):
        return
    if len(host) and (host["kind"].array.codes == HOST_KINDS.index("op")).any():
        return
    span = (float(host["end"].max() - host["ts"].min()) / 1e6) if len(host) else 0.0
    kept = f"{len(host)} annotation or Python span(s) over {span:,.1f} ms" if len(host) else "no span with a time"
    raise InputError(path, f"an empty profiling window: no op, kernel or runtime call was recorded ({kept}), so there is no work to analyse")


def load_trace(path: str | Path, hash_content: bool = True) -> TraceFrames:
    """Read, decode and frame one trace file. Bad input raises InputError naming the file.
    `hash_content`: keep the hash of the bytes read (`content_sha256`, the caches' key);
    without a cache to key, the hashing (~0.5 ms per MB) is skipped."""
    path = Path(path)
    digest = hashlib.sha256() if hash_content else None
    try:
        # No local name for the bytes: the decoder may free them before the frames are built.
        frames = frames_from_bytes(path, read_trace_bytes(path, digest=digest))
    except InputError:
        raise
    except (ValueError, TypeError, KeyError, OverflowError, IndexError, RecursionError) as exc:
        raise InputError(path, f"malformed trace events ({type(exc).__name__}: {exc})") from None
    frames.content_sha256 = digest.hexdigest() if digest is not None else None
    return frames

