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

import re
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
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
from advisor.metrics.breakdown import CATEGORIES
from advisor.sizes import format_bytes, parse_size
from advisor.units import rate as rate_text
from advisor.units import step_ms

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

SEVERITY_LIMITS = ("none", "low", "medium", "high")


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


# --- parsing --------------------------------------------------------------------------------
# Each layer's table is decoded into GateTable: a typo, a value of the wrong type or out of
# range is refused by msgspec, and the error becomes one line naming the file and the key
# with what the key must be (MUST_BE). UNSET marks a key the layer does not set.
_FINITE = sys.float_info.max  # NaN and the infinities are no budget
Positive = Annotated[float, msgspec.Meta(gt=0, le=_FINITE)]
Fraction = Annotated[float, msgspec.Meta(ge=0, le=1)]
Maybe = msgspec.UnsetType
UNSET = msgspec.UNSET

# [max_share]: a fraction per breakdown category, nothing else
MaxShare = msgspec.defstruct("MaxShare", [(c, Fraction | Maybe, UNSET) for c in CATEGORIES], forbid_unknown_fields=True, kw_only=True)


class GateTable(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One layer of gate settings, as written ([tool.advisor.gate], a --budget file, the flags)."""

    baseline: Annotated[str, msgspec.Meta(min_length=1)] | Maybe = UNSET  # relative to the file
    tolerance: Annotated[float, msgspec.Meta(ge=0, lt=1)] | Maybe = UNSET
    confidence: Annotated[float, msgspec.Meta(ge=0.5, lt=1)] | Maybe = UNSET
    min_steps: Annotated[int, msgspec.Meta(ge=3)] | Maybe = UNSET
    strict: bool | Maybe = UNSET
    fail_on_new_findings: bool | Maybe = UNSET
    batch_size: Annotated[int, msgspec.Meta(gt=0)] | Maybe = UNSET
    max_step_time_ms: Positive | Maybe = UNSET
    min_gpu_utilization: Fraction | Maybe = UNSET
    max_share: MaxShare | Maybe = UNSET  # type: ignore[valid-type]
    max_peak_memory: int | float | str | Maybe = UNSET  # bytes or a size (advisor.sizes), checked below
    max_severity: Literal[SEVERITY_LIMITS] | Maybe = UNSET  # type: ignore[valid-type]
    forbid_rules: list[str] | Maybe = UNSET
    min_samples_per_s: Positive | Maybe = UNSET
    max_ms_per_sample: Positive | Maybe = UNSET


KNOWN_KEYS = GateTable.__struct_fields__
_FRACTION = "must be a fraction between 0 and 1 (0.05 = 5%)"
_CATEGORIES = f"categories: {', '.join(CATEGORIES)}"
# What each key must be, for the one-line error ("got VALUE" is added where a value was given).
MUST_BE = {
    "baseline": "must be a path",
    "tolerance": _FRACTION,
    "confidence": "must be between 0.5 and 1 (0.95 = 95%)",
    "min_steps": "must be a whole number of at least 3",
    "strict": "must be true or false",
    "fail_on_new_findings": "must be true or false",
    "batch_size": "must be a positive whole number",
    "max_step_time_ms": "must be a positive number",
    "min_gpu_utilization": _FRACTION,
    "max_share": f"must be a table of category = fraction, {_CATEGORIES}",
    "max_share.": _FRACTION,  # each category's share
    "max_peak_memory": 'must be a number of bytes or a size like "16 GiB"',
    "max_severity": f"must be one of {', '.join(SEVERITY_LIMITS)}",
    "forbid_rules": "must be a list of rule ids",
    "min_samples_per_s": "must be a positive number",
    "max_ms_per_sample": "must be a positive number",
}
_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<key>[^`]*)`(?: - at `\$\.(?P<at>[^`]*)`)?$")
_AT = re.compile(r" - at `\$\.(?P<at>[^`\[]*)[^`]*`$")


def parse_gate_table(table: Any, where: str | Path | None, base_dir: Path | None, table_name: str = "[tool.advisor.gate]") -> dict[str, Any]:
    """Validate one layer of gate settings; returns only the keys it sets (budget keys flat)."""
    if not isinstance(table, dict):
        raise InputError(where, f"{table_name} must be a table")
    try:
        typed = msgspec.convert(table, GateTable)
        out = {k: getattr(typed, k) for k in KNOWN_KEYS if getattr(typed, k) is not UNSET}
        if "max_share" in out:
            out["max_share"] = {c: v for c in CATEGORIES if (v := getattr(out["max_share"], c)) is not UNSET}
            if not out["max_share"]:
                raise _Refused("max_share")
        if "max_peak_memory" in out:
            try:
                out["max_peak_memory"] = float(parse_size(out["max_peak_memory"]))
            except ValueError:
                out["max_peak_memory"] = 0
            if out["max_peak_memory"] <= 0:
                raise _Refused("max_peak_memory")
    except msgspec.ValidationError as exc:  # the first mistake, in the table's order
        raise InputError(where, f"{table_name}: {_problem(str(exc), table)}") from None
    except _Refused as exc:
        raise InputError(where, f"{table_name}: {_problem_at(exc.key, table)}") from None
    if "baseline" in out:
        p = Path(out["baseline"])
        out["baseline"] = p if p.is_absolute() or base_dir is None else base_dir / p
    return out


class _Refused(Exception):
    """A value of the right type that is still no setting (an empty max_share, a size of 0)."""

    def __init__(self, key: str):
        self.key = key


def _problem(text: str, table: dict[str, Any]) -> str:
    """msgspec's error as "KEY must be ..., got VALUE" or "KEY is not a gate setting; known: ..."."""
    m = _UNKNOWN.match(text)
    if m and m["at"] == "max_share":
        return f"max_share.{m['key']} is not a breakdown category; {_CATEGORIES}"
    if m:
        return f"{m['key']} is not a gate setting; known: {', '.join(KNOWN_KEYS)}"
    m = _AT.search(text)
    return _problem_at(m["at"], table) if m else text


def _problem_at(key: str, table: dict[str, Any]) -> str:
    top, _, category = key.partition(".")
    value = table.get(top)
    if not category:
        shown = "" if top in ("baseline", "forbid_rules", "max_share") else f", got {value!r}"
        return f"{key} {MUST_BE[top]}{shown}"
    value = value.get(category) if isinstance(value, dict) else None
    return f"{key} {MUST_BE[top + '.']}, got {value!r}"


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
