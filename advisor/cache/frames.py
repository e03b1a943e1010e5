"""Frames entries: the parsed frames of one trace, one Parquet file per frame."""

from __future__ import annotations

import functools
import hashlib
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from advisor.version import __version__
from advisor.cache.digests import content_digest, trace_digest
from advisor.cache.seal import BadEntry, _sha, entry_name
from advisor.cache.settings import cache_enabled, cache_roots
from advisor.cache.store import read_entry, write_entry

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

    from advisor.load.trace import TraceFrames
else:
    from advisor.cache.lazy import np, pd

FRAMES_META = "advisor_cache.json"
FRAMES_FORMAT = 6  # 4: one sealed cache, keyed on content alone; 5: the profiler session's end in the metadata; 6: impossible copies, memory figures and shared correlation ids read as unknown
FRAME_TABLES = ("host", "runtime", "device", "memory", "steps", "device_properties", "syncs")
JSON_COLUMNS = {"host": ("input_dims", "concrete_inputs")}


@functools.cache
def fixed_categories() -> dict[tuple[str, str], list[str]]:
    from advisor.load.trace import DEVICE_KINDS, HOST_KINDS

    return {("host", "kind"): HOST_KINDS, ("device", "kind"): DEVICE_KINDS}


DEVICE_PROPERTY_COLUMNS = ["id", "name", "total_memory_bytes", "compute_capability", "num_sms"]
# The trace fields the loader reads: a loader that reads one more (or one less) makes new entries.
@functools.cache
def loader_fields() -> str:
    from advisor.load.decode import EventArgs, MemoryArgs

    return hashlib.sha256(repr((EventArgs.__struct_encode_fields__, MemoryArgs.__struct_encode_fields__)).encode()).hexdigest()[:12]

# Traces that parse faster than this (about 100 MB of JSON) are not worth an entry.
MIN_PARSE_SECONDS = 0.5


@dataclass(frozen=True)
class CacheKey:
    """What must match for a frames entry to stand for the trace file's bytes."""

    sha256: str
    advisor_version: str = __version__
    format: int = FRAMES_FORMAT
    fields: str = field(default_factory=loader_fields)

    @classmethod
    def of_frames(cls, frames: TraceFrames) -> CacheKey | None:
        return cls(sha256=frames.content_sha256) if frames.content_sha256 is not None else None

    def as_dict(self) -> dict[str, Any]:
        return {"sha256": self.sha256, "advisor_version": self.advisor_version, "format": self.format, "fields": self.fields}

    @property
    def digest(self) -> str:
        return _sha(orjson.dumps(self.as_dict(), option=orjson.OPT_SORT_KEYS))


def read_cached(path: Path) -> TraceFrames | None:
    """The cached frames of this trace file if an entry holds its bytes' hash, else None."""
    path = Path(path)
    if not cache_roots(path.parent):
        return None
    try:
        key = CacheKey(sha256=trace_digest(path))
    except OSError:
        return None
    found = read_entry("frames", key.digest, path.parent)
    if found is None:
        return None
    return _frames_of(found[1], key, path)


def frames_entry(path: Path) -> Path | None:
    """The folder of the frames entry this trace would read or write (None: cache off)."""
    roots = cache_roots(Path(path).parent)
    if not roots:
        return None
    return roots[0] / entry_name("frames", CacheKey(sha256=content_digest(Path(path))).digest)


# One event of each kind the loader keeps: the frames built from it give the dtype of every
# column (so a column the loader gains is expected of entries too, without a list to update).
_SAMPLE_TRACE = orjson.dumps({"traceEvents": [
    {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 1, "dur": 9, "tid": 1},
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 2, "dur": 2, "tid": 1, "args": {"External id": 1, "Input Dims": [[2, 2]], "Input type": ["float"]}},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 3, "dur": 1, "tid": 1, "args": {"correlation": 1, "External id": 1}},
    {"ph": "X", "cat": "kernel", "name": "k", "ts": 4, "dur": 1, "tid": 7, "args": {"correlation": 1, "device": 0, "stream": 7}},
    {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "ts": 5, "dur": 1, "tid": 7, "args": {"bytes": 8}},
    {"ph": "X", "cat": "cuda_sync", "name": "Stream Sync", "ts": 6, "dur": 1, "tid": 7},
    {"ph": "i", "name": "[memory]", "ts": 7, "args": {"Bytes": 8, "Total Allocated": 8, "Total Reserved": 8}},
]})


