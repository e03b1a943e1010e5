"""From a path to an answer: find the run, load its ranks, measure, run the rules.

This is the pipeline every command shares (`report`, `gate`, `diff`, `profile`):
discover → load → metrics → rules. Renderers only read the `Analysis` it returns; the JSON
report is the encoding of its `report()`, a `Report` (declared here, the schema's source).

It stays one module of about 700 lines: the map (`analyze_rank`, run on the workers by
`advisor.ranks`, by that name on a cluster) and the reduce (the job, from what the ranks sent
back) share the task and result types that cross the process boundary, and split apart each
half would import the other.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Literal, Optional

import msgspec
import numpy as np
import pandas as pd

from advisor.units import rate
from advisor.version import __version__
import advisor.cache as cache_store
from advisor.cache import AnalysisKey, cache_enabled, load_cached, read_analysis, write_analysis
from advisor.files_read import remember_all
from advisor.config import Config, check_rule_options, load_config
from advisor.engine import Finding, RankFindings, all_rules, check_rank_rules, combine_findings, job_findings, rank_findings, select_rules
from advisor.errors import InputError
from advisor.facts import FACTS_FILE, read_facts, typed_facts, validate_facts
from advisor.load.discover import RunFiles, find_run
from advisor.load.trace import TraceFrames
from advisor.metrics.device_records import device_gaps
from advisor.metrics.one_time import HOST_PACE_RULES, cold_window
from advisor.metrics.unprofiled import MeasuredOverhead, ProfilerOverhead, noisy_window_caveat, noisy_window_note, profiler_overhead
from advisor.metrics.collectives import JobWaits, job_waits
from advisor.metrics.copies import CopyBandwidth
from advisor.metrics.modules import ModuleTime
from advisor.metrics.summary import FramesHeader, Metrics, Summary, compute_metrics, plain, step_stats, without_frames
from advisor.rank_view import RankView, rank_view, view_files, view_from_files
from advisor.rule_selection import selector_list
from advisor.whatif.savings import RankReplay, RankWhatIf

if TYPE_CHECKING:
    from concurrent.futures import Executor

WINDOW_FILE = re.compile(r"^(.+?)\.\d+\.pt\.trace\.json(?:\.gz)?$")
RANK_IN_NAME = re.compile(r"(?:rank|worker)[-_]?(\d+)", re.IGNORECASE)
REPORT_SCHEMA = "advisor/report/v1"


class Device(msgspec.Struct, forbid_unknown_fields=True):
    name: Optional[str]
    total_memory_bytes: Optional[float]
    compute_capability: Optional[str]


class Communication(msgspec.Struct, forbid_unknown_fields=True):
    """A rank's collectives: ms per step, the share compute kernels overlap, and (several ranks)
    its wait in them for later ranks and the wait it causes the others; null without collectives."""

    collective_ms_per_step: float
    overlap_share: Optional[float]
    wait_ms_per_step: Optional[float]
    caused_wait_ms_per_step: Optional[float]


class Throughput(msgspec.Struct, forbid_unknown_fields=True):
    """Samples a second over the mean step (steps a second where the batch size is not
    recorded), rounded as every report rounds it (advisor.units.rate)."""

    value: float
    unit: Literal["samples/s", "steps/s"]


class RunSummary(Summary):
    """The run's summary in the JSON report: the figures of `Summary`, and the throughput the
    other formats show, with the batch size it is counted in (per rank, from the facts file)."""

    batch_size: Optional[int]
    throughput: Optional[Throughput]


class RankReport(msgspec.Struct, forbid_unknown_fields=True):
    rank: int
    file: str
    device: Device
    summary: Summary
    communication: Optional[Communication]
    # bytes copied and set over the steps, per time bucket and kind (HTA's memory bandwidth timeline)
    memory_bandwidth: Optional[CopyBandwidth]
    # time per nn.Module path over the steps, where the trace records module calls (with_stack=True)
    modules: Optional[ModuleTime]


class Report(msgspec.Struct, forbid_unknown_fields=True):
    """`advisor report --format json`."""

    schema: Literal["advisor/report/v1"]
    advisor_version: str
    source: str
    run: str
    files: list[str]
    summary: RunSummary
    profiler_overhead: Optional[ProfilerOverhead]
    ranks: list[RankReport]
    whatif: Optional[RankWhatIf]  # the slowest rank's replayed step
    findings: list[Finding]
    considered: list[Finding]  # findings whose fix gains nothing on this run (each says why in no_gain)
    notes: list[str]
    warnings: list[str]


@dataclass
class Analysis:
    source: str
    run: RunFiles
    ranks: list[Metrics]
    facts: dict[int, dict[str, Any]]
    findings: list[Finding]
    warnings: list[str] = field(default_factory=list)
    whatif: list[RankWhatIf] = field(default_factory=list)  # replayed step per rank (advisor.whatif)
    # The user's rule options it was analysed with: a renderer that states a rank's fixes
    # again (the HTML timeline of the replayed step) states them as the report did.
    rule_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Findings whose fix gains nothing on this run (Finding.no_gain says why): not ranked,
    # listed as considered. Taken out of `findings` when the analysis is made.
    considered: list[Finding] = field(default_factory=list)
    # The slowest rank's view (advisor.rank_view): what the renderers draw and replay beyond
    # the figures, made while its frames were loaded. None: read from the cache without one.
    primary_view: RankView | None = field(default=None, repr=False, compare=False)
    # The analysis entry it was read from or stored in, and its key (None: not cached): where
    # the report rendered from it is kept (advisor.cache.store_report).
    cache_key: AnalysisKey | None = field(default=None, repr=False, compare=False)
    cache_entry: Path | None = field(default=None, repr=False, compare=False)

    def headline(self) -> RankWhatIf | None:
        """The slowest rank's replay: its measured step and the step with every fix replayed."""
        if not self.whatif:
            return None
        primary = self.primary.rank
        return next((w for w in self.whatif if w.rank == primary), self.whatif[0])
    _derived: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        found = list(self.findings)
        self.findings = [f for f in found if f.no_gain is None]
        self.considered = [*self.considered, *(f for f in found if f.no_gain is not None)]

    @property
    def primary(self) -> Metrics:
        """The slowest rank: the one the job waits for."""
        return max(self.ranks, key=lambda m: m.mean_step_ns)

    def run_facts(self, rank: int | None = None) -> dict[str, Any] | None:
        rank = self.primary.rank if rank is None else rank
        return self.facts.get(rank) or self.facts.get(-1)

    def batch_size(self) -> int | None:
        """The batch size from the run's facts file (`advisor profile`), when it was recorded."""
        facts = self.run_facts()
        if facts and facts.get("dataloaders"):
            bs = facts["dataloaders"][0].get("batch_size")
            if isinstance(bs, int) and not isinstance(bs, bool) and bs > 0:
                return bs
        return None

    def throughput(self) -> tuple[float, str] | None:
        """(value, unit): samples/s when the batch size is known, else steps/s, from the mean step."""
        mean = self.summary()["step_time_ms"]["mean"]
        if not mean:
            return None
        bs = self.batch_size()
        if bs:
            return bs / mean * 1000.0, "samples/s"
        return 1000.0 / mean, "steps/s"

    def step_times_ms(self) -> np.ndarray:
        """The run's step times: per step, the slowest rank's (a job is as fast as its slowest rank)."""
        # as measured (one-time work in them), as the headline states them
        per_rank = [pd.Series(m.headline_step_ms * 1e6, index=m.steps["step"].to_numpy()) for m in self.ranks]
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

    @property
    def waits(self) -> JobWaits | None:
        """The ranks' collective waits compared step by step (None: one rank, or no collectives)."""
        if "waits" not in self._derived:
            self._derived["waits"] = job_waits([(m.rank, m.comm) for m in self.ranks]) if len(self.ranks) > 1 else None
        return self._derived["waits"]

    @property
    def collective_lanes(self):
        """Each rank's time in collectives over the first steps every rank recorded, for the
        HTML report's ranks x time chart (advisor.metrics.collectives.CollectiveLanes; None:
        fewer than two ranks with collectives)."""
        if "lanes" not in self._derived:
            from advisor.metrics.collectives import collective_lanes

            self._derived["lanes"] = collective_lanes([(m.rank, m.comm, m.steps) for m in self.ranks]) if len(self.ranks) > 1 else None
        return self._derived["lanes"]

    def communication(self, m: Metrics) -> Communication | None:
        """One rank's collectives: time per step, how much of it compute hides, and its waits."""
        if m.comm is None or not m.comm.has_collectives:
            return None
        per_step = m.comm.per_step()
        out = Communication(float(per_step["collective_ns"].mean() / 1e6), m.comm.overlap_share(), None, None)
        w = self.waits
        if w is not None and m.rank in w.ranks:
            i = w.ranks.index(m.rank)
            out.wait_ms_per_step = float(w.mean_wait_ms()[i])
            out.caused_wait_ms_per_step = float(w.mean_caused_ms()[i])
        return out

    def with_primary_frames(self) -> Analysis:
        """The same analysis with the slowest rank's frames loaded again (the HTML report draws
        its timeline, memory and ops): one rank's frames, whatever the rank count."""
        m = self.primary
        if not isinstance(m.frames, FramesHeader):
            return self
        facts = self.run_facts(m.rank)
        frames = _complete_steps_only(load_cached(m.frames.path), facts, [])
        full = compute_metrics(frames, m.rank, facts)
        ranks = [full if r is m else r for r in self.ranks]
        out = replace(self, ranks=ranks)
        out._derived = dict(self._derived)
        return out

    def op_table(self):
        """The slowest rank's ops by (op, input shapes, input dtypes) with their call-time
        distribution (advisor.metrics.op_table), made from its frames when asked."""
        from advisor.metrics.op_table import op_time_table

        m = self.with_primary_frames().primary
        return op_time_table(m.kernels, m.steps)

    def launch_table(self):
        """The slowest rank's launch delays and queue lengths per stream, and its streams' idle
        time by cause, over its whole trace (advisor.metrics.launches), made from its frames
        when asked."""
        from advisor.metrics.launches import idle_table, launch_table

        frames = load_cached(self.primary.frames.path)
        return launch_table(frames), idle_table(frames)

    @property
    def view(self) -> RankView:
        """The slowest rank's view: made with the analysis; for an analysis read from the
        cache without one, or made without its step lanes (`analyze(draw=False)`), made once
        from its trace (the rank's rules state their fixes again)."""
        if self.primary_view is None or self.primary_view.rank != self.primary.rank or not self.primary_view.drawn:
            m = self.primary
            facts = self.run_facts(m.rank)
            frames = _complete_steps_only(load_cached(m.frames.path), facts, [])
            full = compute_metrics(frames, m.rank, facts)
            stated = check_rank_rules(all_rules(), full, facts, self.rule_options, len(self.ranks), [])
            self.primary_view = rank_view(full, facts, self.headline(), {f.rule: f for f in stated if f.change is not None and f.saving_ms is not None})
        return self.primary_view

    def stated_fixes(self, rule_options: dict[str, dict[str, Any]] | None = None) -> tuple["RankReplay", dict[str, Finding]]:
        """The slowest rank's replay and its findings with their fixes as graph changes
        (`.change`), as its rules stated them during the analysis (with its rule options)."""
        v = self.view
        replay = v.replay if v.replay is not None else RankReplay(self.primary, self.run_facts())
        for f in v.stated.values():  # the step each fix leaves at least, as its rule said (RankReplay.leaves)
            if f.change is not None and isinstance(f.evidence.get("leaves_ms"), (int, float)):
                replay.leaves(f.change, float(f.evidence["leaves_ms"]), str(f.evidence.get("leaves", "")))
        return replay, v.stated

    def replayed_saving(self, rules: list[str], rule_options: dict[str, dict[str, Any]] | None = None) -> float | None:
        """What the named findings' fixes save per step, replayed together on the slowest rank
        (never their sum); None when none of them has a fix to replay."""
        replay, modelled = self.stated_fixes(rule_options)
        changes = [modelled[r].change for r in rules if r in modelled]
        if not changes or not replay.available:
            return None
        return replay.saving_ms(replay.merged(changes))

    def summary_figures(self) -> Summary:
        """The run's `summary`: the slowest rank's, with the job's step times when several ranks ran."""
        s = self.primary.summary_figures()
        if len(self.ranks) > 1:
            ms = self.step_times_ms()
            s = msgspec.structs.replace(s, steps=int(len(ms)), step_time_ms=step_stats(ms))
        return s

    def run_summary(self) -> RunSummary:
        """The JSON report's summary: `summary_figures`, the batch size and the throughput."""
        tp = self.throughput()
        throughput = Throughput(float(rate(tp[0]).replace(",", "")), tp[1]) if tp and math.isfinite(tp[0]) else None  # type: ignore[arg-type]
        return RunSummary(**msgspec.structs.asdict(self.summary_figures()), batch_size=self.batch_size(), throughput=throughput)

    def summary(self) -> dict[str, Any]:
        """The run's `summary` as plain values (what the renderers read)."""
        return plain(self.summary_figures())

    def profiler_overhead(self) -> MeasuredOverhead | None:
        """The slowest rank's window against its unprofiled steps (facts of `advisor profile --full`).
        The window's median is the trace's, the one the step time and the replay show: one
        "window median" per report, whatever the facts file's clock made of the same steps."""
        return profiler_overhead(typed_facts(self.run_facts()), self._window_median_ms())

    def _window_median_ms(self) -> float | None:
        d = self.primary.steps["duration"].to_numpy(np.float64) if len(self.primary.steps) else None
        return float(np.median(d)) / 1e6 if d is not None else None

    def noisy_caveat(self) -> str | None:
        """The short caveat the verdict carries beside the step figure when the window was timed
        beside other work (the notes say it at length)."""
        return noisy_window_caveat(typed_facts(self.run_facts()))

    def notes(self) -> list[str]:
        out = list(self.run.notes)
        for m in self.ranks:
            prefix = f"rank {m.rank}: " if len(self.ranks) > 1 else ""
            out += [prefix + n for n in m.notes]
        recorded = typed_facts(self.run_facts())
        overhead = self.profiler_overhead()
        # stacks are recorded unless the facts say they were not (older files do not say)
        note = overhead.note(recorded.profiler.with_stack is not False) if overhead else None
        if note:
            out.append(note)
        noisy = noisy_window_note(recorded)
        if noisy:
            out.append(noisy)
        return out

    def report(self) -> Report:
        """The JSON report (schema advisor/report/v1) as its type."""
        overhead = self.profiler_overhead()
        return Report(
            schema=REPORT_SCHEMA,
            advisor_version=__version__,
            source=self.source,
            run=self.run.name,
            files=[str(p) for p in self.run.files],
            summary=self.run_summary(),
            profiler_overhead=overhead.figures() if overhead else None,
            ranks=[
                RankReport(
                    rank=m.rank,
                    file=str(m.frames.path),
                    device=Device(m.device.name, m.device.total_memory_bytes, m.device.compute_capability),
                    summary=m.summary_figures(),
                    communication=self.communication(m),
                    memory_bandwidth=m.copy_bandwidth,
                    modules=m.modules,
                )
                for m in self.ranks
            ],
            whatif=self.headline(),
            findings=self.findings,
            considered=self.considered,
            notes=self.notes(),
            warnings=self.warnings,
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON report as plain values."""
        return plain(self.report())


def _read_facts(directory: Path, warnings: list[str], sources: dict[int, Path] | None = None) -> dict[int, dict[str, Any]]:
    """The run's facts files by rank (-1: the run's one file); `sources` gets each one's path."""
    facts: dict[int, dict[str, Any]] = {}
    if not directory.is_dir():
        return facts
    for p in sorted(directory.iterdir()):
        m = FACTS_FILE.match(p.name)
        if not m:
            continue
        try:
            data, problems = _facts_file(p)
        except (OSError, ValueError) as exc:
            warnings.append(f"{p}: ignored facts file ({exc})")
            continue
        warnings += [f"{p}: {problem}: read as unknown" for problem in problems]
        rank = int(m.group(1)) if m.group(1) else data.get("rank", -1)
        key = rank if isinstance(rank, int) else -1
        facts[key] = data
        if sources is not None:
            sources[key] = p
    return facts


