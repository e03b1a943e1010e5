"""Everyday use through the installed `advisor` program in a child process, its stdout a pipe
(as in CI): the gate judges throughput, not only step time; output to a pipe is plain lines
with names whole; memory is labelled in the units it is computed in."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, SAMPLE_RUNS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

RUNS = SAMPLE_RUNS / "resnet18_cifar" / "runs"


def advisor_program() -> list[str]:
    """The console script beside this interpreter (what `pip install` put there), else `-m`."""
    script = Path(sys.executable).parent / "advisor"
    return [str(script)] if script.exists() else [sys.executable, "-m", "advisor"]


def advisor(args: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: int = 180) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k != "COLUMNS" and not k.startswith("GITHUB_")}
    return subprocess.run([*advisor_program(), *args], cwd=cwd, env={**base, **(env or {})}, capture_output=True, text=True, timeout=timeout)


# --- 1. the gate sees throughput ------------------------------------------------------------
def test_gate_judges_time_per_sample_when_the_batch_changes(tmp_path):
    """Batch 512 (15,197 samples/s) then batch 128 (5,707 samples/s): the step is 33% shorter
    but each sample takes 2.7x as long; the gate must not pass it."""
    r = advisor(["baseline", str(RUNS / "gpu_walk_final"), "-o", "base.json"], tmp_path)
    assert r.returncode == 0, r.stderr
    r = advisor(["gate", str(RUNS / "gpu_compiled"), "--baseline", "base.json", "--min-steps", "3", "--json", "gate.json"], tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "advisor gate: FAIL" in r.stdout
    row = next(line for line in r.stdout.splitlines() if line.startswith("time per sample vs baseline"))
    assert "µs/sample" in row and "samples per step 512 -> 128" in row and "15,197 -> 5,707 samples/s" in row
    doc = json.loads((tmp_path / "gate.json").read_text())
    check = next(c for c in doc["checks"] if c["id"] == "step-time-regression")
    d = check["details"]
    assert d["unit"] == "ms per sample" and (d["baseline_samples_per_step"], d["candidate_samples_per_step"]) == (512, 128)
    # per sample: the step medians over the batch, from the baseline file itself
    base = json.loads((tmp_path / "base.json").read_text())
    assert d["baseline_median_ms"] == pytest.approx(base["metrics"]["step_time_median_ms"] / 512)
    assert d["ratio"] > 2.5


def test_gate_without_the_baselines_batch_never_passes_a_faster_step(tmp_path):
    """A baseline that does not know its batch: a shorter step may be a smaller batch."""
    r = advisor(["baseline", str(RUNS / "gpu_walk_final"), "-o", "base.json"], tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "base.json").read_text())
    doc["environment"]["batch_size"] = None
    (tmp_path / "base.json").write_text(json.dumps(doc))
    r = advisor(["gate", str(RUNS / "gpu_compiled"), "--baseline", "base.json", "--min-steps", "3"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "advisor gate: INCONCLUSIVE" in r.stdout
    assert "the baseline's batch size is unknown" in r.stdout


def test_gate_time_per_sample_budget(tmp_path):
    # gpu_walk_final: mean step 33.69 ms over batch 512 = 65.8 µs per sample
    r = advisor(["gate", str(RUNS / "gpu_walk_final"), "--max-ms-per-sample", "0.07"], tmp_path)
    assert r.returncode == 0 and "65.8 µs/sample" in r.stdout, r.stdout + r.stderr
    r = advisor(["gate", str(RUNS / "gpu_walk_final"), "--max-ms-per-sample", "0.06"], tmp_path)
    assert r.returncode == 1 and "advisor gate: FAIL" in r.stdout, r.stdout + r.stderr


def _shown_commands(text: str, marker: str) -> list[tuple[list[str], list[str]]]:
    """(command, shown output lines) of each ```console block after `marker` in a document."""
    part = text[text.index(marker):]
    blocks = []
    for body in re.findall(r"```console\n(.*?)```", part, re.S)[:1]:
        cmd, out = None, []
        for line in body.splitlines():
            if line.startswith("$ "):
                if cmd:
                    blocks.append((cmd, out))
                cmd, out = line[2:].split(), []
            else:
                out.append(line)
        blocks.append((cmd, out))
    return blocks


@pytest.mark.parametrize("doc", ["README.md", "docs/gate.md"])
def test_the_documented_gate_example_passes_on_the_sample_runs(doc, tmp_path):
    """The gate example the docs show runs on what ships, and prints what they show."""
    text = (REPO / doc).read_text(encoding="utf-8")
    blocks = _shown_commands(text, "<!-- gate example -->")
    assert [c[0][:2] for c in blocks] == [["advisor", "baseline"], ["advisor", "gate"]]
    shutil.copytree(REPO / "sample_runs", tmp_path / "sample_runs")
    for (cmd, shown), expected in zip(blocks, (0, 0), strict=True):
        r = advisor(cmd[1:], tmp_path)
        assert r.returncode == expected, r.stdout + r.stderr
        printed = [line.rstrip() for line in (r.stdout + r.stderr).splitlines()]
        for line in shown:
            if line != "..." and line.strip():
                assert line.rstrip() in printed, f"{doc} shows a line the command does not print: {line!r}\n{printed}"
    assert "advisor gate: PASS" in r.stdout


# --- 4. pipes: plain lines, names whole -----------------------------------------------------
def test_report_in_a_pipe_is_plain_lines_with_whole_names(tmp_path):
    plain = advisor(["report", str(RUNS / "gpu_baseline")], tmp_path)
    verbose = advisor(["report", str(RUNS / "gpu_baseline"), "-v"], tmp_path)
    for r in (plain, verbose):
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert not [line for line in lines if line != line.rstrip()], "trailing blanks in a pipe"
        assert "…" not in r.stdout
        assert "\x1b[" not in r.stdout
    # whole kernel names: the longest cuDNN batch-norm kernel of the run, with its argument list
    assert "void cudnn::bn_bw_1C11_kernel_new<float, float, float2, 128, true, 1>(float, float, float, float, cudnnTensorStruct," in plain.stdout
    # -v adds the evidence and the code, not frames padded to its longest line
    assert len(verbose.stdout) < 3 * len(plain.stdout)
    assert "│" not in verbose.stdout.split("Findings, ranked")[1]
    assert "\n       loader = DataLoader(train_set, batch_size=32, shuffle=True,\n" in verbose.stdout


def test_text_file_output_has_no_trailing_blanks(tmp_path):
    r = advisor(["report", str(RUNS / "gpu_baseline"), "-o", "r.txt"], tmp_path)
    assert r.returncode == 0, r.stderr
    lines = (tmp_path / "r.txt").read_text().splitlines()
    assert lines and all(line == line.rstrip() for line in lines)


# --- 8. units ------------------------------------------------------------------------------
def test_memory_in_binary_units_is_labelled_binary(tmp_path):
    """The H100's 85,017,493,504 bytes of memory are 79.2 GiB (85.0 GB): the label says which."""
    r = advisor(["report", str(RUNS / "gpu_baseline")], tmp_path)
    assert r.returncode == 0, r.stderr
    facts = json.loads((RUNS / "gpu_baseline" / "advisor_facts.json").read_text())
    total = facts["device"]["total_memory_bytes"]
    assert f"{total / 2**30:.1f} GiB" in r.stdout
    assert not re.search(r"\d GB\b(?!/s)", r.stdout), r.stdout


# --- 2. `advisor profile` composes ------------------------------------------------------------
needs_torch = pytest.mark.skipif(__import__("importlib").util.find_spec("torch") is None, reason="needs torch (pip install 'torch-advisor[profile]')")

SCRIPT = """\
import sys
import torch

model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for i in range(8):
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
    print(f"step {i}", flush=True)
print("script end", flush=True)
sys.exit(7)
"""
WINDOW = ["--wait", "0", "--warmup", "1", "--active", "2", "--no-stack", "--after-steps", "5"]


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    return path


@needs_torch
def test_profile_keeps_stdout_the_scripts_and_says_how_the_script_ended(tmp_path, script):
    """Default: stopped after the window: said once, exit 0 (the window recorded and the report
    written is what was asked for; the script's own 7 is not known); the JSON report goes to
    -o, stdout holds only the script's lines."""
    r = advisor(["profile", "--out", "run", *WINDOW, "-o", "report.json", str(script)], tmp_path)
    assert r.returncode == 0, r.stderr
    # stopped in the optimizer step of step 7: the window's 3 steps and 5 timed after it
    assert r.stdout.splitlines() == [f"step {i}" for i in range(7)]
    said = [line for line in r.stderr.splitlines() if "on purpose" in line]
    assert len(said) == 1 and "its own exit status is not known (--full runs it to its end" in said[0]
    assert r.stderr.count("--full") == 1  # said once, where the stop is told, not in the report
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["schema"] == "advisor/report/v1" and report["summary"]["steps"] == 2
    # --full: the script runs to its end, its output and its own exit status come through
    r = advisor(["profile", "--out", "full", *WINDOW, "--full", "-f", "json", str(script)], tmp_path)
    assert r.returncode == 7, r.stderr
    assert r.stdout.splitlines() == [f"step {i}" for i in range(8)] + ["script end"]
    # without -o the JSON report is on stderr, after the advisor's own lines
    doc = json.loads(r.stderr[r.stderr.index("{\n"):])
    assert doc["schema"] == "advisor/report/v1"


@needs_torch
def test_profile_takes_the_rule_options_of_report(tmp_path, script):
    r = advisor(["profile", "--out", "run", *WINDOW, "--select", "window,memory", "-o", "r.json", str(script)], tmp_path)
    assert r.returncode == 0, r.stderr
    rules = {f["rule"] for f in json.loads((tmp_path / "r.json").read_text())["findings"]}
    assert rules <= {"step-time-variance", "allocator-churn", "empty-cache", "memory-growth", "memory-near-limit", "spare-gpu-memory"}


def test_profile_refuses_the_old_meaning_of_o_and_unknown_rules_before_running(tmp_path, script):
    r = advisor(["profile", "-o", "logs", str(script)], tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "-o names the report file" in r.stderr and "the log dir is --out logs" in r.stderr
    r = advisor(["profile", "--select", "memroy", str(script)], tmp_path)
    assert r.returncode == 2 and "did you mean 'memory'?" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "advisor_runs").exists() and not (tmp_path / "logs").exists()


# --- 7. rule selection: ids, groups, prefixes ------------------------------------------------------
def test_select_takes_groups_and_prefixes(tmp_path):
    run = RUNS / "gpu_baseline"
    r = advisor(["report", str(run), "-f", "json", "--select", "h2d"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert {f["rule"] for f in json.loads(r.stdout)["findings"]} == {"h2d-pageable-copy"}
    r = advisor(["report", str(run), "-f", "json", "--select", "memory"], tmp_path)
    assert {f["rule"] for f in json.loads(r.stdout)["findings"]} == {"spare-gpu-memory"}
    r = advisor(["report", str(run), "-f", "json", "--ignore", "memory,h2d,host"], tmp_path)
    doc = json.loads(r.stdout)
    # zero-grad-memset fires, and on top of the DataLoader's fix saves under 0.5% of the step: considered
    assert [f["rule"] for f in doc["findings"]] == ["dataloader-stall"]
    assert "zero-grad-memset" in [f["rule"] for f in doc["considered"]]
    r = advisor(["report", str(run), "--select", "memroy"], tmp_path)
    assert r.returncode == 2 and r.stderr.strip() == (
        "advisor: error: unknown rule, group or prefix 'memroy' in select (did you mean 'memory'?); run `advisor rules` to list them"
    )


def test_a_users_rule_declares_its_group_like_the_shipped_ones(tmp_path):
    """A group is what each rule file's GROUP says: a user's rule joins an existing group (and
    `--select input` runs it with dataloader-stall) or starts a new one."""
    rules = tmp_path / "my_rules"
    rules.mkdir()
    (rules / "slow_batches.py").write_text('"""Mine."""\nID = "slow-batches"\nTITLE = "Mine"\nGROUP = "input"\n\ndef check(ctx):\n    return None\n')
    (rules / "team_rule.py").write_text('"""Mine."""\nID = "team-rule"\nTITLE = "Ours"\nGROUP = "team"\n\ndef check(ctx):\n    return None\n')
    r = advisor(["rules", "--rules", str(rules), "--format", "json", "--select", "input"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert sorted(x["id"] for x in json.loads(r.stdout)) == ["dataloader-stall", "epoch-end", "slow-batches"]
    r = advisor(["rules", "--rules", str(rules), "--format", "json", "--select", "team"], tmp_path)
    assert r.returncode == 0 and [x["id"] for x in json.loads(r.stdout)] == ["team-rule"], r.stderr
    r = advisor(["rules", "--format", "json", "--select", "team"], tmp_path)  # without the rule, no such group
    assert r.returncode == 2
    # a GROUP that is not a name: one line naming the file, exit 2
    (rules / "team_rule.py").write_text('"""Mine."""\nID = "team-rule"\nTITLE = "Ours"\nGROUP = ["team"]\n\ndef check(ctx):\n    return None\n')
    r = advisor(["rules", "--rules", str(rules)], tmp_path)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "team_rule.py" in r.stderr and "GROUP" in r.stderr, r.stderr


def test_rules_as_json_list_every_rule_with_its_group_and_options(tmp_path):
    r = advisor(["rules", "--format", "json"], tmp_path)
    assert r.returncode == 0, r.stderr
    rules = json.loads(r.stdout)
    shipped = sorted(p.stem.replace("_", "-") for p in (REPO / "rules").glob("*.py") if not p.name.startswith("_"))
    assert sorted(x["id"] for x in rules) == shipped
    assert all(x["group"] for x in rules)  # every shipped rule is in a group
    stall = next(x for x in rules if x["id"] == "dataloader-stall")
    assert stall["group"] == "input" and "min_share" in stall["options"]
    r = advisor(["rules", "--select", "memory"], tmp_path)
    assert r.returncode == 0 and "spare-gpu-memory" in r.stdout and "dataloader-stall" not in r.stdout


def test_explain_offers_the_closest_rule_and_md_is_markdown(tmp_path):
    r = advisor(["explain", "dataloader-stal"], tmp_path)
    assert r.returncode == 2 and "did you mean 'dataloader-stall'?" in r.stderr
    r = advisor(["report", str(RUNS / "cpu_baseline"), "-f", "md"], tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("### advisor: "), r.stderr


def test_show_settings_prints_the_resolved_configuration(tmp_path):
    (tmp_path / "advisor.toml").write_text('ignore = ["channels-last"]\n[rules.dataloader-stall]\nmin_share = 0.2\n')
    r = advisor(["report", str(RUNS / "gpu_baseline"), "--select", "input", "--show-settings"], tmp_path)
    assert r.returncode == 0, r.stderr
    doc = tomllib.loads(r.stdout)["tool"]["advisor"]  # TOML, as it would be written in pyproject.toml
    assert doc["select"] == ["input"] and doc["ignore"] == ["channels-last"]
    assert set(doc["rules"]) == {"dataloader-stall", "epoch-end"}
    assert doc["rules"]["dataloader-stall"]["min_share"] == 0.2  # from the file
    assert "min_share = 0.2  # from the config file" in r.stdout
    assert f"# config file: {tmp_path / 'advisor.toml'}" in r.stdout


# --- 6. the Python API ------------------------------------------------------------------------
API_CHECK = """
import json, sys
import advisor
light = sorted(m for m in ("pandas", "numpy", "torch", "rich", "typer") if m in sys.modules)
run = advisor.analyze(sys.argv[1])
out = {
    "light": light,
    "torch": "torch" in sys.modules,
    "findings": run.findings[["rule", "saving_ms"]].values.tolist(),
    "breakdown": dict(zip(run.breakdown["category"], run.breakdown["ms_per_step"])),
    "share_sum": float(run.breakdown["share"].sum()),
    "steps": run.steps["duration_ms"].tolist(),
    "kernels": run.kernels["total_ms"].tolist(),
    "kernel_names": run.kernels["name"].tolist(),
    "kernel_share_sum": float(run.kernels["share"].sum()),
    "ops": run.ops[["name", "count"]].values.tolist(),
    "html": run._repr_html_(),
    "repr": repr(run),
}
print(json.dumps(out))
"""


def test_python_api_gives_the_reports_figures_as_dataframes(tmp_path):
    run = RUNS / "gpu_baseline"
    r = subprocess.run([sys.executable, "-c", API_CHECK, str(run)], cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["light"] == [] and got["torch"] is False  # `import advisor` loads nothing heavy
    report = json.loads(advisor(["report", str(run), "-f", "json"], tmp_path).stdout)
    assert [f[0] for f in got["findings"]] == [f["rule"] for f in report["findings"]]
    assert [f[1] for f in got["findings"]] == pytest.approx([f["saving_ms"] for f in report["findings"]])
    assert got["breakdown"] == pytest.approx(report["summary"]["breakdown_ms"])
    assert got["share_sum"] == pytest.approx(1.0)
    assert len(got["steps"]) == report["summary"]["steps"]
    assert sorted(got["steps"])[len(got["steps"]) // 2] == pytest.approx(report["summary"]["step_time_ms"]["median"])
    assert got["kernels"] == sorted(got["kernels"], reverse=True) and got["kernel_share_sum"] == pytest.approx(1.0)
    assert not any("…" in n for n in got["kernel_names"])
    assert got["ops"] and all(count > 0 for _, count in got["ops"])
    assert "<table" in got["html"] and "dataloader-stall" in got["html"] and got["repr"].startswith("<advisor analysis of 'gpu_baseline'")


def test_python_api_escapes_trace_strings_in_its_html(tmp_path):
    from advisor.api import RunAnalysis

    import advisor

    run = advisor.analyze(RUNS / "cpu_baseline")
    run.analysis.run.name = "<script>alert(1)</script>"
    page = run._repr_html_()
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert isinstance(run, RunAnalysis)


def test_python_api_bad_input_is_an_input_error(tmp_path):
    import advisor
    from advisor.errors import InputError

    (tmp_path / "t.json").write_text("{not json")
    with pytest.raises(InputError) as e:
        advisor.analyze(tmp_path / "t.json")
    assert "t.json" in str(e.value.line())
