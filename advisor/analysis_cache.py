"""A cache of finished analyses, so a second report of an unchanged run skips metrics and rules.

The frames cache (advisor.load.cache) saves the parse; metrics and rules on a big trace cost
several times more. An entry here holds what the text, JSON and Markdown reports, `gate`,
`baseline` and `diff` read of an Analysis: per rank the small scalar figures and the per-step
tables (steps, breakdown, utilisation, kernel totals per name, collectives and compute kernels
per step), a FramesHeader instead of the frames; and the findings and warnings of the run. The HTML report reads the frames (top ops,
the timeline) and always takes the full path.

Layout: `analysis-<digest of the run's files>/` with one Parquet file per rank and table and
`analysis.json` (the key, the scalars, the findings), written into a temporary folder renamed
into place, so a reader sees a whole entry or none. One entry per run: an analysis with other
options replaces it. Entries live where the frames cache puts its own (advisor.load.cache):
the user cache folder `$XDG_CACHE_HOME/torch-advisor/analysis/` by default, `.advisor-cache/`
beside the run only with `ADVISOR_CACHE=beside`, under <dir> with `ADVISOR_CACHE=<dir>`,
nowhere with `ADVISOR_CACHE=off` or without a usable home folder.

The key (AnalysisKey) is everything that changes the answer: each trace file's path and the
SHA-256 of its bytes (the stored answer is checked against the hashes computed while the
frames were read), the facts files' bytes, the effective select/ignore lists and rule
options, the bytes of the user's `--rules DIR` files, and the advisor's own code (version and
the stat of its source files). Values are stored as JSON (orjson) with tags for what JSON
would change (non-finite floats, tuples, dicts with int keys); a value of any other type
makes the run unstorable and it is simply not cached. Nothing is pickled. On read every
value is validated with its type (typed msgspec structures for the JSON, dtypes and
invariants for the tables: times non-negative, each step's breakdown adding up to the step);
anything odd, and every error, reads as a miss, never as a failed report.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
import numpy as np
import orjson
import pandas as pd

import advisor
from advisor import __version__
from advisor.engine import Finding, Fix
from advisor.load.cache import cache_beside, cache_dir_setting, cache_enabled, cache_setting, content_digest, may_write_under, path_digest, user_cache_root, ON_WORDS
from advisor.load.discover import CACHE_DIR_NAME, RunFiles
from advisor.metrics.collectives import RankComm
from advisor.metrics.kernels import kernel_totals
from advisor.metrics.summary import DeviceInfo, FramesHeader, Metrics
from advisor.whatif.savings import RankWhatIf

META_FILE = "analysis.json"
CACHE_FORMAT = 3  # 3: keyed on the traces' SHA-256, typed entries, kernel totals, collectives per step
# Analyses faster than this are not worth an entry beside the run.
MIN_ANALYSIS_SECONDS = 0.5
TABLES = ("steps", "breakdown", "utilization", "kernels")
COMM_TABLES = ("collectives", "compute")  # a rank's RankComm, when it was measured
TAG = "$t"


class Unstorable(Exception):
    """A value JSON cannot carry back exactly; the run is not cached."""


# --- the key --------------------------------------------------------------------------------
def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _code_fingerprint() -> str:
    """The advisor's source as installed: an edited rule or metric must not read an old answer."""
    roots = [Path(advisor.__file__).parent]
    spec = importlib.util.find_spec("advisor.rules")
    roots += [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []
    h = hashlib.sha256(f"{__version__} pandas {pd.__version__} numpy {np.__version__}".encode())
    for root in roots:
        for p in sorted(root.rglob("*.py")):
            st = p.stat()
            h.update(f"{p}\0{st.st_size}\0{st.st_mtime_ns}\n".encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def _folder_files(folder: Path, keep) -> list[list[str]]:
    """[name, sha256 of bytes] of the files in a folder that `keep` accepts, by name."""
    if not folder.is_dir():
        return []
    return [[p.name, _sha(p.read_bytes())] for p in sorted(folder.iterdir()) if keep(p.name) and p.is_file()]


@dataclass(frozen=True)
class AnalysisKey:
    """What must match for an entry to stand for the analysis asked for now."""

    fields: dict[str, Any]

    @property
    def digest(self) -> str:
        return _sha(orjson.dumps(self.fields, option=orjson.OPT_SORT_KEYS, default=str))

    @classmethod
    def of(
        cls,
        run: RunFiles,
        rule_options: dict[str, dict[str, Any]],
        select: list[str],
        ignore: list[str],
        rules_dir: str | Path | None,
    ) -> AnalysisKey | None:
        """The key of the run as its files are now; None when one cannot be read."""
        from advisor.analysis import FACTS_FILE

        try:
            files = [[str(p.resolve()), content_digest(p)] for p in run.files]
            user_rules = None
            if rules_dir is not None:
                folder = Path(rules_dir).resolve()
                user_rules = [str(folder), folder.is_dir(), _folder_files(folder, lambda n: n.endswith(".py"))]
            return cls(
                {
                    "format": CACHE_FORMAT,
                    "advisor_version": __version__,
                    "code": _code_fingerprint(),
                    "files": files,
                    "facts": _folder_files(run.directory, lambda n: bool(FACTS_FILE.match(n))),
                    "select": list(select),
                    "ignore": list(ignore),
                    "rule_options": rule_options,
                    "user_rules": user_rules,
                }
            )
        except (OSError, ValueError, RuntimeError):
            return None

    def parsed_as_keyed(self, frames: list[Any]) -> bool:
        """True when every trace the analysis read had the bytes this key hashed (the hashes
        computed while the frames were read): an answer is never stored under other bytes."""
        keyed = {path: sha for path, sha in self.fields["files"]}
        try:
            return all(f.content_sha256 is not None and keyed.get(str(Path(f.path).resolve())) == f.content_sha256 for f in frames)
        except (OSError, RuntimeError):
            return False


def entry_dirs(run: RunFiles) -> list[Path]:
    """Where the entry of this run may live, in order of preference."""
    if not cache_enabled():
        return []
    name = "analysis-" + _sha("\n".join(path_digest(p) for p in run.files).encode())[:16]
    if cache_setting().lower() not in ON_WORDS and not cache_beside():
        chosen = cache_dir_setting()
        return [chosen / name] if chosen is not None else []
    user = user_cache_root("analysis")
    dirs = [user / name] if user is not None else []
    if cache_beside():
        dirs.insert(0, run.directory / CACHE_DIR_NAME / name)
    return dirs


# --- values as JSON, exactly ------------------------------------------------------------------
def to_plain(v: Any) -> Any:
    """A value as JSON that from_plain turns back into an equal value of the same type."""
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, int):
        return int(v)
    if isinstance(v, float):
        f = float(v)
        return f if math.isfinite(f) else {TAG: "float", "v": repr(f)}
    if isinstance(v, np.bool_):
        return bool(v)
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, tuple):
        return {TAG: "tuple", "v": [to_plain(x) for x in v]}
    if isinstance(v, list):
        return [to_plain(x) for x in v]
    if isinstance(v, dict):
        if all(isinstance(k, str) for k in v) and TAG not in v:
            return {k: to_plain(x) for k, x in v.items()}
        if all(isinstance(k, (str, int)) and not isinstance(k, bool) for k in v):
            return {TAG: "dict", "v": [[k, to_plain(x)] for k, x in v.items()]}
    raise Unstorable(type(v).__name__)


