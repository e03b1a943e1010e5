"""Compare two runs: did the fix do what the advisor promised?

`compare(before, after)` measures the change in step time, throughput and each slice of the
step-time breakdown, and sorts the findings into resolved, new and remaining. A resolved
finding is shown with the saving it promised next to the change actually measured, so a user
sees at once whether the fix paid off. Renderers: text (terminal), JSON (schema
`advisor/diff/v1`), Markdown and a self-contained HTML page.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table
from rich.text import Text

from advisor.version import __version__
from advisor.analysis import Analysis
from advisor.facts import typed_facts
from advisor.metrics.breakdown import CATEGORIES
from advisor.metrics.unprofiled import unprofiled_steps
from advisor.render import svg
from advisor.render.fmt import batch_size, esc, fmt_bytes, md, pct, rate, signed
from advisor.output import to_json_text
from advisor.terminal_text import inert_console, one_line

DIFF_SCHEMA = "advisor/diff/v1"
STATUSES = ("resolved", "new", "remaining")


@dataclass
class FindingChange:
    rule: str
    title: str
    status: str  # resolved | new | remaining
    before_ms: float | None  # saving the finding promised before (per step)
    after_ms: float | None
    before_pct: float | None
    after_pct: float | None
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "title": self.title,
            "status": self.status,
            "saving_before_ms": self.before_ms,
            "saving_after_ms": self.after_ms,
            "saving_before_pct": self.before_pct,
            "saving_after_pct": self.after_pct,
            "message": self.message,
        }


@dataclass
class Side:
    """One run's figures as the comparison uses them."""

    name: str
    source: str
    device: str | None
    ranks: int
    step_ms: np.ndarray  # per step, the slowest rank's
    breakdown_ms: dict[str, float]
    gpu_utilization: float | None
    peak_memory_bytes: float | None
    batch_size: int | None
    unprofiled_ms: np.ndarray | None = None  # the steps after the window (`advisor profile --full`)

    @classmethod
    def of(cls, a: Analysis) -> "Side":
        s = a.summary()
        after = unprofiled_steps(typed_facts(a.run_facts()))
        return cls(
            name=a.run.name,
            source=a.source,
            device=a.primary.device.name,
            ranks=len(a.ranks),
            step_ms=a.step_times_ms(),
            breakdown_ms=dict(s["breakdown_ms"]),
            gpu_utilization=s["gpu_utilization"],
            peak_memory_bytes=s["peak_memory_bytes"],
            batch_size=batch_size(a),
            unprofiled_ms=None if after is None else after.step_ms,
        )

    @property
    def mean_ms(self) -> float | None:
        return float(self.step_ms.mean()) if len(self.step_ms) else None

    @property
    def samples_per_step(self) -> int | None:
        """Samples one step processes across the ranks; None when the batch size is unknown."""
        return self.batch_size * self.ranks if self.batch_size else None

    @property
    def median_ms(self) -> float | None:
        return float(np.median(self.step_ms)) if len(self.step_ms) else None

    def throughput(self, unit: str) -> float | None:
        m = self.mean_ms
        if not m:
            return None
        return (self.batch_size or 0) / m * 1000.0 if unit == "samples/s" else 1000.0 / m


