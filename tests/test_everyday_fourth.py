"""Everyday use, fourth round: what a user meets after the quick start, on the recorded sample
runs and the public V100 traces (a gate whose "new" means new, outputs where the shell expects
them, the Python API taking what the command line takes, the JSON summary, quick listings)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, SAMPLE_RUNS

GPU_RUN = SAMPLE_RUNS / "resnet18_cifar" / "runs" / "gpu_baseline"
CPU_RUN = SAMPLE_RUNS / "resnet18_cifar" / "runs" / "cpu_baseline"


def advisor(args: list[str], cwd: Path, env: dict[str, str] | None = None, stdin=None) -> subprocess.CompletedProcess:
    """The real program in a child process, its stdout a pipe, no COLUMNS unless given."""
    base = {k: v for k, v in os.environ.items() if k != "COLUMNS" and not k.startswith("GITHUB_")}
    base["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "advisor", *args], cwd=cwd, env={**base, **(env or {})}, capture_output=True, text=True, timeout=120, stdin=stdin
    )


# --- 6. the Python API takes what the command line takes -----------------------------------
def _rule_groups() -> dict[str, list[str]]:
    """Rule ids by the GROUP their rule file declares, read from the files themselves."""
    groups: dict[str, list[str]] = {}
    for f in sorted((REPO / "rules").glob("*.py")):
        text = f.read_text()
        rid = next((line.split("=", 1)[1].strip().strip("\"'") for line in text.splitlines() if line.startswith("ID =")), None)
        group = next((line.split("=", 1)[1].strip().strip("\"'") for line in text.splitlines() if line.startswith("GROUP =")), None)
        if rid and group:
            groups.setdefault(group, []).append(rid)
    return groups


def test_the_api_takes_a_selector_string_and_comma_lists_as_the_command_line_does():
    import advisor

    groups = _rule_groups()
    assert groups.get("input") and groups.get("optimizer"), groups
    by_ids = set(advisor.analyze(GPU_RUN, select=[*groups["input"], *groups["optimizer"]]).findings["rule"])
    # a lone string is one selector (not its letters), and a comma list in one string is split
    assert set(advisor.analyze(GPU_RUN, select="input,optimizer").findings["rule"]) == by_ids
    assert set(advisor.analyze(GPU_RUN, select=["input,optimizer"]).findings["rule"]) == by_ids
    without_input = set(advisor.analyze(GPU_RUN, ignore=groups["input"]).findings["rule"])
    assert set(advisor.analyze(GPU_RUN, ignore="input").findings["rule"]) == without_input


# --- 1. the gate's and diff's "new" means the rule did not fire on the baseline at all ------
def _fired(cli, run: Path, cwd: Path) -> tuple[set[str], set[str]]:
    """(ranked, considered) rule ids of a run, from its JSON report."""
    code, out, err = cli(["report", str(run), "-f", "json"], cwd=cwd)
    assert code == 0, err
    doc = json.loads(out)
    return {f["rule"] for f in doc["findings"]}, {f["rule"] for f in doc["considered"]}


@pytest.mark.parametrize("baseline_kind", ["run", "baseline file", "report file"])
def test_a_rule_the_baseline_considered_is_not_new(cli, tmp_path, nw0, nw4, baseline_kind):
    ranked_before, considered_before = _fired(cli, nw0, tmp_path)
    ranked_after, considered_after = _fired(cli, nw4, tmp_path)
    # nw4 (4 workers) ranks these two; nw0 found them too, behind its DataLoader stall
    assert {"single-tensor-optimizer", "h2d-pageable-copy"} <= ranked_after & considered_before
    baseline = nw0
    if baseline_kind == "baseline file":
        baseline = tmp_path / "b.json"
        assert cli(["baseline", str(nw0), "-o", str(baseline)], cwd=tmp_path)[0] == 0
    elif baseline_kind == "report file":
        baseline = tmp_path / "r.json"
        assert cli(["report", str(nw0), "-o", str(baseline)], cwd=tmp_path)[0] == 0
    result = tmp_path / "gate.json"
    code, out, err = cli(["gate", str(nw4), "-b", str(baseline), "--fail-on-new-findings", "--json", str(result)], cwd=tmp_path)
    doc = json.loads(result.read_text())
    new = {f["rule"] for f in doc["new_findings"]}
    assert new == ranked_after - ranked_before - considered_before, out
    assert not new and code == 0, out  # 21% faster, nothing new: a pass
    # the other way round: what nw4 only considered (launch-bound) is not new on nw0 either
    code, out, err = cli(["gate", str(nw0), "-b", str(nw4), "--json", str(result)], cwd=tmp_path)
    new = {f["rule"] for f in json.loads(result.read_text())["new_findings"]}
    assert new == ranked_before - ranked_after - considered_after and "launch-bound" not in new, out


def test_diff_calls_a_rule_the_baseline_considered_remaining(cli, tmp_path, nw0, nw4):
    ranked_before, considered_before = _fired(cli, nw0, tmp_path)
    code, out, err = cli(["diff", str(nw0), str(nw4), "-f", "json"], cwd=tmp_path)
    assert code == 0, err
    findings = json.loads(out)["findings"]
    new = {f["rule"] for f in findings["new"]}
    remaining = {f["rule"] for f in findings["remaining"]}
    assert not new & (ranked_before | considered_before), new
    assert {"single-tensor-optimizer", "h2d-pageable-copy"} <= remaining


# --- 4. every format goes to stdout unless -o names a file ----------------------------------
@pytest.mark.parametrize("command", [["report", str(CPU_RUN)], ["diff", str(CPU_RUN), str(CPU_RUN)]])
def test_html_goes_to_stdout_like_every_format(tmp_path, command):
    with open(tmp_path / "x.html", "w") as target:  # `advisor report RUN -f html > x.html`
        r = subprocess.run(
            [sys.executable, "-m", "advisor", *command, "-f", "html"], cwd=tmp_path, stdout=target, stderr=subprocess.PIPE, text=True, timeout=120,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))},
        )
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "x.html").read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.html"], "nothing written beside it"


def test_html_to_a_terminal_is_refused_in_one_line(tmp_path):
    pty = pytest.importorskip("pty")
    leader, follower = pty.openpty()
    try:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        r = subprocess.run([sys.executable, "-m", "advisor", "report", str(CPU_RUN), "-f", "html"], cwd=tmp_path, stdout=follower, stderr=subprocess.PIPE, text=True, timeout=120, env=env)
    finally:
        os.close(follower)
        os.close(leader)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and r.stderr.startswith("advisor: error: ") and "-o report.html" in r.stderr, r.stderr
    assert list(tmp_path.iterdir()) == []


# --- 5. -o: a suffix that names no format, a folder that does not exist ----------------------
@pytest.mark.parametrize("command", [["report", str(CPU_RUN)], ["diff", str(CPU_RUN), str(CPU_RUN)]])
def test_an_output_suffix_that_names_no_format_is_refused(cli, tmp_path, command):
    for name in ("out.pdf", "report"):
        code, out, err = cli([*command, "-o", str(tmp_path / name)], cwd=tmp_path)
        assert code == 2, (name, out, err)
        assert err.startswith(f"advisor: error: {tmp_path / name}: ") and err.count("\n") == 1, err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", [["report", str(CPU_RUN)], ["diff", str(CPU_RUN), str(CPU_RUN)], ["baseline", str(CPU_RUN)]])
def test_a_missing_output_folder_is_never_made(cli, tmp_path, command):
    target = tmp_path / "no" / "such" / "dir" / "r.json"
    code, out, err = cli([*command, "-o", str(target)], cwd=tmp_path)
    assert code == 2, (out, err)
    assert err == f"advisor: error: {target}: cannot write output: the folder {target.parent} does not exist (the advisor makes no folder you did not name; create it first)\n"
    assert list(tmp_path.iterdir()) == []


def test_the_gate_outputs_make_no_missing_folder(cli, tmp_path):
    for option in ("--json", "--junit"):
        target = tmp_path / "ci" / "out.xml"
        code, out, err = cli(["gate", str(CPU_RUN), "--max-step-time-ms", "1e6", option, str(target)], cwd=tmp_path)
        assert code == 2, (out, err)
        assert "does not exist" in err and err.count("\n") == 1, err
        assert list(tmp_path.iterdir()) == []


def test_the_default_baseline_path_still_gets_its_folder(cli, tmp_path):
    code, out, err = cli(["baseline", str(CPU_RUN)], cwd=tmp_path)
    assert code == 0, err
    assert json.loads((tmp_path / "perf" / "baseline.json").read_text())["schema"] == "advisor/baseline/v1"


# --- 7. diff judges a batch change per sample ------------------------------------------------
def test_diff_judges_a_batch_change_per_sample(cli, tmp_path):
    before, after = GPU_RUN, SAMPLE_RUNS / "resnet18_cifar" / "runs" / "gpu_walk_final"
    # samples per step from the facts files as `advisor profile` recorded them (one rank each)
    b_n, a_n = (json.loads((r / "advisor_facts.json").read_text())["dataloaders"][0]["batch_size"] for r in (before, after))
    assert (b_n, a_n) == (32, 512)
    # the step times after the window, as each run's own report gives them
    medians = []
    for run in (before, after):
        code, out, err = cli(["report", str(run), "-f", "json"], cwd=tmp_path)
        assert code == 0, err
        medians.append(json.loads(out)["profiler_overhead"]["unprofiled_median_ms"])
    code, out, err = cli(["diff", str(before), str(after), "-f", "json"], cwd=tmp_path)
    assert code == 0, err
    promise = json.loads(out)["promise"]
    # the before step's 32 samples take medians[1] / 512 * 32 ms after the change
    measured = medians[0] - medians[1] / a_n * b_n
    assert promise["measured_saving_ms"] == pytest.approx(measured, abs=0.01)
    assert promise["realised"] == pytest.approx(measured / promise["resolved_saving_ms"], rel=1e-3)
    assert promise["realised"] > 1.0  # a 36x throughput is not "51% of the promise"
    code, out, err = cli(["diff", str(before), str(after)], cwd=tmp_path)
    assert "judged per sample (32 → 512 samples per step" in out and f"({promise['realised'] * 100:.0f}% of the promise)" in out, out