def from_plain(v: Any) -> Any:
    if isinstance(v, list):
        return [from_plain(x) for x in v]
    if not isinstance(v, dict):
        return v
    tag = v.get(TAG)
    if tag is None:
        return {k: from_plain(x) for k, x in v.items()}
    if tag == "float":
        return float(v["v"])
    if tag == "tuple":
        return tuple(from_plain(x) for x in v["v"])
    if tag == "dict":
        return {k: from_plain(x) for k, x in v["v"]}
    raise ValueError(f"unknown tag {tag!r}")


# --- writing --------------------------------------------------------------------------------
@dataclass
class CachedRun:
    """What an entry gives back: enough for Analysis without frames."""

    ranks: list[Metrics]
    findings: list[Finding]
    warnings: list[str]
    whatif: list[RankWhatIf]


def _rank_meta(m: Metrics, run: RunFiles) -> dict[str, Any]:
    file_index = next(i for i, p in enumerate(run.files) if p == m.frames.path)
    return {
        "rank": int(m.rank),
        "file_index": file_index,
        "metadata": to_plain(m.frames.metadata),
        "distributed": to_plain(m.frames.distributed),
        "has_device": bool(m.has_device),
        "device": to_plain(asdict(m.device)),
        "tensor_core_kernel_share": to_plain(m.tensor_core_kernel_share),
        "tensor_core_eligible_share": to_plain(m.tensor_core_eligible_share),
        "kernel_time_by_precision_ms": to_plain(m.kernel_time_by_precision_ms),
        "h2d": to_plain(m.h2d),
        "d2h": to_plain(m.d2h),
        "peak_memory": to_plain(m.peak_memory),
        "notes": to_plain(m.notes),
        "comm": m.comm is not None,
    }


