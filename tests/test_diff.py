"""`advisor diff`: did the fix do what the advisor promised?

The V100 ResNet-50 pair differs in one change, DataLoader(num_workers=0) → 4. The expected
figures are the TensorBoard plugin's (ANCHORS.md): mean step 177.59 → 141.07 ms (-20.6%; -20.9% to conftest.NW4_MEAN_MS),
DataLoader 59.26 → 1.19 ms per step.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import NW4_MEAN_MS
from trace_edit import trace_path

from advisor.analysis import analyze
from advisor.render.diff import compare, diff_html, diff_json, diff_markdown


@pytest.fixture(scope="module")
def pair():
    return analyze(trace_path("v100_resnet50_nw0")), analyze(trace_path("v100_resnet50_nw4"))


@pytest.fixture(scope="module")
def comparison(pair):
    return compare(*pair)


def test_step_time_drop_and_dataloader_stall_resolved(comparison, pair):
    c = comparison
    assert c.before.mean_ms == pytest.approx(177.59, abs=0.01)
    assert c.after.mean_ms == pytest.approx(NW4_MEAN_MS, abs=0.01)
    assert c.step_change_pct == pytest.approx(NW4_MEAN_MS / 177.59 - 1, abs=1e-4)  # about -21%
    assert c.throughput_unit == "steps/s"  # no facts file: no batch size
    assert c.throughput_change_pct == pytest.approx(177.59 / NW4_MEAN_MS - 1, abs=1e-3)
    assert c.significant is True
    status = {f.rule: f.status for f in c.findings}
    assert status["dataloader-stall"] == "resolved"
    stall = next(f for f in c.findings if f.rule == "dataloader-stall")
    before_finding = next(f for f in pair[0].findings if f.rule == "dataloader-stall")
    assert stall.before_ms == before_finding.saving_ms and stall.after_ms is None
    dl_before, dl_after, dl_change = c.breakdown_change()["dataloader"]
    assert (dl_before, dl_after) == (pytest.approx(59.26, abs=0.01), pytest.approx(1.19, abs=0.01))
    # The promise is the resolved findings' savings; the measurement is the step-time drop.
    assert c.promised_ms == pytest.approx(sum(f.before_ms for f in c.findings if f.status == "resolved"))
    assert c.measured_saving_ms == pytest.approx(177.59 - NW4_MEAN_MS, abs=0.01)


def test_every_finding_is_sorted_into_exactly_one_status(comparison, pair):
    before = {f.rule for f in pair[0].findings}
    after = {f.rule for f in pair[1].findings}
    # a finding the after run still finds but does not rank (its fix gains nothing once the
    # fixes ranked above it are in) is remaining, not resolved
    considered = {f.rule for f in pair[1].considered}
    # and one the before run found but did not rank is not new when the after run ranks it
    considered_before = {f.rule for f in pair[0].considered}
    got = {s: {f.rule for f in comparison.findings if f.status == s} for s in ("resolved", "new", "remaining")}
    assert got["resolved"] == before - after - considered
    assert got["new"] == after - before - considered_before
    assert got["remaining"] == (before & (after | considered)) | (after & considered_before)


def test_a_run_against_itself_changes_nothing(pair):
    c = compare(pair[0], pair[0])
    assert c.step_change_ms == 0 and c.significant is False
    assert {f.status for f in c.findings} == {"remaining"}
    assert all(d == 0 for _, _, d in c.breakdown_change().values())
    assert "within the step-to-step noise" in c.verdict()


def test_reverse_direction_is_slower_and_the_stall_is_new(pair):
    c = compare(pair[1], pair[0])
    assert c.step_change_pct == pytest.approx(177.59 / NW4_MEAN_MS - 1, abs=1e-4)
    assert "slower" in c.verdict()
    assert {f.rule: f.status for f in c.findings}["dataloader-stall"] == "new"


def test_json_markdown_html_carry_the_same_numbers(comparison):
    doc = json.loads(diff_json(comparison))
    assert doc["schema"] == "advisor/diff/v1"
    assert doc["change"]["step_time_pct"] == pytest.approx(comparison.step_change_pct)
    assert "dataloader-stall" in [f["rule"] for f in doc["findings"]["resolved"]]
    assert doc["promise"]["resolved_saving_ms"] == pytest.approx(comparison.promised_ms)

    md = diff_markdown(comparison)
    assert f"{100 * (1 - NW4_MEAN_MS / 177.59):.1f}% faster per step" in md  # 20.9%
    stall = next(f for f in comparison.findings if f.rule == "dataloader-stall")
    assert f"| dataloader-stall | resolved | {stall.before_ms:.2f} ms" in md
    # The promise and the measurement side by side.
    assert f"promised {comparison.promised_ms:.2f} ms per step; the mean step fell by {177.59 - NW4_MEAN_MS:.2f} ms" in md

    html = diff_html(comparison)
    assert html.startswith("<!DOCTYPE html>") and "http-equiv=\"Content-Security-Policy\"" in html
    assert f"-{177.59 - NW4_MEAN_MS:.2f} ms" in html and "dataloader-stall" in html


def test_cli_diff_text_and_json(tmp_path):
    nw0, nw4 = trace_path("v100_resnet50_nw0"), trace_path("v100_resnet50_nw4")
    r = subprocess.run([sys.executable, "-m", "advisor", "diff", str(nw0), str(nw4)], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "NO_COLOR": "1", "COLUMNS": "100"})
    assert r.returncode == 0, r.stderr
    assert f"{100 * (1 - NW4_MEAN_MS / 177.59):.1f}% faster per step" in r.stdout
    assert "\x1b[" not in r.stdout  # piped: no colour codes
    resolved_line = next(line for line in r.stdout.splitlines() if "dataloader-stall" in line)
    out = tmp_path / "diff.json"
    r = subprocess.run([sys.executable, "-m", "advisor", "diff", str(nw0), str(nw4), "-f", "json", "-o", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    resolved = json.loads(out.read_text())["findings"]["resolved"][0]
    assert resolved["rule"] == "dataloader-stall"
    # the text and the JSON carry the same promise (the stall's replayed saving, a third of the step)
    assert "resolved" in resolved_line and f"{resolved['saving_before_ms']:.2f} ms" in resolved_line
    assert 0.3 < resolved["saving_before_ms"] / 177.59 < 0.35


def test_cli_diff_bad_input_is_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "advisor", "diff", str(tmp_path / "missing"), str(trace_path("v100_resnet50_nw4"))], capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "no such file or directory" in r.stderr


def test_several_resolved_fixes_are_promised_as_replayed_together_and_checked_without_the_profiler():
    # ViT on an H100: the baseline against the run with every fix applied. tf32-disabled and
    # tensor-cores-unused speed up the same kernels, so their savings cannot add up; both runs
    # timed their steps after the window, so the promise is checked against those steps.
    from conftest import shared

    before_dir, after_dir = shared("whatif/h100_vit/baseline"), shared("whatif/h100_vit/all")
    c = compare(analyze(before_dir), analyze(after_dir))
    resolved = [f.before_ms for f in c.with_status("resolved")]
    assert {"tf32-disabled", "tensor-cores-unused"} <= {f.rule for f in c.with_status("resolved")}
    assert max(resolved) <= c.promised_ms < sum(resolved)

    def after_median(run):
        facts = json.loads((run / "advisor_facts.json").read_text())
        times = facts["step_times_ms"][max(facts["profiled_steps"]) + 2 :]
        return sorted(times)[len(times) // 2] if len(times) % 2 else sum(sorted(times)[len(times) // 2 - 1 : len(times) // 2 + 1]) / 2

    assert c.measured_from_unprofiled
    assert c.measured_saving_ms == pytest.approx(after_median(before_dir) - after_median(after_dir), abs=1e-6)
    assert 0.75 <= c.realised <= 1.25  # a promise the user can bank on
    data = json.loads(diff_json(c))
    assert data["promise"]["measured_from"] == "unprofiled median"
