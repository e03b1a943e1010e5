"""A cache of parsed frames, so a second report on the same trace is instant.

Where entries go (`ADVISOR_CACHE`):

- unset, `on`: the user cache folder, `$XDG_CACHE_HOME/torch-advisor/frames/` (else
  `~/.cache/torch-advisor/frames/`), one entry per trace path; nothing is written beside
  the user's traces. With no usable home (HOME unset and no passwd entry) nothing is cached.
- `beside`: `<trace dir>/.advisor-cache/<trace file name>/`, else the user cache folder
  where the trace's folder is not writable.
- a folder (`~` is expanded): every entry under it. `off`: no cache.

An entry holds one Parquet file per frame and `advisor_cache.json` (written last, so it
marks a complete entry) with the key and the scalar fields of TraceFrames. The key is the
SHA-256 of the trace file's bytes (computed while the trace is read for parsing, so the
entry stands for exactly the bytes that were parsed), the advisor version and the cache
format: a copied, touched or `rsync -a`'d folder cannot pass stale or forged frames
off as the trace's. Entries are validated with their types on read (every column's dtype,
times that are non-negative and add up, categories of the fixed kinds); anything odd is a
miss, and every error in the cache reads as a miss: the cache never fails a report.
Nothing is pickled.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd

from advisor import __version__
from advisor.load.decode import EventArgs, MemoryArgs
from advisor.load.discover import CACHE_DIR_NAME
from advisor.load.trace import DEVICE_KINDS, HOST_KINDS, TraceFrames, load_trace

META_FILE = "advisor_cache.json"
CACHE_FORMAT = 4  # 2: metadata marks range-profiler traces and MTIA devices; 3: keyed on the bytes' SHA-256, load warnings; 4: the profiler session's end
TABLES = ("host", "runtime", "device", "memory", "steps", "device_properties", "syncs")
JSON_COLUMNS = {"host": ("input_dims",)}
FIXED_CATEGORIES = {("host", "kind"): HOST_KINDS, ("device", "kind"): DEVICE_KINDS}
DEVICE_PROPERTY_COLUMNS = ["id", "name", "total_memory_bytes", "compute_capability", "num_sms"]
# The trace fields the loader reads: a loader that reads one more (or one less) makes new entries.
FIELDS = hashlib.sha256(repr((EventArgs.__struct_encode_fields__, MemoryArgs.__struct_encode_fields__)).encode()).hexdigest()[:12]
# Traces that parse faster than this (about 100 MB of JSON) are not worth an entry.
MIN_PARSE_SECONDS = 0.5
HASH_READ_BYTES = 1 << 20
OFF_WORDS = ("off", "0", "no", "false")
ON_WORDS = ("on", "", "1", "yes", "true", "user")
BESIDE = "beside"


class BadEntry(Exception):
    """A cache entry that does not hold what load_trace would build: read as a miss."""


def content_digest(path: Path) -> str:
    """SHA-256 of a file's bytes, read in pieces (about 1.5 GB/s)."""
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(HASH_READ_BYTES):
            h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True)
class CacheKey:
    """What must match for an entry to stand for the trace file's bytes."""

    sha256: str
    advisor_version: str = __version__
    format: int = CACHE_FORMAT
    fields: str = FIELDS

    @classmethod
    def of_frames(cls, frames: TraceFrames) -> CacheKey | None:
        return cls(sha256=frames.content_sha256) if frames.content_sha256 is not None else None

    def as_dict(self) -> dict[str, Any]:
        return {"sha256": self.sha256, "advisor_version": self.advisor_version, "format": self.format, "fields": self.fields}


# --- where entries go -------------------------------------------------------------------------
def cache_setting() -> str:
    return os.environ.get("ADVISOR_CACHE", "on").strip()


def cache_enabled() -> bool:
    return cache_setting().lower() not in OFF_WORDS


def cache_beside() -> bool:
    """ADVISOR_CACHE=beside: entries beside the traces (only when asked)."""
    return cache_setting().lower() == BESIDE


def expand_home(path: str) -> Path | None:
    """`~` and `~user` expanded; None when the home folder cannot be found (a literal `~`
    folder is never created)."""
    try:
        expanded = os.path.expanduser(path)
    except (RuntimeError, KeyError, OSError):  # Python 3.12+: no HOME and no passwd entry
        return None
    return None if expanded.startswith("~") else Path(expanded)


def cache_dir_setting() -> Path | None:
    """The folder ADVISOR_CACHE=<dir> names, or None (user cache, beside, off, or a `~` path
    with no home to expand it to)."""
    setting = cache_setting()
    if setting.lower() in ON_WORDS + OFF_WORDS + (BESIDE,):
        return None
    return expand_home(setting)