def _tables(m: Metrics) -> dict[str, pd.DataFrame]:
    tables = {
        "steps": m.steps,
        "breakdown": m.breakdown,
        "utilization": m.utilization.to_frame("utilization"),
        "kernels": kernel_totals(m.kernels),
    }
    if m.comm is not None:
        tables.update(collectives=m.comm.collectives, compute=m.comm.compute)
    return tables


def write_analysis(
    run: RunFiles, key: AnalysisKey, ranks: list[Metrics], findings: list[Finding], warnings: list[str], whatif: list[RankWhatIf] | None = None
) -> Path | None:
    """Store a finished analysis; the entry's folder, or None where it could not be stored."""
    if not cache_enabled():
        return None
    try:
        meta = {
            "key": key.fields,
            "key_digest": key.digest,
            "written": time.time(),
            "ranks": [_rank_meta(m, run) for m in ranks],
            "findings": [to_plain(f.to_dict()) for f in findings],
            "warnings": to_plain(list(warnings)),
            "whatif": [to_plain(w.to_dict()) for w in whatif or []],
        }
        meta_bytes = orjson.dumps(meta, default=str)
        # What the reader would refuse is not written: the same types, the same tables.
        for r in msgspec.convert(from_plain(orjson.loads(meta_bytes)), EntryMeta).ranks:
            _device(r.device)
        for m in ranks:
            check_tables(_tables(m))
    except Exception:  # noqa: BLE001 - an odd value in a finding: this run is not cached
        return None
    for entry in entry_dirs(run):
        if _write_entry(entry, meta_bytes, ranks):
            return entry
    return None


def _write_entry(entry: Path, meta_bytes: bytes, ranks: list[Metrics]) -> bool:
    if not may_write_under(entry):
        return False
    tmp = entry.parent / f".{entry.name}.tmp-{os.getpid()}"
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq

        tmp.mkdir(parents=True, exist_ok=True)
        for i, m in enumerate(ranks):
            for name, df in _tables(m).items():
                pq.write_table(pa.Table.from_pandas(df), tmp / f"{i}.{name}.parquet", compression="zstd", compression_level=1)
        (tmp / META_FILE).write_bytes(meta_bytes)
        if entry.exists():
            shutil.rmtree(entry, ignore_errors=True)
        os.replace(tmp, entry)
        return True
    except Exception:  # noqa: BLE001 - read-only folder, full disk: skip caching, keep the report
        shutil.rmtree(tmp, ignore_errors=True)
        return False


# --- reading --------------------------------------------------------------------------------
def read_analysis(run: RunFiles, key: AnalysisKey) -> CachedRun | None:
    """The stored analysis of this run if an entry matches the key, else None."""
    if not cache_enabled():
        return None
    for entry in entry_dirs(run):
        hit = _read_entry(entry, key, run)
        if hit is not None:
            return hit
    return None


# What analysis.json holds, as types: an entry whose values do not fit is a miss.
NonNegative = Annotated[float, msgspec.Meta(ge=0)]
Share = Annotated[float, msgspec.Meta(ge=0, le=1)]


class _Entry(msgspec.Struct, forbid_unknown_fields=True):
    pass


class FixEntry(_Entry):
    text: str
    snippet: str = ""


class FindingEntry(_Entry):
    rule: str
    severity: Literal["low", "medium", "high"]
    title: str
    message: str
    saving_ms: NonNegative | None
    saving_pct: NonNegative | None
    confidence: str
    evidence: dict[str, Any]
    fix: FixEntry
    causes: list[str]
    rank: int | None
    no_gain: str | None = None
    saving_alone_ms: NonNegative | None = None


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


