"""Parse one torch.profiler (Kineto) Chrome trace into typed pandas frames.

Both trace generations are understood: the 2021 schema (`cat` = Operator, Runtime, Kernel,
Memcpy, Memset) and the current one (cpu_op, user_annotation, python_function,
cuda_runtime, cuda_driver, kernel, gpu_memcpy, gpu_memset, ...). ROCm traces use the same
categories; MTIA's `mtia_*` categories count as runtime and device activity.

Speed matters here (traces reach gigabytes): the document is decoded once by orjson with
the cyclic garbage collector paused (it dominates decoding of large documents), events are
bucketed by category in one pass, and each column is pulled out with one comprehension per
bucket. Times become int64 nanoseconds relative to the trace's first event; names become
categoricals.
"""

from __future__ import annotations

import gc
import gzip
import math
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd

from advisor.errors import InputError

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
SYNC_CATS = {"cuda_sync"}

STEP_NAME = re.compile(r"^ProfilerStep#(\d+)$")
COPY_NAME = re.compile(r"^Memcpy (\w+) \((\w+) -> (\w+)\)")

TRACE_FILE_HINT = "a torch.profiler trace (JSON with 'traceEvents')"


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

    @property
    def rank(self) -> int | None:
        rank = self.distributed.get("rank")
        return int(rank) if isinstance(rank, (int, float)) and not isinstance(rank, bool) else None

    @property
    def has_device(self) -> bool:
        return len(self.device) > 0


# --- decoding -----------------------------------------------------------------------------
def read_bytes(path: Path) -> bytes:
    """The decompressed bytes of a trace file (gzip is recognised by its magic number)."""
    try:
        raw = path.read_bytes()
    except IsADirectoryError:
        raise InputError(path, "is a directory, expected a trace file") from None
    except OSError as exc:
        raise InputError(path, f"cannot read: {exc.strerror or exc}") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            return gzip.decompress(raw)
        except (EOFError, gzip.BadGzipFile, zlib.error, OSError) as exc:
            detail = "truncated gzip (file cut short while being written?)" if isinstance(exc, EOFError) else f"corrupt gzip ({exc})"
            raise InputError(path, detail) from None
    return raw


