"""A cache of finished analyses, so a second report of an unchanged run skips metrics and rules.

The frames cache (advisor.load.cache) saves the parse; metrics and rules on a big trace cost
several times more. An entry here holds what the text, JSON and Markdown reports, `gate`,
`baseline` and `diff` read of an Analysis: per rank the small scalar figures and the per-step
tables (steps, breakdown, utilisation, kernel totals per name, collectives and compute kernels
per step), a FramesHeader instead of the frames; and the findings and warnings of the run. The HTML report reads the frames (top ops,
the timeline) and always takes the full path.

Layout: `<run dir>/.advisor-cache/analysis-<digest of the run's files>/` with one Parquet file
per rank and table and `analysis.json` (the key, the scalars, the findings), written into a
temporary folder renamed into place, so a reader sees a whole entry or none. One entry per
run: an analysis with other options replaces it. Where the run's folder is not writable the
entry goes to `$XDG_CACHE_HOME/torch-advisor/analysis/`; `ADVISOR_CACHE=<dir>` puts it under
<dir>, `ADVISOR_CACHE=off` disables it.

The key (AnalysisKey) is everything that changes the answer: each trace file's path, size and
mtime, the facts files' bytes, the effective select/ignore lists and rule options, the bytes
of the user's `--rules DIR` files, and the advisor's own code (version and the stat of its
source files). Values are stored as JSON (orjson) with tags for what JSON would change
(non-finite floats, tuples, dicts with int keys); a value of any other type makes the run
unstorable and it is simply not cached. Nothing is pickled. Every error reads as a miss or a
skipped write, never as a failed report.
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
from typing import Any

import numpy as np
import orjson
import pandas as pd

import advisor
from advisor import __version__
from advisor.engine import Finding, Fix
from advisor.load.cache import cache_dir_setting, cache_enabled, may_write_under, user_cache_root
from advisor.load.discover import CACHE_DIR_NAME, RunFiles
from advisor.metrics.collectives import RankComm
from advisor.metrics.kernels import kernel_totals
from advisor.metrics.summary import DeviceInfo, FramesHeader, Metrics
from advisor.whatif.savings import RankWhatIf

META_FILE = "analysis.json"
CACHE_FORMAT = 2
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
            files = []
            for p in run.files:
                st = p.stat()
                files.append([str(p.resolve()), st.st_size, st.st_mtime_ns])
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
        except (OSError, ValueError):
            return None


def entry_dirs(run: RunFiles) -> list[Path]:
    """Where the entry of this run may live, in order of preference."""
    name = "analysis-" + _sha("\n".join(str(p.resolve()) for p in run.files).encode("utf-8", "surrogateescape"))[:16]
    chosen = cache_dir_setting()
    if chosen is not None:
        return [chosen / name]
    return [run.directory / CACHE_DIR_NAME / name, user_cache_root("analysis") / name]


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


def _read_entry(entry: Path, key: AnalysisKey, run: RunFiles) -> CachedRun | None:
    try:
        meta = orjson.loads((entry / META_FILE).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    try:
        if meta.get("key_digest") != key.digest:
            return None
        import pyarrow.parquet as pq

        ranks = []
        for i, r in enumerate(meta["ranks"]):
            names = TABLES + (COMM_TABLES if r["comm"] else ())
            t = {name: pq.read_table(entry / f"{i}.{name}.parquet").to_pandas() for name in names}
            ranks.append(
                Metrics(
                    rank=int(r["rank"]),
                    frames=FramesHeader(
                        path=run.files[r["file_index"]],
                        metadata=from_plain(r["metadata"]),
                        distributed=from_plain(r["distributed"]),
                        has_device=bool(r["has_device"]),
                    ),
                    steps=t["steps"],
                    breakdown=t["breakdown"],
                    utilization=t["utilization"]["utilization"].rename(None),
                    kernels=t["kernels"],
                    device=DeviceInfo(**from_plain(r["device"])),
                    tensor_core_kernel_share=from_plain(r["tensor_core_kernel_share"]),
                    tensor_core_eligible_share=from_plain(r["tensor_core_eligible_share"]),
                    kernel_time_by_precision_ms=from_plain(r["kernel_time_by_precision_ms"]),
                    h2d=from_plain(r["h2d"]),
                    d2h=from_plain(r["d2h"]),
                    peak_memory=from_plain(r["peak_memory"]),
                    notes=from_plain(r["notes"]),
                    comm=RankComm(t["collectives"], t["compute"]) if r["comm"] else None,
                )
            )
        findings = []
        for d in meta["findings"]:
            d = from_plain(d)
            findings.append(Finding(**{**d, "fix": Fix(**d["fix"])}))
        whatif = [RankWhatIf(**from_plain(w)) for w in meta.get("whatif", [])]
        return CachedRun(ranks=ranks, findings=findings, warnings=[str(w) for w in from_plain(meta["warnings"])], whatif=whatif)
    except Exception:  # noqa: BLE001 - a damaged or foreign entry is a miss, never a failed report
        return None
