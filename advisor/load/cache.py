"""A cache of parsed frames beside the trace, so a second report on the same run is instant.

Layout: `<trace dir>/.advisor-cache/<trace file name>/` holds one Parquet file per frame and
`advisor_cache.json` (written last, so it marks a complete entry) with the key (trace file
size, mtime in ns, advisor version, cache format, digest of the trace fields the loader
reads) and the scalar fields of TraceFrames.
Parquet keeps categoricals as dictionaries and int64 ns as int64; `input_dims` (nested
lists) is stored as its JSON text. Nothing is pickled.

Where the trace's folder is not writable the entry goes to the user cache folder
(`$XDG_CACHE_HOME/torch-advisor/frames/`, keyed by the trace's absolute path); where that
fails too, nothing is cached. The cache never fails a report: every error in it reads as a
miss. `ADVISOR_CACHE=off` disables it; `ADVISOR_CACHE=<dir>` puts every entry under <dir>.
"""

from __future__ import annotations

import hashlib
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
CACHE_FORMAT = 2  # 2: metadata marks range-profiler traces and MTIA devices
TABLES = ("host", "runtime", "device", "memory", "steps", "device_properties", "syncs")
JSON_COLUMNS = {"host": ("input_dims",)}
FIXED_CATEGORIES = {("host", "kind"): HOST_KINDS, ("device", "kind"): DEVICE_KINDS}
# The trace fields the loader reads: a loader that reads one more (or one less) makes new entries.
FIELDS = hashlib.sha256(repr((EventArgs.__struct_encode_fields__, MemoryArgs.__struct_encode_fields__)).encode()).hexdigest()[:12]
# Traces that parse faster than this (about 100 MB of JSON) are not worth files beside them.
MIN_PARSE_SECONDS = 0.5


@dataclass(frozen=True)
class CacheKey:
    """What must match for an entry to stand for the trace file as it is now."""

    size: int
    mtime_ns: int
    advisor_version: str = __version__
    format: int = CACHE_FORMAT
    fields: str = FIELDS

    @classmethod
    def of(cls, path: Path) -> CacheKey:
        st = path.stat()
        return cls(size=st.st_size, mtime_ns=st.st_mtime_ns)

    def as_dict(self) -> dict[str, Any]:
        return {"size": self.size, "mtime_ns": self.mtime_ns, "advisor_version": self.advisor_version, "format": self.format, "fields": self.fields}


def cache_setting() -> str:
    return os.environ.get("ADVISOR_CACHE", "on").strip()


def cache_enabled() -> bool:
    return cache_setting().lower() not in ("off", "0", "no", "false")


def cache_dir_setting() -> Path | None:
    """The folder ADVISOR_CACHE=<dir> names, or None when the cache goes beside the traces."""
    setting = cache_setting()
    return None if setting.lower() in ("on", "", "1", "yes", "true") else Path(setting)


def user_cache_root(kind: str = "frames") -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "torch-advisor" / kind


def path_digest(path: Path) -> str:
    return hashlib.sha256(str(path.resolve()).encode("utf-8", "surrogateescape")).hexdigest()[:16]


def candidate_dirs(path: Path) -> list[Path]:
    """Where an entry for this trace may live, in order of preference."""
    chosen = cache_dir_setting()
    if chosen is not None:
        return [chosen / f"{path_digest(path)}-{path.name}"]
    return [path.parent / CACHE_DIR_NAME / path.name, user_cache_root() / f"{path_digest(path)}-{path.name}"]


def writable(folder: Path) -> bool:
    """Writable, and meant to be: a folder with no write bits is left alone even by root."""
    try:
        return os.access(folder, os.W_OK) and bool(folder.stat().st_mode & 0o222)
    except OSError:
        return False


def may_write_under(entry: Path) -> bool:
    """False where the nearest existing folder above an entry is not ours to write."""
    existing = next((p for p in (entry.parent, entry.parent.parent) if p.exists()), None)
    return existing is None or writable(existing)


# --- reading --------------------------------------------------------------------------------
def read_cached(path: Path) -> TraceFrames | None:
    """The cached frames of this trace file if an entry matches its size and mtime, else None."""
    if not cache_enabled():
        return None
    try:
        key = CacheKey.of(path)
    except OSError:
        return None
    for entry in candidate_dirs(path):
        frames = _read_entry(entry, key, path)
        if frames is not None:
            return frames
    return None


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
            if name == "syncs" and not meta.get("has_syncs"):
                tables[name] = None
                continue
            df = pq.read_table(file).to_pandas()
            for col in JSON_COLUMNS.get(name, ()):
                df[col] = _from_json_text(df[col])
            for col in df.columns:  # Parquet cannot tell an empty string dictionary from an empty object one
                if isinstance(df[col].dtype, pd.CategoricalDtype) and len(df[col].cat.categories) == 0:
                    df[col] = df[col].cat.set_categories(pd.Index(FIXED_CATEGORIES.get((name, col), []), dtype="str"))
            tables[name] = df
        window = meta["window"]
        return TraceFrames(
            path=path,
            schema=str(meta["schema"]),
            base_us=float(meta["base_us"]),
            host=tables["host"],
            runtime=tables["runtime"],
            device=tables["device"],
            memory=tables["memory"],
            steps=tables["steps"],
            device_properties=tables["device_properties"],
            distributed=meta.get("distributed") or {},
            window=(int(window[0]), int(window[1])),
            metadata=meta.get("metadata") or {},
            syncs=tables["syncs"],
        )
    except Exception:  # noqa: BLE001 - a damaged or foreign entry is a miss, never a failed report
        return None


# --- writing --------------------------------------------------------------------------------
def write_cached(frames: TraceFrames) -> Path | None:
    """Store the frames beside their trace (or in the user cache); the entry's folder, or None."""
    if not cache_enabled():
        return None
    try:
        key = CacheKey.of(frames.path)
    except OSError:
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
        decoded[i] = orjson.loads(text)
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