def _facts_file(p: Path) -> tuple[dict[str, Any], list[str]]:
    """A facts file read and checked with its types: wrong values read as null, and what was wrong."""
    return validate_facts(read_facts(p))


def _assign_ranks(distributed: list[int | None], names: list[str]) -> list[int]:
    """distributedInfo.rank when present and distinct, else the file name, else file order."""
    if all(r is not None for r in distributed) and len(set(distributed)) == len(distributed):
        return distributed  # type: ignore[return-value]
    named = [_rank_in_name(n) for n in names]
    if all(r is not None for r in named) and len(set(named)) == len(named):
        return named  # type: ignore[return-value]
    return list(range(len(names)))


def _rank_in_name(name: str) -> int | None:
    m = RANK_IN_NAME.search(name)
    return int(m.group(1)) if m else None


def worker_key(frames: TraceFrames) -> str:
    """Which process wrote a trace: its distributed rank, else the handler's worker name
    (`<worker>.<timestamp>.pt.trace.json[.gz]`), else the file itself."""
    if frames.rank is not None:
        return f"rank{frames.rank}"
    m = WINDOW_FILE.match(frames.path.name)
    return m.group(1) if m else frames.path.name


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


def _same_job(a: RankResult, b: RankResult) -> str | None:
    """None when two traces can be ranks (or windows) of one job, else why not."""
    sa, sb = a.signature, b.signature
    if sa[:2] != sb[:2]:
        return "different devices"
    if sa[2] != sb[2]:
        return "different distributed settings"
    if a.worker != b.worker:
        (a0, a1), (b0, b1) = a.span_us, b.span_us
        if max(a0, b0) - min(a1, b1) > JOB_TIME_GAP_US:
            return "recorded at different times"
    return None


