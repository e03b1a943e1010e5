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


# --- 2. the cache removes only what it sealed, and follows no link --------------------------------
def _foreign(folder: Path) -> dict[str, bytes]:
    """Folders named as the cache names its own, and a digests/ folder, that the advisor did not make."""
    made = {}
    for rel in ("analysis-0123abcd/notes.txt", "frames-photos/2024.jpg", ".analysis-x.tmp-1/draft.txt", "digests/0123456789abcdef0123456789abcdef", "digests/mine.txt"):
        p = folder / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"the user's own " + rel.encode() * 50)
        made[rel] = p.read_bytes()
    (folder / "analysis-0123abcd" / "seal.json").write_text('{"kind": "analysis", "key": "0123abcd", "files": {}, "mac": "00"}')
    made["analysis-0123abcd/seal.json"] = (folder / "analysis-0123abcd" / "seal.json").read_bytes()
    return made


def _still_there(folder: Path, made: dict[str, bytes]) -> None:
    for rel, data in made.items():
        assert (folder / rel).read_bytes() == data, rel


def _log_dir(tmp_path: Path) -> Path:
    log = tmp_path / "log"
    log.mkdir()
    for p in CPU_RUN.iterdir():
        if p.is_file():
            (log / p.name).write_bytes(p.read_bytes())
    return log


def test_cache_clear_and_eviction_remove_only_sealed_entries(cli, tmp_path):
    """The reproducer: with ADVISOR_CACHE=DIR, `advisor cache clear` and the size cap deleted
    any folder in DIR named analysis-*, frames-* or digests/."""
    cache = tmp_path / "cache"
    cache.mkdir()
    made = _foreign(cache)
    env = {"ADVISOR_CACHE": str(cache)}
    code, _, err = cli(["report", str(CPU_RUN), "-f", "json"], env=env)
    assert code == 0, err
    own = [p for p in cache.iterdir() if p.name.startswith("analysis-") and (p / "seal.json").is_file() and p.name != "analysis-0123abcd"]
    assert own, "the report made an entry of its own"
    # A cap of one byte: eviction after the next write removes every entry but the one written, never a foreign one.
    code, _, err = cli(["report", str(CPU_RUN), "-f", "md"], env={**env, "ADVISOR_CACHE_MAX_BYTES": "1"})
    assert code == 0, err
    _still_there(cache, made)
    code, out, err = cli(["cache", "clear"], env=env)
    assert code == 0, err
    assert not any(p.exists() for p in own), "the advisor's own entries are removed"
    _still_there(cache, made)


def test_a_cache_link_shipped_with_a_log_dir_is_not_followed(cli, tmp_path):
    """The reproducer: a log dir shipping `.advisor-cache -> VICTIM` got entries written into
    VICTIM and VICTIM's analysis-* folders evicted. The link is not used: nothing in VICTIM is
    written, replaced or removed, by a report, the size cap or `advisor cache clear`."""
    victim = tmp_path / "victim"
    victim.mkdir()
    made = _foreign(victim)
    before = sorted(p.relative_to(victim).as_posix() for p in victim.rglob("*"))
    log = _log_dir(tmp_path)
    (log / ".advisor-cache").symlink_to(victim, target_is_directory=True)
    env = {"ADVISOR_CACHE": "beside", "ADVISOR_CACHE_MAX_BYTES": "1"}
    for fmt in ("json", "md"):
        code, _, err = cli(["report", str(log), "-f", fmt], env=env)
        assert code == 0, err
    code, _, err = cli(["cache", "clear", str(log)], env=env)
    assert code == 0, err
    assert sorted(p.relative_to(victim).as_posix() for p in victim.rglob("*")) == before
    _still_there(victim, made)
    # An entry inside a cache folder that is a link: not read through, not replaced, not removed.
    cache = tmp_path / "cache"
    cache.mkdir()
    code, _, err = cli(["report", str(CPU_RUN), "-f", "json"], env={"ADVISOR_CACHE": str(cache)})
    (entry,) = [p for p in cache.iterdir() if p.name.startswith("analysis-")]
    moved = tmp_path / "moved"
    entry.rename(moved)
    entry.symlink_to(moved, target_is_directory=True)
    kept = sorted(p.name for p in moved.iterdir())
    code, _, err = cli(["report", str(CPU_RUN), "-f", "json"], env={"ADVISOR_CACHE": str(cache), "ADVISOR_CACHE_MAX_BYTES": "1"})
    assert code == 0, err
    code, _, err = cli(["cache", "clear"], env={"ADVISOR_CACHE": str(cache)})
    assert code == 0 and entry.is_symlink() and sorted(p.name for p in moved.iterdir()) == kept, err