@dataclass
class Comparison:
    before: Side
    after: Side
    findings: list[FindingChange]
    warnings: list[str] = field(default_factory=list)
    # the resolved findings' fixes replayed together on the before run (None: not replayable)
    replayed_promise_ms: float | None = None

    # --- step time and throughput -------------------------------------------------------
    @property
    def step_change_ms(self) -> float | None:
        b, a = self.before.mean_ms, self.after.mean_ms
        return None if b is None or a is None else a - b

    @property
    def step_change_pct(self) -> float | None:
        d, b = self.step_change_ms, self.before.mean_ms
        return None if d is None or not b else d / b

    @property
    def throughput_unit(self) -> str:
        return "samples/s" if self.before.batch_size and self.after.batch_size else "steps/s"

    @property
    def throughput_change_pct(self) -> float | None:
        b, a = self.before.throughput(self.throughput_unit), self.after.throughput(self.throughput_unit)
        return None if not b or a is None else a / b - 1.0

    @property
    def noise_ms(self) -> float | None:
        """Two standard errors of the difference of mean step times: a change smaller than this
        could be step-to-step variation rather than the fix."""
        b, a = self.before.step_ms, self.after.step_ms
        if len(b) < 2 or len(a) < 2:
            return None
        return 2.0 * math.sqrt(b.var(ddof=1) / len(b) + a.var(ddof=1) / len(a))

    @property
    def significant(self) -> bool | None:
        d, n = self.step_change_ms, self.noise_ms
        return None if d is None or n is None else abs(d) > n

    # --- findings -------------------------------------------------------------------------
    def with_status(self, status: str) -> list[FindingChange]:
        return [f for f in self.findings if f.status == status]

    @property
    def promised_ms(self) -> float:
        """What the resolved findings' fixes would save per step: replayed together on the
        before run, never their sum (fixes overlap); at least the largest of them."""
        largest = max([f.before_ms or 0.0 for f in self.with_status("resolved")], default=0.0)
        return largest if self.replayed_promise_ms is None else max(self.replayed_promise_ms, 0.0)

    @property
    def measured_from_unprofiled(self) -> bool:
        """Both runs timed their steps after the window: the promise (replayed against those
        steps) is checked against them, free of the profiler's own cost."""
        return self.before.unprofiled_ms is not None and self.after.unprofiled_ms is not None

    @property
    def per_sample(self) -> bool:
        """Both runs know their samples per step and they differ: a step of 512 samples is not
        a step of 32, so the promise is judged on time per sample (as `advisor gate` judges)."""
        b, a = self.before.samples_per_step, self.after.samples_per_step
        return bool(b and a and b != a)

    @property
    def after_step_scale(self) -> float:
        """What one after-step's time is multiplied by to cover a before-step's samples."""
        if not self.per_sample:
            return 1.0
        return self.before.samples_per_step / self.after.samples_per_step  # type: ignore[operator]

    def _measured_times(self) -> tuple[float, float] | None:
        """(before, after) step time the measurement compares: the median step after the window
        when both runs timed one, else the mean profiled step."""
        if self.measured_from_unprofiled:
            return float(np.median(self.before.unprofiled_ms)), float(np.median(self.after.unprofiled_ms))
        b, a = self.before.mean_ms, self.after.mean_ms
        return None if b is None or a is None else (b, a)

    @property
    def measured_saving_ms(self) -> float | None:
        """Time saved per before-step: the before step's samples, before against after (per
        sample when the batch changed, otherwise per step)."""
        times = self._measured_times()
        return None if times is None else times[0] - times[1] * self.after_step_scale

    @property
    def realised(self) -> float | None:
        """Measured saving as a share of the promised saving of the resolved findings."""
        m, p = self.measured_saving_ms, self.promised_ms
        return None if m is None or p <= 0 else m / p

    def breakdown_change(self) -> dict[str, tuple[float, float, float]]:
        return {
            c: (self.before.breakdown_ms.get(c, 0.0), self.after.breakdown_ms.get(c, 0.0), self.after.breakdown_ms.get(c, 0.0) - self.before.breakdown_ms.get(c, 0.0))
            for c in CATEGORIES
        }

    def verdict(self) -> str:
        d, p = self.step_change_ms, self.step_change_pct
        if d is None or p is None:
            return "no steps to compare"
        word = "faster" if d < 0 else "slower"
        text = f"{abs(p) * 100:.1f}% {word} per step ({signed(d, 'ms')})"
        if self.significant is False:
            text += ", within the step-to-step noise"
        return text

    def to_dict(self) -> dict[str, Any]:
        unit = self.throughput_unit

        def side(s: Side) -> dict[str, Any]:
            return {
                "run": s.name,
                "source": s.source,
                "device": s.device,
                "ranks": s.ranks,
                "steps": int(len(s.step_ms)),
                "step_time_ms": {"mean": s.mean_ms, "median": s.median_ms},
                "throughput": {"value": s.throughput(unit), "unit": unit},
                "breakdown_ms": s.breakdown_ms,
                "gpu_utilization": s.gpu_utilization,
                "peak_memory_bytes": s.peak_memory_bytes,
                "batch_size": s.batch_size,
            }

        return {
            "schema": DIFF_SCHEMA,
            "advisor_version": __version__,
            "before": side(self.before),
            "after": side(self.after),
            "change": {
                "step_time_ms": self.step_change_ms,
                "step_time_pct": self.step_change_pct,
                "throughput_pct": self.throughput_change_pct,
                "noise_ms": self.noise_ms,
                "significant": self.significant,
                "breakdown_ms": {c: d for c, (_, _, d) in self.breakdown_change().items()},
            },
            "findings": {
                status: [f.to_dict() for f in self.with_status(status)] for status in STATUSES
            },
            "promise": {
                "resolved_saving_ms": self.promised_ms,
                "measured_saving_ms": self.measured_saving_ms,
                "measured_from": ("unprofiled median" if self.measured_from_unprofiled else "window mean") + (" per sample" if self.per_sample else ""),
                "realised": self.realised,
            },
            "warnings": self.warnings,
        }


