"""`advisor gate` and `advisor baseline` on the real V100 ResNet-50 traces, and the statistics.

Expected figures come from outside the code under test: the TensorBoard plugin's numbers in
../shared/ANCHORS.md (mean step 177.59 ms with num_workers=0, 141.07 ms with 4 workers: +26%, conftest.NW4_MEAN_MS
for the advisor's last step;
DataLoader 59.26 ms of 177.59 = 33.4% and 1.19 of 141.07 = 0.8%), the devices named in
../shared/traces/MANIFEST.md, and published critical values of the Mann-Whitney U test.
"""

from __future__ import annotations

import io
import math
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import orjson
import pytest
from conftest import NW4_MEAN_MS, shared_trace
from rich.console import Console

from advisor.errors import InputError
from advisor.gate.budgets import (
    KNOWN_KEYS,
    GateSettings,
    build_settings,
    parse_gate_table,
    read_budget_file,
)
from advisor.gate.compare import (
    _u_counts,
    compare_step_times,
    mann_whitney_greater,
    median_ratio_bounds,
)
from advisor.gate.evaluate import run_gate
from advisor.gate.outputs import (
    github_annotations,
    github_summary,
    render_terminal,
    to_junit,
)
from advisor.gate.record import BASELINE_SCHEMA, read_record_file, record_from_analysis
from advisor.gate.verdict import Check, GateResult

ADVISOR = [sys.executable, "-m", "advisor"]  # the console script's main(), in a fresh process


# --- fixtures: analyse each real trace once -------------------------------------------------
@pytest.fixture(scope="module")
def analyses():
    from advisor.analysis import analyze
    from advisor.config import Config

    cache = {}

    def get(rel: str):
        if rel not in cache:
            cache[rel] = analyze(shared_trace(rel), config=Config())
        return cache[rel]

    return get


@pytest.fixture(scope="module")
def baselines(tmp_path_factory, analyses):
    """Baseline files written by `advisor baseline` for both V100 runs."""
    out = tmp_path_factory.mktemp("baselines")
    files = {}
    for name in ("v100_resnet50_nw0", "v100_resnet50_nw4"):
        target = out / f"{name}.json"
        code, _, err = run_cli(["baseline", str(shared_trace(name)), "-o", str(target)], cwd=out)
        assert code == 0, err
        files[name] = target
    return files


