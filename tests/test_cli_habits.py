"""The command line's everyday habits, on the recorded sample runs: --version, shell completion,
the format from the output file's suffix, comma-separated rule lists, the gate finding the
baseline where `advisor baseline` put it, and output that is not wrapped in pipes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, SAMPLE_RUNS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

GPU_RUN = SAMPLE_RUNS / "resnet18_cifar" / "runs" / "gpu_baseline"
CPU_RUN = SAMPLE_RUNS / "resnet18_cifar" / "runs" / "cpu_baseline"


def advisor(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The real program in a child process, its stdout a pipe (as in CI), no COLUMNS unless given."""
    base = {k: v for k, v in os.environ.items() if k != "COLUMNS" and not k.startswith("GITHUB_")}
    base["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "advisor", *args], cwd=cwd, env={**base, **(env or {})}, capture_output=True, text=True, timeout=120
    )


def test_version_is_the_packaged_one(cli, tmp_path):
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    code, out, err = cli(["--version"], cwd=tmp_path)
    assert code == 0, err
    assert out.strip() == f"advisor {version}"


def test_shell_completion_is_offered_and_completes_commands(tmp_path):
    script = Path(sys.executable).parent / "advisor"
    if not script.exists():
        pytest.skip("the advisor console script is not installed in this environment")
    env = {**os.environ, "_ADVISOR_COMPLETE": "complete_bash", "COMP_WORDS": "advisor ga", "COMP_CWORD": "1"}
    r = subprocess.run([str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.split() == ["gate"], (r.stdout, r.stderr)
    r = subprocess.run([str(script), "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert "--install-completion" in r.stdout


@pytest.mark.parametrize(
    "name, opening",
    [("report.html", "<!doctype html>"), ("report.json", '{\n  "schema": "advisor/report/v1"'), ("report.md", "### advisor: "), ("report.txt", "Run ")],
)
def test_output_suffix_chooses_the_format(cli, tmp_path, name, opening):
    code, _, err = cli(["report", str(CPU_RUN), "-o", str(tmp_path / name)], cwd=tmp_path)
    assert code == 0, err
    assert (tmp_path / name).read_text().lower().startswith(opening.lower())


def test_explicit_format_wins_over_the_suffix(cli, tmp_path):
    code, _, err = cli(["report", str(CPU_RUN), "--format", "json", "-o", str(tmp_path / "r.html")], cwd=tmp_path)
    assert code == 0, err
    assert json.loads((tmp_path / "r.html").read_text())["schema"] == "advisor/report/v1"


def test_diff_output_suffix_chooses_the_format(cli, tmp_path):
    after = SAMPLE_RUNS / "resnet18_cifar" / "runs" / "gpu_workers"
    code, _, err = cli(["diff", str(GPU_RUN), str(after), "-o", str(tmp_path / "d.html")], cwd=tmp_path)
    assert code == 0, err
    assert (tmp_path / "d.html").read_text().lower().startswith("<!doctype html>")


def test_select_takes_a_comma_separated_list(cli, tmp_path):
    def rules(args: list[str]) -> list[str]:
        code, out, err = cli(["report", str(GPU_RUN), "--format", "json", *args], cwd=tmp_path)
        assert code == 0, err
        return sorted(f["rule"] for f in json.loads(out)["findings"])

    everything = rules([])
    assert len(everything) >= 3
    pair = everything[:2]
    assert rules(["--select", ",".join(pair)]) == pair == rules(["--select", pair[0], "--select", pair[1]])
    rest = rules(["--ignore", f"{pair[0]}, {pair[1]}"])
    assert not set(pair) & set(rest) and rest == rules(["--ignore", pair[0], "--ignore", pair[1]])
    code, _, err = cli(["report", str(GPU_RUN), "--select", f"{pair[0]},no-such-rule"], cwd=tmp_path)
    assert code == 2 and "no-such-rule" in err


def test_gate_reads_the_baseline_where_baseline_wrote_it(cli, tmp_path):
    code, _, err = cli(["baseline", str(GPU_RUN)], cwd=tmp_path)
    assert code == 0, err
    assert (tmp_path / "perf" / "baseline.json").is_file()
    code, out, err = cli(["gate", str(GPU_RUN), "--json", str(tmp_path / "gate.json")], cwd=tmp_path)
    assert code == 0, out + err
    result = json.loads((tmp_path / "gate.json").read_text())
    assert result["settings"]["baseline"] == str(Path("perf") / "baseline.json")
    regression = next(c for c in result["checks"] if c["id"] == "step-time-regression")
    assert regression["status"] in ("pass", "inconclusive")  # the same run: never slower than itself
    assert "perf/baseline.json" in err


def test_pipes_are_not_wrapped_at_80_columns(tmp_path):
    r = advisor(["report", str(GPU_RUN)], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    report = json.loads(advisor(["report", str(GPU_RUN), "--format", "json"], cwd=tmp_path).stdout)
    lines = r.stdout.splitlines()
    for f in report["findings"]:
        assert any(line.strip() == f["message"] for line in lines), f["message"]  # each message whole, on one line
    assert max(len(line) for line in lines) > 80
    narrow = advisor(["report", str(GPU_RUN)], cwd=tmp_path, env={"COLUMNS": "80"})
    assert max(len(line) for line in narrow.stdout.splitlines()) <= 80


def test_gate_why_column_is_not_squeezed_in_a_pipe(tmp_path):
    r = advisor(["gate", str(GPU_RUN), "--max-step-time-ms", "1", "--json", str(tmp_path / "g.json")], cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    check = next(c for c in json.loads((tmp_path / "g.json").read_text())["checks"] if c["status"] == "fail")
    assert len(check["message"]) > 40
    assert any(check["message"] in line for line in r.stdout.splitlines())


def test_the_report_hint_lines_fit_80_columns(tmp_path):
    r = advisor(["report", str(GPU_RUN)], cwd=tmp_path, env={"COLUMNS": "80"})
    lines = [line.rstrip() for line in r.stdout.splitlines()]
    assert "  -v: the evidence and the code to change" in lines
    assert "  advisor explain RULE: how a rule decides and estimates its saving" in lines
    verbose = advisor(["report", str(GPU_RUN), "-v"], cwd=tmp_path)
    snippet_line = "for x, y in loader:"
    assert any(snippet_line in line for line in verbose.stdout.splitlines())


def test_gate_forbid_takes_a_comma_separated_list(cli, tmp_path):
    code, out, err = cli(["report", str(GPU_RUN), "--format", "json"], cwd=tmp_path)
    fired = [f["rule"] for f in json.loads(out)["findings"]][:2]
    code, _, err = cli(["gate", str(GPU_RUN), "--forbid", ",".join(fired), "--json", str(tmp_path / "g.json")], cwd=tmp_path)
    assert code == 1, err  # both rules fire on this run, so the budget fails
    settings = json.loads((tmp_path / "g.json").read_text())["settings"]["budgets"]["forbid_rules"]
    assert settings == fired


def test_the_advisors_own_failure_has_its_own_exit_code(cli, tmp_path, monkeypatch):
    """A bug in the advisor ends in 70 (EX_SOFTWARE), never 3: a profiled script's own
    `sys.exit(3)` is passed through as 3, and CI must tell the two apart."""
    import advisor.render.text as text

    def broken(*_a, **_k):
        raise ZeroDivisionError("float division by zero")

    monkeypatch.setattr(text, "render_text", broken)
    code, _, err = cli(["report", str(SAMPLE_RUNS / "resnet18_cifar" / "runs" / "cpu_baseline")], tmp_path)
    assert code == 70, err
    assert err.strip() == "advisor: internal error: ZeroDivisionError: float division by zero (set ADVISOR_DEBUG=1 for the traceback)"


def test_an_analysis_command_ends_as_python_would_without_the_teardown(tmp_path):
    """report, gate, baseline, diff and whatif leave by advisor.leaving.leave, skipping the
    interpreter's teardown: all they wrote reaches the pipe, the status is sys.exit's, an error
    is its one line, and the atexit handlers run (a temporary folder is removed)."""
    r = advisor(["report", str(GPU_RUN), "-f", "json"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["findings"]
    missing = advisor(["report", str(tmp_path / "missing")], cwd=tmp_path)
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "missing" in missing.stderr
    script = (
        "import atexit, sys, tempfile\n"
        "from advisor.leaving import leave\n"
        "folder = tempfile.TemporaryDirectory()\n"
        "sys.stderr.write(folder.name)\n"
        "atexit.register(lambda: open(sys.argv[1], 'w').write('ran'))\n"
        "sys.stdout.write('written, never flushed')\n"
        "leave(5)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    r = subprocess.run([sys.executable, "-c", script, str(tmp_path / "atexit")], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 5 and r.stdout == "written, never flushed", r.stderr
    assert (tmp_path / "atexit").read_text() == "ran"
    assert r.stderr and not Path(r.stderr).exists()