class WhatIfEntry(_Entry):
    """A rank's replay summary (whatif.savings.RankWhatIf)."""

    rank: int
    measured_ms: NonNegative
    baseline_ms: NonNegative
    host_scale: NonNegative
    loader_scale: NonNegative
    remainder_ms: NonNegative
    untimed_host_ms: NonNegative
    unprofiled_ms: NonNegative | None
    all_fixes_ms: NonNegative | None
    fixes: list[str]
    savings: dict[str, NonNegative]
    scale_range: list[NonNegative] | None = None
    baseline_range_ms: list[NonNegative] | None = None


def _within_replay(w: WhatIfEntry) -> bool:
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
    findings: list[FindingEntry]
    warnings: list[str]
    whatif: list[WhatIfEntry] = []  # each rank's replay summary


BREAKDOWN_COLUMNS = ["kernel", "memcpy", "memset", "communication", "runtime", "dataloader", "cpu_exec", "other"]
KERNEL_TOTAL_COLUMNS = ["name", "count", "total_ns", "tensor_core", "precision"]  # kernel_totals
STEP_DTYPES = {"step": "int64", "name": "str", "host_start": "int64", "host_end": "int64", "start": "int64", "end": "int64", "device_ops": "int64", "duration": "int64"}


class BadEntry(Exception):
    """Tables that are not what compute_metrics builds."""


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


def _device(fields: dict[str, Any]) -> DeviceInfo:
    """DeviceInfo from an entry: its own field types (strict), and no negative memory."""
    device = msgspec.convert(fields, DeviceInfo, strict=True)
    if device.total_memory_bytes is not None and not (math.isfinite(device.total_memory_bytes) and device.total_memory_bytes >= 0):
        raise BadEntry("device memory")
    return device


def _read_entry(entry: Path, key: AnalysisKey, run: RunFiles) -> CachedRun | None:
    try:
        raw = orjson.loads((entry / META_FILE).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    try:
        if not isinstance(raw, dict) or raw.get("key_digest") != key.digest:
            return None
        meta = msgspec.convert(from_plain(raw), EntryMeta)
        import pyarrow.parquet as pq

        if len({r.rank for r in meta.ranks}) != len(meta.ranks) or any(r.file_index >= len(run.files) for r in meta.ranks):
            return None  # ranks twice, or files the run does not have
        ranks = []
        for i, r in enumerate(meta.ranks):
            names = TABLES + (COMM_TABLES if r.comm else ())
            t = {name: pq.read_table(entry / f"{i}.{name}.parquet").to_pandas() for name in names}
            check_tables(t)
            ranks.append(
                Metrics(
                    rank=r.rank,
                    frames=FramesHeader(path=run.files[r.file_index], metadata=r.metadata, distributed=r.distributed, has_device=r.has_device),
                    steps=t["steps"],
                    breakdown=t["breakdown"],
                    utilization=t["utilization"]["utilization"].rename(None),
                    kernels=t["kernels"],
                    device=_device(r.device),
                    tensor_core_kernel_share=r.tensor_core_kernel_share,
                    tensor_core_eligible_share=r.tensor_core_eligible_share,
                    kernel_time_by_precision_ms=r.kernel_time_by_precision_ms,
                    h2d=msgspec.structs.asdict(r.h2d),
                    d2h=msgspec.structs.asdict(r.d2h),
                    peak_memory=r.peak_memory,
                    notes=r.notes,
                    comm=RankComm(t["collectives"], t["compute"]) if r.comm else None,
                )
            )
        findings = []
        if not all(_within_replay(w) for w in meta.whatif):
            return None
        whatif = [RankWhatIf(**msgspec.structs.asdict(w)) for w in meta.whatif]
        # A saving is a finite, non-negative time no longer than the longest step, measured or replayed.
        longest_ms = max([float(m.steps["duration"].max()) / 1e6 for m in ranks if len(m.steps)] + [w.baseline_ms for w in whatif] + [0.0])
        for f in meta.findings:
            if f.saving_ms is not None and not (math.isfinite(f.saving_ms) and 0 <= f.saving_ms <= longest_ms * (1 + 1e-6) + 1e-6):
                return None
            d = msgspec.structs.asdict(f)
            findings.append(Finding(**{**d, "fix": Fix(**msgspec.structs.asdict(f.fix))}))
        return CachedRun(ranks=ranks, findings=findings, warnings=meta.warnings, whatif=whatif)
    except Exception:  # noqa: BLE001 - a damaged, foreign or forged entry is a miss, never a failed report
        return None
