"""What a reader of the ranking relies on, checked on every real trace the tests can reach.

Every public trace (../shared/traces, its misc/ and corpus/) and every recording of this
project (sample_runs/, tests/data/*/runs) is analysed once (`tests/corpus.py`), and its report
must hold together:

- no sentence states a part of a step larger than the step ("X of the Y ms step", X > Y);
- every share is the finding's saving against the measured step (the unprofiled steps'
  median where recorded, else the window's), never against the profiler-corrected replay;
- no ranked finding saves under 0.5% of the step;
- a fix that alone saves at least 10% of the step is ranked, or says what it saves once the
  fixes ranked above it are in;
- `saving_alone_ms` is a number on every finding, ranked or considered;
- the text, JSON, Markdown and HTML reports, rendered from one analysis, rank the same
  findings in the same order with the same savings.
"""

from __future__ import annotations

import html as html_lib
import io
import json
import re

import pytest
from conftest import check_invariant_minimum
from corpus import analysis_of, own_runs, public_traces
from rich.console import Console

from advisor.engine import find_loaded_rule
from advisor.render.html import to_html
from advisor.render.json_report import to_json
from advisor.render.markdown import to_markdown
from advisor.render.text import render_text

RUNS = [pytest.param(n, id=n) for n in public_traces()] + [pytest.param(n, id=n) for n in own_runs()]

# On how many traces each invariant must reach its assertion: (with ../shared/traces, without
# it), counted when the counts were introduced (73 traces with it, 30 without); a trace it does not apply to (no finding of
# the kind it checks) is a skip that says why, and the run's summary prints the counts.
MINIMUM: dict[str, tuple[int, int]] = {
    "part-of-step": (33, 21),
    "share-of-measured-step": (48, 28),
    "half-a-percent": (48, 28),
    "tenth-alone": (9, 5),
    "saving-alone-number": (49, 28),
    "formats-agree": (73, 30),
    "recipe-change": (17, 10),
    "dependents-below": (7, 4),
    "messages-leave-savings": (48, 28),
}


def invariant(name: str):
    return pytest.mark.invariant(name, minimum=MINIMUM[name][0], minimum_own=MINIMUM[name][1])


def asserted_on(n: int, what: str) -> None:
    """Skips, saying why, where the invariant's assertion ran on nothing of this trace."""
    if n == 0:
        pytest.skip(f"not applicable: {what}")

# "91.7 of 57.1 ms", "100.6 ms of the 121.6 ms replayed step", "59.3 ms of each 177.6 ms step"
PART_OF_STEP = re.compile(r"(\d+(?:\.\d+)?)(?: ms)? of (?:the|each) (\d+(?:\.\d+)?) ms(?: replayed)? step")


def _steps_ms(a) -> dict[int | None, float]:
    """Each rank's measured step (the unprofiled median where recorded, else the window's
    median), from the what-if summaries; a rank without a replay: its mean window step."""
    out: dict[int | None, float] = {}
    for w in a.whatif:
        out[w.rank] = w.unprofiled_ms if w.unprofiled_ms is not None else w.measured_ms
    return out


def _step_of(a, f) -> float | None:
    steps = _steps_ms(a)
    if f.rank in steps:
        return steps[f.rank]
    if None in steps:
        return steps[None]
    if len(steps) == 1:
        return next(iter(steps.values()))
    return None


@invariant("part-of-step")
@pytest.mark.parametrize("name", RUNS)
def test_no_part_of_a_step_is_larger_than_the_step(name):
    a = analysis_of(name)
    checked = 0
    for f in [*a.findings, *a.considered]:
        for part, whole in PART_OF_STEP.findall(f.message + " " + (f.no_gain or "")):
            # the figures are printed to 0.1 ms: equal after rounding is not larger
            assert float(part) <= float(whole) + 0.05, f"{f.rule}: {part} of {whole} ms in: {f.message}"
            checked += 1
    asserted_on(checked, "no sentence states a part of a step")


@invariant("share-of-measured-step")
@pytest.mark.parametrize("name", RUNS)
def test_every_share_is_of_the_measured_step(name):
    a = analysis_of(name)
    checked = 0
    replayed = {w.rank for w in a.whatif if w.fixes or w.savings}
    for f in a.findings:
        if f.saving_ms is None or f.saving_pct is None or f.rank not in replayed and len(a.whatif) != 1:
            continue
        step = _step_of(a, f)
        if step is None or not a.whatif:
            continue
        rule = find_loaded_rule(f.rule)
        if isinstance(f.evidence.get("unprofiled_step_ms"), (int, float)) and "estimate_ms" not in f.evidence:
            # measured by its rule on the unprofiled steps (their mean), not on the window
            step = f.evidence["unprofiled_step_ms"]
        elif rule is not None and rule.scope == "job":
            # a finding about the job (a straggler): of the job's step, its slowest rank's
            step = max(m.mean_step_ns for m in a.ranks) / 1e6
        assert f.saving_pct == pytest.approx(f.saving_ms / step, rel=1e-6, abs=1e-9), f"{f.rule}: {f.saving_pct} of a {step} ms step"
        checked += 1
    asserted_on(checked, "no ranked finding with a share of a replayed step")