def compare(before: Analysis, after: Analysis, rule_options: dict[str, dict[str, Any]] | None = None) -> Comparison:
    b_by_rule = {f.rule: f for f in before.findings}
    a_by_rule = {f.rule: f for f in after.findings}
    # Found again but not ranked (the fixes above it take the same time now): not resolved.
    a_considered = {f.rule: f for f in after.considered if f.rule not in a_by_rule}
    changes: list[FindingChange] = []
    for rule, f in b_by_rule.items():
        g = a_by_rule.get(rule) or a_considered.get(rule)
        changes.append(
            FindingChange(
                rule, f.title, "remaining" if g else "resolved",
                f.saving_ms, g.saving_ms if g else None, f.saving_pct, g.saving_pct if g else None,
                g.message if g else f.message,
            )
        )
    # Fired before but not ranked, ranked now: its rank changed, it is not new.
    b_considered = {f.rule: f for f in before.considered if f.rule not in b_by_rule}
    for rule, g in a_by_rule.items():
        if rule in b_considered:
            f = b_considered[rule]
            changes.append(FindingChange(rule, g.title, "remaining", f.saving_ms, g.saving_ms, f.saving_pct, g.saving_pct, g.message))
        elif rule not in b_by_rule:
            changes.append(FindingChange(rule, g.title, "new", None, g.saving_ms, None, g.saving_pct, g.message))
    order = {s: i for i, s in enumerate(STATUSES)}
    changes.sort(key=lambda c: (order[c.status], -((c.before_ms if c.status == "resolved" else c.after_ms) or 0.0)))
    b, a = Side.of(before), Side.of(after)
    warnings = []
    if b.device and a.device and b.device != a.device:
        warnings.append(f"different devices ({b.device} → {a.device}): the change is not only the fix")
    if b.ranks != a.ranks:
        warnings.append(f"different number of ranks ({b.ranks} → {a.ranks})")
    if b.batch_size and a.batch_size and b.batch_size != a.batch_size:
        warnings.append(f"different batch sizes ({b.batch_size} → {a.batch_size}): compare throughput, not step time")
    if min(len(b.step_ms), len(a.step_ms)) < 3:
        warnings.append("fewer than 3 steps in a run: the change may be noise; profile more steps")
    resolved = [c.rule for c in changes if c.status == "resolved" and c.before_ms]
    together = before.replayed_saving(resolved, rule_options) if len(resolved) > 1 else None
    return Comparison(b, a, changes, warnings, together)


# --- JSON ---------------------------------------------------------------------------------
def diff_json(c: Comparison) -> str:
    return to_json_text(c.to_dict())


# --- shared wording -----------------------------------------------------------------------
def _num(x: float | None, digits: int = 2) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x:.{digits}f}"


def _saving(ms_: float | None, share: float | None) -> str:
    if ms_ is None:
        return "—"
    return f"{ms_:.2f} ms" + (f" ({pct(share)})" if share is not None else "")


