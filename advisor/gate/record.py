"""What a gate compares: one run reduced to the figures a later run is judged against.

A `RunRecord` is built from an `Analysis` (a log dir or trace), and is exactly what
`advisor baseline` writes (schema `advisor/baseline/v1`): every step time, not just their
mean, so a comparison can weigh the noise; the breakdown; the key metrics; the findings; and
the device and versions, so a later comparison knows whether it compares like with like.
A report JSON (`advisor/report/v1`) can stand in as a baseline too, minus the step times.
"""

from __future__ import annotations

import datetime as _dt
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

from advisor.version import __version__
from advisor.errors import InputError
from advisor.files_read import read_regular, remember
from advisor.output import jsonable

BASELINE_SCHEMA = "advisor/baseline/v1"
# A baseline or report JSON larger than this is not one (the step times of a million steps fit).
MAX_RECORD_BYTES = 512 * 2**20
REPORT_SCHEMA_PREFIX = "advisor/report/"
SEVERITY_ORDER = {"low": 1, "medium": 2, "high": 3}


@dataclass
class Environment:
    """Where a run ran: what decides whether two step times are comparable at all."""

    device_name: str | None = None
    compute_capability: str | None = None
    device_memory_bytes: float | None = None
    world_size: int | None = None
    batch_size: int | None = None
    versions: dict[str, str] = field(default_factory=dict)


@dataclass
class FindingRecord:
    rule: str
    severity: str
    title: str
    saving_ms: float | None = None
    saving_share: float | None = None  # of the step (0.3: 30%), as the JSON report's findings say it
    message: str = ""

    @classmethod
    def of(cls, finding: Any) -> "FindingRecord":
        """The record of an analysis's finding (advisor.engine.Finding)."""
        return cls(finding.rule, finding.severity, finding.title, finding.saving_ms, finding.saving_pct, finding.message)


@dataclass
class RunRecord:
    source: str
    run: str
    step_times_ms: list[float] | None  # per step, the slowest rank's; None when not recorded
    breakdown_ms: dict[str, float]  # mean per step, by category
    gpu_utilization: float | None
    peak_memory_bytes: float | None
    findings: list[FindingRecord]
    environment: Environment
    advisor_version: str = __version__
    created: str | None = None
    kind: str = "run"  # run | baseline | report: where the record came from
    summary_step_time_ms: dict[str, float | None] = field(default_factory=dict)
    # Rules that fired but were not ranked (considered: their fix gains nothing on this run).
    # None where the file does not say (a baseline written before they were recorded).
    considered: list[FindingRecord] | None = None

    # --- derived figures ------------------------------------------------------------------
    @property
    def steps(self) -> int:
        if self.step_times_ms is not None:
            return len(self.step_times_ms)
        return int(self.summary_step_time_ms.get("steps") or 0)

    @property
    def median_step_ms(self) -> float | None:
        if self.step_times_ms:
            s = sorted(self.step_times_ms)
            k = len(s) // 2
            return s[k] if len(s) % 2 else (s[k - 1] + s[k]) / 2
        return self.summary_step_time_ms.get("median")

    @property
    def mean_step_ms(self) -> float | None:
        if self.step_times_ms:
            return sum(self.step_times_ms) / len(self.step_times_ms)
        return self.summary_step_time_ms.get("mean")

    @property
    def breakdown_share(self) -> dict[str, float]:
        """Each category's share of the step time (the categories add up to the step)."""
        total = sum(v for v in self.breakdown_ms.values() if v is not None and math.isfinite(v))
        if total <= 0:
            return {}
        return {k: (v or 0.0) / total for k, v in self.breakdown_ms.items()}

    def samples_per_s(self, batch_size: int | None = None) -> float | None:
        """Samples a second for the whole job: batch size x ranks / mean step time.

        The mean (not the median) because throughput is total samples over total time.
        """
        bs = batch_size or self.environment.batch_size
        mean = self.mean_step_ms
        if not bs or not mean:
            return None
        return bs * (self.environment.world_size or 1) / (mean / 1000.0)

    @property
    def rules_fired(self) -> dict[str, FindingRecord]:
        """The ranked findings, by rule."""
        return {f.rule: f for f in self.findings}

    @property
    def rules_considered(self) -> dict[str, FindingRecord]:
        """The rules that fired without being ranked (none where the record does not say)."""
        return {f.rule: f for f in self.considered or [] if f.rule not in self.rules_fired}

    # --- (de)serialisation ----------------------------------------------------------------
    def to_baseline(self) -> dict[str, Any]:
        """The `advisor/baseline/v1` document."""
        share = self.breakdown_share
        return jsonable(
            {
                "schema": BASELINE_SCHEMA,
                "advisor_version": self.advisor_version,
                "created": self.created or _now(),
                "source": self.source,
                "run": self.run,
                "step_times_ms": self.step_times_ms,
                "metrics": {
                    "steps": self.steps,
                    "step_time_median_ms": self.median_step_ms,
                    "step_time_mean_ms": self.mean_step_ms,
                    "gpu_utilization": self.gpu_utilization,
                    "peak_memory_bytes": self.peak_memory_bytes,
                    "samples_per_s": self.samples_per_s(),
                },
                "breakdown_ms": self.breakdown_ms,
                "breakdown_share": share,
                "findings": [asdict(f) for f in self.findings],
                "considered": None if self.considered is None else [asdict(f) for f in self.considered],
                "environment": asdict(self.environment),
            }
        )


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


