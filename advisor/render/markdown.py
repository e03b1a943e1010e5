"""The Markdown report: short enough for a pull-request comment or a CI step summary.

One headline, one line of figures, one line of breakdown, the findings table; fixes fold
away in `<details>` blocks. `verbose` adds each finding's evidence, the top kernels and the
per-rank table. Strings from a trace are Markdown-escaped (`md`) in text and HTML-escaped
(`esc`) inside the raw `<summary>` tags, so a kernel name can never become markup.
"""

from __future__ import annotations

from advisor.analysis import Analysis
from advisor.engine import Finding
from advisor.metrics.breakdown import CATEGORIES
from advisor.metrics.kernels import top_kernels
from advisor.metrics.summary import device_idle, device_ran_no_kernel
from advisor.render.fmt import (
    esc,
    finding_rank,
    fmt_bytes,
    md,
    md_code_block,
    order_note,
    pct,
    saved_text,
    rate,
    saving_note,
    short_value,
    throughput,
)
from advisor.render.svg import CATEGORY_LABELS

# GitHub refuses comments over 65,536 characters; stay well below it.
MAX_CHARS = 60_000


def _headline(a: Analysis) -> list[str]:
    s = a.summary()
    st = s["step_time_ms"]
    m = a.primary
    replayed = a.headline()
    noisy = a.noisy_caveat()
    step = f"{st['mean']:.2f} ms/step (mean)" if st["mean"] is not None else "no steps"
    if noisy and st["mean"] is not None:
        step = f"{st['mean']:.2f} ms/step (mean; {md(noisy)})"
    could = ""
    if a.findings and replayed is not None and replayed.all_fixes_ms is not None:
        # the replay against the replay: the same statistic on both sides (never the mean step)
        saved = replayed.all_fixes_saving_ms or 0.0
        could = (
            f" — {len(a.findings)} finding{'s' if len(a.findings) != 1 else ''}; the replayed {replayed.statistic} step "
            f"{replayed.baseline_ms:.2f} ms, with the fixes replayed together {replayed.all_fixes_ms:.2f} ms ({saved_text(saved, replayed.baseline_ms)})"
        )
    out = [f"### advisor: {md(a.run.name)} — {step}{could}", ""]
    facts = []
    if m.device.name:
        facts.append(f"**{md(m.device.name)}**" + (" (listed; ran nothing: read as a CPU run)" if device_idle(m) else device_ran_no_kernel(m)))
    elif not m.has_device:
        facts.append("**CPU only**")
    if len(a.ranks) > 1:
        facts.append(f"{len(a.ranks)} ranks (figures of rank {m.rank}, the slowest; each finding names its rank)")
    if st["mean"] is not None:
        facts.append(f"{s['steps']} steps: mean {st['mean']:.2f} ms (median {st['median']:.2f}, p90 {st['p90']:.2f})")
    if s["projected"] is not None and s["projected"]["step_time_ms"]["mean"] is not None:
        facts.append(f"{s['projected']['step_time_ms']['mean']:.2f} ms/step without one-time work (a projection: the replay and savings in ms are of it, their shares of the measured step)")
    if replayed is not None:
        facts.append(f"replayed {replayed.baseline_ms:.2f} ms")
    tp = throughput(a)
    if tp:
        facts.append(f"{rate(tp[0])} {tp[1]}")
    if m.has_device:
        facts.append(f"{m.device.short_kind} busy {pct(s['gpu_utilization'])}")
        if m.device.matrix_units and s["tensor_core_kernel_share"] is not None:
            facts.append(f"{m.device.matrix_units} {pct(s['tensor_core_kernel_share'])} of kernel time")
        if s["peak_memory_bytes"] is not None:
            facts.append(f"peak memory {fmt_bytes(s['peak_memory_bytes'])}")
    out += [" · ".join(facts), ""]
    bd = s["breakdown_ms"]
    total = sum(bd.values()) or 1.0
    parts = [f"{CATEGORY_LABELS[c]} {bd[c]:.1f} ms ({100 * bd[c] / total:.0f}%)" for c in sorted(CATEGORIES, key=lambda c: -bd[c]) if bd[c] / total >= 0.005]
    if parts:
        out += ["**Where the step goes:** " + " · ".join(parts), ""]
    return out