def promise_sentence(c: Comparison) -> str | None:
    resolved = c.with_status("resolved")
    if not resolved:
        return None
    names = ", ".join(f.rule for f in resolved)
    m = c.measured_saving_ms
    if m is None:
        return f"Resolved {names}: promised {c.promised_ms:.2f} ms per step; no steps to measure."
    share = f" ({c.realised * 100:.0f}% of the promise)" if c.realised is not None and m > 0 else ""
    what = "the median step after the profiled window" if c.measured_from_unprofiled else "the mean step"
    if c.per_sample:
        b_n, a_n = c.before.samples_per_step, c.after.samples_per_step
        b, a = c._measured_times()  # type: ignore[misc]
        moved = f"{m:.2f} ms less" if m >= 0 else f"{-m:.2f} ms more"
        return (
            f"Resolved {names}: promised {c.promised_ms:.2f} ms per step; judged per sample ({b_n} → {a_n} samples per step, "
            f"from {what}): {b / b_n:.3f} → {a / a_n:.3f} ms per sample, {moved} for a step of {b_n} samples{share}.{movers_sentence(c)}"
        )
    moved = f"fell by {m:.2f} ms" if m >= 0 else f"rose by {-m:.2f} ms"
    return f"Resolved {names}: promised {c.promised_ms:.2f} ms per step; {what} {moved}{share}.{movers_sentence(c)}"


def movers_sentence(c: Comparison, min_ms: float = 1.0) -> str:
    """Which slices of the step moved: the largest drop, and what rose against it."""
    changes = sorted(((d, k) for k, (_, _, d) in c.breakdown_change().items()), key=lambda t: t[0])
    if not changes or changes[0][0] > -min_ms:
        return ""
    drop, key = changes[0]
    text = f" Largest drop: {svg.CATEGORY_LABELS[key]} {drop:+.2f} ms"
    rises = [f"{svg.CATEGORY_LABELS[k]} {d:+.2f}" for d, k in reversed(changes) if d >= min_ms]
    if rises:
        text += "; offset by " + ", ".join(rises) + " ms"
    return text + "."


def _breakdown_lines(c: Comparison) -> list[tuple[str, float, float, float]]:
    return [(svg.CATEGORY_LABELS[k], b, a, d) for k, (b, a, d) in c.breakdown_change().items() if b > 0.005 or a > 0.005]


# --- text ---------------------------------------------------------------------------------
def render_diff_text(c: Comparison, console: Console, notes: Console | None = None) -> None:
    b, a = c.before, c.after
    unit = c.throughput_unit
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    head.add_row("Before", Text(one_line(f"{b.name}  ({b.source})")))
    head.add_row("After", Text(one_line(f"{a.name}  ({a.source})")))
    d = c.step_change_ms
    style = "green" if d is not None and d < 0 else "red" if d is not None and d > 0 else ""
    head.add_row("Step time", Text.assemble(f"{_num(b.mean_ms)} ms → {_num(a.mean_ms)} ms mean  ", (c.verdict(), style)))
    head.add_row("", Text(f"median {_num(b.median_ms)} → {_num(a.median_ms)} ms" + (f"; noise ±{c.noise_ms:.2f} ms" if c.noise_ms is not None else "")))
    tb, ta = b.throughput(unit), a.throughput(unit)
    if tb and ta:
        head.add_row("Throughput", Text(f"{rate(tb)} → {rate(ta)} {unit}, from the mean step  ({signed(100 * (c.throughput_change_pct or 0), '%', 1)})"))
    if b.gpu_utilization is not None or a.gpu_utilization is not None:
        head.add_row("GPU utilisation", Text(f"{pct(b.gpu_utilization)} → {pct(a.gpu_utilization)}"))
    if b.peak_memory_bytes is not None or a.peak_memory_bytes is not None:
        head.add_row("Peak memory", Text(f"{fmt_bytes(b.peak_memory_bytes)} → {fmt_bytes(a.peak_memory_bytes)}"))
    console.print(head)
    console.print()
    t = Table(title="Step-time breakdown (mean ms per step)", title_justify="left", show_edge=False)
    for col in ("category", "before", "after", "change"):
        t.add_column(col, justify="left" if col == "category" else "right")
    for name, bv, av, dv in _breakdown_lines(c):
        t.add_row(name, f"{bv:.2f}", f"{av:.2f}", Text(signed(dv), style="green" if dv < -0.005 else "red" if dv > 0.005 else ""))
    console.print(t)
    console.print()
    ft = Table(title="Findings", title_justify="left", show_edge=False)
    for col in ("status", "rule", "saving before", "saving after"):
        ft.add_column(col, justify="right" if "saving" in col else "left")
    styles = {"resolved": "green", "new": "red", "remaining": "yellow"}
    for f in c.findings:
        ft.add_row(Text(f.status, style=styles[f.status]), Text(one_line(f.rule)), _saving(f.before_ms, f.before_pct), _saving(f.after_ms, f.after_pct))
    if c.findings:
        console.print(ft)
    else:
        console.print(Text("Findings: none before, none after"))
    sentence = promise_sentence(c)
    if sentence:
        console.print()
        console.print(Text(one_line(sentence), style="bold"))
    for w in c.warnings:
        (notes or console).print(Text(one_line(f"warning: {w}"), style="yellow"))


