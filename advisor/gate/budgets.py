"""Budgets and gate settings: read, validated, layered, and checked against a run.

Settings come in layers, each overriding the one before: `[tool.advisor.gate]` of the
project's pyproject.toml (or `[gate]` of an advisor.toml), then a `--budget FILE`, then the
command-line flags. Every key is validated where it is read; a typo or a value of the wrong
kind is an InputError naming the file and the key, never a budget silently ignored.

    [tool.advisor.gate]
    baseline = "perf/baseline.json"   # relative to this file
    tolerance = 0.05                  # step-time regression allowed against the baseline
    max_step_time_ms = 120            # median step time
    min_gpu_utilization = 0.6
    max_peak_memory = "20 GiB"        # or a number of bytes
    max_severity = "medium"           # a `high` finding fails the gate
    forbid_rules = ["dataloader-stall"]
    min_samples_per_s = 1500          # needs the batch size (facts file or batch_size)
    max_ms_per_sample = 0.5           # median step time / samples per step; needs it too
    [tool.advisor.gate.max_share]
    dataloader = 0.05                 # share of the step time per breakdown category
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import orjson

from advisor.errors import InputError
from advisor.files_read import remember
from advisor.gate.compare import (
    DEFAULT_CONFIDENCE,
    DEFAULT_MIN_STEPS,
    DEFAULT_TOLERANCE,
)
from advisor.gate.record import SEVERITY_ORDER, RunRecord
from advisor.gate.verdict import Check
from advisor.gate_table import KNOWN_KEYS, SEVERITY_LIMITS, parse_gate_table  # noqa: F401  (re-exported for the gate's commands)
from advisor.sizes import format_bytes
from advisor.units import rate as rate_text
from advisor.units import step_ms

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib


@dataclass
class Budgets:
    max_step_time_ms: float | None = None
    min_gpu_utilization: float | None = None
    max_share: dict[str, float] = field(default_factory=dict)
    max_peak_memory: float | None = None  # bytes
    max_severity: str | None = None
    forbid_rules: list[str] = field(default_factory=list)
    min_samples_per_s: float | None = None
    max_ms_per_sample: float | None = None

    def any(self) -> bool:
        return any(getattr(self, f.name) not in (None, [], {}) for f in fields(self))


@dataclass
class GateSettings:
    budgets: Budgets = field(default_factory=Budgets)
    baseline: Path | None = None
    tolerance: float = DEFAULT_TOLERANCE
    confidence: float = DEFAULT_CONFIDENCE
    min_steps: int = DEFAULT_MIN_STEPS
    strict: bool = False
    fail_on_new_findings: bool = False
    batch_size: int | None = None
    sources: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        b = self.budgets
        return {
            "baseline": str(self.baseline) if self.baseline else None,
            "tolerance": self.tolerance,
            "confidence": self.confidence,
            "min_steps": self.min_steps,
            "strict": self.strict,
            "fail_on_new_findings": self.fail_on_new_findings,
            "batch_size": self.batch_size,
            "budgets": {f.name: getattr(b, f.name) for f in fields(b)},
            "sources": self.sources,
        }


def read_budget_file(path: Path) -> dict[str, Any]:
    """A `--budget FILE`: TOML or JSON; its `[tool.advisor.gate]` or `[gate]` table, else the whole file."""
    if not path.is_file():
        raise InputError(path, "budget file not found")
    remember(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(path, f"cannot read: {exc}") from None
    if path.suffix.lower() == ".json":
        try:
            doc = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            raise InputError(path, f"invalid JSON: {exc.msg}") from None
    else:
        try:
            doc = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise InputError(path, f"invalid TOML: {exc}") from None
        except RecursionError:
            raise InputError(path, "invalid TOML: values nested too deeply") from None
    if not isinstance(doc, dict):
        raise InputError(path, "a budget file must hold a table of budgets")
    nested = doc.get("tool", {}).get("advisor", {}) if isinstance(doc.get("tool"), dict) else {}
    if isinstance(nested, dict) and "gate" in nested:
        return parse_gate_table(nested["gate"], path, path.parent, "[tool.advisor.gate]")
    if path.name == "pyproject.toml":
        raise InputError(path, "no [tool.advisor.gate] table")
    if "gate" in doc:
        return parse_gate_table(doc["gate"], path, path.parent, "[gate]")
    return parse_gate_table(doc, path, path.parent, "budgets")


def build_settings(layers: list[tuple[str, dict[str, Any]]]) -> GateSettings:
    """Apply validated layers in order (later wins) over the defaults."""
    s = GateSettings()
    budget_names = {f.name for f in fields(Budgets)}
    for source, layer in layers:
        if not layer:
            continue
        s.sources.append(source)
        for key, value in layer.items():
            if key in budget_names:
                if key == "max_share":
                    s.budgets.max_share = {**s.budgets.max_share, **value}
                else:
                    setattr(s.budgets, key, value)
            else:
                setattr(s, key, value)
    return s


# --- checking -------------------------------------------------------------------------------
def _ms(v: float | None) -> str:
    return step_ms(v)


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{100 * v:.1f}%"


def _status(ok: bool) -> str:
    return "pass" if ok else "fail"


def budget_checks(record: RunRecord, budgets: Budgets, batch_size: int | None = None) -> list[Check]:
    """One check per budget set; a budget the run cannot measure is inconclusive, not a pass."""
    checks: list[Check] = []
    b = budgets
    if b.max_step_time_ms is not None:
        mean = record.mean_step_ms
        limit = f"<= {b.max_step_time_ms:g} ms"
        if mean is None:
            checks.append(Check("max-step-time", "mean step time", "inconclusive", "n/a", limit, "the run has no steps (no ProfilerStep spans)"))
        else:
            ok = mean <= b.max_step_time_ms
            med = record.median_step_ms
            checks.append(
                Check(
                    "max-step-time",
                    "mean step time",
                    _status(ok),
                    _ms(mean),
                    limit,
                    f"mean of {record.steps} steps is {_ms(mean)}" + (f" (median {_ms(med)})" if med is not None else "")
                    + ("" if ok else f", {mean / b.max_step_time_ms - 1:+.0%} over budget"),
                    {"mean_ms": mean, "median_ms": med, "budget_ms": b.max_step_time_ms, "steps": record.steps},
                )
            )
    if b.min_gpu_utilization is not None:
        util = record.gpu_utilization
        limit = f">= {_pct(b.min_gpu_utilization)}"
        if util is None:
            checks.append(Check("min-gpu-utilization", "GPU utilisation", "inconclusive", "n/a", limit, "the trace records no device activity"))
        else:
            ok = util >= b.min_gpu_utilization
            checks.append(
                Check(
                    "min-gpu-utilization",
                    "GPU utilisation",
                    _status(ok),
                    _pct(util),
                    limit,
                    f"the device is busy {_pct(util)} of the step time",
                    {"gpu_utilization": util, "budget": b.min_gpu_utilization},
                )
            )
    share = record.breakdown_share
    for cat, budget in b.max_share.items():
        limit = f"<= {_pct(budget)}"
        if not share:
            checks.append(Check(f"max-share.{cat}", f"{cat} share of step", "inconclusive", "n/a", limit, "no step-time breakdown (no steps)"))
            continue
        value = share.get(cat, 0.0)
        ms = record.breakdown_ms.get(cat, 0.0)
        ok = value <= budget
        checks.append(
            Check(
                f"max-share.{cat}",
                f"{cat} share of step",
                _status(ok),
                _pct(value),
                limit,
                f"{cat} takes {ms:.1f} ms of each {sum(record.breakdown_ms.values()):.1f} ms step ({_pct(value)})",
                {"share": value, "ms_per_step": ms, "budget": budget},
            )
        )
    if b.max_peak_memory is not None:
        peak = record.peak_memory_bytes
        limit = f"<= {format_bytes(b.max_peak_memory, digits=2)}"
        if peak is None:
            checks.append(
                Check("max-peak-memory", "peak device memory", "inconclusive", "n/a", limit, "no device memory recorded (a CPU-only run, or profiled without profile_memory=True)")
            )
        else:
            ok = peak <= b.max_peak_memory
            checks.append(
                Check(
                    "max-peak-memory",
                    "peak device memory",
                    _status(ok),
                    format_bytes(peak, digits=2),
                    limit,
                    f"peak allocated device memory {format_bytes(peak, digits=2)}",
                    {"peak_bytes": peak, "budget_bytes": b.max_peak_memory},
                )
            )
    if b.max_severity is not None:
        allowed = SEVERITY_ORDER.get(b.max_severity, 0)
        over = [f for f in record.findings if SEVERITY_ORDER.get(f.severity, 3) > allowed]
        worst = max((f.severity for f in record.findings), key=lambda s: SEVERITY_ORDER.get(s, 0), default="none")
        checks.append(
            Check(
                "max-severity",
                "finding severity",
                _status(not over),
                worst,
                f"<= {b.max_severity}",
                ("findings above the limit: " + "; ".join(f"{f.rule} ({f.severity}): {f.title}" for f in over))
                if over
                else f"{len(record.findings)} finding(s), none above {b.max_severity}",
                {"over": [f.rule for f in over]},
            )
        )
    if b.forbid_rules:
        fired = record.rules_fired
        hit = [r for r in b.forbid_rules if r in fired]
        checks.append(
            Check(
                "forbid-rules",
                "forbidden findings",
                _status(not hit),
                ", ".join(hit) if hit else "none",
                "none of " + ", ".join(b.forbid_rules),
                ("fired: " + "; ".join(f"{r} ({fired[r].severity}): {fired[r].message or fired[r].title}" for r in hit))
                if hit
                else "none of the forbidden rules fired",
                {"fired": hit, "forbidden": b.forbid_rules},
            )
        )
    if b.min_samples_per_s is not None:
        limit = f">= {b.min_samples_per_s:g} samples/s"
        rate = record.samples_per_s(batch_size)
        if rate is None:
            checks.append(
                Check(
                    "min-samples-per-s",
                    "throughput",
                    "inconclusive",
                    "n/a",
                    limit,
                    "the batch size is unknown: profile with `advisor profile` (it records it) or set batch_size",
                )
            )
        else:
            ok = rate >= b.min_samples_per_s
            bs = batch_size or record.environment.batch_size
            checks.append(
                Check(
                    "min-samples-per-s",
                    "throughput",
                    _status(ok),
                    f"{rate_text(rate)} samples/s",
                    limit,
                    f"batch {bs} x {record.environment.world_size or 1} rank(s) / mean step {_ms(record.mean_step_ms)}",
                    {"samples_per_s": rate, "batch_size": bs, "budget": b.min_samples_per_s},
                )
            )
    if b.max_ms_per_sample is not None:
        limit = f"<= {1000 * b.max_ms_per_sample:.1f} µs/sample"
        bs = record.environment.batch_size or batch_size
        mean = record.mean_step_ms
        if not bs or mean is None:
            why = "the batch size is unknown: profile with `advisor profile` (it records it) or set batch_size" if not bs else "the run has no steps"
            checks.append(Check("max-ms-per-sample", "time per sample", "inconclusive", "n/a", limit, why))
        else:
            n = bs * (record.environment.world_size or 1)
            per = mean / n  # 1 / throughput
            ok = per <= b.max_ms_per_sample
            checks.append(
                Check(
                    "max-ms-per-sample",
                    "time per sample",
                    _status(ok),
                    f"{1000 * per:.1f} µs/sample",
                    limit,
                    f"mean step {_ms(mean)} / {n} samples per step (batch {bs} x {record.environment.world_size or 1} rank(s)), {rate_text(n / mean * 1000.0)} samples/s",
                    {"ms_per_sample": per, "samples_per_step": n, "budget": b.max_ms_per_sample},
                )
            )
    return checks