def group_jobs(results: list[RankResult]) -> tuple[list[list[RankResult]], set[str]]:
    """Traces grouped into jobs: a trace joins the first group whose first trace it agrees
    with (device, distributed settings, time), and the reasons the groups differ."""
    groups: list[list[RankResult]] = []
    reasons: set[str] = set()
    for f in results:
        for g in groups:
            why = _same_job(g[0], f)
            if why is None:
                g.append(f)
                break
            reasons.add(why)
        else:
            groups.append([f])
    return groups, (reasons if len(groups) > 1 else set())


def _one_job(results: list[RankResult], directory: Path, warnings: list[str]) -> list[RankResult]:
    """The traces of one job: all of them when they agree; else the largest group (then the
    one with the newest file), with a warning that names the others."""
    groups, reasons = group_jobs(results)
    if len(groups) == 1:
        return results
    chosen = max(groups, key=lambda g: (len(g), max(f.mtime for f in g), max(f.path.name for f in g)))
    others = [f.path.name for g in groups if g is not chosen for f in g]
    listed = ", ".join(others[:6]) + (f" and {len(others) - 6} more" if len(others) > 6 else "")
    warnings.append(
        f"the {len(results)} traces in {directory} {JOB_SPLIT_NOTE} ({', '.join(sorted(reasons))}): reporting "
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


# --- the map: one rank, where its trace is ---------------------------------------------------
@dataclass
class RankTask:
    """What a worker needs to analyse one rank. Small and picklable: it travels to the worker
    (a local process or a cluster node), which reads the trace and facts files itself."""

    path: Path
    index: int  # position among the run's files
    world_size: int
    facts_files: dict[int, str] = field(default_factory=dict)  # rank (-1: any) -> facts file
    rules_dir: str | None = None
    select: list[str] = field(default_factory=list)
    ignore: list[str] = field(default_factory=list)
    rule_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    rank: int | None = None  # the rank to analyse it as; None: its own guess (see provisional_rank)
    draw: bool = True  # make the view's step lanes (advisor.rank_view): some output may draw them


@dataclass
class RankResult:
    """What comes back of one rank: its metrics without frames and its rank rules' findings
    (a few kB), or what is wrong with its file; and what the reduce needs to settle which
    rank it is and whether it is one of several profiling windows of one worker."""

    path: Path
    index: int
    rank: int = 0  # the rank it was analysed as
    world_size: int = 1
    distributed_rank: int | None = None
    worker: str = ""
    window_steps: int = 0
    mtime: float = 0.0
    metrics: Metrics | None = None
    view: RankView | None = None  # what the reports draw and replay of it (advisor.rank_view)
    findings: RankFindings = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    timing_warning: str | None = None  # the trace's times cannot be trusted (distorted_timing_warning)
    whatif: RankWhatIf | None = None  # this rank's replay: measured step, each fix, all fixes (advisor.whatif)
    content_sha256: str | None = None  # of the trace's bytes, hashed while they were read
    signature: tuple = ()  # device and distributed settings (_job_signature): which job it is
    span_us: tuple[float, float] = (0.0, 0.0)  # when it was recorded (_time_span_us)
    error_path: str | None = None
    problem: str | None = None
    too_small: bool = False  # fewer than MIN_RANK_EVENTS events: counted in the job, its rules not run

    @property
    def error(self) -> InputError | None:
        return InputError(self.error_path, self.problem) if self.problem is not None else None


# In a job of several ranks, a rank's trace with fewer events than this holds no step's work
# to explain (a step is a step annotation, its ops and their launches): its rules are not run.
# Per rank they cost about 70 ms of fixed work whatever the trace holds, which thousands of
# such files multiply. A run of one trace is always analysed, however small.
MIN_RANK_EVENTS = 8


def provisional_rank(frames: TraceFrames, index: int) -> int:
    """A rank's own guess at its number, right unless the run's files disagree (see _assign_ranks)."""
    if frames.rank is not None:
        return frames.rank
    named = _rank_in_name(frames.path.name)
    return named if named is not None else index


def _facts_for(task: RankTask, rank: int) -> dict[str, Any] | None:
    path = task.facts_files.get(rank) or task.facts_files.get(-1)
    if path is None:
        return None
    try:
        return _facts_file(Path(path))[0]
    except (OSError, ValueError):
        return None  # changed since the client read it; the client's copy has the warning


def analyze_rank(task: RankTask) -> RankResult:
    """The one place a rank is analysed: frames -> metrics -> rank rules, where the trace is.
    Only the result travels back; the frames are dropped here."""
    try:
        frames = load_cached(task.path)
    except InputError as exc:
        return RankResult(task.path, task.index, error_path=exc.path, problem=exc.problem)
    rank = task.rank if task.rank is not None else provisional_rank(frames, task.index)
    facts = _facts_for(task, rank)
    warnings: list[str] = []
    window_steps = len(frames.steps)
    warnings += [f"{frames.path.name}: {w}" for w in frames.load_warnings]
    frames = _complete_steps_only(frames, facts, warnings)
    metrics = compute_metrics(frames, rank, facts)
    replayed: list[RankWhatIf] = []
    too_small = task.world_size > 1 and frames.event_count < MIN_RANK_EVENTS
    found: RankFindings = []
    stated: dict[str, Finding] = {}
    gaps = device_gaps(frames)
    if gaps.any:
        warnings.append(f"{frames.path.name}: {gaps.line()}")
    if not too_small:
        rules = select_rules(all_rules(task.rules_dir), select=task.select, ignore=task.ignore)
        # no rule whose finding would rest on the side the trace is missing runs (or is replayed)
        rules = [r for r in rules if gaps.supports(r.id)] if gaps.any else rules
        if cold_window(metrics):  # every step was a first call: nothing about the host's pace holds
            rules = [r for r in rules if r.id not in HOST_PACE_RULES]
        found = rank_findings(rules, metrics, facts, task.rule_options, task.world_size, warnings, replayed, stated)
    view = rank_view(metrics, facts, replayed[0] if replayed else None, stated, draw=task.draw)
    try:
        mtime = task.path.stat().st_mtime
    except OSError:
        mtime = 0.0
    return RankResult(
        path=task.path,
        index=task.index,
        rank=rank,
        world_size=task.world_size,
        distributed_rank=frames.rank,
        worker=worker_key(frames),
        window_steps=window_steps,
        mtime=mtime,
        metrics=without_frames(metrics),
        view=view,
        findings=found,
        warnings=warnings,
        timing_warning=distorted_timing_warning(frames),
        whatif=replayed[0] if replayed else None,
        content_sha256=frames.content_sha256,
        signature=_job_signature(frames),
        span_us=_time_span_us(frames),
        too_small=too_small,
    )


def analyze_ranks(tasks: list[RankTask], progress: Callable[[Path], None] | None = None, executor: Executor | None = None) -> list[RankResult]:
    """analyze_rank on every task: in the calling process for a few small files, else on a
    local process pool (one worker per core) or the given executor (a cluster's). In task order."""
    from advisor.ranks import map_ranks

    out: dict[int, RankResult] = {}
    slowest: RankResult | None = None
    for task, result in map_ranks(analyze_rank, tasks, progress=progress, executor=executor):
        out[task.index] = result
        # Only the slowest rank's view is drawn: the others' are let go as they arrive, so
        # the caller holds one view, not one per rank.
        if result.metrics is not None and result.view is not None:
            if slowest is None or result.metrics.mean_step_ns > slowest.metrics.mean_step_ns:  # type: ignore[union-attr]
                if slowest is not None:
                    slowest.view = None
                slowest = result
            else:
                result.view = None
    return [out[t.index] for t in tasks]


# --- the reduce: the job, from what the ranks sent back --------------------------------------
def _reduce(run: RunFiles, results: list[RankResult], warnings: list[str]) -> tuple[list[RankResult], bool]:
    """The ranks to report: broken files skipped with a warning (the error itself when the run
    has one file, or when none loaded), one window per worker; and whether the files held
    several jobs (then the run is the chosen job's files only)."""
    kept, errors = [], []
    for r in results:
        if r.error is not None:
            if len(run.files) == 1:
                raise r.error
            errors.append(r.error)
            warnings.append(f"skipped {r.error.line()}")
        else:
            kept.append(r)
    if not kept:
        raise errors[0]
    job = _one_job(kept, run.directory, warnings)
    windows = _one_window_per_worker(job, warnings)
    return windows, len(windows) < len(kept)


def _narrowed(run: RunFiles, chosen: set[Path]) -> RunFiles:
    """The run as reported when some of its files are left out (other jobs, other windows of
    one worker): those files only, and one file is the run's name (a report of one file of a
    folder is never titled with the folder's name)."""
    files = [p for p in run.files if p in chosen]
    name = files[0].name if len(files) == 1 else run.name
    return replace(run, files=files, name=name, notes=[*run.notes, f"reads {len(files)} of the {len(run.files)} trace files in {run.directory}: see the warnings"])


def _one_window_per_worker(results: list[RankResult], warnings: list[str]) -> list[RankResult]:
    """Several files from one worker are profiling windows (schedule `repeat`, or a last
    partial window cut short), not ranks: keep the window with the most steps (then the newest)."""
    by_worker: dict[str, list[RankResult]] = {}
    for r in results:
        by_worker.setdefault(r.worker, []).append(r)
    if all(len(v) == 1 for v in by_worker.values()):
        return results
    kept = []
    for key, windows in by_worker.items():
        best = max(windows, key=lambda r: (r.window_steps, r.mtime))
        kept.append(best)
        if len(windows) > 1:
            warnings.append(f"{len(windows)} profiling windows from worker {key}: using {best.path.name} ({best.window_steps} steps)")
    kept_ids = {id(k) for k in kept}
    return [r for r in results if id(r) in kept_ids]


def analyze(
    path: str | Path,
    run: str | None = None,
    config: Config | None = None,
    rules_dir: str | Path | None = None,
    select: list[str] | None = None,
    ignore: list[str] | None = None,
    progress: Callable[[Path], None] | None = None,
    cache: bool = False,
    executor: Executor | None = None,
    store: bool = False,
    draw: bool = True,
) -> Analysis:
    """The analysis of a run: each rank analysed where it is loaded (`analyze_rank`, on a local
    process pool or `executor`), the job put together from what the ranks send back. The
    caller holds one rank's frames per worker at most, never every rank's.

    With `cache`, an unchanged run analysed the same way before comes back from the analysis
    cache. Either way the ranks carry a FramesHeader, not frames, and the slowest rank's view
    (advisor.rank_view) carries what the renderers draw. With `store` too, the analysis is stored however
    quickly it was made (its rendered report will be kept in its entry). With `draw` False the
    caller draws no timeline (a JSON or text report): an analysis that is not stored leaves the
    view's step lanes out, and `Analysis.view` makes them from the trace if asked after all."""
    config = config if config is not None else load_config()
    if config.rule_options:  # checked before the cache: a mistake in them is reported every time
        config = check_rule_options(config, all_rules(rules_dir))
    warnings: list[str] = []
    run_files = find_run(path, run)
    remember_all(run_files.files)
    if run_files.directory is not None and run_files.directory.is_dir():  # the facts files are inputs too, read or not
        remember_all(p for p in sorted(run_files.directory.iterdir()) if FACTS_FILE.match(p.name))
    select = selector_list(select) or selector_list(config.select)  # "input,optimizer" or ["h2d"], as on the command line
    ignore = [*selector_list(ignore), *selector_list(config.ignore)]
    key = _cache_key(run_files, config, select, ignore, rules_dir) if cache else None
    if key is not None:
        hit = read_analysis(run_files, key)
        if hit is not None:
            facts = _read_facts(run_files.directory, [])  # its warnings are among the stored ones
            if hit.split_job:
                run_files = _narrowed(run_files, {m.frames.path for m in hit.ranks})
            slowest = max(hit.ranks, key=lambda m: m.mean_step_ns)
            view = view_from_files(hit.extra, slowest, facts.get(slowest.rank) or facts.get(-1))
            return Analysis(
                source=str(path), run=run_files, ranks=hit.ranks, facts=facts, findings=hit.findings, warnings=hit.warnings, whatif=hit.whatif,
                rule_options=config.rule_options, cache_key=key, cache_entry=hit.folder, primary_view=view,
            )
    rules = select_rules(all_rules(rules_dir), select=select, ignore=ignore)  # bad ids fail here, once
    started = time.perf_counter()
    fact_warnings: list[str] = []
    fact_paths: dict[int, Path] = {}
    facts = _read_facts(run_files.directory, fact_warnings, fact_paths)
    base = RankTask(
        path=Path(),
        index=0,
        world_size=len(run_files.files),
        facts_files={r: str(p) for r, p in fact_paths.items()},
        rules_dir=None if rules_dir is None else str(rules_dir),
        select=list(select),
        ignore=list(ignore),
        rule_options=config.rule_options,
        draw=draw or key is not None,  # a stored analysis serves every format later
    )
    tasks = [replace(base, path=p, index=i) for i, p in enumerate(run_files.files)]
    results, split_job = _reduce(run_files, analyze_ranks(tasks, progress, executor), warnings)
    found_files = run_files  # the cache's entry indexes the files as found (its reader narrows them again)
    if split_job:
        run_files = _narrowed(run_files, {r.path for r in results})
    warnings += fact_warnings
    ranks = _assign_ranks([r.distributed_rank for r in results], [r.path.name for r in results])
    # A rank that guessed its number (or the world size) wrong is analysed again as what it is.
    again = [replace(tasks[r.index], rank=rank, world_size=len(results)) for r, rank in zip(results, ranks, strict=True) if r.rank != rank or r.world_size != len(results)]
    if again:
        redone = {x.index: x for x in analyze_ranks(again, None, executor)}
        results = [redone.get(r.index, r) for r in results]
    for r in results:
        warnings += r.warnings
    warnings += [r.timing_warning for r in results if r.timing_warning]
    small = [r.path.name for r in results if r.too_small]
    if small:
        named = ", ".join(small[:3]) + (f" and {len(small) - 3:,} more" if len(small) > 3 else "")
        warnings.append(
            f"{named}: fewer than {MIN_RANK_EVENTS} events in {'each' if len(small) > 1 else 'it'}, too few to hold a step's work: "
            "counted in the job (step time, ranks), no rule run on them"
        )
    per_rank = sorted(((r.metrics, r.findings) for r in results), key=lambda x: x[0].rank)
    metrics = [m for m, _ in per_rank]
    waits = job_waits([(m.rank, m.comm) for m in metrics]) if len(metrics) > 1 else None
    whatif = [r.whatif for r in sorted(results, key=lambda r: r.rank) if r.whatif is not None]
    slowest = max(metrics, key=lambda m: m.mean_step_ns)
    view = next((r.view for r in results if r.metrics is slowest), None)
    findings = combine_findings(rules, per_rank, job_findings(rules, metrics, waits, facts, config.rule_options))
    entry = None
    if key is not None and (store or time.perf_counter() - started >= cache_store.MIN_ANALYSIS_SECONDS):
        # Stored only if the bytes analysed are the bytes keyed (a trace still being written, say).
        if key.parsed_as_keyed(results):
            entry = write_analysis(found_files, key, metrics, findings, warnings, whatif, extra=view_files(view), split_job=split_job)
    return Analysis(
        source=str(path), run=run_files, ranks=metrics, facts=facts, findings=findings, warnings=warnings, whatif=whatif,
        rule_options=config.rule_options, cache_key=key if entry is not None else None, cache_entry=entry, primary_view=view,
    )


def _cache_key(run: RunFiles, config: Config, select: list[str], ignore: list[str], rules_dir: str | Path | None) -> AnalysisKey | None:
    return AnalysisKey.of(run, config.rule_options, select, ignore, rules_dir) if cache_enabled() else None


# --- views computed only when asked (`report --collectives`, `report --ops -f csv`, `diff --ops`) ---
# Each reads the ranks' frames (the frames cache first) where they are loaded and sends back
# a small table: the cold report computes none of them.


@dataclass(frozen=True)
class RankFile:
    """A rank's trace and its place in the run (the rank number where the trace names none)."""

    index: int
    path: Path


def _rank_collectives_task(item: RankFile):
    from advisor.metrics.collectives import rank_collectives

    frames = load_cached(item.path)
    return rank_collectives(frames, provisional_rank(frames, item.index))


def collectives_of_run(path: str | Path, run: str | None = None, executor: Executor | None = None):
    """The run's files and its job's collectives (`advisor.metrics.collectives.JobCollectives`),
    every rank read once where it is loaded."""
    from advisor.metrics.collectives import job_collectives
    from advisor.ranks import map_ranks

    found = find_run(Path(path), run)
    items = [RankFile(i, p) for i, p in enumerate(found.files)]
    per_rank = [r for _, r in map_ranks(_rank_collectives_task, items, executor=executor)]
    return found, job_collectives(per_rank)