@invariant("half-a-percent")
@pytest.mark.parametrize("name", RUNS)
def test_no_ranked_finding_saves_under_half_a_percent_of_the_step(name):
    a = analysis_of(name)
    timed = [f for f in a.findings if f.saving_ms is not None]  # not a risk with no time cost yet (an OOM ahead)
    asserted_on(len(timed), "no ranked finding with a saving")
    for f in timed:
        assert f.saving_pct is not None and f.saving_pct >= 0.005 - 1e-9, f"{f.rule} ranked at {f.saving_ms:.3f} ms/step ({f.saving_pct})"


@invariant("tenth-alone")
@pytest.mark.parametrize("name", RUNS)
def test_a_fix_worth_a_tenth_of_the_step_alone_is_ranked_or_says_what_it_saves_after_others(name):
    a = analysis_of(name)
    ranked = {f.rule for f in a.findings}
    checked = 0
    for f in a.considered:
        step = _step_of(a, f)
        alone = f.saving_alone_ms or 0.0
        if step is None or alone < 0.10 * step or f.rule in ranked:
            continue
        assert "ranked above it" in (f.no_gain or ""), f"{f.rule} saves {alone:.2f} ms alone of {step:.2f} and is not ranked: {f.no_gain}"
        checked += 1
    asserted_on(checked, "no finding left unranked saves a tenth of the step alone")


@invariant("saving-alone-number")
@pytest.mark.parametrize("name", RUNS)
def test_saving_alone_is_always_a_number(name):
    doc = json.loads(to_json(analysis_of(name)))
    asserted_on(len(doc["findings"]) + len(doc["considered"]), "no finding, ranked or considered")
    for f in [*doc["findings"], *doc["considered"]]:
        assert isinstance(f["saving_alone_ms"], (int, float)) and not isinstance(f["saving_alone_ms"], bool), f"{f['rule']}: {f['saving_alone_ms']!r}"


def _text_savings(a) -> list[tuple[str, str]]:
    buf = io.StringIO()
    render_text(a, Console(file=buf, width=400, color_system=None, force_terminal=False), verbose=False)
    text = buf.getvalue()
    body = text.split("Findings, ranked by time saved per step", 1)[1].split("Considered, not ranked", 1)[0]
    return re.findall(r"^\s*\d+\. (\S+)\s+(\d+\.\d\d) ms/step", body, flags=re.M)


def _markdown_savings(a) -> list[tuple[str, str]]:
    return re.findall(r"^\| \d+ \| ([^ |]+)[^|]*\| (\d+\.\d\d) ms ", to_markdown(a), flags=re.M)


def _html_savings(a) -> list[tuple[str, str]]:
    page = to_html(a)
    return [(html_lib.unescape(r), s) for r, s in re.findall(r'<span class="rule"><code>([^<]+)</code></span>.*?<span class="saving">(\d+\.\d\d) ms/step', page)]


@invariant("formats-agree")
@pytest.mark.parametrize("name", RUNS)
def test_text_json_markdown_and_html_rank_the_same_savings(name):
    a = analysis_of(name)
    doc = json.loads(to_json(a))
    timed = [f for f in doc["findings"] if f["saving_ms"] is not None]
    # (with no ranked finding too: every format then shows none)
    from_json = [(f["rule"], f"{f['saving_ms']:.2f}") for f in timed]
    assert _text_savings(a) == from_json
    assert _html_savings(a) == from_json
    md = _markdown_savings(a)
    # the Markdown report is cut to fit a PR comment: what it shows is the same, in order
    assert md == from_json[: len(md)]
    # the headline's step with every fix is the step less the ranked replayed savings (one
    # rank: with several, each rule's finding is its worst rank's, not one rank's sum)
    for w in a.whatif if len(a.whatif) == 1 else ():
        if w.all_fixes_ms is None:
            continue
        mine = [f for f in a.findings if f.rank in (w.rank, None) and f.rule in w.fixes and f.saving_ms is not None]
        assert w.baseline_ms - sum(f.saving_ms for f in mine) == pytest.approx(w.all_fixes_ms, abs=0.05 + 0.01 * w.baseline_ms)


@invariant("recipe-change")
@pytest.mark.parametrize("name", RUNS)
def test_a_recipe_change_says_it_changes_what_is_trained_or_served(name):
    a = analysis_of(name)
    recipe = [f for f in [*a.findings, *a.considered] if f.rule in ("spare-gpu-memory", "tensor-cores-unused")]
    asserted_on(len(recipe), "no finding that changes the recipe (spare-gpu-memory, tensor-cores-unused)")
    for f in recipe:
        text = f.message + " " + f.fix.text
        if f.rule == "spare-gpu-memory":
            if f.evidence.get("mode") == "inference":
                # serving: batching requests, and the latency each one pays; no optimizer
                assert "learning rate" not in text and "latency" in text, text
            else:
                assert "changes what is trained" in f.message, f.message
        elif f.rule == "tensor-cores-unused":
            assert "changes the numerics" in f.message, f.message
        elif f.rule == "fp8-gemm":
            assert "change to the numerics" in f.message and f.evidence["changes_numerics"] is True, f.message