def _str_or_none(v: Any) -> str | None:
    return str(v) if v is not None and v != "" else None


# --- from an analysis -----------------------------------------------------------------------
def environment_of(analysis: Any) -> Environment:
    """Device, world size, batch size and versions, from the trace and the facts file."""
    m = analysis.primary
    facts = analysis.run_facts() or {}
    fdev = facts.get("device") if isinstance(facts.get("device"), dict) else {}
    versions: dict[str, str] = {}
    fv = facts.get("versions")
    if isinstance(fv, dict):
        versions.update({str(k): str(v) for k, v in fv.items() if v is not None})
    for key, value in m.frames.metadata.items():
        if key.endswith("_version") and value is not None:
            versions.setdefault(key, str(value))
    nccl = m.frames.distributed.get("nccl_version")
    if nccl is not None:
        versions.setdefault("nccl", str(nccl))
    world = facts.get("world_size")
    if not isinstance(world, int) or isinstance(world, bool):
        dist_world = m.frames.distributed.get("world_size")
        world = int(dist_world) if isinstance(dist_world, (int, float)) and not isinstance(dist_world, bool) else len(analysis.ranks)
    batch = None
    loaders = facts.get("dataloaders")
    if isinstance(loaders, list) and loaders and isinstance(loaders[0], dict):
        batch = loaders[0].get("batch_size")
    if batch is None:
        batch = facts.get("batch_size")
    return Environment(
        device_name=m.device.name or _str_or_none(fdev.get("name")),
        compute_capability=m.device.compute_capability or _str_or_none(fdev.get("compute_capability")),
        device_memory_bytes=m.device.total_memory_bytes or fdev.get("total_memory_bytes"),
        world_size=world,
        batch_size=int(batch) if isinstance(batch, (int, float)) and not isinstance(batch, bool) and batch > 0 else None,
        versions=versions,
    )


def record_from_analysis(analysis: Any) -> RunRecord:
    m = analysis.primary
    peak = max((r.peak_allocated for r in analysis.ranks if r.peak_allocated is not None), default=None)
    if peak is None:
        facts = analysis.run_facts() or {}
        fdev = facts.get("device") if isinstance(facts.get("device"), dict) else {}
        peak = fdev.get("max_memory_allocated_bytes")
    steps = [float(x) for x in analysis.step_times_ms()]
    return RunRecord(
        source=str(analysis.source),
        run=analysis.run.name,
        step_times_ms=steps,
        breakdown_ms={k: float(v) for k, v in m.breakdown_mean_ms.items()},
        gpu_utilization=m.gpu_utilization,
        peak_memory_bytes=float(peak) if peak is not None else None,
        findings=[FindingRecord.of(f) for f in analysis.findings],
        considered=[FindingRecord.of(f) for f in analysis.considered],
        environment=environment_of(analysis),
        created=_now(),
        kind="run",
    )


# --- from a file ------------------------------------------------------------------------
def _need(doc: dict[str, Any], key: str, kind: type | tuple[type, ...], path: Path) -> Any:
    if key not in doc:
        raise InputError(path, f"not a valid baseline: missing {key!r}")
    value = doc[key]
    if not isinstance(value, kind):
        raise InputError(path, f"not a valid baseline: {key!r} has the wrong type")
    return value


# What a baseline may hold: more step times than this make the gate's bootstrap slow (about
# 7 s at 10,000) and no profiled window has them; a step time of 11.6 days or more (the
# loader's limit on one trace's span) is not a step.
MAX_BASELINE_STEPS = 10_000
MAX_STEP_MS = 1e9
MIN_STEP_MS = 1e-6  # 1 ns