@functools.cache
def frame_dtypes() -> dict[str, dict[str, str]]:
    """The dtype of every column of every frame load_trace builds: an entry must match exactly."""
    from advisor.load.trace import frames_from_bytes

    frames = frames_from_bytes(Path("<dtypes>"), bytearray(_SAMPLE_TRACE))
    return {name: {c: str(t) for c, t in getattr(frames, name).dtypes.items()} for name in FRAME_TABLES if name != "device_properties"}


def _check_table(name: str, df: pd.DataFrame) -> None:
    """Raise BadEntry unless the table has load_trace's columns, dtypes and time invariants."""
    if name == "device_properties":
        if list(df.columns) != DEVICE_PROPERTY_COLUMNS:
            raise BadEntry(name)
        mem = pd.to_numeric(df["total_memory_bytes"], errors="coerce").to_numpy(np.float64)
        if (mem < 0).any():
            raise BadEntry(name)
        return
    expected = frame_dtypes()[name]
    if {c: str(t) for c, t in df.dtypes.items()} != expected:
        raise BadEntry(name)
    for col, kind in expected.items():
        if kind == "category" and len(df[col].cat.categories) and not all(isinstance(c, str) for c in df[col].cat.categories):
            raise BadEntry(f"{name}.{col}")
    fixed = fixed_categories().get((name, "kind"))
    if fixed is not None and list(df["kind"].cat.categories) != fixed:
        raise BadEntry(f"{name}.kind")
    if "dur" in expected:
        ts, dur, end = (df[c].to_numpy(np.int64) for c in ("ts", "dur", "end"))
        if (dur < 0).any() or not np.array_equal(ts + dur, end) or (np.diff(ts) < 0).any():
            raise BadEntry(f"{name} times")
    if name == "steps":
        start, end = df["start"].to_numpy(np.int64), df["end"].to_numpy(np.int64)
        # as the parser leaves them: ordered, none overlapping another (each instant in one step)
        if (end < start).any() or df["step"].duplicated().any() or (start[1:] < end[:-1]).any():
            raise BadEntry("steps")
    if name == "memory" and (np.diff(df["ts"].to_numpy(np.int64)) < 0).any():
        raise BadEntry("memory times")


def _json_scalars(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict) or not all(isinstance(v, (str, int, float, bool)) for v in value.values()):
        raise BadEntry("metadata")
    return value


def _frames_of(files: dict[str, bytes], key: CacheKey, path: Path) -> TraceFrames | None:
    try:
        meta = orjson.loads(files[FRAMES_META])
    except (KeyError, orjson.JSONDecodeError):
        return None
    if not isinstance(meta, dict) or meta.get("key") != key.as_dict():
        return None
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq

        tables: dict[str, pd.DataFrame | None] = {}
        for name in FRAME_TABLES:
            if name == "syncs" and meta.get("has_syncs") is not True:
                tables[name] = None
                continue
            df = pq.read_table(pa.BufferReader(files[f"{name}.parquet"])).to_pandas()
            for col in JSON_COLUMNS.get(name, ()):
                if col in df.columns:
                    df[col] = _from_json_text(df[col])
            for col in df.columns:  # Parquet cannot tell an empty string dictionary from an empty object one
                if isinstance(df[col].dtype, pd.CategoricalDtype) and len(df[col].cat.categories) == 0:
                    df[col] = df[col].cat.set_categories(pd.Index(fixed_categories().get((name, col), []), dtype="str"))
            _check_table(name, df)
            tables[name] = df
        window = meta["window"]
        schema, base_us = meta["schema"], meta["base_us"]
        if schema not in ("2021", "current") or type(base_us) not in (int, float) or not math.isfinite(base_us):
            raise BadEntry("header")
        if not (isinstance(window, list) and len(window) == 2 and all(type(w) is int for w in window) and window[0] <= window[1]):
            raise BadEntry("window")
        distributed, load_warnings = meta.get("distributed"), meta.get("load_warnings")
        if not isinstance(distributed, dict):
            raise BadEntry("distributed")
        if not (isinstance(load_warnings, list) and all(isinstance(w, str) for w in load_warnings)):
            raise BadEntry("load_warnings")
        from advisor.load.trace import TraceFrames

        return TraceFrames(
            path=path,
            schema=schema,
            base_us=float(base_us),
            host=tables["host"],
            runtime=tables["runtime"],
            device=tables["device"],
            memory=tables["memory"],
            steps=tables["steps"],
            device_properties=tables["device_properties"],
            distributed=distributed,
            window=(window[0], window[1]),
            metadata=_json_scalars(meta.get("metadata")),
            syncs=tables["syncs"],
            content_sha256=key.sha256,
            load_warnings=load_warnings,
        )
    except Exception:  # noqa: BLE001 - a damaged, foreign or forged entry is a miss, never a failed report
        return None