# --- Markdown -----------------------------------------------------------------------------
def diff_markdown(c: Comparison) -> str:
    b, a = c.before, c.after
    unit = c.throughput_unit
    out = [f"### advisor diff: {md(b.name)} → {md(a.name)}", "", f"**{md(c.verdict())}**", ""]
    out += ["| | before | after | change |", "|---|--:|--:|--:|"]
    out.append(f"| step time, mean | {_num(b.mean_ms)} ms | {_num(a.mean_ms)} ms | {signed(c.step_change_ms, 'ms')} ({signed(100 * c.step_change_pct, '%', 1) if c.step_change_pct is not None else 'n/a'}) |")
    out.append(f"| step time, median | {_num(b.median_ms)} ms | {_num(a.median_ms)} ms | {signed((a.median_ms or 0) - (b.median_ms or 0), 'ms') if a.median_ms is not None and b.median_ms is not None else 'n/a'} |")
    tb, ta = b.throughput(unit), a.throughput(unit)
    if tb and ta:
        out.append(f"| throughput (mean step) | {rate(tb)} {unit} | {rate(ta)} {unit} | {signed(100 * (c.throughput_change_pct or 0), '%', 1)} |")
    if b.gpu_utilization is not None or a.gpu_utilization is not None:
        out.append(f"| GPU utilisation | {pct(b.gpu_utilization)} | {pct(a.gpu_utilization)} | |")
    for name, bv, av, dv in _breakdown_lines(c):
        out.append(f"| {md(name)} ms/step | {bv:.2f} | {av:.2f} | {signed(dv)} |")
    out.append("")
    if c.findings:
        out += ["| finding | status | saving before | saving after |", "|---|---|--:|--:|"]
        for f in c.findings:
            out.append(f"| {md(f.rule)} | {f.status} | {_saving(f.before_ms, f.before_pct)} | {_saving(f.after_ms, f.after_pct)} |")
        out.append("")
    sentence = promise_sentence(c)
    if sentence:
        out += [md(sentence), ""]
    if c.noise_ms is not None:
        out += [f"Step-to-step noise: ±{c.noise_ms:.2f} ms (two standard errors of the difference).", ""]
    for w in c.warnings:
        out.append(f"> warning: {md(w)}")
    return "\n".join(out).rstrip() + "\n"


