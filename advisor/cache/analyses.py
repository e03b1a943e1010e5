"""Analysis entries: per rank the scalar figures and per-step tables, the findings, warnings
and what-if figures of a run, keyed on the traces' content, the facts, the rules and options."""

from __future__ import annotations

import hashlib
import importlib.util
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import orjson

from advisor.version import __version__
from advisor.facts import FACTS_FILE
from advisor.load.discover import RunFiles
from advisor.cache.digests import trace_digest
from advisor.cache.entry_types import EntryMeta, _within_replay, check_tables, typed_results
from advisor.cache.plain import from_plain, to_plain
from advisor.cache.seal import BadEntry, _open_entry, _sha, entry_name
from advisor.cache.settings import cache_enabled, cache_roots
from advisor.cache.store import read_entry, write_entry

if TYPE_CHECKING:
    import pandas as pd

    from advisor.engine import Finding
    from advisor.metrics.summary import DeviceInfo, Metrics
    from advisor.whatif.savings import RankWhatIf
else:
    from advisor.cache.lazy import pd

ANALYSIS_META = "analysis.json"
ANALYSIS_FORMAT = 10  # 4: one sealed cache, keyed on the traces' content and names, not paths; 5: steps found without ProfilerStep; 6: a finding's saving_share; 7: collectives' offsets in their steps, copy bandwidth over time, time per module; 8: shares of the measured window (RankWhatIf.headline_ms); 9: the unprofiled figure in the replay's statistic; 10: the optimizer step at its unprofiled time (RankWhatIf.optimizer_scale)
# Analyses faster than this are not worth an entry, unless a report rendered from it is kept
# there (`analyze(store=True)`: a report to stdout, which a warm report then writes as it is).
MIN_ANALYSIS_SECONDS = 0.5
TABLES = ("steps", "breakdown", "utilization", "kernels")
COMM_TABLES = ("collectives", "compute")  # a rank's RankComm, when it was measured


# The libraries whose versions can change an analysis or how a report is written.
LIBRARIES = ("numpy", "pandas", "pyarrow", "rich", "orjson", "msgspec")


def _libraries() -> str:
    """The installed libraries that make or write an analysis, read from their files (their
    distributions' names and versions, and their top module's size and mtime) rather than
    imported: the key of a warm report is made without importing them."""
    out, listed = [], {}
    for name in LIBRARIES:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            out.append(f"{name} -")
            continue
        origin = Path(spec.origin)
        site = origin.parent.parent if origin.name == "__init__.py" else origin.parent
        try:
            if site not in listed:
                listed[site] = sorted(os.listdir(site))
            st = origin.stat()
        except OSError:
            out.append(f"{name} {origin} ?")
            continue
        dists = [n for n in listed[site] if n.lower().startswith(f"{name}-") and n.endswith((".dist-info", ".egg-info"))]
        out.append(f"{name} {origin} {dists} {st.st_size} {st.st_mtime_ns}")
    return "; ".join(out)