def _number(value: Any, what: str, path: Path, *, upper: float = math.inf, share: bool = False) -> float | None:
    """A figure from a baseline or report file: None, or a finite number in [0, upper)
    ([0, 1] for a share); anything else is one line naming the file and the key."""
    if value is None:
        return None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (0 <= value <= 1 if share else 0 <= value < upper)
    if not ok:
        expected = "a share between 0 and 1" if share else "a non-negative number" + (f" below {upper:g}" if math.isfinite(upper) else "")
        raise InputError(path, f"not a valid baseline: {what} is {str(value)[:40]!r}, expected {expected}")
    return float(value)


def _findings(raw: Any, path: Path, key: str = "findings") -> list[FindingRecord]:
    if not isinstance(raw, list):
        raise InputError(path, f"not a valid baseline: {key!r} must be a list")
    out = []
    for f in raw:
        if not isinstance(f, dict) or not isinstance(f.get("rule"), str):
            raise InputError(path, "not a valid baseline: each finding needs a 'rule'")
        out.append(
            FindingRecord(
                rule=f["rule"],
                severity=str(f.get("severity") or "low"),
                title=str(f.get("title") or f["rule"]),
                saving_ms=_number(f.get("saving_ms"), "a finding's 'saving_ms'", path, upper=MAX_STEP_MS),
                # saving_share (files written before it was named so: saving_pct)
                saving_share=_number(f.get("saving_share", f.get("saving_pct")), "a finding's 'saving_share'", path, upper=MAX_STEP_MS),
                message=str(f.get("message") or ""),
            )
        )
    return out


def _environment(raw: dict[str, Any], path: Path) -> Environment:
    known = {k: v for k, v in raw.items() if k in Environment.__dataclass_fields__}
    env = Environment(**known)
    for key in ("device_name", "compute_capability"):
        if getattr(env, key) is not None and not isinstance(getattr(env, key), str):
            raise InputError(path, f"not a valid baseline: 'environment.{key}' must be a string")
    for key in ("world_size", "batch_size"):
        v = getattr(env, key)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise InputError(path, f"not a valid baseline: 'environment.{key}' is {str(v)[:40]!r}, expected a positive integer")
    env.device_memory_bytes = _number(env.device_memory_bytes, "'environment.device_memory_bytes'", path)
    if not isinstance(env.versions, dict):
        raise InputError(path, "not a valid baseline: 'environment.versions' must be a table")
    env.versions = {str(k): str(v) for k, v in env.versions.items()}
    return env


def _step_times(steps: list[Any], path: Path) -> list[float]:
    if len(steps) > MAX_BASELINE_STEPS:
        raise InputError(path, f"not a valid baseline: {len(steps)} step times, more than the {MAX_BASELINE_STEPS} a baseline may hold (a profiled window has tens)")
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in steps):
        raise InputError(path, "not a valid baseline: 'step_times_ms' must be a list of numbers")
    values = [float(x) for x in steps]
    # A trace's clock counts nanoseconds at best: a step of less than 1 ns (1e-6 ms) is not a
    # measurement (1e-300 once made a 300-digit percentage), only 0 (no time) is.
    bad = next((v for v in values if not (math.isfinite(v) and (v == 0 or MIN_STEP_MS <= v < MAX_STEP_MS))), None)
    if bad is not None:
        raise InputError(path, f"not a valid baseline: 'step_times_ms' holds {bad!r}, not a possible step time (0, or {MIN_STEP_MS:g} to {MAX_STEP_MS:g} ms)")
    return values


def _breakdown(raw: dict[str, Any], path: Path) -> dict[str, float]:
    return {str(k): _number(v, f"'breakdown_ms.{k}'", path, upper=MAX_STEP_MS) or 0.0 for k, v in raw.items()}


def record_from_baseline(doc: dict[str, Any], path: Path) -> RunRecord:
    steps = _step_times(_need(doc, "step_times_ms", list, path), path)
    metrics = _need(doc, "metrics", dict, path)
    breakdown = _need(doc, "breakdown_ms", dict, path)
    env = _environment(_need(doc, "environment", dict, path), path)
    return RunRecord(
        source=str(doc.get("source", path)),
        run=str(doc.get("run", "")),
        step_times_ms=steps,
        breakdown_ms=_breakdown(breakdown, path),
        gpu_utilization=_number(metrics.get("gpu_utilization"), "'metrics.gpu_utilization'", path, share=True),
        peak_memory_bytes=_number(metrics.get("peak_memory_bytes"), "'metrics.peak_memory_bytes'", path),
        findings=_findings(_need(doc, "findings", list, path), path),
        considered=None if doc.get("considered") is None else _findings(doc["considered"], path, "considered"),
        environment=env,
        advisor_version=str(doc.get("advisor_version", "")),
        created=doc.get("created"),
        kind="baseline",
    )


