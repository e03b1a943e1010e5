"""From a path to an answer: find the run, load its ranks, measure, run the rules.

This is the pipeline every command shares (`report`, `gate`, `diff`, `profile`):
discover → load → metrics → rules. Renderers only read the `Analysis` it returns.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np
import orjson

from advisor import __version__, analysis_cache
from advisor.analysis_cache import AnalysisKey, read_analysis, write_analysis
from advisor.capture.facts import validate_facts
from advisor.config import Config, check_rule_options, load_config
from advisor.engine import Finding, all_rules, run_rules, select_rules
from advisor.load.cache import cache_enabled
from advisor.load.discover import RunFiles, find_run
from advisor.load.trace import TraceFrames
from advisor.metrics.unprofiled import ProfilerOverhead, profiler_overhead
from advisor.metrics.summary import Metrics, _stats, compute_metrics

FACTS_FILE = re.compile(r"^advisor_facts(?:\.rank(\d+))?\.json$")
WINDOW_FILE = re.compile(r"^(.+?)\.\d+\.pt\.trace\.json(?:\.gz)?$")
RANK_IN_NAME = re.compile(r"(?:rank|worker)[-_]?(\d+)", re.IGNORECASE)
REPORT_SCHEMA = "advisor/report/v1"


@dataclass
class Analysis:
    source: str
    run: RunFiles
    ranks: list[Metrics]
    facts: dict[int, dict[str, Any]]
    findings: list[Finding]
    warnings: list[str] = field(default_factory=list)

    @property
    def primary(self) -> Metrics:
        """The slowest rank: the one the job waits for."""
        return max(self.ranks, key=lambda m: m.mean_step_ns)

    def run_facts(self, rank: int | None = None) -> dict[str, Any] | None:
        rank = self.primary.rank if rank is None else rank
        return self.facts.get(rank) or self.facts.get(-1)

    def step_times_ms(self) -> np.ndarray:
        """The run's step times: per step, the slowest rank's (a job is as fast as its slowest rank)."""
        per_rank = [m.steps.set_index("step")["duration"] for m in self.ranks]
        if len(per_rank) == 1:
            return per_rank[0].to_numpy(np.float64) / 1e6
        common = set(per_rank[0].index)
        for s in per_rank[1:]:
            common &= set(s.index)
        if common:
            idx = sorted(common)
            return np.max([s.loc[idx].to_numpy() for s in per_rank], axis=0).astype(np.float64) / 1e6
        n = min(len(s) for s in per_rank)
        return np.max([s.to_numpy()[:n] for s in per_rank], axis=0).astype(np.float64) / 1e6

    def summary(self) -> dict[str, Any]:
        s = self.primary.summary()
        if len(self.ranks) > 1:
            ms = self.step_times_ms()
            s["steps"] = int(len(ms))
            s["step_time_ms"] = _stats(ms)
        return s

    def profiler_overhead(self) -> ProfilerOverhead | None:
        """The slowest rank's window against its unprofiled steps (facts of `advisor profile --full`)."""
        return profiler_overhead(self.run_facts())

    def notes(self) -> list[str]:
        out = list(self.run.notes)
        for m in self.ranks:
            prefix = f"rank {m.rank}: " if len(self.ranks) > 1 else ""
            out += [prefix + n for n in m.notes]
        overhead = self.profiler_overhead()
        note = overhead.note((self.run_facts() or {}).get("profiler", {}).get("with_stack", True)) if overhead else None
        if note:
            out.append(note)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": REPORT_SCHEMA,
            "advisor_version": __version__,
            "source": self.source,
            "run": self.run.name,
            "files": [str(p) for p in self.run.files],
            "summary": self.summary(),
            "profiler_overhead": overhead.to_dict() if (overhead := self.profiler_overhead()) else None,
            "ranks": [
                {
                    "rank": m.rank,
                    "file": str(m.frames.path),
                    "device": {
                        "name": m.device.name,
                        "total_memory_bytes": m.device.total_memory_bytes,
                        "compute_capability": m.device.compute_capability,
                    },
                    "summary": m.summary(),
                }
                for m in self.ranks
            ],
            "findings": [f.to_dict() for f in self.findings],
            "notes": self.notes(),
            "warnings": self.warnings,
        }


def _read_facts(directory: Path, warnings: list[str]) -> dict[int, dict[str, Any]]:
    facts: dict[int, dict[str, Any]] = {}
    if not directory.is_dir():
        return facts
    for p in sorted(directory.iterdir()):
        m = FACTS_FILE.match(p.name)
        if not m:
            continue
        try:
            data, problems = validate_facts(orjson.loads(p.read_bytes()))
        except (OSError, ValueError) as exc:
            warnings.append(f"{p}: ignored facts file ({exc})")
            continue
        warnings += [f"{p}: {problem}: read as unknown" for problem in problems]
        rank = int(m.group(1)) if m.group(1) else data.get("rank", -1)
        facts[rank if isinstance(rank, int) else -1] = data
    return facts


