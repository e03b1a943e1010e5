"""Hostile folders and broken traces, third round: each test is built from one reproducer.

- A config merely found in the current folder or above (a cloned repository's pyproject.toml)
  never makes the advisor reach a machine (`scheduler`), and the paths it names never make
  `advisor baseline` replace a file that is not a baseline.
- The cache removes only what it sealed and follows no symbolic link.
- Files that are not files (FIFOs, links to /dev/zero, sparse files) end in one line or a
  warning, never in a hang or gigabytes read.
- Numbers from broken traces are warned about, never reported as measured.

Every input is generated here (or is one of this project's own recordings, changed as named).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import SAMPLE_RUNS

import advisor.load.cluster as cluster

CPU_RUN = SAMPLE_RUNS / "resnet18_cifar" / "runs" / "cpu_baseline"


@pytest.fixture(autouse=True)
def private_dirs(tmp_path_factory, monkeypatch):
    """A cache and a user config folder of this test's own."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("xdg-config")))
    for k in ("ADVISOR_CACHE", "ADVISOR_SCHEDULER", "ADVISOR_MAX_TRACE_BYTES"):
        monkeypatch.delenv(k, raising=False)


@pytest.fixture
def reached(monkeypatch):
    """The scheduler addresses the report tried to reach (none is reached: each ends in exit 2)."""
    from advisor.errors import InputError

    addresses: list[str] = []

    def fake(address, note=None):
        addresses.append(address)
        raise InputError(None, f"would reach {address}")

    monkeypatch.setattr(cluster, "cluster_executor", fake)
    return addresses


# --- 1. nothing reached from a found config ------------------------------------------------------
@pytest.mark.parametrize("name, text", [("pyproject.toml", '[tool.advisor]\nscheduler = "tcp://10.9.8.7:8786"\n'), ("advisor.toml", 'scheduler = "tcp://10.9.8.7:8786"\n')])
def test_a_scheduler_in_a_found_config_is_refused_and_nothing_is_reached(cli, tmp_path, reached, name, text):
    """The reproducer: `[tool.advisor] scheduler = "tcp://HOST:PORT"` in a cloned repository made
    `advisor report` connect there and unpickle what came back. Found in the folder or a parent,
    it is refused in one line naming the file, the key and how to pass one (exit 2)."""
    (tmp_path / name).write_text(text)
    inner = tmp_path / "src" / "deeper"
    inner.mkdir(parents=True)
    for cwd in (tmp_path, inner):
        code, out, err = cli(["report", str(CPU_RUN), "-f", "json"], cwd=cwd)
        assert code == 2, out + err
        [line] = err.strip().splitlines()
        assert str(tmp_path / name) in line and "scheduler" in line and "--scheduler" in line and "ADVISOR_SCHEDULER" in line and "--config" in line, line
    assert reached == []


def test_a_scheduler_passed_explicitly_is_the_one_reached(cli, tmp_path, reached):
    """The command line, the environment, a --config file and the user's own config are explicit:
    their scheduler is reached (and a found config's key is never the one used)."""
    found = tmp_path / "repo"
    found.mkdir()
    (found / "pyproject.toml").write_text('[tool.advisor]\nscheduler = "tcp://found:1"\n')
    code, _, err = cli(["report", str(CPU_RUN), "--scheduler", "tcp://flag:2"], cwd=found)
    assert code == 2 and "would reach tcp://flag:2" in err, err
    code, _, err = cli(["report", str(CPU_RUN)], cwd=found, env={"ADVISOR_SCHEDULER": "tcp://env:3"})
    assert code == 2 and "would reach tcp://env:3" in err, err
    named = tmp_path / "cluster.toml"
    named.write_text('scheduler = "tcp://named:4"\n')
    code, _, err = cli(["report", str(CPU_RUN), "--config", str(named)], cwd=tmp_path)
    assert code == 2 and "would reach tcp://named:4" in err, err
    # The user's own config: where no project config is found, and beside a project config without the key.
    user = Path(os.environ["XDG_CONFIG_HOME"]) / "torch-advisor" / "advisor.toml"
    user.parent.mkdir(parents=True)
    user.write_text('scheduler = "tcp://mine:5"\n')
    plain = tmp_path / "plain"
    plain.mkdir()
    code, _, err = cli(["report", str(CPU_RUN)], cwd=plain)
    assert code == 2 and "would reach tcp://mine:5" in err, err
    (plain / "pyproject.toml").write_text('[tool.advisor]\nignore = ["channels-last"]\n')
    code, _, err = cli(["report", str(CPU_RUN)], cwd=plain)
    assert code == 2 and "would reach tcp://mine:5" in err, err
    assert reached == ["tcp://flag:2", "tcp://env:3", "tcp://named:4", "tcp://mine:5", "tcp://mine:5"]


def test_a_found_config_path_never_replaces_a_file_that_is_not_a_baseline(cli, tmp_path):
    """The reproducer: `[tool.advisor.gate] baseline = "../precious.txt"` and `advisor baseline
    RUN` replaced precious.txt with JSON. A file that is not a baseline the advisor wrote is
    replaced only when the user names it (-o) or passes --force; a link is never followed."""
    repo = tmp_path / "repo"
    repo.mkdir()
    precious = tmp_path / "precious.txt"
    precious.write_text("years of notes\n")
    (repo / "pyproject.toml").write_text('[tool.advisor.gate]\nbaseline = "../precious.txt"\n')
    code, out, err = cli(["baseline", str(CPU_RUN)], cwd=repo)
    assert code == 2, out + err
    [line] = err.strip().splitlines()
    assert "precious.txt" in line and "not a baseline" in line and "--force" in line and "-o" in line, line
    assert precious.read_text() == "years of notes\n"
    # A link the config names, to a file that is not a baseline: not followed, not replaced.
    target = tmp_path / "elsewhere.txt"
    target.write_text("keep\n")
    (repo / "pyproject.toml").write_text('[tool.advisor.gate]\nbaseline = "link.json"\n')
    (repo / "link.json").symlink_to(target)
    code, _, err = cli(["baseline", str(CPU_RUN)], cwd=repo)
    assert code == 2 and "not a baseline" in err and target.read_text() == "keep\n" and (repo / "link.json").is_symlink(), err
    # The default path holding something else is kept too.
    (repo / "pyproject.toml").unlink()
    (repo / "perf").mkdir()
    (repo / "perf" / "baseline.json").write_text('{"mine": true}\n')
    code, _, err = cli(["baseline", str(CPU_RUN)], cwd=repo)
    assert code == 2 and json.loads((repo / "perf" / "baseline.json").read_text()) == {"mine": True}, err
    # --force replaces it; then it is a baseline, which a later plain run replaces.
    code, _, err = cli(["baseline", str(CPU_RUN), "--force"], cwd=repo)
    assert code == 0, err
    assert json.loads((repo / "perf" / "baseline.json").read_text())["schema"] == "advisor/baseline/v1"
    code, _, err = cli(["baseline", str(CPU_RUN)], cwd=repo)
    assert code == 0, err
    # -o names the file: the user's explicit choice.
    (repo / "pyproject.toml").write_text('[tool.advisor.gate]\nbaseline = "../precious.txt"\n')
    code, _, err = cli(["baseline", str(CPU_RUN), "-o", str(precious)], cwd=repo)
    assert code == 0, err
    assert json.loads(precious.read_text())["schema"] == "advisor/baseline/v1"