def record_from_report(doc: dict[str, Any], path: Path) -> RunRecord:
    """A report JSON as a baseline: its summary and findings, but no per-step times."""
    summary = _need(doc, "summary", dict, path)
    ranks = doc.get("ranks") or []
    if not isinstance(ranks, list):
        raise InputError(path, "not a valid baseline: 'ranks' must be a list")
    dev = ranks[0].get("device", {}) if ranks and isinstance(ranks[0], dict) else {}
    if not isinstance(dev, dict):
        raise InputError(path, "not a valid baseline: a rank's 'device' must be a table")
    stats = summary.get("step_time_ms") if isinstance(summary.get("step_time_ms"), dict) else {}
    stats = {str(k): _number(v, f"'summary.step_time_ms.{k}'", path, upper=MAX_STEP_MS) for k, v in stats.items()}
    breakdown = summary.get("breakdown_ms") or {}
    if not isinstance(breakdown, dict):
        raise InputError(path, "not a valid baseline: 'summary.breakdown_ms' must be a table")
    steps = summary.get("steps")
    if steps is not None and (not isinstance(steps, int) or isinstance(steps, bool) or steps < 0):
        raise InputError(path, f"not a valid baseline: 'summary.steps' is {str(steps)[:40]!r}, expected a step count")
    return RunRecord(
        source=str(doc.get("source", path)),
        run=str(doc.get("run", "")),
        step_times_ms=None,
        breakdown_ms=_breakdown(breakdown, path),
        gpu_utilization=_number(summary.get("gpu_utilization"), "'summary.gpu_utilization'", path, share=True),
        peak_memory_bytes=_number(summary.get("peak_memory_bytes"), "'summary.peak_memory_bytes'", path),
        findings=_findings(doc.get("findings", []), path),
        considered=None if doc.get("considered") is None else _findings(doc["considered"], path, "considered"),
        environment=_environment(
            {
                "device_name": dev.get("name"),
                "compute_capability": dev.get("compute_capability"),
                "device_memory_bytes": dev.get("total_memory_bytes"),
                "world_size": len(ranks) or None,
            },
            path,
        ),
        advisor_version=str(doc.get("advisor_version", "")),
        kind="report",
        summary_step_time_ms={**stats, "steps": summary.get("steps")},
    )


def is_advisor_baseline(path: Path) -> bool:
    """PATH is a regular file (not a link) holding a baseline `advisor baseline` wrote."""
    try:
        doc = orjson.loads(read_regular(path, MAX_RECORD_BYTES, follow=False))
    except (OSError, orjson.JSONDecodeError):
        return False
    return isinstance(doc, dict) and isinstance(doc.get("schema"), str) and doc["schema"].startswith("advisor/baseline/")


def read_record_file(path: Path) -> RunRecord | None:
    """A baseline or report JSON as a record; None when the file is a trace (to be analysed)."""
    remember(path)
    if path.name.endswith((".gz", ".pt.trace.json")):
        return None
    try:
        raw = read_regular(path, MAX_RECORD_BYTES)
    except OSError as exc:
        raise InputError(path, f"cannot read: {exc.strerror or exc}") from None
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InputError(path, f"not a baseline: invalid JSON ({exc.msg})") from None
    if not isinstance(doc, dict):
        raise InputError(path, "not a baseline: expected a JSON object")
    if "traceEvents" in doc:
        return None
    schema = doc.get("schema")
    if schema == BASELINE_SCHEMA:
        return record_from_baseline(doc, path)
    if isinstance(schema, str) and schema.startswith(REPORT_SCHEMA_PREFIX):
        if schema != REPORT_SCHEMA_PREFIX + "v1":
            raise InputError(path, f"unsupported report schema {schema!r} (this advisor reads {REPORT_SCHEMA_PREFIX}v1)")
        return record_from_report(doc, path)
    if isinstance(schema, str) and schema.startswith("advisor/baseline/"):
        raise InputError(path, f"unsupported baseline schema {schema!r} (this advisor reads {BASELINE_SCHEMA})")
    raise InputError(
        path,
        f"not an advisor baseline (schema {schema!r}); write one with `advisor baseline PATH -o FILE`"
        if schema is not None
        else "not an advisor baseline (no 'schema' key); write one with `advisor baseline PATH -o FILE`",
    )