def _assign_ranks(frames: list[TraceFrames]) -> list[int]:
    """distributedInfo.rank when present and distinct, else the file name, else file order."""
    ranks = [f.rank for f in frames]
    if all(r is not None for r in ranks) and len(set(ranks)) == len(ranks):
        return ranks  # type: ignore[return-value]
    named = [RANK_IN_NAME.search(f.path.name) for f in frames]
    if all(named) and len({int(m.group(1)) for m in named}) == len(named):  # type: ignore[union-attr]
        return [int(m.group(1)) for m in named]  # type: ignore[union-attr]
    return list(range(len(frames)))


def load_ranks(run: RunFiles, warnings: list[str], progress: Callable[[Path], None] | None = None) -> list[TraceFrames]:
    """Every rank's frames: in parallel processes when there is enough to load, through the
    Parquet cache beside each trace; a broken rank is skipped with a warning (unless alone)."""
    from advisor.load.parallel import load_frames

    frames, errors = [], []
    for loaded in load_frames(run.files, progress=progress):
        if loaded.error is not None:
            if len(run.files) == 1:
                raise loaded.error
            errors.append(loaded.error)
            warnings.append(f"skipped {loaded.error.line()}")
        else:
            frames.append(loaded.frames)
            warnings += [f"{loaded.frames.path.name}: {w}" for w in loaded.frames.load_warnings]
    if not frames:
        raise errors[0]
    return _one_window_per_worker(_one_job(frames, run.directory, warnings), warnings)


def worker_key(frames: TraceFrames) -> str:
    """Which process wrote a trace: its distributed rank, else the handler's worker name
    (`<worker>.<timestamp>.pt.trace.json[.gz]`), else the file itself."""
    if frames.rank is not None:
        return f"rank{frames.rank}"
    m = WINDOW_FILE.match(frames.path.name)
    return m.group(1) if m else frames.path.name


def _one_window_per_worker(frames: list[TraceFrames], warnings: list[str]) -> list[TraceFrames]:
    """Several files from one worker are profiling windows (schedule `repeat`, or a last
    partial window cut short), not ranks: keep the window with the most steps (then the newest)."""
    by_worker: dict[str, list[TraceFrames]] = {}
    for f in frames:
        by_worker.setdefault(worker_key(f), []).append(f)
    if all(len(v) == 1 for v in by_worker.values()):
        return frames
    kept = []
    for key, windows in by_worker.items():
        best = max(windows, key=lambda f: (len(f.steps), f.path.stat().st_mtime))
        kept.append(best)
        if len(windows) > 1:
            warnings.append(f"{len(windows)} profiling windows from worker {key}: using {best.path.name} ({len(best.steps)} steps)")
    return [f for f in frames if any(f is k for k in kept)]


# --- traces of one job ----------------------------------------------------------------------
# Two traces farther apart than this (and not windows of one worker) are not one job's ranks.
JOB_TIME_GAP_US = 10 * 60 * 1e6
JOB_SPLIT_NOTE = "do not belong to one job"


def _job_signature(frames: TraceFrames) -> tuple:
    props = frames.device_properties
    device = str(props["name"].iloc[0]) if len(props) else None
    return (frames.has_device, device, frames.distributed.get("world_size"))


def _time_span_us(frames: TraceFrames) -> tuple[float, float]:
    return frames.base_us + frames.window[0] / 1e3, frames.base_us + frames.window[1] / 1e3


def _same_job(a: TraceFrames, b: TraceFrames) -> str | None:
    """None when two traces can be ranks (or windows) of one job, else why not."""
    sa, sb = _job_signature(a), _job_signature(b)
    if sa[:2] != sb[:2]:
        return "different devices"
    if sa[2] != sb[2]:
        return "different distributed settings"
    if worker_key(a) != worker_key(b):
        (a0, a1), (b0, b1) = _time_span_us(a), _time_span_us(b)
        if max(a0, b0) - min(a1, b1) > JOB_TIME_GAP_US:
            return "recorded at different times"
    return None


def group_jobs(frames: list[TraceFrames]) -> tuple[list[list[TraceFrames]], set[str]]:
    """Traces grouped into jobs: a trace joins the first group whose first trace it agrees
    with (device, distributed settings, time), and the reasons the groups differ."""
    groups: list[list[TraceFrames]] = []
    reasons: set[str] = set()
    for f in frames:
        for g in groups:
            why = _same_job(g[0], f)
            if why is None:
                g.append(f)
                break
            reasons.add(why)
        else:
            groups.append([f])
    return groups, (reasons if len(groups) > 1 else set())


def _one_job(frames: list[TraceFrames], directory: Path, warnings: list[str]) -> list[TraceFrames]:
    """The traces of one job: all of them when they agree; else the largest group (then the
    one with the newest file), with a warning that names the others."""
    groups, reasons = group_jobs(frames)
    if len(groups) == 1:
        return frames
    chosen = max(groups, key=lambda g: (len(g), max(f.path.stat().st_mtime for f in g), max(f.path.name for f in g)))
    others = [f.path.name for g in groups if g is not chosen for f in g]
    listed = ", ".join(others[:6]) + (f" and {len(others) - 6} more" if len(others) > 6 else "")
    warnings.append(
        f"the {len(frames)} traces in {directory} {JOB_SPLIT_NOTE} ({', '.join(sorted(reasons))}): reporting "
        f"{', '.join(f.path.name for f in chosen)} as one run; the others are separate runs, each with --run FILE: {listed}"
    )
    return chosen


