"""Run the gate: budgets on the candidate, and the comparison with a baseline when given."""

from __future__ import annotations

import math
from typing import Any

from advisor.gate.budgets import GateSettings, budget_checks
from advisor.gate.compare import compare_step_times
from advisor.gate.record import RunRecord
from advisor.gate.verdict import Check, GateResult
from advisor.units import rate as rate_text


PER_SAMPLE_NOTE = " (so time per sample is compared, not step time)"


def signed_pct(ratio_minus_one: float | None) -> str:
    """+26%, -4.3%: whole percent from 10% on, one decimal below."""
    if ratio_minus_one is None or not math.isfinite(ratio_minus_one):
        return "n/a"
    v = 100 * ratio_minus_one
    if abs(v) >= 100_000:  # a thousand times and more: a factor, not a 300-digit percentage
        return f"{ratio_minus_one + 1:.3g}x"
    return f"{v:+.0f}%" if abs(v) >= 10 else f"{v:+.1f}%"


def _change(ratio: float | None) -> str:
    return signed_pct(None if ratio is None else ratio - 1)


def samples_per_step(record: RunRecord, batch_size: int | None = None) -> int | None:
    """Samples one step processes across all ranks (batch x world size); None when unknown."""
    bs = record.environment.batch_size or batch_size
    return bs * (record.environment.world_size or 1) if bs else None


def step_time_check(baseline: RunRecord, candidate: RunRecord, settings: GateSettings) -> Check:
    """Step time against the baseline, or time per sample when the runs' batches differ.

    Step times only compare when both steps do the same work. When both runs know their
    batch (facts file, the DataLoader's batch size, or --batch-size) and the samples per
    step differ, the comparison is made on time per sample (step time / samples per step),
    so a smaller batch cannot pass as a faster step. When only one side knows its batch, a
    batch change cannot be ruled out: a step that looks as fast or faster is inconclusive.
    """
    limit = f"<= {signed_pct(settings.tolerance)}"
    b_n = samples_per_step(baseline, settings.batch_size)
    c_n = samples_per_step(candidate, settings.batch_size)
    if b_n and c_n and b_n != c_n and baseline.step_times_ms:
        return _per_sample_check(baseline, candidate, settings, b_n, c_n, limit)
    check = _step_check(baseline, candidate, settings, limit)
    if (b_n is None) != (c_n is None) and check.status == "pass":
        side = "baseline" if b_n is None else "candidate"
        check.status = "inconclusive"
        check.message += (
            f"; but the {side}'s batch size is unknown, so a faster step may be a smaller batch "
            "(give both runs a facts file from `advisor profile`, or --batch-size)"
        )
    return check


def _per_sample_check(baseline: RunRecord, candidate: RunRecord, settings: GateSettings, b_n: int, c_n: int, limit: str) -> Check:
    title = "time per sample vs baseline"
    assert baseline.step_times_ms is not None
    cmp = compare_step_times(
        [t / b_n for t in baseline.step_times_ms],
        [t / c_n for t in (candidate.step_times_ms or [])],
        tolerance=settings.tolerance,
        confidence=settings.confidence,
        min_steps=settings.min_steps,
    )
    us = lambda ms: f"{1000 * ms:.1f} µs"  # noqa: E731
    parts = [f"samples per step {b_n} -> {c_n}"]
    # The headline is the mean step per sample, 1 / throughput; the test reads each step's time
    # per sample (medians, rank test), and is given after it as such.
    b_mean, c_mean = baseline.mean_step_ms, candidate.mean_step_ms
    if b_mean and c_mean:
        parts.append(
            f"mean step per sample {us(b_mean / b_n)} -> {us(c_mean / c_n)} ({_change((c_mean / c_n) / (b_mean / b_n))}), "
            f"throughput {rate_text(b_n / b_mean * 1000.0)} -> {rate_text(c_n / c_mean * 1000.0)} samples/s"
        )
    if cmp.baseline_median_ms is not None and cmp.candidate_median_ms is not None:
        part = f"the test on each step: median per sample {us(cmp.baseline_median_ms)} -> {us(cmp.candidate_median_ms)} ({_change(cmp.ratio)}"
        if cmp.lower is not None and cmp.upper is not None:
            part += f"; {cmp.confidence:.0%} bounds {_change(cmp.lower)} to {_change(cmp.upper)}"
        parts.append(part + ")")
    if cmp.p_slower is not None:
        parts.append(f"rank test p={cmp.p_slower:.3g}")
    parts.append(f"{cmp.baseline_steps} vs {cmp.candidate_steps} steps")
    message = ", ".join(parts) + f": {cmp.reason}"
    if b_mean and c_mean:
        measured = f"{us(c_mean / c_n)}/sample, {rate_text(c_n / c_mean * 1000.0)} samples/s"
    else:
        measured = f"{us(cmp.candidate_median_ms)}/sample (median)" if cmp.candidate_median_ms is not None else "n/a"
    details = {**cmp.to_dict(), "unit": "ms per sample", "baseline_samples_per_step": b_n, "candidate_samples_per_step": c_n}
    return Check("step-time-regression", title, cmp.verdict, measured, limit, message, details)