# --- HTML ---------------------------------------------------------------------------------
def diff_html(c: Comparison) -> str:
    from advisor.render.html import (
        Column,
        breakdown_segments,
        page,
        sortable_table,
        tile,
    )

    b, a = c.before, c.after
    unit = c.throughput_unit
    d, p = c.step_change_ms, c.step_change_pct
    cls = "down" if d is not None and d < 0 else "up"
    body = [
        f'<h1>Did it get faster? <span class="mono">{esc(b.name)}</span> → <span class="mono">{esc(a.name)}</span></h1>',
        f'<p class="sub">before: {esc(b.source)} · after: {esc(a.source)}</p>',
        '<div class="tiles">',
        tile("Step time (mean)", f"{_num(a.mean_ms)} ms", f"was {_num(b.mean_ms)} ms"),
        f'<div class="tile"><div class="k">Change per step</div><div class="v {cls}">{esc(signed(d, "ms"))}</div><div class="d">{esc(signed(100 * p, "%", 1) if p is not None else "n/a")}'
        + (f" · noise ±{c.noise_ms:.2f} ms" if c.noise_ms is not None else "")
        + "</div></div>",
    ]
    tb, ta = b.throughput(unit), a.throughput(unit)
    if tb and ta:
        body.append(tile("Throughput", f"{rate(ta)} {unit}", f"was {rate(tb)} ({signed(100 * (c.throughput_change_pct or 0), '%', 1)}), from the mean step"))
    if b.gpu_utilization is not None or a.gpu_utilization is not None:
        body.append(tile("GPU utilisation", pct(a.gpu_utilization), f"was {pct(b.gpu_utilization)}"))
    if c.with_status("resolved"):
        body.append(tile("Promised (resolved fixes, replayed together)", f"{c.promised_ms:.2f} ms", f"measured: {_num(c.measured_saving_ms)} ms" + (f" ({c.realised * 100:.0f}%)" if c.realised is not None else "")))
    body.append("</div>")
    body.append(f"<p><strong>{esc(c.verdict())}</strong></p>")
    sentence = promise_sentence(c)
    if sentence:
        body.append(f"<p>{esc(sentence)}</p>")
        promised, measured = c.promised_ms, max(c.measured_saving_ms or 0.0, 0.0)
        scale = max(promised, measured) or 1.0
        body.append('<div class="promise">')
        body.append(f'<div class="muted">promised: {promised:.2f} ms/step</div>' + svg.stacked_hbar([svg.Segment("before", promised, f"promised {promised:.2f} ms/step")], total=scale, height=18, label="promised saving"))
        body.append(f'<div class="muted">measured: {measured:.2f} ms/step</div>' + svg.stacked_hbar([svg.Segment("after", measured, f"measured {measured:.2f} ms/step")], total=scale, height=18, label="measured saving"))
        body.append("</div>")
    body.append('<h2 id="breakdown">Step-time breakdown, before and after</h2><p class="muted">Both bars on one scale: the longer mean step.</p>')
    longest = max(sum(b.breakdown_ms.values()), sum(a.breakdown_ms.values())) or 1.0
    for label, s in (("before", b), ("after", a)):
        body.append(f'<div class="muted">{label}: {sum(s.breakdown_ms.values()):.2f} ms</div>')
        body.append(svg.stacked_hbar(breakdown_segments(s.breakdown_ms), total=longest, height=24, label=f"{label} breakdown"))
    used = [k for k in CATEGORIES if b.breakdown_ms.get(k, 0) > 0 or a.breakdown_ms.get(k, 0) > 0]
    body.append(svg.legend(used))
    cols = [Column("category", nowrap=True), Column("before ms", True), Column("after ms", True), Column("change ms", True)]
    rows = [[(n, None), (f"{bv:.2f}", bv), (f"{av:.2f}", av), (signed(dv), dv)] for n, bv, av, dv in _breakdown_lines(c)]
    body.append(sortable_table(cols, rows))
    body.append('<h2 id="findings">Findings</h2>')
    if c.findings:
        cols = [Column("status", nowrap=True), Column("rule", nowrap=True), Column("saving before (ms/step)", True), Column("saving after (ms/step)", True), Column("finding")]
        rows = [
            [(f.status, None), (f.rule, None), (_saving(f.before_ms, f.before_pct), f.before_ms), (_saving(f.after_ms, f.after_pct), f.after_ms), (f.message, None)]
            for f in c.findings
        ]
        body.append(sortable_table(cols, rows))
    else:
        body.append("<p>No findings before or after.</p>")
    if c.warnings:
        body.append("".join(f'<p class="warn">warning: {esc(w)}</p>' for w in c.warnings))
    body.append(f"<footer>advisor {esc(__version__)} · diff schema {DIFF_SCHEMA}</footer>")
    return page(f"advisor diff: {b.name} → {a.name}", "".join(body))


def render_diff(c: Comparison, fmt: str, console: Console | None = None, notes: Console | None = None) -> str | None:
    """The comparison in a format (text goes to the console, its warnings to NOTES when given,
    and returns None)."""
    if fmt == "json":
        return diff_json(c)
    if fmt == "markdown":
        return diff_markdown(c)
    if fmt == "html":
        return diff_html(c)
    render_diff_text(c, console or inert_console(highlight=False), notes)
    return None


__all__ = ["Comparison", "FindingChange", "compare", "diff_json", "diff_markdown", "diff_html", "render_diff_text", "render_diff"]
