"""One batch of decoded events to column pieces: one C-level transpose per field group, the
events split by what their category is (advisor.load.categories)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

import numpy as np
import pandas as pd

from advisor.load.decode import (
    EMPTY_ARGS,
    EMPTY_MEMORY_ARGS,
    INSTANT_TYPES,
    NULL,
    Span,
)
from advisor.load.categories import DEVICE, DEVICE_CATS, DEVICE_KINDS, HOST, HOST_CATS, HOST_KINDS, IGNORED, MAX_BYTES, MEMORY_EVENT, MTIA_DEVICE_CAT, MTIA_NOT_WORK, PROFILER_SESSION_CAT, RUNTIME, RUNTIME_CATS, SYNC, SYNC_CATS
from advisor.load.columns import _ids_pair, categorical, decoded_raw, floats, ids, object_categorical, objects, raw_json_categorical, raw_text_categorical, str_codes

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
    if nelems.count(None) == len(nelems):  # no collective kernel among these rows
        return out
    for i, (n, d) in enumerate(zip(nelems, dtypes, strict=True)):
        if n is None:
            continue
        size = DTYPE_BYTES.get(d.lower()) if isinstance(d, str) else None
        if size and type(n) is int and 0 <= n < MAX_BYTES / 8:
            out[i] = float(n * size)
    return out


def _process_groups(rows: list[Any]) -> pd.Categorical:
    """The process group a collective kernel ran in: its `Process Group Name`, else its
    `Process Group Ranks` ("ranks [0, 1]"); missing where the kernel names neither."""
    names = [a.pg_name for a in rows]
    ranks = [a.pg_ranks for a in rows]
    if names.count(None) == len(names) and ranks.count(None) == len(ranks):
        return object_categorical(names)
    return object_categorical([str(n) if n is not None else (f"ranks {r}" if r is not None else None) for n, r in zip(names, ranks, strict=True)])


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

    cat_codes, cat_uniques = pd.factorize(objects(cat))
    del cat
    group_of_cat = np.array([_group_of(c) for c in cat_uniques] + [IGNORED], dtype=np.int8)
    group = group_of_cat[cat_codes]
    name_codes, name_uniques = pd.factorize(objects(name))
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
        "msg_out_bytes": _message_bytes([a.msg_out_nelems for a in rows], [a.msg_dtype for a in rows]),
        "group_size": ids([a.group_size for a in rows]),
        "process_group": _process_groups(rows),
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