def _step_check(baseline: RunRecord, candidate: RunRecord, settings: GateSettings, limit: str) -> Check:
    title = "step time vs baseline"
    if not baseline.step_times_ms:
        med = baseline.mean_step_ms
        cmed = candidate.mean_step_ms
        change = f" (mean step {med:.2f} -> {cmed:.2f} ms, {_change(cmed / med)})" if med and cmed else ""
        return Check(
            "step-time-regression",
            title,
            "inconclusive",
            f"{cmed:.2f} ms mean" if cmed else "n/a",
            limit,
            f"the baseline has no per-step times{change}: write it with `advisor baseline` or pass a log dir",
        )
    cmp = compare_step_times(
        baseline.step_times_ms,
        candidate.step_times_ms or [],
        tolerance=settings.tolerance,
        confidence=settings.confidence,
        min_steps=settings.min_steps,
    )
    parts = []
    if cmp.mean_ratio is not None:
        parts.append(f"mean step {cmp.baseline_mean_ms:.2f} -> {cmp.candidate_mean_ms:.2f} ms ({_change(cmp.mean_ratio)})")
    if cmp.baseline_median_ms is not None and cmp.candidate_median_ms is not None:
        parts.append(f"the test on each step: median {cmp.baseline_median_ms:.2f} -> {cmp.candidate_median_ms:.2f} ms ({_change(cmp.ratio)}")
        if cmp.lower is not None and cmp.upper is not None:
            parts[-1] += f"; {cmp.confidence:.0%} bounds {_change(cmp.lower)} to {_change(cmp.upper)}"
        parts[-1] += ")"
    if cmp.p_slower is not None:
        parts.append(f"rank test p={cmp.p_slower:.3g}")
    parts.append(f"{cmp.baseline_steps} vs {cmp.candidate_steps} steps")
    message = ", ".join(parts) + f": {cmp.reason}"
    if cmp.mean_ratio is not None:
        measured = f"{cmp.candidate_mean_ms:.2f} ms mean ({_change(cmp.mean_ratio)})"
    else:
        measured = f"{cmp.candidate_median_ms:.2f} ms median ({_change(cmp.ratio)})" if cmp.candidate_median_ms is not None else "n/a"
    return Check("step-time-regression", title, cmp.verdict, measured, limit, message, cmp.to_dict())


def findings_check(baseline: RunRecord, candidate: RunRecord, settings: GateSettings) -> tuple[Check, list[dict[str, Any]], list[dict[str, Any]]]:
    # New: the rule did not fire on the baseline at all; a rule the baseline considered (fired,
    # not ranked) and the candidate ranks has changed rank, as one ranked before and only
    # considered now has not gone.
    before, after = baseline.rules_fired, candidate.rules_fired
    fired_before = {**baseline.rules_considered, **before}
    fired_after = {**candidate.rules_considered, **after}
    new = [after[r] for r in after if r not in fired_before]
    gone = [before[r] for r in before if r not in fired_after]
    new_d = [{"rule": f.rule, "severity": f.severity, "title": f.title, "saving_ms": f.saving_ms, "message": f.message} for f in new]
    gone_d = [{"rule": f.rule, "severity": f.severity, "title": f.title} for f in gone]
    if new:
        status = "fail" if settings.fail_on_new_findings else "warn"
        saving = lambda f: f" {f.saving_ms:.1f} ms/step" if f.saving_ms else ""  # noqa: E731
        message = "new since the baseline: " + "; ".join(f"{f.rule} ({f.severity}{saving(f)}): {f.title}" for f in new)
    else:
        status = "pass"
        message = "no finding that the baseline did not have"
    if gone:
        message += "; gone since the baseline: " + ", ".join(f.rule for f in gone)
    check = Check(
        "new-findings",
        "new findings",
        status,
        (new[0].rule if len(new) == 1 else f"{len(new)} new") if new else "none",
        "none" if settings.fail_on_new_findings else "(listed)",
        message,
        {"new": [f.rule for f in new], "gone": [f.rule for f in gone]},
    )
    return check, new_d, gone_d


