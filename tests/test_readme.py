"""The README shows what the advisor prints: its sample output comes from the command it names,
run on the recorded sample in the repository."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

from conftest import REPO

README = (REPO / "README.md").read_text(encoding="utf-8")


def test_sample_output_is_what_the_command_prints():
    block = re.search(r"```\n\$ (advisor [^\n]+)\n(.*?)```", README, re.S)
    assert block is not None, "no sample output block"
    command, shown = shlex.split(block.group(1)), block.group(2).splitlines()
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}  # as in a pipe: no wrapping
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    r = subprocess.run([sys.executable, "-m", *command], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    printed = [line.rstrip() for line in r.stdout.splitlines()]
    # the shown lines appear in the output, in order ("..." stands for lines left out)
    at = 0
    for line in shown:
        if line == "...":
            continue
        assert line in printed[at:], f"README shows a line the command does not print after line {at}: {line!r}"
        at = printed.index(line, at) + 1
    assert len([line for line in shown if line != "..."]) >= 4


def _block_after(marker: str, fence: str) -> str:
    """The first ```fence block after `marker` in the README."""
    body = re.search(rf"```{fence}\n(.*?)```", README[README.index(marker):], re.S)
    assert body is not None, f"no ```{fence} block after {marker!r}"
    return body.group(1)


def test_the_commands_on_the_shipped_runs_run_on_a_clone(tmp_path):
    """"Already have a trace?": each command of that block that names no folder of the user's
    (`./log`) runs, from a folder holding what a clone has (sample_runs/), and exits 0; the
    HTML file it names is written."""
    import shutil

    from test_everyday import advisor

    shutil.copytree(REPO / "sample_runs", tmp_path / "sample_runs")
    block = _block_after("Already have a trace?", "bash")
    commands = [shlex.split(line.split("#", 1)[0]) for line in block.splitlines() if line.strip()]
    ours = [c for c in commands if "./log" not in c]
    assert len(ours) >= 5 and all(c[0] == "advisor" for c in commands)
    for command in ours:
        assert all(not a.startswith("/") and "shared" not in a for a in command)
        r = advisor(command[1:], tmp_path)
        assert r.returncode == 0, (command, r.stderr)
        assert "Traceback" not in r.stderr
    assert "<html" in (tmp_path / "report.html").read_text(encoding="utf-8").lower()


def test_the_python_example_runs_on_a_clone(tmp_path, monkeypatch):
    """The README's Python block runs as written, from a folder holding sample_runs/, and the
    frames it names are there: the findings ranked, the breakdown's slices, the steps."""
    import shutil

    shutil.copytree(REPO / "sample_runs", tmp_path / "sample_runs")
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(_block_after("From Python", "python"), "README.md", "exec"), scope)
    run = scope["run"]
    found = run.findings[["rule", "saving_ms", "message"]]
    # ranked: in rank order, the largest saving first (a fix that saves on top of another follows it)
    assert len(found) and list(run.findings["rank"]) == sorted(run.findings["rank"])
    assert found["saving_ms"].iloc[0] == found["saving_ms"].max()
    assert found["rule"].iloc[0] == "dataloader-stall"
    assert {"category", "ms_per_step"} <= set(run.breakdown.columns)
    assert len(run.steps) == 3 and len(run.kernels) and len(run.ops)
