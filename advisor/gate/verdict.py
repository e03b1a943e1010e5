"""The gate's result: one `Check` per budget or comparison, and the verdict they add up to.

A check is `pass`, `fail`, `inconclusive` (the data cannot say: too few steps, a figure the
trace does not record) or `warn` (worth reading, never fails: new findings, a device or
version mismatch). The verdict is `fail` if any check fails, else `inconclusive` if any is
inconclusive, else `pass`; `--strict` turns an inconclusive verdict into a failure.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from advisor.version import __version__

GATE_SCHEMA = "advisor/gate/v1"
STATUSES = ("pass", "warn", "inconclusive", "fail")
EXIT_PASS = 0
EXIT_FAIL = 1


@dataclass
class Check:
    id: str  # stable key: "step-time-regression", "max-share.dataloader", ...
    title: str  # what a person reads: "step time vs baseline"
    status: str  # pass | warn | inconclusive | fail
    measured: str  # the figure, formatted: "177.4 ms"
    limit: str  # the budget, formatted: "<= 120 ms"
    message: str  # one sentence: why this status
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown check status {self.status!r}")

    def effective_status(self, strict: bool) -> str:
        return "fail" if strict and self.status == "inconclusive" else self.status


@dataclass
class GateResult:
    checks: list[Check]
    strict: bool
    candidate: dict[str, Any]
    baseline: dict[str, Any] | None
    settings: dict[str, Any]
    new_findings: list[dict[str, Any]] = field(default_factory=list)
    resolved_findings: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        statuses = {c.effective_status(self.strict) for c in self.checks}
        if "fail" in statuses:
            return "fail"
        if "inconclusive" in statuses:
            return "inconclusive"
        return "pass"

    @property
    def exit_code(self) -> int:
        return EXIT_FAIL if self.verdict == "fail" else EXIT_PASS

    def count(self, status: str) -> int:
        return sum(1 for c in self.checks if c.effective_status(self.strict) == status)

    def headline(self) -> str:
        """One line: the verdict and the checks behind it."""
        n = len(self.checks)
        if self.verdict == "fail":
            failed = [c.title for c in self.checks if c.effective_status(self.strict) == "fail"]
            return f"FAIL: {len(failed)} of {n} checks failed ({'; '.join(failed)})"
        if self.verdict == "inconclusive":
            unsure = [c.title for c in self.checks if c.status == "inconclusive"]
            return f"INCONCLUSIVE: {len(unsure)} of {n} checks cannot be judged ({'; '.join(unsure)}); --strict makes this a failure"
        warned = self.count("warn")
        return f"PASS: {n} checks" + (f", {warned} with a warning" if warned else "")

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": GATE_SCHEMA,
            "advisor_version": __version__,
            "verdict": self.verdict,
            "exit_code": self.exit_code,
            "strict": self.strict,
            "headline": self.headline(),
            "checks": [{**asdict(c), "effective_status": c.effective_status(self.strict)} for c in self.checks],
            "new_findings": self.new_findings,
            "resolved_findings": self.resolved_findings,
            "warnings": self.warnings,
            "candidate": self.candidate,
            "baseline": self.baseline,
            "settings": self.settings,
        }
