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
from advisor.api import analyze

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


@pytest.mark.parametrize("command", [["report", str(CPU_RUN)], ["diff", str(CPU_RUN), str(CPU_RUN)], ["view", str(CPU_RUN), "--no-browser"]])
def test_a_missing_output_folder_is_never_made(cli, tmp_path, command):
    target = tmp_path / "no" / "such" / "dir" / ("r.html" if command[0] == "view" else "r.json")  # view writes HTML only
    code, out, err = cli([*command, "-o", str(target)], cwd=tmp_path)
    assert code == 2, (out, err)
    assert err == f"advisor: error: {target}: cannot write output: the folder {target.parent} does not exist (the advisor makes no folder you did not name; create it first)\n"
    assert list(tmp_path.iterdir()) == []


def test_the_gate_files_get_their_folder_as_ci_tools_do(cli, tmp_path):
    # a CI artifact or a record (like pytest's --junitxml): its folder is made
    for option in ("--json", "--junit"):
        target = tmp_path / "ci" / option.strip("-") / "out"
        code, out, err = cli(["gate", str(CPU_RUN), "--max-step-time-ms", "1e6", option, str(target)], cwd=tmp_path)
        assert code == 0, err
        assert target.is_file()


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


# --- 8. the listings come up without the analysis's libraries ---------------------------------
HEAVY = ("pandas", "numpy", "msgspec", "pyarrow")