def run_cli(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """The real `advisor` entry point in a fresh process, as CI runs it."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("GITHUB_")}
    full_env.update({"COLUMNS": "200", **(env or {})})
    p = subprocess.run([*ADVISOR, *args], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout, p.stderr


# --- statistics -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "n, one_sided_05, two_sided_05",
    [(6, 7, 5), (10, 27, 23), (8, 15, 13)],  # critical values of U from published tables
)
def test_exact_u_distribution_matches_published_critical_values(n, one_sided_05, two_sided_05):
    counts = _u_counts(n, n)
    total = math.comb(2 * n, n)
    assert sum(counts) == total
    cdf = np.cumsum(counts) / total
    # the critical value is the largest U whose lower tail stays within alpha
    assert cdf[one_sided_05] <= 0.05 < cdf[one_sided_05 + 1]
    assert cdf[two_sided_05] <= 0.025 < cdf[two_sided_05 + 1]


def test_mann_whitney_extremes_and_large_sample_approximation():
    a = np.arange(6, dtype=float)
    u, p = mann_whitney_greater(a + 100, a)
    assert u == 36 and p == pytest.approx(1 / math.comb(12, 6))
    u, p = mann_whitney_greater(a, a + 100)
    assert u == 0 and p == 1.0
    # at the exact/normal boundary both agree: 30 vs 30 exact, 31 vs 31 approximated
    rng = np.random.default_rng(7)
    x, y = rng.normal(1.0, 0.1, 31), rng.normal(0.95, 0.1, 31)
    _, p_exact = mann_whitney_greater(x[:30], y[:30])
    _, p_approx = mann_whitney_greater(x[:30] + 0.0, np.append(y[:30], y[:30].mean()))  # 30 vs 31: normal
    assert abs(p_exact - p_approx) < 0.03


def test_false_positive_rate_and_power_on_known_distributions():
    """With no tolerance the check is a one-sided test at 95%: it must fail about 5% or less of
    same-distribution pairs, and catch a 30% slowdown nearly always."""
    rng = np.random.default_rng(11)
    same = [compare_step_times(rng.lognormal(0, 0.15, 12), rng.lognormal(0, 0.15, 12), tolerance=0.0, resamples=2000) for _ in range(300)]
    rate = sum(c.verdict == "fail" for c in same) / len(same)
    assert rate <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / len(same))
    slower = [
        compare_step_times(rng.lognormal(0, 0.15, 12), 1.3 * rng.lognormal(0, 0.15, 12), tolerance=0.05, resamples=2000)
        for _ in range(100)
    ]
    assert sum(c.verdict == "fail" for c in slower) >= 85


def test_bootstrap_is_reproducible(analyses):
    base = analyses("v100_resnet50_nw4").step_times_ms()
    cand = analyses("v100_resnet50_nw0").step_times_ms()
    assert median_ratio_bounds(base, cand) == median_ratio_bounds(base, cand)


def test_v100_step_times_regression_swap_and_self(analyses):
    nw0 = analyses("v100_resnet50_nw0").step_times_ms()
    nw4 = analyses("v100_resnet50_nw4").step_times_ms()
    assert len(nw0) == len(nw4) == 6  # the traces hold 6 steps each
    slower = compare_step_times(nw4, nw0)
    assert slower.verdict == "fail"
    assert slower.mean_ratio == pytest.approx(177.59 / NW4_MEAN_MS, rel=0.002)  # ANCHORS.md: +26%
    assert slower.lower > 1.05 and slower.p_slower < 0.05
    faster = compare_step_times(nw0, nw4)
    assert faster.verdict == "pass" and faster.ratio < 1
    for same in (nw0, nw4):
        c = compare_step_times(same, same)
        assert c.verdict == "pass" and c.ratio == 1.0


def test_a_uniform_slowdown_fails_and_a_speedup_passes(analyses):
    nw0 = analyses("v100_resnet50_nw0").step_times_ms()
    assert compare_step_times(nw0, nw0 * 1.5).verdict == "fail"
    assert compare_step_times(nw0, nw0 * 0.7).verdict == "pass"


def test_too_few_steps_is_inconclusive(analyses):
    two = analyses("a100_two_ranks").step_times_ms()  # 2 steps
    c = compare_step_times(two, two * 1.5)
    assert c.verdict == "inconclusive" and "too few steps" in c.reason


# --- baseline file --------------------------------------------------------------------------
def test_baseline_file_holds_every_step_and_the_environment(baselines, analyses):
    doc = orjson.loads(baselines["v100_resnet50_nw4"].read_bytes())
    assert doc["schema"] == BASELINE_SCHEMA
    steps = np.array(doc["step_times_ms"])
    assert len(steps) == 6 and steps.mean() == pytest.approx(NW4_MEAN_MS, abs=0.01)  # ANCHORS.md, the last step as the advisor ends it
    assert len(set(doc["step_times_ms"])) == 6  # the samples, not a repeated mean
    assert doc["breakdown_ms"]["dataloader"] == pytest.approx(1.19, abs=0.01)
    assert sum(doc["breakdown_share"].values()) == pytest.approx(1.0)
    assert doc["environment"]["device_name"] == "Tesla V100-DGXS-32GB"  # MANIFEST.md
    assert doc["environment"]["compute_capability"] == "7.0"
    assert doc["metrics"]["steps"] == 6
    nw0 = orjson.loads(baselines["v100_resnet50_nw0"].read_bytes())
    assert "dataloader-stall" in {f["rule"] for f in nw0["findings"]}
    assert "dataloader-stall" not in {f["rule"] for f in doc["findings"]}


def test_baseline_file_and_log_dir_give_the_same_comparison(baselines, analyses):
    from_file = read_record_file(baselines["v100_resnet50_nw4"])
    from_dir = record_from_analysis(analyses("v100_resnet50_nw4"))
    cand = record_from_analysis(analyses("v100_resnet50_nw0"))
    a = run_gate(cand, from_file, GateSettings(baseline=Path("x")))
    b = run_gate(cand, from_dir, GateSettings(baseline=Path("x")))
    assert a.checks[0].details == b.checks[0].details
    assert a.verdict == b.verdict == "fail"


def test_report_json_as_baseline_compares_findings_but_cannot_judge_step_time(tmp_path, analyses):
    from advisor.render.json_report import to_json

    report = tmp_path / "report.json"
    report.write_text(to_json(analyses("v100_resnet50_nw4")))
    base = read_record_file(report)
    assert base.kind == "report" and base.step_times_ms is None
    result = run_gate(record_from_analysis(analyses("v100_resnet50_nw0")), base, GateSettings(baseline=report))
    by_id = {c.id: c for c in result.checks}
    assert by_id["step-time-regression"].status == "inconclusive"
    assert "dataloader-stall" in {f["rule"] for f in result.new_findings}


# --- the command: acceptance ----------------------------------------------------------------
def test_gate_fails_a_slower_run_and_names_the_regression_and_the_new_finding(baselines, tmp_path):
    json_out, junit_out = tmp_path / "gate.json", tmp_path / "gate.xml"
    code, out, err = run_cli(
        ["gate", str(shared_trace("v100_resnet50_nw0")), "--baseline", str(baselines["v100_resnet50_nw4"]), "--json", str(json_out), "--junit", str(junit_out)],
        cwd=tmp_path,
    )
    assert code == 1, out + err
    assert "FAIL" in out and "+26%" in out and "dataloader-stall" in out
    doc = orjson.loads(json_out.read_bytes())  # written although the gate failed
    assert doc["verdict"] == "fail" and doc["exit_code"] == 1
    step = next(c for c in doc["checks"] if c["id"] == "step-time-regression")
    assert step["status"] == "fail"
    assert step["details"]["mean_ratio"] == pytest.approx(177.59 / NW4_MEAN_MS, rel=0.002)
    assert "dataloader-stall" in [f["rule"] for f in doc["new_findings"]]
    assert junit_out.is_file()


@pytest.mark.parametrize("baseline_name, candidate_name", [("v100_resnet50_nw0", "v100_resnet50_nw4"), ("v100_resnet50_nw4", "v100_resnet50_nw4"), ("v100_resnet50_nw0", "v100_resnet50_nw0")])
def test_gate_passes_a_faster_run_and_a_run_against_itself(cli, baselines, tmp_path, baseline_name, candidate_name):
    json_out = tmp_path / "gate.json"
    code, out, err = cli(["gate", str(shared_trace(candidate_name)), "-b", str(baselines[baseline_name]), "--json", str(json_out)], cwd=tmp_path)
    assert code == 0, out + err
    doc = orjson.loads(json_out.read_bytes())
    assert doc["verdict"] == "pass"
    assert next(c for c in doc["checks"] if c["id"] == "step-time-regression")["status"] == "pass"


def test_dataloader_budget_fails_nw0_and_passes_nw4(cli, tmp_path):
    code0, out0, _ = cli(["gate", str(shared_trace("v100_resnet50_nw0")), "--max-share", "dataloader=0.05"], cwd=tmp_path)
    code4, out4, _ = cli(["gate", str(shared_trace("v100_resnet50_nw4")), "--max-share", "dataloader=0.05"], cwd=tmp_path)
    assert (code0, code4) == (1, 0)
    assert "33.4%" in out0  # ANCHORS.md: 59.26 of 177.59 ms
    assert "0.8%" in out4  # 1.19 of 141.07 ms


def test_budgets_from_pyproject_and_flags_override_them(cli, tmp_path, baselines):
    (tmp_path / "perf").mkdir()
    (tmp_path / "perf" / "baseline.json").write_bytes(baselines["v100_resnet50_nw4"].read_bytes())
    (tmp_path / "pyproject.toml").write_text(
        '[tool.advisor.gate]\nbaseline = "perf/baseline.json"\ntolerance = 0.5\n[tool.advisor.gate.max_share]\ndataloader = 0.5\n'
    )
    sub = tmp_path / "sub"
    sub.mkdir()
    nw0 = str(shared_trace("v100_resnet50_nw0"))
    # found from a sub-folder, baseline relative to pyproject.toml; +40% median is within 50%
    code, out, err = cli(["gate", nw0, "--json", "g.json"], cwd=sub)
    assert code == 0, out + err
    doc = orjson.loads((sub / "g.json").read_bytes())
    assert {c["id"] for c in doc["checks"]} >= {"step-time-regression", "max-share.dataloader"}
    assert doc["settings"]["baseline"].endswith("perf/baseline.json")
    # the command line wins over the file
    code, out, _ = cli(["gate", nw0, "--tolerance", "0.05", "--max-share", "dataloader=0.05"], cwd=sub)
    assert code == 1
    # a --budget file sits between the two
    (tmp_path / "budget.toml").write_text("max_step_time_ms = 150\n")
    code, out, _ = cli(["gate", nw0, "--budget", str(tmp_path / "budget.toml")], cwd=sub)
    assert code == 1 and "mean step time" in out


def test_finding_budgets_memory_and_throughput(analyses):
    nw0 = record_from_analysis(analyses("v100_resnet50_nw0"))
    nw4 = record_from_analysis(analyses("v100_resnet50_nw4"))

    def checks(record, **layer):
        s = build_settings([("test", parse_gate_table(layer, None, None, "test"))])
        return {c.id: c for c in run_gate(record, None, s).checks}

    assert checks(nw0, forbid_rules=["dataloader-stall"])["forbid-rules"].status == "fail"
    assert checks(nw4, forbid_rules=["dataloader-stall"])["forbid-rules"].status == "pass"
    sev = checks(nw0, max_severity="medium")["max-severity"]
    assert sev.status == "fail" and "dataloader-stall" in sev.message
    # peak allocated memory is about 2.8 GB on the 32 GB V100
    assert checks(nw0, max_peak_memory="2 GiB")["max-peak-memory"].status == "fail"
    assert checks(nw0, max_peak_memory="4 GiB")["max-peak-memory"].status == "pass"
    # throughput needs the batch size: without it the budget cannot be judged
    assert checks(nw4, min_samples_per_s=100)["min-samples-per-s"].status == "inconclusive"
    tp = checks(nw4, min_samples_per_s=100, batch_size=32)["min-samples-per-s"]
    assert tp.details["samples_per_s"] == pytest.approx(32 / (NW4_MEAN_MS / 1e3), rel=0.002)  # batch / mean step
    assert tp.status == "pass"
    assert checks(nw4, min_samples_per_s=300, batch_size=32)["min-samples-per-s"].status == "fail"
    assert checks(nw0, min_gpu_utilization=0.9)["min-gpu-utilization"].status == "fail"


def test_too_few_steps_is_inconclusive_and_strict_fails(cli, tmp_path):
    two = str(shared_trace("a100_two_ranks"))  # 2 steps per rank
    junit = tmp_path / "j.xml"
    code, out, _ = cli(["gate", two, "--baseline", two, "--junit", str(junit)], cwd=tmp_path)
    assert code == 0 and "INCONCLUSIVE" in out
    assert ET.parse(junit).getroot().find("testsuite").get("skipped") == "1"
    code, out, _ = cli(["gate", two, "--baseline", two, "--strict", "--junit", str(junit)], cwd=tmp_path)
    assert code == 1
    failure = ET.parse(junit).getroot().find(".//failure")
    assert failure is not None and failure.get("type") == "inconclusive"


def test_device_mismatch_is_a_warning(analyses):
    v100 = record_from_analysis(analyses("v100_resnet50_nw4"))
    a100 = record_from_analysis(analyses("misc/a100_80gb_train.json.gz"))
    result = run_gate(a100, v100, GateSettings(baseline=Path("x")))
    env = next(c for c in result.checks if c.id == "same-environment")
    assert env.status == "warn"
    assert any("Tesla V100-DGXS-32GB" in w and "A100-SXM4-80GB" in w for w in result.warnings)


# --- bad input ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "extra, files, expect",
    [
        (["--baseline", "missing.json"], {}, "baseline not found"),
        (["--baseline", "b.json"], {"b.json": '{"schema": "advisor/baseline/v9"}'}, "unsupported baseline schema"),
        (["--baseline", "b.json"], {"b.json": '{"schema": "something/else"}'}, "not an advisor baseline"),
        (["--baseline", "b.json"], {"b.json": '{"schema": "advisor/baseline/v1", "step_times_ms": "x"}'}, "step_times_ms"),
        (["--baseline", "b.json"], {"b.json": "{not json"}, "invalid JSON"),
        (["--budget", "b.toml"], {"b.toml": "max_step_time_ms = ["}, "invalid TOML"),
        (["--budget", "b.toml"], {"b.toml": "max_step_tme_ms = 100"}, "max_step_tme_ms is not a gate setting"),
        (["--budget", "b.toml"], {"b.toml": "min_gpu_utilization = 60"}, "fraction"),
        (["--budget", "b.toml"], {"b.toml": "[max_share]\ndataloder = 0.05"}, "not a breakdown category"),
        (["--budget", "missing.toml"], {}, "budget file not found"),
        (["--max-share", "dataloader"], {}, "CATEGORY=FRACTION"),
        (["--forbid", "no-such-rule"], {}, "unknown rule"),
        (["--max-peak-memory", "lots"], {}, "max_peak_memory"),
        ([], {}, "nothing to gate on"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(cli, tmp_path, extra, files, expect):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    code, out, err = cli(["gate", str(shared_trace("v100_resnet50_nw4")), *extra], cwd=tmp_path)
    assert code == 2, out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("advisor: error:") and expect in lines[0], err


def test_usage_errors_exit_2(cli, tmp_path):
    assert cli(["gate"], cwd=tmp_path)[0] == 2  # no PATH
    assert cli(["gate", str(shared_trace("v100_resnet50_nw4")), "--tolerance", "five"], cwd=tmp_path)[0] == 2
    code, _, err = cli(["gate", str(shared_trace("v100_resnet50_nw4")), "--tolerance", "5"], cwd=tmp_path)
    assert code == 2 and "0.05 = 5%" in err


def test_baseline_goes_where_the_config_points_and_warns_on_few_steps(cli, tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.advisor.gate]\nbaseline = "perf/b.json"\n')
    code, _, err = cli(["baseline", str(shared_trace("a100_two_ranks"))], cwd=tmp_path)
    assert code == 0, err
    doc = orjson.loads((tmp_path / "perf" / "b.json").read_bytes())
    assert len(doc["step_times_ms"]) == 2 and doc["environment"]["world_size"] == 128  # distributedInfo of the trace
    assert "only 2 step(s)" in err


def test_size_and_budget_file_layouts(tmp_path):
    # (the units themselves: tests/test_sizes.py)
    assert parse_gate_table({"max_peak_memory": "16 GiB"}, None, None) == {"max_peak_memory": 16.0 * 2**30}
    assert parse_gate_table({"max_peak_memory": "800MB"}, None, None) == {"max_peak_memory": 800 * 10**6}
    for bad in ("12 parsecs", True, -1, 0, "0 GiB"):
        with pytest.raises(InputError, match="max_peak_memory must be a number of bytes"):
            parse_gate_table({"max_peak_memory": bad}, None, None)
    # every setting refuses a value of the wrong type in one line naming the file and the key
    for key in KNOWN_KEYS:
        with pytest.raises(InputError) as info:
            parse_gate_table({key: [None]}, tmp_path / "b.toml", None, "[gate]")
        assert str(info.value).startswith(f"{tmp_path / 'b.toml'}: [gate]: {key} must be ") and "\n" not in str(info.value)
    (tmp_path / "pyproject.toml").write_text("[tool.advisor.gate]\nmax_step_time_ms = 100\n")
    (tmp_path / "advisor.toml").write_text("[gate]\nmax_severity = 'low'\n")
    (tmp_path / "plain.json").write_text('{"forbid_rules": ["dataloader-stall"]}')
    assert read_budget_file(tmp_path / "pyproject.toml") == {"max_step_time_ms": 100.0}
    assert read_budget_file(tmp_path / "advisor.toml") == {"max_severity": "low"}
    assert read_budget_file(tmp_path / "plain.json") == {"forbid_rules": ["dataloader-stall"]}
    (tmp_path / "pyproject.toml").write_text("[tool.other]\nx = 1\n")
    with pytest.raises(InputError, match=r"no \[tool.advisor.gate\]"):
        read_budget_file(tmp_path / "pyproject.toml")


# --- JUnit XML ------------------------------------------------------------------------------
ISO_DATETIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}$")
DECIMAL = re.compile(r"^-?\d+(\.\d+)?$")


def assert_valid_junit(xml_text: str) -> ET.Element:
    """The rules of the JUnit XML schema that Jenkins, GitLab and Surefire read (junit.xsd):
    <testsuites> of <testsuite name tests [failures errors skipped time timestamp hostname]>,
    each holding [properties], testcase*, [system-out], [system-err] in that order; a testcase
    has name and classname, a decimal time, and children among skipped / error / failure /
    system-out / system-err; counts agree with the test cases."""
    root = ET.fromstring(xml_text.encode("utf-8"))
    assert root.tag == "testsuites"
    assert all(child.tag == "testsuite" for child in root)
    for suite in root:
        assert suite.get("name") and suite.get("tests") is not None
        for attr in ("tests", "failures", "errors", "skipped"):
            assert suite.get(attr, "0").isdigit()
        assert DECIMAL.match(suite.get("time", "0"))
        if suite.get("timestamp") is not None:
            assert ISO_DATETIME.match(suite.get("timestamp"))  # xs:dateTime without a zone
        order = {"properties": 0, "testcase": 1, "system-out": 2, "system-err": 3}
        tags = [order[c.tag] for c in suite]  # KeyError on an element the schema does not allow
        assert tags == sorted(tags) and tags.count(0) <= 1 and tags.count(2) <= 1 and tags.count(3) <= 1
        for prop in suite.findall("properties/property"):
            assert prop.get("name") is not None and prop.get("value") is not None
        cases = suite.findall("testcase")
        assert int(suite.get("tests")) == len(cases)
        assert int(suite.get("failures", "0")) == sum(1 for c in cases if c.find("failure") is not None)
        assert int(suite.get("errors", "0")) == sum(1 for c in cases if c.find("error") is not None)
        assert int(suite.get("skipped", "0")) == sum(1 for c in cases if c.find("skipped") is not None)
        for case in cases:
            assert case.get("name") and case.get("classname")
            assert DECIMAL.match(case.get("time", "0"))
            kids = [k.tag for k in case]
            assert set(kids) <= {"skipped", "error", "failure", "system-out", "system-err"}
            assert kids.count("skipped") <= 1
            assert not ("skipped" in kids and "failure" in kids)
            for f in case.findall("failure"):
                assert f.get("message") is not None and f.get("type") is not None
    return root


def test_junit_validates_one_case_per_check(cli, baselines, tmp_path):
    junit = tmp_path / "gate.xml"
    code, _, _ = cli(
        ["gate", str(shared_trace("v100_resnet50_nw0")), "-b", str(baselines["v100_resnet50_nw4"]), "--max-share", "dataloader=0.05", "--junit", str(junit)],
        cwd=tmp_path,
    )
    assert code == 1
    root = assert_valid_junit(junit.read_text(encoding="utf-8"))
    cases = root.findall(".//testcase")
    assert len(cases) == 4  # step time, new findings, environment, dataloader share
    failed = [c.get("name") for c in cases if c.find("failure") is not None]
    assert len(failed) == 2 and any("step time" in n for n in failed) and any("dataloader" in n for n in failed)


def hostile_result(status: str = "fail", strict: bool = False) -> GateResult:
    evil = 'ker<nel>|"x" & %0A 50%\nline2\x00\x07\x1b[2J [link](javascript:alert(1)) ::error::'
    return GateResult(
        checks=[Check("max-share.dataloader", f"title, with: {evil}", status, evil, "<= 5%", evil)],
        strict=strict,
        candidate={"source": evil, "steps": 6},
        baseline=None,
        settings={"tolerance": 0.05},
        warnings=[evil],
    )


def test_strings_from_traces_stay_data_in_every_format():
    xml_text = to_junit(hostile_result())
    root = assert_valid_junit(xml_text)  # parses: control characters removed, markup escaped
    assert "ker<nel>" in root.find(".//failure").get("message")
    (line,) = github_annotations(hostile_result())
    assert line.startswith("::error title=advisor gate%3A title%2C with%3A ")
    assert "\n" not in line and "%0A" in line and "%25" in line
    command, _, message = line[2:].partition("::")  # the first "::" after the command ends its properties
    assert ":" not in command and command.count(",") == 0 and "\x00" not in line
    assert message.endswith("::error::")  # the message's own colons stay in the message
    md = github_summary(hostile_result())
    table_rows = [r for r in md.splitlines() if r.startswith("| ")]
    assert all(r.count(" | ") == 4 for r in table_rows[2:])  # no cell splits the table
    assert "<nel>" not in md and "&lt;nel&gt;" in md
    assert re.search(r"(?<!\\)[\[\]]", md) is None  # every bracket escaped: no link can form
    term = io.StringIO()
    render_terminal(hostile_result(), Console(file=term, color_system=None, width=300))
    assert "ker<nel>" in term.getvalue() and "\x1b" not in term.getvalue()  # no markup, no escape sequences
    # an inconclusive check is a skip, or a failure under --strict
    assert assert_valid_junit(to_junit(hostile_result("inconclusive"))).find(".//skipped") is not None
    assert assert_valid_junit(to_junit(hostile_result("inconclusive", strict=True))).find(".//failure") is not None


# --- GitHub Actions -------------------------------------------------------------------------
def test_github_actions_annotations_and_step_summary(baselines, tmp_path):
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    code, out, _ = run_cli(
        ["gate", str(shared_trace("v100_resnet50_nw0")), "-b", str(baselines["v100_resnet50_nw4"])],
        cwd=tmp_path,
        env={"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary)},
    )
    assert code == 1
    errors = [l for l in out.splitlines() if l.startswith("::error ")]
    warnings = [l for l in out.splitlines() if l.startswith("::warning ")]
    assert len(errors) == 1 and errors[0].startswith("::error title=advisor gate%3A step time vs baseline::")
    assert "+26%" in errors[0]
    assert any("dataloader-stall" in w for w in warnings)
    text = summary.read_text()
    assert text.startswith("earlier step\n")  # appended, not overwritten
    assert "advisor gate: FAIL" in text and "| step time vs baseline | ❌ fail |" in text
    # outside GitHub Actions: no workflow commands
    code, out, _ = run_cli(["gate", str(shared_trace("v100_resnet50_nw0")), "-b", str(baselines["v100_resnet50_nw4"])], cwd=tmp_path)
    assert "::error" not in out
