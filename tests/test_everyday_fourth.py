"""Everyday use, fourth round: what a user meets after the quick start, on the recorded sample
runs and the public V100 traces (a gate whose "new" means new, outputs where the shell expects
them, the Python API taking what the command line takes, the JSON summary, quick listings)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