def test_v100_without_workers_ranks_the_loader_then_autocast_once_it_is_exposed():
    a = analysis_of("v100_resnet50_nw0")
    ranked = [f.rule for f in a.findings]
    assert ranked[0] == "dataloader-stall"
    tc = next(f for f in a.findings if f.rule == "tensor-cores-unused")
    # 68% of kernel time is fp32 convolution work (MANIFEST.md): once the loader's fix exposes
    # it, autocast saves a real share of the step, and says which fixes it waits for
    assert tc.saving_ms > 0.05 * a.headline().measured_ms
    assert ranked.index("tensor-cores-unused") > ranked.index("dataloader-stall")
    assert "dataloader-stall" in tc.evidence["depends_on"] and "on top of the fixes ranked above it" in tc.message
    # the casts' host cost is an op that launches one kernel on this host, not a DataLoader copy
    assert tc.evidence["autocast_casts"]["host_cost_per_cast_us"]["copy_op"] < 50


def test_a_recurring_dataloader_stall_is_the_loaders_finding_with_its_share_of_steps():
    # Our own CPU recording (bf16 inference, num_workers=0): two of its five steps wait several
    # ms for their batch, the others almost nothing. That is the DataLoader's finding, with the
    # steps it hits, and no "look at the slow steps" variance finding above it.
    import numpy as np

    a = analysis_of("tests/data/cpu_inference_grad/runs/batch256_bf16").with_primary_frames()
    m = a.primary
    wait = m.breakdown["dataloader"].to_numpy(np.float64) / 1e6
    hit = wait > 0.2 * float(np.median(m.step_ms))
    assert 0 < hit.sum() < len(wait)  # recurring, not every step
    ranked = [f.rule for f in a.findings]
    stall = next(f for f in a.findings if f.rule == "dataloader-stall")
    assert stall.evidence["stalled_steps"] == int(hit.sum())
    assert f"{int(hit.sum())} of {len(wait)} steps" in stall.message
    assert "step-time-variance" not in ranked[: ranked.index("dataloader-stall")]
    # throughput is the mean step: the replay prices it on the mean
    assert a.headline().statistic == "mean"


@invariant("dependents-below")
@pytest.mark.parametrize("name", RUNS)
def test_a_fix_saving_on_top_of_others_is_listed_below_them(name):
    """"Each on top of the fixes above it": a ranked fix whose saving depends on others (it
    gains nothing alone) comes after every one of them, whatever the savings compare."""
    ranked = [f.rule for f in analysis_of(name).findings]
    pairs = [(i, f, dep) for i, f in enumerate(analysis_of(name).findings) for dep in f.evidence.get("depends_on") or () if dep in ranked]
    asserted_on(len(pairs), "no ranked fix depends on another")
    for i, f, dep in pairs:
        assert ranked.index(dep) < i, (f.rule, dep, ranked)


@invariant("messages-leave-savings")
@pytest.mark.parametrize("name", RUNS)
def test_messages_leave_the_savings_to_the_reports(name):
    """A rule's message says what it found and what the fix does, never the saving: the text
    report prints the ranked saving, the saving alone where it differs, and the rule's estimate
    (`evidence.estimate_ms`) where the replay alone is outside [½×, 2×] of it."""
    a = analysis_of(name)
    buf = io.StringIO()
    render_text(a, Console(file=buf, width=400, color_system=None, force_terminal=False), verbose=False)
    text = buf.getvalue()
    timed = [f for f in a.findings if f.saving_ms is not None]
    asserted_on(len(timed), "no ranked finding with a saving")
    for f in timed:
        for figure in {f.saving_ms, f.saving_alone_ms} - {None}:
            if figure > 0:
                assert f"~{figure:.2f} ms" not in f.message, (f.rule, figure, f.message)
        line = re.search(rf"^\s*\d+\. {re.escape(f.rule)}\s+{f.saving_ms:.2f} ms/step \([^)]*\)(.*)$", text, flags=re.M)
        assert line is not None, (f.rule, f.saving_ms)
        note = line.group(1)
        alone = f.saving_alone_ms if f.saving_alone_ms is not None else f.saving_ms
        assert (f"alone {alone:.2f}" in note) == (abs(alone - f.saving_ms) >= 0.005), (f.rule, note)
        estimate = f.evidence.get("estimate_ms")
        departs = estimate is not None and not (0.5 * estimate <= alone <= 2.0 * estimate)
        assert (f"rule's estimate {estimate:.2f}" in note) == departs if estimate is not None else "estimate" not in note, (f.rule, note)


# --- each invariant asserted on enough traces (runs last: every case of the file before it) ----
@pytest.mark.parametrize("invariant_name", sorted(MINIMUM))
def test_each_invariant_asserted_on_its_minimum_of_traces(invariant_name):
    check_invariant_minimum(invariant_name)