def _considered(a: Analysis) -> list[str]:
    """The findings whose fix gains nothing on this run: not ranked, each with its reason."""
    if not a.considered:
        return []
    return ["**Considered, not ranked**", "", *(f"- {md(f.rule)}: {md(f.no_gain or '')}" for f in a.considered), ""]


def _findings(a: Analysis, verbose: bool, details: bool = True) -> list[str]:
    if not a.findings:
        return ["No findings: no rule fired on this run." if not a.considered else "No findings: no fix gains time on this run.", "", *_considered(a)]
    out = ["| # | rule | saving/step | finding |", "|--:|---|--:|---|"]
    for i, f in enumerate(a.findings, 1):
        saving = "risk" if f.saving_ms is None else f"{f.saving_ms:.2f} ms ({pct(f.saving_pct)}){saving_note(f)}"
        where = finding_rank(a, f)
        order = order_note(a.findings, i - 1)
        saving += f" ({md(order)})" if order else ""
        out.append(f"| {i} | {md(f.rule)}{' (' + md(where) + ')' if where else ''} | {saving} | {md(f.message)} |")
    out.append("")
    out += _considered(a)
    if not details:
        return out + ["Fixes: `advisor report -v` or `--format html`.", ""]
    for i, f in enumerate(a.findings, 1):
        body = _details_body(f, verbose)
        if body:
            out += [f"<details><summary>#{i} {esc(f.rule)}: how to fix</summary>", "", *body, "", "</details>", ""]
    return out


def _details_body(f: Finding, verbose: bool) -> list[str]:
    body: list[str] = []
    if f.fix.text:
        body += [md(f.fix.text), ""]
    if f.fix.snippet:
        body += [md_code_block(f.fix.snippet.strip("\n"), "python"), ""]
    if verbose and f.evidence:
        body += [f"- {md(k)}: {md(short_value(v))}" for k, v in f.evidence.items()]
        body.append("")
    if verbose:
        body.append(f"Confidence {md(f.confidence)}; `advisor explain {md(f.rule)}` gives the method.")
    while body and not body[-1]:
        body.pop()
    return body


def _kernels(a: Analysis, n: int = 5) -> list[str]:
    k = top_kernels(a.primary.kernels, n)
    if len(k) == 0:
        return []
    out = ["**Top kernels**", "", "| kernel | calls | total ms | share | Tensor Cores |", "|---|--:|--:|--:|:-:|"]
    for r in k.itertuples():
        name = str(r.name)
        name = name if len(name) <= 120 else name[:119] + "…"
        out.append(f"| {md(name)} | {r.count} | {r.total_ns / 1e6:.2f} | {100 * r.share:.1f}% | {'yes' if r.tensor_core else 'no'}{f' ({r.precision})' if r.precision else ''} |")
    return out + [""]


def _ranks(a: Analysis) -> list[str]:
    out = ["**Ranks**", "", "| rank | steps | mean ms | GPU busy | DataLoader ms | communication ms |", "|--:|--:|--:|--:|--:|--:|"]
    for m in a.ranks:
        s = m.summary()
        mean = s["step_time_ms"]["mean"]
        out.append(
            f"| {m.rank} | {s['steps']} | {mean:.2f} | {pct(s['gpu_utilization'])} | {s['breakdown_ms']['dataloader']:.2f} | {s['breakdown_ms']['communication']:.2f} |"
            if mean is not None
            else f"| {m.rank} | 0 | n/a | n/a | n/a | n/a |"
        )
    return out + [""]


def to_markdown(analysis: Analysis, verbose: bool = False) -> str:
    a = analysis
    for details in (True, False):
        out = _headline(a) + _findings(a, verbose, details)
        if verbose:
            out += _kernels(a)
            if len(a.ranks) > 1:
                out += _ranks(a)
            out += [f"- note: {md(n)}" for n in a.notes()]
        out += [f"> warning: {md(w)}" for w in a.warnings]
        text = "\n".join(out).rstrip() + "\n"
        if len(text) <= MAX_CHARS:
            return text
    # Still too long without the fixes: whole lines only, so no table row or block is cut.
    cut = text.rfind("\n", 0, MAX_CHARS - 200)
    return text[:cut] + "\n\n*(shortened to fit a comment; `advisor report --format html` has everything)*\n"