def _complete_steps_only(frames: TraceFrames, facts: dict[str, Any] | None, warnings: list[str]) -> TraceFrames:
    """An interrupted capture ends with a partly recorded step; the facts list the complete ones."""
    done = (facts or {}).get("profiled_steps")
    if not isinstance(done, list) or not done or len(frames.steps) == 0:
        return frames
    keep = frames.steps["step"].isin([s for s in done if isinstance(s, int)])
    if keep.all() or not keep.any():
        return frames
    dropped = frames.steps.loc[~keep, "step"].tolist()
    warnings.append(f"{frames.path.name}: left out step(s) {dropped}, not completed when the capture stopped")
    return replace(frames, steps=frames.steps[keep].reset_index(drop=True))


def distorted_timing_warning(frames: TraceFrames) -> str | None:
    """A trace whose times are not the run's: CUPTI's range profiler replays each kernel to
    read its counters, and the launch calls wait for the replays."""
    if not frames.range_profiled:
        return None
    rt = frames.runtime
    launch = rt[rt["name"].astype(str).str.contains("LaunchKernel", regex=False)]
    mean = f", kernel launch calls average {launch['dur'].mean() / 1e6:,.1f} ms" if len(launch) else ""
    return (
        f"{frames.path.name}: recorded with CUPTI's range profiler (kernels appear only as cuda_profiler_range counter "
        f"ranges{mean}): kernels were replayed to read counters, so these timings are distorted and cannot be trusted; "
        "profile again without counter collection to measure time"
    )


def analyze(
    path: str | Path,
    run: str | None = None,
    config: Config | None = None,
    rules_dir: str | Path | None = None,
    select: list[str] | None = None,
    ignore: list[str] | None = None,
    progress: Callable[[Path], None] | None = None,
    cache: bool = False,
) -> Analysis:
    """The analysis of a run. With `cache`, an unchanged run analysed the same way before comes
    back from the analysis cache: its ranks then carry a FramesHeader, not frames, which is
    all the text, JSON and Markdown reports, gate and diff read (the HTML report needs frames)."""
    config = config if config is not None else load_config()
    if config.rule_options:  # checked before the cache: a mistake in them is reported every time
        config = check_rule_options(config, all_rules(rules_dir))
    warnings: list[str] = []
    run_files = find_run(path, run)
    select = select or config.select
    ignore = [*(ignore or []), *config.ignore]
    key = _cache_key(run_files, config, select, ignore, rules_dir) if cache else None
    if key is not None:
        hit = read_analysis(run_files, key)
        if hit is not None:
            facts = _read_facts(run_files.directory, [])  # its warnings are among the stored ones
            if any(JOB_SPLIT_NOTE in w for w in hit.warnings):
                chosen = {m.frames.path for m in hit.ranks}
                run_files = replace(run_files, files=[p for p in run_files.files if p in chosen])
            return Analysis(source=str(path), run=run_files, ranks=hit.ranks, facts=facts, findings=hit.findings, warnings=hit.warnings)
    started = time.perf_counter()
    frames = load_ranks(run_files, warnings, progress)
    if any(JOB_SPLIT_NOTE in w for w in warnings):
        chosen = {f.path for f in frames}
        run_files = replace(run_files, files=[p for p in run_files.files if p in chosen])
    facts = _read_facts(run_files.directory, warnings)
    ranks = _assign_ranks(frames)
    frames = [_complete_steps_only(f, facts.get(r) or facts.get(-1), warnings) for f, r in zip(frames, ranks)]
    metrics = [compute_metrics(f, rank, facts.get(rank) or facts.get(-1)) for f, rank in zip(frames, ranks)]
    metrics.sort(key=lambda m: m.rank)
    warnings += [w for f in frames if (w := distorted_timing_warning(f))]
    rules = select_rules(all_rules(rules_dir), select=select, ignore=ignore)
    findings = run_rules(rules, metrics, facts, config.rule_options)
    if key is not None and time.perf_counter() - started >= analysis_cache.MIN_ANALYSIS_SECONDS:
        # Stored only if the bytes analysed are the bytes keyed (a trace still being written, say).
        if key.parsed_as_keyed(frames):
            write_analysis(run_files, key, metrics, findings, warnings)
    return Analysis(source=str(path), run=run_files, ranks=metrics, facts=facts, findings=findings, warnings=warnings)


def _cache_key(run: RunFiles, config: Config, select: list[str], ignore: list[str], rules_dir: str | Path | None) -> AnalysisKey | None:
    return AnalysisKey.of(run, config.rule_options, select, ignore, rules_dir) if cache_enabled() else None