def imported_by(args: list[str], tmp_path: Path) -> list[str]:
    """The heavy libraries a command imports, from the interpreter's own import log (-X importtime:
    the analysis commands end the process themselves, so nothing runs after them)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "advisor", *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    modules = {line.rsplit("|", 1)[-1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")}
    assert "advisor.cli" in modules, r.stderr[-2000:]
    return [m for m in HEAVY if m in modules]


@pytest.mark.parametrize("args", [["--help"], ["-h"], ["gate", "--help"], ["baseline", "--help"], ["cache", "--help"], ["diff", "--help"]])
def test_help_imports_no_analysis_library(tmp_path, args):
    assert imported_by(args, tmp_path) == []


# --- 9. habits: -h, usage, messages, widths, notes on stderr, view without a display ----------
def test_dash_h_is_help_and_usage_names_arguments_in_capitals(tmp_path):
    for args, usage in ((["-h"], "COMMAND [ARGS]..."), (["report", "-h"], "report [OPTIONS] PATH"), (["diff", "-h"], "diff [OPTIONS] BEFORE AFTER"), (["cache", "-h"], "cache [OPTIONS] ACTION [PATH]")):
        r = advisor(args, tmp_path)
        assert r.returncode == 0, (args, r.stderr)
        assert r.stdout.splitlines()[0].endswith(usage), (args, r.stdout)
    r = advisor(["report"], tmp_path)
    assert r.returncode == 2 and "report [OPTIONS] PATH" in r.stderr and "{" not in r.stderr, r.stderr


def test_a_bad_choice_reads_in_the_project_own_words(tmp_path):
    r = advisor(["cache", "frob"], tmp_path)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == "Error: Invalid value for 'ACTION': 'frob' is not one of 'info', 'clear'.", r.stderr


def test_with_columns_set_a_piped_report_has_no_trailing_blanks_and_hangs_its_wrapped_lines(tmp_path, nw0):
    r = advisor(["report", str(nw0)], tmp_path, env={"COLUMNS": "80"})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert [line for line in lines if line != line.rstrip()] == []
    assert max(len(line) for line in lines) <= 80
    start = lines.index("Considered, not ranked")
    entries = lines[start + 1 : lines.index("", start) if "" in lines[start:] else None]
    entries = [line for line in entries if not line.startswith("  -v") and not line.startswith("  advisor explain")]
    assert len(entries) > 3, entries  # nw0 considers three rules, each wrapped at 80 columns
    assert all(line.startswith("  - ") or line.startswith("    ") for line in entries), entries


def test_the_gate_table_rule_in_a_ci_log_ends_with_its_header(tmp_path, nw0, nw4):
    r = advisor(["gate", str(nw4), "-b", str(nw0)], tmp_path)
    assert r.returncode == 0, r.stderr
    header, rule, *rows = r.stdout.splitlines()
    assert header.startswith("check") and set(rule) <= set("━╇")
    assert len(rule) == len(header.rstrip())
    assert any(len(row) > 200 for row in rows)  # the rows stay whole lines, as CI logs show them


def test_notes_and_warnings_go_to_stderr_and_a_warm_report_repeats_them(tmp_path):
    first = advisor(["report", str(GPU_RUN)], tmp_path)
    second = advisor(["report", str(GPU_RUN)], tmp_path)  # from the stored report
    for r in (first, second):
        assert r.returncode == 0, r.stderr
        assert not [line for line in r.stdout.splitlines() if line.startswith(("note:", "warning:"))]
        assert r.stderr.startswith("note: the profiler slowed the recorded steps"), r.stderr
    assert (first.stdout, first.stderr) == (second.stdout, second.stderr)
    diff = advisor(["diff", str(GPU_RUN), str(SAMPLE_RUNS / "resnet18_cifar" / "runs" / "gpu_walk_final")], tmp_path)
    assert "warning:" not in diff.stdout and "warning: different batch sizes (32 → 512)" in diff.stderr


def test_view_without_a_display_names_the_file_once_and_says_why(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "BROWSER", "COLUMNS")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    target = tmp_path / "page.html"
    r = subprocess.run([sys.executable, "-m", "advisor", "view", str(CPU_RUN), "-o", str(target)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"{target}\n"
    assert r.stderr == "advisor view: no browser found (no display, and $BROWSER is not set): open the report at the path above\n"
    assert target.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")


# --- 10. the JSON summary has what the other formats show ---------------------------------------
def _floats(obj):
    if isinstance(obj, float):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _floats(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _floats(v)


def test_the_json_summary_has_throughput_and_batch_size_as_the_text_shows_them(cli, tmp_path):
    import re

    batch = json.loads((GPU_RUN / "advisor_facts.json").read_text())["dataloaders"][0]["batch_size"]
    code, out, err = cli(["report", str(GPU_RUN), "-f", "json"], cwd=tmp_path)
    assert code == 0, err
    doc = json.loads(out)
    summary = doc["summary"]
    assert summary["batch_size"] == batch == 32
    assert summary["throughput"]["unit"] == "samples/s"
    assert summary["throughput"]["value"] == round(batch / summary["step_time_ms"]["mean"] * 1000)  # whole numbers from 100 up
    code, text, err = cli(["report", str(GPU_RUN)], cwd=tmp_path)
    shown = re.search(r"^Throughput +([\d,.]+) samples/s \(batch (\d+) /", text, re.M)
    assert shown and float(shown.group(1).replace(",", "")) == summary["throughput"]["value"] and int(shown.group(2)) == batch, text
    # a finding's share is named a share, and is the text's percentage
    top = doc["findings"][0]
    assert "saving_pct" not in top
    assert re.search(rf"{re.escape(top['rule'])}  {top['saving_ms']:.2f} ms/step \({top['saving_share'] * 100:.1f}%\)", text), text
    # the Python API names the same fraction the same way, in the same order
    frame = analyze(GPU_RUN).findings
    assert "saving_pct" not in frame.columns
    assert list(frame["rule"]) == [f["rule"] for f in doc["findings"]]
    assert frame["saving_share"].tolist() == pytest.approx([f["saving_share"] for f in doc["findings"]], abs=1e-6)
    # no float with more digits than a measurement holds (78.59808, not 78.59807833333333)
    for x in _floats(doc):
        assert x == int(x) or len(f"{x:.15g}".split("e")[0].lstrip("-0.").replace(".", "").rstrip("0")) <= 7, x


def test_a_run_without_a_batch_size_gives_steps_per_second(cli, tmp_path, nw0):
    code, out, err = cli(["report", str(nw0), "-f", "json"], cwd=tmp_path)
    assert code == 0, err
    summary = json.loads(out)["summary"]
    # the V100 trace has no facts file: 1 / 177.59 ms mean step (README) = 5.63 steps/s
    assert summary["batch_size"] is None
    assert summary["throughput"] == {"value": 5.63, "unit": "steps/s"}


# --- 11. a script's own exit status is not a failure, and a run that recorded nothing leaves nothing
@pytest.mark.parametrize("body, said", [
    ('print("hello")\nimport sys\nsys.exit(3)\n', "s.py exited with status 3 after 0 steps, before any step was recorded"),
    ('print("hello")\nraise ValueError("boom")\n', "s.py failed with exit code 1 after 0 steps, before any step was recorded"),
])
def test_a_script_that_ends_before_a_step_leaves_no_run_folder(tmp_path, body, said):
    pytest.importorskip("torch")
    (tmp_path / "s.py").write_text(body)
    r = advisor(["profile", "s.py"], tmp_path)
    assert r.returncode == (3 if "exit(3)" in body else 1), r.stderr
    assert r.stdout == "hello\n"
    assert f"advisor: {said}: nothing to report, and no log dir kept" in r.stderr, r.stderr
    assert "s.py failed" not in r.stderr or "ValueError" in body
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.py"]
    # a folder the user named is theirs: kept, with the facts of the run
    r = advisor(["profile", "--out", "mine", "s.py"], tmp_path)
    assert [p.name for p in (tmp_path / "mine").iterdir()] == ["advisor_facts.json"], r.stderr


@pytest.mark.parametrize("args, allowed", [(["rules"], ()), (["rules", "-f", "json"], ()), (["explain", "dataloader-stall"], ("msgspec",))])
def test_the_rule_catalogue_imports_no_analysis_library(tmp_path, args, allowed):
    assert [m for m in imported_by(args, tmp_path) if m not in allowed] == []


def test_the_catalogue_read_from_the_files_is_the_engines_own():
    """Every shipped rule's page, read from its file's text, as the engine gives it on import."""
    from advisor.engine import all_rules
    from advisor.metrics.vendors import tested_on
    from advisor.rule_catalogue import page_of_rule, rule_page, rule_pages

    by_engine = [page_of_rule(r) for r in all_rules()]
    read = rule_pages()
    assert [p.id for p in read] == [p.id for p in by_engine]
    for page, engine in zip(read, by_engine, strict=True):
        assert (page.title, page.docs_url, page.defaults, page.source, page.training_only, page.scope, page.group) == (
            engine.title, engine.docs_url, engine.defaults, engine.source, engine.training_only, engine.scope, engine.group), page.id
        assert tested_on(page) == tested_on(engine), page.id
        assert rule_page(page.id).doc == engine.doc, page.id


def test_a_baseline_names_its_shares_as_the_report_does_and_reads_older_files(cli, tmp_path):
    code, out, err = cli(["report", str(CPU_RUN), "-f", "json"], cwd=tmp_path)
    report = {f["rule"]: f["saving_share"] for f in json.loads(out)["findings"]}
    assert cli(["baseline", str(CPU_RUN), "-o", str(tmp_path / "b.json")], cwd=tmp_path)[0] == 0
    doc = json.loads((tmp_path / "b.json").read_text())
    assert {f["rule"]: f["saving_share"] for f in doc["findings"]} == pytest.approx(report, rel=1e-6)
    # a baseline written before the field was renamed is read the same
    for f in doc["findings"]:
        f["saving_pct"] = f.pop("saving_share")
    (tmp_path / "old.json").write_text(json.dumps(doc))
    code, out, err = cli(["gate", str(CPU_RUN), "-b", str(tmp_path / "old.json"), "--min-steps", "3"], cwd=tmp_path)
    assert code == 0 and "no finding that the baseline did not have" in out, (out, err)