def write_cached(frames: TraceFrames) -> Path | None:
    """Store the frames under the hash of the bytes they were parsed from; the entry's
    folder, or None (cache off, nowhere writable, or frames not read from a file)."""
    key = CacheKey.of_frames(frames)
    if key is None or not cache_roots(frames.path.parent):
        return None
    try:
        for name in FRAME_TABLES:
            if getattr(frames, name) is not None:
                _check_table(name, getattr(frames, name))  # what the reader would refuse is not written
        import pyarrow as pa
        import pyarrow.parquet as pq

        files: dict[str, bytes] = {}
        for name in FRAME_TABLES:
            df = getattr(frames, name)
            if df is None:
                continue
            for col in JSON_COLUMNS.get(name, ()):
                if col in df.columns:
                    df = df.assign(**{col: _to_json_text(df[col])})
            sink = pa.BufferOutputStream()
            pq.write_table(pa.Table.from_pandas(df, preserve_index=False), sink, compression="zstd", compression_level=1)
            files[f"{name}.parquet"] = sink.getvalue().to_pybytes()
        meta = {
            "key": key.as_dict(),
            "written": time.time(),
            "schema": frames.schema,
            "base_us": frames.base_us,
            "window": list(frames.window),
            "distributed": frames.distributed,
            "metadata": frames.metadata,
            "has_syncs": frames.syncs is not None,
            "load_warnings": frames.load_warnings,
        }
        files[FRAMES_META] = orjson.dumps(meta, option=orjson.OPT_SERIALIZE_NUMPY)
    except Exception:  # noqa: BLE001 - odd values: skip caching, keep the report
        return None
    return write_entry("frames", key.digest, frames.path.parent, files)


def _to_json_text(values: pd.Series) -> pd.Categorical:
    """Nested lists as JSON text, encoded once per distinct object (equal shapes share objects)."""
    arr = values.to_numpy(dtype=object)
    codes, _ = pd.factorize(np.fromiter(map(id, arr), dtype=np.int64, count=len(arr)))
    first_row = np.unique(codes, return_index=True)[1]  # codes number objects by first appearance
    texts = np.array([orjson.dumps(arr[i]).decode() for i in first_row], dtype=object)
    return pd.Categorical(texts[codes] if len(arr) else [])


def _from_json_text(values: pd.Series) -> np.ndarray:
    codes, uniques = pd.factorize(values.astype(object).to_numpy())
    decoded = np.empty(len(uniques) + 1, dtype=object)
    for i, text in enumerate(uniques):
        value = orjson.loads(text)
        if value is not None and not isinstance(value, list):
            raise BadEntry("input_dims")
        decoded[i] = value
    return decoded[codes]


def load_cached(path: str | Path, cache: bool = True, min_parse_seconds: float = MIN_PARSE_SECONDS) -> TraceFrames:
    """load_trace through the cache: a hit reads Parquet; a miss parses, and stores the frames
    when parsing took at least min_parse_seconds."""
    path = Path(path)
    if cache:
        hit = read_cached(path)
        if hit is not None:
            return hit
    started = time.perf_counter()
    from advisor.load.trace import load_trace

    frames = load_trace(path, hash_content=cache_enabled())
    if cache and time.perf_counter() - started >= min_parse_seconds:
        write_cached(frames)
    return frames
