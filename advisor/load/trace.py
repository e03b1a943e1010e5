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
"""

from __future__ import annotations

import gc
import hashlib
import math
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd
from pandas.api.types import union_categoricals

from advisor.errors import InputError
from advisor.load.decode import (
    EMPTY_ARGS,
    EMPTY_MEMORY_ARGS,
    INSTANT_TYPES,
    NULL,
    TRACE_FILE_HINT,
    Span,
    decode_trace,
    read_trace_bytes,
)

# --- what each `cat` is -------------------------------------------------------------------
HOST_CATS = {
    "cpu_op": "op",
    "operator": "op",
    "user_annotation": "annotation",
    "python_function": "python",
    "python": "python",
}
RUNTIME_CATS = {"cuda_runtime", "runtime", "cuda_driver", "mtia_runtime"}
DEVICE_CATS = {
    "kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "memcpy": "memcpy",
    "gpu_memset": "memset",
    "memset": "memset",
    "mtia_ccp_events": "kernel",
}
# MTIA command-processor events that are bookkeeping, not device work.
MTIA_NOT_WORK = ("event_wait", "event_record", "synchronize")
MTIA_DEVICE_CAT = "mtia_ccp_events"
SYNC_CATS = {"cuda_sync"}
# Kernels replayed by CUPTI's range profiler to read hardware counters: the trace then has
# these instead of kernel events, and every launch call lasts as long as the replays.
RANGE_PROFILER_CAT = "cuda_profiler_range"
PROFILER_SESSION_CAT = "trace"  # the profiler's own span over the recording: where a step marker can end at the latest
SCHEMA_2021_CATS = ("Operator", "Kernel", "Runtime")
MEMORY_EVENT = "[memory]"

STEP_NAME = re.compile(r"^ProfilerStep#(\d+)$")
COPY_NAME = re.compile(r"^Memcpy (\w+) \((\w+) -> (\w+)\)")

# Times further apart than this (µs; 11.6 days) are not one profiling window; in int64 ns they
# and their sums stay far from overflowing. Byte counts from 2**53 up are not real sizes.
MAX_SPAN_US = 1e12
MAX_BYTES = float(2**53)
# No link or memory moves bytes faster than this (GB/s; HBM3e is about 8,000): a copy that
# claims more in its recorded time has a byte count or a duration that cannot be measured.
MAX_COPY_GBPS = 50_000.0

HOST_KINDS = ["op", "annotation", "python"]
DEVICE_KINDS = ["kernel", "memcpy", "memset"]
# event groups, by category
IGNORED, HOST, RUNTIME, DEVICE, SYNC = 0, 1, 2, 3, 4

__all__ = ["DEVICE_CATS", "HOST_CATS", "RUNTIME_CATS", "SYNC_CATS", "TRACE_FILE_HINT", "TraceFrames", "load_trace"]


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


# --- columns from sequences of decoded values -----------------------------------------------
def _num(v: Any) -> float:
    """A JSON number as float, or NaN for anything else (strings, bools, null, huge ints)."""
    if type(v) is float:
        return v
    if type(v) is int:
        try:
            return float(v)
        except OverflowError:
            return math.nan
    return math.nan


def floats(values: Sequence[float]) -> np.ndarray:
    """float64 column in one numpy call (the decoder types these fields: every value is a float)."""
    try:
        return np.array(values, dtype=np.float64)
    except (TypeError, ValueError, OverflowError):
        return np.fromiter(map(_num, values), dtype=np.float64, count=len(values))


def ids(values: Sequence[int]) -> np.ndarray:
    """int64 id column, -1 where absent or not an integer that fits (ints up to 2**64 decode)."""
    try:
        return np.array(values, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        pass
    vals = np.fromiter(map(_num, values), dtype=np.float64, count=len(values))
    out = np.full(len(vals), -1, dtype=np.int64)
    ok = np.isfinite(vals) & (np.abs(vals) < 2**62)
    out[ok] = vals[ok].astype(np.int64)
    return out


def _first_id(primary: np.ndarray, fallback: np.ndarray) -> np.ndarray:
    return np.where(primary != -1, primary, fallback)


def categorical(codes: np.ndarray, uniques: np.ndarray) -> pd.Categorical:
    """uniques[codes] (-1 = missing) as a Categorical of the used values, sorted like pd.Categorical(values)."""
    codes = np.asarray(codes)
    present = codes >= 0
    used = np.flatnonzero(np.bincount(codes[present], minlength=len(uniques))) if len(uniques) else np.array([], dtype=np.int64)
    cats = np.asarray(uniques, dtype=object)[used]
    order = np.argsort(cats, kind="stable") if len(cats) else np.array([], dtype=np.int64)
    remap = np.full(len(uniques) + 1, -1, dtype=np.int32)  # slot -1 keeps missing missing
    remap[used[order]] = np.arange(len(used), dtype=np.int32)
    return pd.Categorical.from_codes(remap[codes], categories=pd.Index(cats[order], dtype="str"), validate=False)


def str_codes(values: list[Any]) -> tuple[np.ndarray, np.ndarray]:
    """Codes and unique str(v) for mixed values (thread ids are ints in one trace, strings in another)."""
    if set(map(type, values)) <= {int}:
        try:
            codes, uniques = pd.factorize(np.array(values, dtype=np.int64))
            return codes, np.array([str(u) for u in uniques], dtype=object)
        except OverflowError:
            pass
    codes, uniques = pd.factorize(np.array(values, dtype=object), use_na_sentinel=False)
    names = np.array([str(u) for u in uniques], dtype=object)
    if len(set(names)) < len(names):  # e.g. 7 and "7": one category
        merged, names = pd.factorize(names)
        codes = merged[codes]
    return codes, np.asarray(names, dtype=object)


def _ids_pair(primary: list[Any], fallback: list[Any]) -> np.ndarray:
    """An id from the first of two spellings of a key that is present (-1 where neither is)."""
    if fallback.count(-1) == len(fallback):  # the usual case: only one spelling in the trace
        return ids(primary)
    return _first_id(ids(primary), ids(fallback))


def object_categorical(values: Sequence[Any]) -> pd.Categorical:
    """Categorical of strings where None is missing."""
    codes, uniques = pd.factorize(np.array(values, dtype=object))
    return categorical(codes, uniques)


def _raw_bytes(raws: Sequence[Any]) -> np.ndarray:
    return np.array(list(map(bytes, raws)), dtype=object)


def _decode_each(uniques: np.ndarray) -> list[Any]:
    out = []
    for b in uniques:
        try:
            out.append(orjson.loads(b))
        except orjson.JSONDecodeError:  # numbers a double cannot hold (1e400) pass msgspec's raw scan
            out.append(None)
    return out


def decoded_raw(raws: Sequence[Any]) -> np.ndarray:
    """Raw JSON values (Input Dims) decoded once per distinct value: object array.

    Equal values share one Python object, so a million ops with a few hundred distinct
    shapes hold a few hundred lists, not a million.
    """
    if len(raws) == 0:
        return np.empty(0, dtype=object)
    codes, uniques = pd.factorize(_raw_bytes(raws))
    decoded = np.empty(len(uniques), dtype=object)
    decoded[:] = _decode_each(uniques)
    return decoded[codes]


def raw_text_categorical(raws: Sequence[Any]) -> pd.Categorical:
    """Raw JSON values (grid, block) as a Categorical of str(value); JSON null is missing."""
    if len(raws) == 0:
        return categorical(np.empty(0, dtype=np.int64), np.empty(0, dtype=object))
    codes, uniques = pd.factorize(_raw_bytes(raws))
    texts = [str(v) if v is not None else None for v in _decode_each(uniques)]
    text_codes, names = pd.factorize(np.array(texts, dtype=object))  # "[1,2]" and "[1, 2]" are one value
    return categorical(np.append(text_codes, -1)[codes], np.asarray(names, dtype=object))


def raw_json_categorical(raws: Sequence[Any]) -> pd.Categorical:
    """Raw JSON values (Input type) as a Categorical of their compact JSON text; JSON null is missing.

    A few dozen distinct dtype lists stand for millions of ops; readers decode the categories."""
    if len(raws) == 0:
        return categorical(np.empty(0, dtype=np.int64), np.empty(0, dtype=object))
    codes, uniques = pd.factorize(_raw_bytes(raws))
    texts = [orjson.dumps(v).decode() if v is not None else None for v in _decode_each(uniques)]
    text_codes, names = pd.factorize(np.array(texts, dtype=object))
    return categorical(np.append(text_codes, -1)[codes], np.asarray(names, dtype=object))


# --- one batch of events to column pieces ---------------------------------------------------
_INSTANT_TYPES = frozenset(INSTANT_TYPES)


def _group_of(cat: Any) -> int:
    key = cat.lower() if isinstance(cat, str) else None
    if key in HOST_CATS:
        return HOST
    if key in RUNTIME_CATS:
        return RUNTIME
    if key in DEVICE_CATS:
        return DEVICE
    if key in SYNC_CATS:
        return SYNC
    return IGNORED


# Bytes per element of the dtypes NCCL collectives name in their kernels' args.
DTYPE_BYTES = {
    "float": 4, "float32": 4, "int": 4, "int32": 4, "uint32": 4,
    "double": 8, "float64": 8, "long": 8, "int64": 8, "uint64": 8,
    "half": 2, "float16": 2, "bfloat16": 2, "short": 2, "int16": 2,
    "byte": 1, "char": 1, "int8": 1, "uint8": 1, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
}


def _message_bytes(nelems: list[Any], dtypes: list[Any]) -> np.ndarray:
    """A collective kernel's message size in bytes (`In msg nelems` x the dtype's size), NaN
    where either is absent, not a number or an unknown dtype."""
    out = np.full(len(nelems), np.nan)
    for i, (n, d) in enumerate(zip(nelems, dtypes, strict=True)):
        if n is None:
            continue
        size = DTYPE_BYTES.get(d.lower()) if isinstance(d, str) else None
        if size and type(n) is int and 0 <= n < MAX_BYTES / 8:
            out[i] = float(n * size)
    return out


def _take(values: list[Any], idx: np.ndarray) -> list[Any]:
    if len(idx) == 0:
        return []
    if len(idx) == 1:
        return [values[int(idx[0])]]
    return list(itemgetter(*idx.tolist())(values))


def _args_of(rows: list[Any], idx: np.ndarray | None, empty: Any) -> list[Any]:
    """The args structs of the selected rows (an `args`-less event reads as empty args).

    rows are args structs when idx is given, else events whose .args are taken."""
    sel = _take(rows, idx) if idx is not None else [e.args for e in rows]
    if None in sel:
        sel = [a if a is not None else empty for a in sel]
    return sel


@dataclass
class _Part:
    """Column pieces of one frame from one batch (times still in float µs)."""

    ts: np.ndarray
    dur: np.ndarray
    name: pd.Categorical | None  # None for [memory] events, whose frame has no name column
    tid: pd.Categorical | None
    cat_rank: np.ndarray  # ties in time keep the order of first appearance of the category
    cols: dict[str, Any]


@dataclass
class _BatchColumns:
    """Per-event columns of one batch that every frame takes its rows from."""

    ts: np.ndarray
    dur: np.ndarray
    name_codes: np.ndarray
    name_uniques: np.ndarray
    tid_codes: np.ndarray
    tid_names: np.ndarray
    cat_rank: np.ndarray

    def part(self, idx: np.ndarray, cols: dict[str, Any]) -> _Part:
        return _Part(
            ts=self.ts[idx],
            dur=self.dur[idx],
            name=categorical(self.name_codes[idx], self.name_uniques),
            tid=categorical(self.tid_codes[idx], self.tid_names),
            cat_rank=self.cat_rank[idx],
            cols=cols,
        )


@dataclass
class _Batch:
    host: _Part
    runtime: _Part
    device: _Part
    memory: _Part
    sync: _Part
    cats: set[str]
    durational: bool
    events: int
    profiler_ts: np.ndarray  # start (µs) of every span of a profiler category, for the base time
    session_end: float = math.nan  # end (µs) of the profiler's own span ("PyTorch Profiler (0)", category Trace)


def _batch(events: list[Any], cat_order: dict[Any, int]) -> _Batch:
    """Column pieces of every frame from one batch; cat_order ranks categories by first appearance."""
    n = len(events)
    spans = [e for e in events if type(e) is Span]
    instants = [e for e in events if type(e) in _INSTANT_TYPES]
    # Comprehensions with attribute access are the fastest transpose CPython has.
    cat = [e.cat for e in spans]
    name = [e.name for e in spans]
    ts = floats([e.ts for e in spans])
    dur = floats([e.dur for e in spans])
    tid_codes, tid_names = str_codes([e.tid for e in spans])
    args = [e.args for e in spans]
    del spans

    cat_codes, cat_uniques = pd.factorize(np.array(cat, dtype=object))
    del cat
    group_of_cat = np.array([_group_of(c) for c in cat_uniques] + [IGNORED], dtype=np.int8)
    group = group_of_cat[cat_codes]
    name_codes, name_uniques = pd.factorize(np.array(name, dtype=object))
    del name
    name_uniques = np.asarray(name_uniques, dtype=object)
    if (name_codes < 0).any():  # "name": null
        name_uniques = np.append(name_uniques, "")
        name_codes = np.where(name_codes < 0, len(name_uniques) - 1, name_codes)

    lower_cats = [c.lower() for c in cat_uniques]
    rank_of_cat = np.array([cat_order.setdefault(c, len(cat_order)) for c in cat_uniques] + [-1], dtype=np.int32)
    # The base time is the first start of any span of a profiler category (MTIA bookkeeping included).
    in_profiler_cat = group != IGNORED
    batch = _BatchColumns(ts, dur, name_codes, name_uniques, tid_codes, tid_names, rank_of_cat[cat_codes])
    # MTIA command-processor rows: bookkeeping is not device work; dma* is a copy.
    mtia = np.zeros(len(group), dtype=bool)
    if MTIA_DEVICE_CAT in lower_cats:
        mtia = np.isin(cat_codes, [i for i, c in enumerate(lower_cats) if c == MTIA_DEVICE_CAT])
        not_work = np.array([str(u).startswith(MTIA_NOT_WORK) for u in name_uniques], dtype=bool)
        group = np.where(mtia & not_work[name_codes], IGNORED, group)

    # host
    idx = np.flatnonzero(group == HOST)
    kind_of_cat = np.array([HOST_KINDS.index(HOST_CATS[c]) if c in HOST_CATS else -1 for c in lower_cats] + [-1], dtype=np.int8)
    rows = _args_of(args, idx, EMPTY_ARGS)
    ext = [a.external_id for a in rows]
    ext_lower = [a.external_id_lower for a in rows]
    stacks = [a.call_stack for a in rows]
    dims = [a.input_dims for a in rows]
    dims_lower = [a.input_dims_lower for a in rows]
    types = [a.input_types for a in rows]
    concrete = [a.concrete_inputs for a in rows]
    seq = [a.sequence for a in rows]
    if dims_lower.count(NULL) != len(dims_lower):
        dims = [d if d is not NULL else dl for d, dl in zip(dims, dims_lower, strict=True)]
    host = batch.part(idx, {
        "kind": pd.Categorical.from_codes(kind_of_cat[cat_codes[idx]], categories=HOST_KINDS),
        "external_id": _ids_pair(ext, ext_lower),
        "call_stack": object_categorical(stacks),
        "input_dims": decoded_raw(dims),
        "input_types": raw_json_categorical(types),
        "concrete_inputs": decoded_raw(concrete),
        "sequence": ids(seq),
    })
    del ext, ext_lower, stacks, dims, dims_lower, types, concrete, seq

    # runtime
    idx = np.flatnonzero(group == RUNTIME)
    rows = _args_of(args, idx, EMPTY_ARGS)
    corr = [a.correlation for a in rows]
    ext = [a.external_id for a in rows]
    ext_lower = [a.external_id_lower for a in rows]
    runtime = batch.part(idx, {
        "correlation": ids(corr),
        "external_id": _ids_pair(ext, ext_lower),
    })

    # device
    idx = np.flatnonzero(group == DEVICE)
    kind_of_cat = np.array([DEVICE_KINDS.index(DEVICE_CATS[c]) if c in DEVICE_CATS else -1 for c in lower_cats] + [-1], dtype=np.int8)
    kinds = kind_of_cat[cat_codes[idx]]
    if mtia.any():
        is_dma = np.array([str(u).startswith("dma") for u in name_uniques], dtype=bool)
        kinds = np.where(mtia[idx] & is_dma[name_codes[idx]], DEVICE_KINDS.index("memcpy"), kinds)
    rows = _args_of(args, idx, EMPTY_ARGS)
    device = batch.part(idx, {
        "kind": pd.Categorical.from_codes(kinds, categories=DEVICE_KINDS),
        "device": ids([a.device for a in rows]),
        "stream": ids([a.stream for a in rows]),
        "correlation": ids([a.correlation for a in rows]),
        "external_id": _ids_pair([a.external_id for a in rows], [a.external_id_lower for a in rows]),
        "registers": floats([a.registers for a in rows]).astype(np.float32),
        "shared_memory": floats([a.shared_memory for a in rows]).astype(np.float32),
        "blocks_per_sm": floats([a.blocks_per_sm for a in rows]).astype(np.float32),
        "warps_per_sm": floats([a.warps_per_sm for a in rows]).astype(np.float32),
        "occupancy": floats([a.occupancy for a in rows]).astype(np.float32),
        "grid": raw_text_categorical([a.grid for a in rows]),
        "block": raw_text_categorical([a.block for a in rows]),
        "bytes": floats([a.bytes for a in rows]),
        "msg_bytes": _message_bytes([a.msg_nelems for a in rows], [a.msg_dtype for a in rows]),
    })
    del rows

    sync = batch.part(np.flatnonzero(group == SYNC), {})

    # [memory] instant events (no category in the 2021 schema, cpu_instant_event later)
    mem = [e for e in instants if e.name == MEMORY_EVENT]
    rows = _args_of(mem, None, EMPTY_MEMORY_ARGS)
    memory = _Part(
        ts=floats([e.ts for e in mem]),
        dur=np.zeros(len(mem)),
        name=None,
        tid=None,
        cat_rank=np.zeros(len(mem), dtype=np.int32),
        cols={
            "device_type": ids([a.device_type for a in rows]),
            "device_id": ids([a.device_id for a in rows]),
            "bytes": floats([a.bytes for a in rows]),
            "total_allocated": floats([a.total_allocated for a in rows]),
            "total_reserved": floats([a.total_reserved for a in rows]),
        },
    )

    dts = ts[in_profiler_cat]
    dts = dts[np.isfinite(dts) & (np.abs(dts) < 1e17)]
    session = np.isin(cat_codes, [i for i, c in enumerate(lower_cats) if c == PROFILER_SESSION_CAT]) if PROFILER_SESSION_CAT in lower_cats else None
    session_ends = (ts + dur)[session] if session is not None else np.zeros(0)
    session_ends = session_ends[np.isfinite(session_ends) & (np.abs(session_ends) < 1e17)]
    return _Batch(
        host=host,
        runtime=runtime,
        device=device,
        memory=memory,
        sync=sync,
        cats={c for c in cat_uniques if isinstance(c, str)},
        durational=bool(in_profiler_cat.any()),
        events=n,
        profiler_ts=dts,
        session_end=float(session_ends.max()) if len(session_ends) else math.nan,
    )


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
        load_warnings = []
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


def load_trace(path: str | Path) -> TraceFrames:
    """Read, decode and frame one trace file. Bad input raises InputError naming the file."""
    path = Path(path)
    digest = hashlib.sha256()
    try:
        # No local name for the bytes: the decoder may free them before the frames are built.
        frames = frames_from_bytes(path, read_trace_bytes(path, digest=digest))
    except InputError:
        raise
    except (ValueError, TypeError, KeyError, OverflowError, IndexError, RecursionError) as exc:
        raise InputError(path, f"malformed trace events ({type(exc).__name__}: {exc})") from None
    frames.content_sha256 = digest.hexdigest()
    return frames