def environment_mismatches(baseline: RunRecord, candidate: RunRecord) -> list[str]:
    """What differs between the two runs' device, scale and software (both sides known)."""
    b, c = baseline.environment, candidate.environment
    out = []
    for label, x, y in (
        ("device", b.device_name, c.device_name),
        ("compute capability", b.compute_capability, c.compute_capability),
        ("world size", b.world_size, c.world_size),
        ("batch size", b.batch_size, c.batch_size),
    ):
        if x is not None and y is not None and x != y:
            out.append(f"{label} differs: baseline {x}, candidate {y}")
    for key in sorted(set(b.versions) & set(c.versions)):
        if b.versions[key] != c.versions[key]:
            out.append(f"{key} version differs: baseline {b.versions[key]}, candidate {c.versions[key]}")
    if baseline.advisor_version and candidate.advisor_version and baseline.advisor_version != candidate.advisor_version:
        out.append(f"advisor version differs: baseline {baseline.advisor_version}, candidate {candidate.advisor_version} (rules may differ)")
    return out


def environment_check(mismatches: list[str]) -> Check:
    return Check(
        "same-environment",
        "same device and versions",
        "warn" if mismatches else "pass",
        f"{len(mismatches)} difference(s)" if mismatches else "same",
        "same",
        ("; ".join(mismatches) + ("" if all(m.endswith(PER_SAMPLE_NOTE) for m in mismatches) else ": step times may not be comparable"))
        if mismatches
        else "device, scale and recorded versions match",
        {"mismatches": mismatches},
    )


def record_summary(r: RunRecord) -> dict[str, Any]:
    return {
        "source": r.source,
        "run": r.run,
        "kind": r.kind,
        "steps": r.steps,
        "step_time_median_ms": r.median_step_ms,
        "step_time_mean_ms": r.mean_step_ms,
        "gpu_utilization": r.gpu_utilization,
        "peak_memory_bytes": r.peak_memory_bytes,
        "breakdown_share": r.breakdown_share,
        "findings": [f.rule for f in r.findings],
        "environment": {
            "device_name": r.environment.device_name,
            "compute_capability": r.environment.compute_capability,
            "world_size": r.environment.world_size,
            "batch_size": r.environment.batch_size,
            "versions": r.environment.versions,
        },
        "advisor_version": r.advisor_version,
    }


def run_gate(candidate: RunRecord, baseline: RunRecord | None, settings: GateSettings, notes: list[str] | None = None) -> GateResult:
    checks: list[Check] = []
    new_d: list[dict[str, Any]] = []
    gone_d: list[dict[str, Any]] = []
    warnings = list(notes or [])
    if baseline is not None:
        step = step_time_check(baseline, candidate, settings)
        checks.append(step)
        fcheck, new_d, gone_d = findings_check(baseline, candidate, settings)
        checks.append(fcheck)
        mismatches = environment_mismatches(baseline, candidate)
        if step.details.get("unit") == "ms per sample":
            mismatches = [m + PER_SAMPLE_NOTE if m.startswith("batch size differs") else m for m in mismatches]
        checks.append(environment_check(mismatches))
        warnings += mismatches
    checks += budget_checks(candidate, settings.budgets, settings.batch_size)
    return GateResult(
        checks=checks,
        strict=settings.strict,
        candidate=record_summary(candidate),
        baseline=record_summary(baseline) if baseline is not None else None,
        settings=settings.to_dict(),
        new_findings=new_d,
        resolved_findings=gone_d,
        warnings=warnings,
    )