def decode(path: Path, data: bytes) -> dict[str, Any]:
    """orjson.loads with the cyclic GC paused; a bad document becomes an InputError."""
    if not data.strip():
        raise InputError(path, "file is empty")
    enabled = gc.isenabled()
    gc.disable()
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        where = f" at byte {exc.pos}" if getattr(exc, "pos", None) is not None else ""
        truncated = exc.pos is not None and exc.pos >= len(data.rstrip()) - 1
        why = "truncated JSON (profiler stopped mid-write?)" if truncated else f"invalid JSON{where}: {exc.msg}"
        raise InputError(path, why) from None
    finally:
        if enabled:
            gc.enable()
    if isinstance(doc, list):
        doc = {"traceEvents": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise InputError(path, f"not a Chrome trace: expected {TRACE_FILE_HINT}")
    return doc


# --- columns ------------------------------------------------------------------------------
def _num(v: Any) -> float:
    """A JSON number, or NaN for anything else (strings, bools, null, huge ints)."""
    if type(v) is int or type(v) is float:
        return v
    return math.nan


def _col_float(events: list[dict], key: str) -> np.ndarray:
    return np.fromiter((_num(e.get(key)) for e in events), dtype=np.float64, count=len(events))


def _arg_float(args: list[dict], key: str) -> np.ndarray:
    return np.fromiter((_num(a.get(key)) for a in args), dtype=np.float64, count=len(args))


def _arg_id(args: list[dict], *keys: str) -> np.ndarray:
    """An integer id from args (first key present), -1 where absent."""
    out = np.full(len(args), -1, dtype=np.int64)
    for key in keys:
        vals = _arg_float(args, key)
        fill = (out == -1) & np.isfinite(vals) & (np.abs(vals) < 2**62)
        out[fill] = vals[fill].astype(np.int64)
    return out


def _names(events: list[dict]) -> pd.Categorical:
    return pd.Categorical([n if type(n := e.get("name")) is str else str(n) for e in events])


def _tid(events: list[dict]) -> pd.Categorical:
    return pd.Categorical([str(e.get("tid")) for e in events])


def _args(events: list[dict]) -> list[dict]:
    return [a if type(a := e.get("args")) is dict else {} for e in events]


def _times(events: list[dict], base_us: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ts, dur, keep): ns relative to base; keep drops events without a usable time."""
    ts = _col_float(events, "ts")
    dur = _col_float(events, "dur")
    keep = np.isfinite(ts) & np.isfinite(dur) & (dur >= 0) & (np.abs(ts) < 1e17) & (dur < 1e15)
    ts_ns = np.zeros(len(events), dtype=np.int64)
    dur_ns = np.zeros(len(events), dtype=np.int64)
    ts_ns[keep] = np.rint((ts[keep] - base_us) * 1000.0).astype(np.int64)
    dur_ns[keep] = np.rint(dur[keep] * 1000.0).astype(np.int64)
    return ts_ns, dur_ns, keep


def _frame(events: list[dict], base_us: float, extra: dict[str, Any]) -> pd.DataFrame:
    ts, dur, keep = _times(events, base_us)
    cols = {"name": _names(events), "tid": _tid(events), "ts": ts, "dur": dur}
    cols.update(extra)
    df = pd.DataFrame(cols)
    if not keep.all():
        df = df[keep].reset_index(drop=True)
    df["end"] = df["ts"] + df["dur"]
    return df


def _host_frame(events: list[dict], kinds: list[str], base_us: float) -> pd.DataFrame:
    args = _args(events)
    stacks = [s if type(s := a.get("Call stack")) is str else None for a in args]
    dims = [a.get("Input Dims", a.get("Input dims")) for a in args]
    df = _frame(
        events,
        base_us,
        {
            "kind": pd.Categorical(kinds, categories=["op", "annotation", "python"]),
            "external_id": _arg_id(args, "External id", "external id"),
            "call_stack": pd.Categorical(stacks),
            "input_dims": dims,
        },
    )
    return df.sort_values(["ts", "dur"], ascending=[True, False], kind="stable").reset_index(drop=True)


def _runtime_frame(events: list[dict], base_us: float) -> pd.DataFrame:
    args = _args(events)
    df = _frame(
        events,
        base_us,
        {
            "correlation": _arg_id(args, "correlation"),
            "external_id": _arg_id(args, "External id", "external id"),
        },
    )
    return df.sort_values("ts", kind="stable").reset_index(drop=True)


def _device_frame(events: list[dict], kinds: list[str], base_us: float) -> pd.DataFrame:
    args = _args(events)
    df = _frame(
        events,
        base_us,
        {
            "kind": pd.Categorical(kinds, categories=["kernel", "memcpy", "memset"]),
            "device": _arg_id(args, "device"),
            "stream": _arg_id(args, "stream"),
            "correlation": _arg_id(args, "correlation"),
            "external_id": _arg_id(args, "External id", "external id"),
            "registers": _arg_float(args, "registers per thread").astype(np.float32),
            "shared_memory": _arg_float(args, "shared memory").astype(np.float32),
            "blocks_per_sm": _arg_float(args, "blocks per SM").astype(np.float32),
            "warps_per_sm": _arg_float(args, "warps per SM").astype(np.float32),
            "occupancy": _arg_float(args, "est. achieved occupancy %").astype(np.float32),
            "grid": pd.Categorical([str(g) if (g := a.get("grid")) is not None else None for a in args]),
            "block": pd.Categorical([str(b) if (b := a.get("block")) is not None else None for a in args]),
            "bytes": _arg_float(args, "bytes"),
        },
    )
    # Copy direction and memory kinds come from the name: "Memcpy HtoD (Pageable -> Device)".
    names = pd.Series(df["name"].cat.categories)
    parts = names.str.extract(COPY_NAME)
    lookup = dict(zip(names, parts.itertuples(index=False)))
    codes = df["name"].astype(object).map(lambda n: lookup.get(n, (None, None, None)))
    df["copy_kind"] = pd.Categorical([c[0] for c in codes])
    df["copy_src"] = pd.Categorical([c[1] for c in codes])
    df["copy_dst"] = pd.Categorical([c[2] for c in codes])
    with np.errstate(divide="ignore", invalid="ignore"):
        df["bandwidth_gbps"] = np.where(df["dur"] > 0, df["bytes"] / df["dur"], np.nan)  # bytes/ns == GB/s
    return df.sort_values("ts", kind="stable").reset_index(drop=True)


def _memory_frame(events: list[dict], base_us: float) -> pd.DataFrame:
    args = _args(events)
    ts = _col_float(events, "ts")
    keep = np.isfinite(ts)
    df = pd.DataFrame(
        {
            "ts": np.rint((np.where(keep, ts, base_us) - base_us) * 1000.0).astype(np.int64),
            "device_type": _arg_id(args, "Device Type"),
            "device_id": _arg_id(args, "Device Id"),
            "bytes": _arg_float(args, "Bytes"),
            "total_allocated": _arg_float(args, "Total Allocated"),
            "total_reserved": _arg_float(args, "Total Reserved"),
        }
    )
    return df[keep].sort_values("ts", kind="stable").reset_index(drop=True)


def _steps_frame(host: pd.DataFrame) -> pd.DataFrame:
    """ProfilerStep#N spans on the host (never the GPU-side annotation of the same name)."""
    names = host["name"].astype(str)
    match = names.str.extract(STEP_NAME, expand=False)
    is_step = match.notna() & (host["kind"] != "python")
    steps = host.loc[is_step, ["name", "ts", "end", "tid"]].copy()
    steps["step"] = match[is_step].astype(np.int64)
    steps = steps.sort_values("ts", kind="stable").drop_duplicates("step", keep="first")
    return steps.rename(columns={"ts": "start"})[["step", "name", "start", "end", "tid"]].reset_index(drop=True)


def _device_properties(doc: dict) -> pd.DataFrame:
    props = doc.get("deviceProperties")
    rows = []
    if isinstance(props, list):
        for p in props:
            if not isinstance(p, dict):
                continue
            major, minor = _num(p.get("computeMajor")), _num(p.get("computeMinor"))
            rows.append(
                {
                    "id": int(p["id"]) if type(p.get("id")) is int else len(rows),
                    "name": str(p.get("name", "")),
                    "total_memory_bytes": _num(p.get("totalGlobalMem")),
                    "compute_capability": f"{int(major)}.{int(minor)}" if math.isfinite(major) and math.isfinite(minor) else None,
                    "num_sms": _num(p.get("numSms")),
                }
            )
    return pd.DataFrame(rows, columns=["id", "name", "total_memory_bytes", "compute_capability", "num_sms"])


def frames_from_doc(path: Path, doc: dict[str, Any]) -> TraceFrames:
    events = doc["traceEvents"]
    buckets: dict[Any, list[dict]] = {}
    memory: list[dict] = []
    min_ts = math.inf
    for e in events:
        if type(e) is not dict:
            continue
        cat = e.get("cat")
        if cat is None:
            if e.get("name") == "[memory]":
                memory.append(e)
            continue
        b = buckets.get(cat)
        if b is None:
            buckets[cat] = b = []
        b.append(e)
    durational = [c for c in buckets if type(c) is str and c.lower() in HOST_CATS.keys() | RUNTIME_CATS | DEVICE_CATS.keys() | SYNC_CATS]
    if not durational and not memory:
        if not events:
            raise InputError(path, "trace has no events")
        raise InputError(path, "trace has no profiler events (no ops, kernels or runtime calls)")

    # A base near the first event keeps ns offsets exact in float64.
    for c in durational:
        for e in buckets[c][:1]:
            t = _num(e.get("ts"))
            if math.isfinite(t):
                min_ts = min(min_ts, t)
    for c in durational:
        ts = _col_float(buckets[c], "ts")
        ts = ts[np.isfinite(ts) & (np.abs(ts) < 1e17)]
        if len(ts):
            min_ts = min(min_ts, float(ts.min()))
    base_us = 0.0 if not math.isfinite(min_ts) else float(math.floor(min_ts))

    schema = "2021" if any(c in buckets for c in ("Operator", "Kernel", "Runtime")) else "current"
    host_ev, host_kind, rt_ev, dev_ev, dev_kind, sync_ev = [], [], [], [], [], []
    for cat, evs in buckets.items():
        if type(cat) is not str:
            continue
        key = cat.lower()
        if key in HOST_CATS:
            ph_x = [e for e in evs if e.get("ph") == "X"]
            host_ev += ph_x
            host_kind += [HOST_CATS[key]] * len(ph_x)
        elif key in RUNTIME_CATS:
            rt_ev += [e for e in evs if e.get("ph") == "X"]
        elif key in DEVICE_CATS:
            ph_x = [e for e in evs if e.get("ph") == "X"]
            if key == "mtia_ccp_events":
                ph_x = [e for e in ph_x if not str(e.get("name", "")).startswith(MTIA_NOT_WORK)]
                kinds = ["memcpy" if str(e.get("name", "")).startswith("dma") else "kernel" for e in ph_x]
            else:
                kinds = [DEVICE_CATS[key]] * len(ph_x)
            dev_ev += ph_x
            dev_kind += kinds
        elif key in SYNC_CATS:
            sync_ev += [e for e in evs if e.get("ph") == "X"]

    host = _host_frame(host_ev, host_kind, base_us)
    runtime = _runtime_frame(rt_ev, base_us)
    device = _device_frame(dev_ev, dev_kind, base_us)
    mem = _memory_frame(memory, base_us)
    syncs = _frame(sync_ev, base_us, {}) if sync_ev else None
    starts = [f["ts"].min() for f in (host, runtime, device) if len(f)]
    ends = [f["end"].max() for f in (host, runtime, device) if len(f)]
    window = (int(min(starts)), int(max(ends))) if starts else (0, 0)
    dist = doc.get("distributedInfo")
    meta = {k: v for k, v in doc.items() if k not in ("traceEvents", "deviceProperties", "distributedInfo") and isinstance(v, (str, int, float, bool))}
    return TraceFrames(
        path=path,
        schema=schema,
        base_us=base_us,
        host=host,
        runtime=runtime,
        device=device,
        memory=mem,
        steps=_steps_frame(host),
        device_properties=_device_properties(doc),
        distributed=dist if isinstance(dist, dict) else {},
        window=window,
        metadata=meta,
        syncs=syncs,
    )


def load_trace(path: str | Path) -> TraceFrames:
    """Read, decode and frame one trace file. Bad input raises InputError naming the file."""
    path = Path(path)
    doc = decode(path, read_bytes(path))
    try:
        return frames_from_doc(path, doc)
    except InputError:
        raise
    except (ValueError, TypeError, KeyError, OverflowError) as exc:
        raise InputError(path, f"malformed trace events ({type(exc).__name__}: {exc})") from None