def user_cache_root(kind: str = "frames") -> Path | None:
    """`$XDG_CACHE_HOME/torch-advisor/<kind>` (an absolute XDG_CACHE_HOME), else
    `~/.cache/torch-advisor/<kind>`; None with no usable home: then nothing is cached."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if os.path.isabs(xdg):
        return Path(xdg) / "torch-advisor" / kind
    home = expand_home("~")
    if home is None or not home.is_absolute() or home == Path("/"):
        return None
    return home / ".cache" / "torch-advisor" / kind


def path_digest(path: Path) -> str:
    try:
        where = str(path.resolve())
    except (OSError, RuntimeError):
        where = os.path.abspath(path)
    return hashlib.sha256(where.encode("utf-8", "surrogateescape")).hexdigest()[:16]


def candidate_dirs(path: Path) -> list[Path]:
    """Where an entry for this trace may live, in order of preference (none when off)."""
    if not cache_enabled():
        return []
    setting = cache_setting()
    name = f"{path_digest(path)}-{path.name}"
    if setting.lower() not in ON_WORDS and setting.lower() != BESIDE:
        chosen = cache_dir_setting()
        return [chosen / name] if chosen is not None else []
    user = user_cache_root()
    dirs = [user / name] if user is not None else []
    if cache_beside():
        dirs.insert(0, path.parent / CACHE_DIR_NAME / path.name)
    return dirs


def writable(folder: Path) -> bool:
    """Writable, and meant to be: a folder with no write bits is left alone even by root."""
    try:
        return os.access(folder, os.W_OK) and bool(folder.stat().st_mode & 0o222)
    except OSError:
        return False


def may_write_under(entry: Path) -> bool:
    """False where the nearest existing folder above an entry is not ours to write."""
    try:
        existing = next((p for p in (entry.parent, entry.parent.parent) if p.exists()), None)
    except OSError:
        return False
    return existing is None or writable(existing)


# --- reading --------------------------------------------------------------------------------
def read_cached(path: Path) -> TraceFrames | None:
    """The cached frames of this trace file if an entry holds its bytes' hash, else None."""
    dirs = candidate_dirs(path)
    if not dirs:
        return None
    try:
        key = CacheKey(sha256=content_digest(path))
    except OSError:
        return None
    for entry in dirs:
        frames = _read_entry(entry, key, path)
        if frames is not None:
            return frames
    return None


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
    return {name: {c: str(t) for c, t in getattr(frames, name).dtypes.items()} for name in TABLES if name != "device_properties"}


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
    fixed = FIXED_CATEGORIES.get((name, "kind"))
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


def _read_entry(entry: Path, key: CacheKey, path: Path) -> TraceFrames | None:
    meta_file = entry / META_FILE
    try:
        meta = orjson.loads(meta_file.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    if not isinstance(meta, dict) or meta.get("key") != key.as_dict():
        return None
    try:
        import pyarrow.parquet as pq

        tables: dict[str, pd.DataFrame | None] = {}
        for name in TABLES:
            file = entry / f"{name}.parquet"
            if name == "syncs" and meta.get("has_syncs") is not True:
                tables[name] = None
                continue
            df = pq.read_table(file).to_pandas()
            for col in JSON_COLUMNS.get(name, ()):
                if col in df.columns:
                    df[col] = _from_json_text(df[col])
            for col in df.columns:  # Parquet cannot tell an empty string dictionary from an empty object one
                if isinstance(df[col].dtype, pd.CategoricalDtype) and len(df[col].cat.categories) == 0:
                    df[col] = df[col].cat.set_categories(pd.Index(FIXED_CATEGORIES.get((name, col), []), dtype="str"))
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


# --- writing --------------------------------------------------------------------------------
def write_cached(frames: TraceFrames) -> Path | None:
    """Store the frames under the hash of the bytes they were parsed from; the entry's
    folder, or None (cache off, nowhere writable, or frames not read from a file)."""
    key = CacheKey.of_frames(frames)
    if key is None:
        return None
    for entry in candidate_dirs(frames.path):
        if _write_entry(entry, key, frames):
            return entry
    return None


def _write_entry(entry: Path, key: CacheKey, frames: TraceFrames) -> bool:
    tmp = entry.parent / f".{entry.name}.tmp-{os.getpid()}"
    if not may_write_under(entry):
        return False
    try:
        for name in TABLES:
            if getattr(frames, name) is not None:
                _check_table(name, getattr(frames, name))  # what the reader would refuse is not written
        import pyarrow as pa
        import pyarrow.parquet as pq

        tmp.mkdir(parents=True, exist_ok=True)
        for name in TABLES:
            df = getattr(frames, name)
            if df is None:
                continue
            for col in JSON_COLUMNS.get(name, ()):
                df = df.assign(**{col: _to_json_text(df[col])})
            table = pa.Table.from_pandas(df, preserve_index=False)
            pq.write_table(table, tmp / f"{name}.parquet", compression="zstd", compression_level=1)
        meta = {
            "key": key.as_dict(),
            "trace": str(frames.path),
            "written": time.time(),
            "schema": frames.schema,
            "base_us": frames.base_us,
            "window": list(frames.window),
            "distributed": frames.distributed,
            "metadata": frames.metadata,
            "has_syncs": frames.syncs is not None,
            "load_warnings": frames.load_warnings,
        }
        (tmp / META_FILE).write_bytes(orjson.dumps(meta, option=orjson.OPT_SERIALIZE_NUMPY))
        if entry.exists():
            shutil.rmtree(entry, ignore_errors=True)
        os.replace(tmp, entry)
        return True
    except Exception:  # noqa: BLE001 - read-only folder, full disk, odd values: skip caching, keep the report
        shutil.rmtree(tmp, ignore_errors=True)
        return False


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
    frames = load_trace(path)
    if cache and time.perf_counter() - started >= min_parse_seconds:
        write_cached(frames)
    return frames