def _code_fingerprint() -> str:
    """The advisor's source as installed: an edited rule or metric must not read an old answer."""
    roots = [Path(__file__).resolve().parents[1]]  # advisor/
    spec = importlib.util.find_spec("advisor.rules")
    roots += [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []
    h = hashlib.sha256(f"{__version__} {sys.version} {_libraries()}".encode())
    for root in roots:
        for p in sorted(root.rglob("*.py")):
            st = p.stat()
            h.update(f"{p}\0{st.st_size}\0{st.st_mtime_ns}\n".encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def _folder_files(folder: Path, keep) -> list[list[str]]:
    """[name, sha256 of bytes] of the files in a folder that `keep` accepts, by name."""
    if not folder.is_dir():
        return []
    from advisor.facts import read_facts_bytes

    out = []
    for p in sorted(folder.iterdir()):
        if keep(p.name) and p.is_file():
            try:
                out.append([p.name, _sha(read_facts_bytes(p))])
            except OSError as exc:  # too large: ignored by the analysis too, with a warning
                out.append([p.name, f"unread: {exc}"])
    return out


@dataclass(frozen=True)
class AnalysisKey:
    """What must match for an entry to stand for the analysis asked for now: the traces' bytes
    and names (a copy of the run elsewhere has the same key), not where they are."""

    fields: dict[str, Any]
    paths: tuple[str, ...] = ()  # the run's files as keyed (resolved), in the order of fields["files"]

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
        try:
            files = [[p.name, trace_digest(p)] for p in run.files]
            user_rules = None
            if rules_dir is not None:
                folder = Path(rules_dir).resolve()
                user_rules = [folder.is_dir(), _folder_files(folder, lambda n: n.endswith(".py"))]
            return cls(
                {
                    "format": ANALYSIS_FORMAT,
                    "advisor_version": __version__,
                    "code": _code_fingerprint(),
                    "files": files,
                    "facts": _folder_files(run.directory, lambda n: bool(FACTS_FILE.match(n))),
                    "select": list(select),
                    "ignore": list(ignore),
                    "rule_options": rule_options,
                    "user_rules": user_rules,
                },
                tuple(str(p.resolve()) for p in run.files),
            )
        except (OSError, ValueError, RuntimeError):
            return None

    def parsed_as_keyed(self, frames: list[Any]) -> bool:
        """True when every trace the analysis read had the bytes this key hashed (the hashes
        computed while the frames were read): an answer is never stored under other bytes."""
        keyed = {path: sha for path, (_, sha) in zip(self.paths, self.fields["files"], strict=True)}
        try:
            return all(f.content_sha256 is not None and keyed.get(str(Path(f.path).resolve())) == f.content_sha256 for f in frames)
        except (OSError, RuntimeError):
            return False


# --- writing --------------------------------------------------------------------------------
@dataclass
class CachedRun:
    """What an entry gives back: enough for Analysis without frames."""

    ranks: list[Metrics]
    findings: list[Finding]
    warnings: list[str]
    whatif: list[RankWhatIf]
    folder: Path | None = None  # the entry it came from
    extra: dict[str, bytes] = field(default_factory=dict)  # the entry's "view." files (advisor.rank_view)
    split_job: bool = False  # the run's files held several jobs: its ranks are the chosen job's


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
        "roofline": _roofline_meta(m),
        "measured": to_plain(asdict(m.measured)) if m.measured is not None else None,
        "copy_bandwidth": to_plain(msgspec.structs.asdict(m.copy_bandwidth)) if m.copy_bandwidth is not None else None,
        "modules": to_plain(msgspec.to_builtins(m.modules)) if m.modules is not None else None,
    }


def _roofline_meta(m: Metrics) -> dict[str, Any] | None:
    r = m.roofline
    if r is None:
        return None
    return to_plain({"device_name": r.device_name, "shapes_recorded": bool(r.shapes_recorded), "modelled_ms": float(r.modelled_ms),
                     "kernel_ms": float(r.kernel_ms), "bandwidth_tbps": r.bandwidth_tbps, "sm_count": r.sm_count, "notes": list(r.notes)})


def _copy_bandwidth_of(fields: dict[str, Any] | None):
    from advisor.metrics.copies import CopyBandwidth

    return msgspec.convert(fields, CopyBandwidth) if fields is not None else None


def _modules_of(fields: dict[str, Any] | None):
    from advisor.metrics.modules import ModuleTime

    return msgspec.convert(fields, ModuleTime) if fields is not None else None


def _roofline_of(meta: dict[str, Any] | None, table: pd.DataFrame | None):
    from advisor.metrics.devices import device_ceiling
    from advisor.metrics.roofline import ROOFLINE_COLUMNS, Roofline

    if meta is None or table is None:
        return None
    if list(table.columns) != ROOFLINE_COLUMNS:
        raise BadEntry("roofline")
    return Roofline(table, device_ceiling(meta.get("device_name")), meta.get("device_name"), bool(meta.get("shapes_recorded")),
                    float(meta.get("modelled_ms") or 0.0), float(meta.get("kernel_ms") or 0.0), meta.get("bandwidth_tbps"), meta.get("sm_count"),
                    list(meta.get("notes") or []))


def _tables(m: Metrics) -> dict[str, pd.DataFrame]:
    from advisor.metrics.kernels import kernel_totals

    tables = {
        "steps": m.steps,
        "breakdown": m.breakdown,
        "utilization": m.utilization.to_frame("utilization"),
        "kernels": kernel_totals(m.kernels),
    }
    if m.comm is not None:
        tables.update(collectives=m.comm.collectives, compute=m.comm.compute)
    if m.roofline is not None:
        tables["roofline"] = m.roofline.ops
    return tables


def write_analysis(
    run: RunFiles,
    key: AnalysisKey,
    ranks: list[Metrics],
    findings: list[Finding],
    warnings: list[str],
    whatif: list[RankWhatIf] | None = None,
    extra: dict[str, bytes] | None = None,
    split_job: bool = False,
) -> Path | None:
    """Store a finished analysis; the entry's folder, or None where it could not be stored.
    `extra`: more files of the entry, named "view.*" (the slowest rank's view, advisor.rank_view)."""
    if not cache_enabled():
        return None
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq

        meta = {
            "key": key.fields,
            "key_digest": key.digest,
            "written": time.time(),
            "ranks": [_rank_meta(m, run) for m in ranks],
            "findings": to_plain(list(findings)),
            "warnings": to_plain(list(warnings)),
            "whatif": to_plain(list(whatif or [])),
            "split_job": bool(split_job),
        }
        meta_bytes = orjson.dumps(meta, default=str)
        # What the reader would refuse is not written: the same types, the same tables.
        read_back = msgspec.convert(from_plain(orjson.loads(meta_bytes)), EntryMeta)
        typed_results(read_back)
        for r in read_back.ranks:
            _device(r.device)
        files = {ANALYSIS_META: meta_bytes}
        for i, m in enumerate(ranks):
            tables = _tables(m)
            check_tables(tables)
            for name, df in tables.items():
                sink = pa.BufferOutputStream()
                pq.write_table(pa.Table.from_pandas(df), sink, compression="zstd", compression_level=1)
                files[f"{i}.{name}.parquet"] = sink.getvalue().to_pybytes()
        files.update({k: v for k, v in (extra or {}).items() if k.startswith("view.")})
    except Exception:  # noqa: BLE001 - an odd value in a finding: this run is not cached
        return None
    return write_entry("analysis", key.digest, run.directory, files)


def read_analysis(run: RunFiles, key: AnalysisKey) -> CachedRun | None:
    """The stored analysis of this run if a sealed entry matches the key, else None."""
    found = read_entry("analysis", key.digest, run.directory)
    if found is None:
        return None
    hit = _analysis_of(found[1], key, run)
    if hit is not None:
        hit.folder = found[0]
        hit.extra = {k: v for k, v in found[1].items() if k.startswith("view.")}
    return hit


def read_analysis_entry(folder: Path, key: AnalysisKey, run: RunFiles) -> CachedRun | None:
    """The analysis in one entry folder, if its seal and values hold (see read_analysis)."""
    files = _open_entry(folder, "analysis", key.digest)
    return None if files is None else _analysis_of(files, key, run)


def analysis_entry(run: RunFiles, key: AnalysisKey) -> Path | None:
    """The folder of the analysis entry this run would read or write (None: cache off)."""
    roots = cache_roots(run.directory)
    return roots[0] / entry_name("analysis", key.digest) if roots else None


def _device(fields: dict[str, Any]) -> DeviceInfo:
    """DeviceInfo from an entry: its own field types (strict), and no negative memory."""
    from advisor.metrics.summary import DeviceInfo

    device = msgspec.convert(fields, DeviceInfo, strict=True)
    if device.total_memory_bytes is not None and not (math.isfinite(device.total_memory_bytes) and device.total_memory_bytes >= 0):
        raise BadEntry("device memory")
    return device


def _analysis_of(files: dict[str, bytes], key: AnalysisKey, run: RunFiles) -> CachedRun | None:
    from advisor.metrics.collectives import RankComm
    from advisor.metrics.summary import FramesHeader, MeasuredWindow, Metrics

    try:
        raw = orjson.loads(files[ANALYSIS_META])
    except (KeyError, orjson.JSONDecodeError):
        return None
    try:
        if not isinstance(raw, dict) or raw.get("key_digest") != key.digest:
            return None
        meta = msgspec.convert(from_plain(raw), EntryMeta)
        import pyarrow as pa
        import pyarrow.parquet as pq

        if len({r.rank for r in meta.ranks}) != len(meta.ranks) or any(r.file_index >= len(run.files) for r in meta.ranks):
            return None  # ranks twice, or files the run does not have
        ranks = []
        for i, r in enumerate(meta.ranks):
            names = TABLES + (COMM_TABLES if r.comm else ()) + (("roofline",) if r.roofline is not None else ())
            t = {name: pq.read_table(pa.BufferReader(files[f"{i}.{name}.parquet"])).to_pandas() for name in names}
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
                    measured=MeasuredWindow(**r.measured) if r.measured is not None else None,
                    comm=RankComm(t["collectives"], t["compute"]) if r.comm else None,
                    roofline=_roofline_of(r.roofline, t.get("roofline")),
                    copy_bandwidth=_copy_bandwidth_of(r.copy_bandwidth),
                    modules=_modules_of(r.modules),
                )
            )
        findings, whatif = typed_results(meta)
        if not all(_within_replay(w) for w in whatif):
            return None
        # A saving is a finite, non-negative time no longer than the longest step, measured or replayed.
        longest_ms = max([float(m.steps["duration"].max()) / 1e6 for m in ranks if len(m.steps)] + [w.baseline_ms for w in whatif] + [0.0])
        for f in findings:
            if f.saving_ms is not None and not (math.isfinite(f.saving_ms) and 0 <= f.saving_ms <= longest_ms * (1 + 1e-6) + 1e-6):
                return None
        return CachedRun(ranks=ranks, findings=findings, warnings=meta.warnings, whatif=whatif, split_job=meta.split_job)
    except Exception:  # noqa: BLE001 - a damaged, foreign or forged entry is a miss, never a failed report
        return None
