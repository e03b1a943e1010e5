"""`advisor fix --write` and what it writes: the script's own settings kept, the kept original
(SCRIPT.orig) never written through a link nor left half-written, the git check that runs
nothing from the repository, and a written file that always compiles, with the script's own
line endings and byte order mark.

The scripts are generated here; the findings are those of a real CPU run of
tests/data/fix/plain_loop.py (`advisor profile`, 2 cores: it asks for one DataLoader worker).
"""

from __future__ import annotations

import codecs
import os
import stat
import subprocess
from pathlib import Path

import pytest

from advisor.analysis import analyze
from advisor.errors import InputError
from advisor.fix import DONE, PLACED, SKIPPED, plan_fixes

REPO = Path(__file__).resolve().parents[1]
RUN = REPO / "tests" / "data" / "fix" / "runs" / "plain_loop_cpu"

SCRIPT = """\
import argparse

import torch
from torch.utils.data import DataLoader

p = argparse.ArgumentParser()
p.add_argument("--workers", type=int, default=0)
args = p.parse_args()
loader = DataLoader(range(8), batch_size=4, num_workers=args.workers)
for x in loader:
    pass
"""


@pytest.fixture(scope="module")
def found() -> list[dict]:
    return analyze(RUN).to_dict()["findings"]


@pytest.fixture(scope="module")
def stall(found) -> dict:
    return next(f for f in found if f["rule"] == "dataloader-stall")


def git(folder: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=folder, check=True, capture_output=True)


def repo_with(folder: Path, files: dict[str, str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    git(folder, "init", "-q")
    git(folder, "add", *files)
    git(folder, "commit", "-qm", "x")
    return folder


# --- the script's own switch is kept ----------------------------------------------------------
def test_a_workers_switch_gets_its_default_changed_and_keeps_working(tmp_path, stall):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    plan = plan_fixes(path, [stall])
    [result] = plan.results
    text = plan.fixed_text()
    assert 'p.add_argument("--workers", type=int, default=1)' in text  # the finding's one worker
    assert "num_workers=args.workers, persistent_workers=args.workers > 0)" in text  # the expression stays
    assert result.status == PLACED and "--workers switch" in result.detail and "num_workers=args.workers is kept" in result.detail
    # the switch still decides: 0 workers from the command line is still 0 (no persistent workers then)
    path.write_text(text)
    for workers in ("0", "1"):
        done = subprocess.run([os.sys.executable, str(path), "--workers", workers], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
    assert plan_fixes(path, [stall]).results[0].status == DONE


def test_a_plain_name_gets_its_assignment_changed_and_an_unknown_setting_is_not_guessed(tmp_path, stall):
    path = tmp_path / "train.py"
    path.write_text("from torch.utils.data import DataLoader\nworkers = 0\nloader = DataLoader(range(8), num_workers=workers)\n")
    text = plan_fixes(path, [stall]).fixed_text()
    assert "workers = 1\n" in text and "num_workers=workers, persistent_workers=workers > 0)" in text
    path.write_text("from torch.utils.data import DataLoader\ndef make(cfg):\n    return DataLoader(range(8), num_workers=cfg.workers)\n")
    [result] = plan_fixes(path, [stall]).results
    assert result.status == SKIPPED and "cfg.workers" in result.detail and "make it 1 where cfg.workers is set" in result.detail


def test_a_second_write_on_the_fixed_script_changes_nothing_and_says_so(cli, tmp_path):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    code, out, err = cli(["fix", str(path), "--from", str(RUN), "--select", "dataloader-stall", "--write"])
    assert code == 0 and "default=1" in path.read_text(), err
    orig = path.with_name("train.py.orig")
    assert orig.read_text() == SCRIPT
    fixed = path.read_text()
    for force in ([], ["--force"]):
        code, out, err = cli(["fix", str(path), "--from", str(RUN), "--select", "dataloader-stall", "--write", *force])
        assert code == 0 and out == "", err
        assert "nothing to change: the script already has every fix asked for" in err and "train.py.orig is left as it is" in err
        assert "already exists" not in err
        assert path.read_text() == fixed and orig.read_text() == SCRIPT


# --- git runs nothing from the repository -------------------------------------------------------
def test_the_git_check_runs_no_command_of_the_repository(cli, tmp_path):
    work = repo_with(tmp_path / "repo", {"train.py": SCRIPT})
    marker = tmp_path / "fsmonitor-ran"
    hook = tmp_path / "monitor.sh"
    hook.write_text(f"#!/bin/sh\ntouch {marker}\n")
    hook.chmod(0o755)
    git(work, "config", "core.fsmonitor", str(hook))
    # git itself runs the repository's fsmonitor (the check is real)
    subprocess.run(["git", "status", "--porcelain"], cwd=work, capture_output=True)
    assert marker.exists(), "this git runs core.fsmonitor: the check below can fail"
    marker.unlink()
    path = work / "train.py"
    path.write_text(SCRIPT + "# mine\n")
    code, out, err = cli(["fix", str(path), "--from", str(RUN), "--select", "dataloader-stall", "--write"])
    assert code == 2 and "uncommitted changes" in err and len(err.strip().splitlines()) == 1
    assert not marker.exists()
    git(work, "commit", "-qam", "mine")  # git's own commit runs the monitor
    marker.unlink(missing_ok=True)
    code, out, err = cli(["fix", str(path), "--from", str(RUN), "--select", "dataloader-stall", "--write"])
    assert code == 0, err
    assert not marker.exists()


def test_a_link_to_a_changed_file_in_git_is_refused_like_the_file(cli, tmp_path):
    work = repo_with(tmp_path / "repo", {"train.py": SCRIPT})
    (work / "train.py").write_text(SCRIPT + "# mine\n")
    link = tmp_path / "train.py"
    link.symlink_to(work / "train.py")
    code, out, err = cli(["fix", str(link), "--from", str(RUN), "--select", "dataloader-stall", "--write"])
    assert code == 2 and "uncommitted changes" in err
    assert (work / "train.py").read_text() == SCRIPT + "# mine\n" and not (tmp_path / "train.py.orig").exists()


# --- the kept original ------------------------------------------------------------------------
def test_a_dangling_orig_link_is_never_followed(cli, tmp_path):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    elsewhere = tmp_path / "elsewhere" / "x"
    elsewhere.parent.mkdir()
    path.with_name("train.py.orig").symlink_to(elsewhere)
    code, out, err = cli(["fix", str(path), "--from", str(RUN), "--select", "dataloader-stall", "--write"])
    assert code == 2 and "train.py.orig" in err and "already exists" in err
    assert not elsewhere.exists() and path.read_text() == SCRIPT


def test_with_force_an_orig_link_is_replaced_never_written_through(cli, tmp_path):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    important = tmp_path / "important.txt"
    important.write_text("keep me\n")
    orig = path.with_name("train.py.orig")
    orig.symlink_to(important)
    code, out, err = cli(["fix", str(path), "--from", str(RUN), "--select", "dataloader-stall", "--write", "--force"])
    assert code == 0, err
    assert important.read_text() == "keep me\n"
    assert not orig.is_symlink() and orig.read_text() == SCRIPT


def test_the_orig_keeps_the_scripts_mode(cli, tmp_path):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    path.chmod(0o600)
    code, out, err = cli(["fix", str(path), "--from", str(RUN), "--select", "dataloader-stall", "--write"])
    assert code == 0, err
    assert stat.S_IMODE(path.with_name("train.py.orig").stat().st_mode) == 0o600
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_failed_write_leaves_no_orig_behind(cli, tmp_path, monkeypatch):
    """A full disk: every write of the backup fails with ENOSPC. Nothing is left, and the next
    run is not blocked by an empty SCRIPT.orig."""
    import errno

    from advisor.fix import files

    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    real_write = os.write

    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files.os, "write", full)
    code, out, err = cli(["fix", str(path), "--from", str(RUN), "--select", "dataloader-stall", "--write"])
    assert code == 2 and "train.py.orig: cannot write: No space left on device" in err.strip().splitlines()[-1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"] and path.read_text() == SCRIPT
    monkeypatch.setattr(files.os, "write", real_write)
    code, out, err = cli(["fix", str(path), "--from", str(RUN), "--select", "dataloader-stall", "--write"])
    assert code == 0 and path.with_name("train.py.orig").read_text() == SCRIPT, err


# --- what is written compiles, and only the fix's lines change ---------------------------------
def test_a_generator_argument_gets_its_parentheses(tmp_path, found):
    path = tmp_path / "train.py"
    path.write_text(
        "import torch\nfrom torch.utils.data import DataLoader\n"
        "model = torch.nn.Linear(2, 2)\n"
        "opt = torch.optim.AdamW(p for p in model.parameters() if p.requires_grad)\n"
        "loader = DataLoader(x for x in range(8))\n"
        "for x in loader:\n    opt.zero_grad()\n"
    )
    single = {"rule": "single-tensor-optimizer", "message": "", "fix": {"text": "foreach=True"}}
    stall = next(f for f in found if f["rule"] == "dataloader-stall")
    plan = plan_fixes(path, [stall, single])
    text = plan.fixed_text()
    assert "torch.optim.AdamW((p for p in model.parameters() if p.requires_grad), foreach=True)" in text
    assert "DataLoader((x for x in range(8)), num_workers=1, persistent_workers=True)" in text
    compile(plan.fixed_bytes(), str(path), "exec")


def test_a_fix_that_would_not_compile_is_refused_in_one_line(cli, tmp_path, monkeypatch):
    """Whatever an edit produces, a file that would not compile is never written or shown as
    the fix: one line, exit 2 (here the edit is made to break the code on purpose)."""
    from advisor.fix import source

    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    monkeypatch.setattr(source.cst, "parse_expression", lambda code, _p=source.cst.parse_expression: _p("(yield)") if code == "args.workers > 0" else _p(code))
    for mode in ([], ["--write"]):
        code, out, err = cli(["fix", str(path), "--from", str(RUN), "--select", "dataloader-stall", *mode])
        assert code == 2 and out == "" and "would not compile" in err and len(err.strip().splitlines()) == 1, err
    assert path.read_text() == SCRIPT and sorted(p.name for p in tmp_path.iterdir()) == ["train.py"]


@pytest.mark.parametrize("newline,bom", [("\r\n", False), ("\n", True), ("\r\n", True)])
def test_line_endings_and_byte_order_mark_are_kept(cli, tmp_path, newline, bom):
    path = tmp_path / "train.py"
    original = (codecs.BOM_UTF8 if bom else b"") + SCRIPT.replace("\n", newline).encode()
    path.write_bytes(original)
    code, out, err = cli(["fix", str(path), "--from", str(RUN), "--select", "dataloader-stall", "--write"])
    assert code == 0, err
    written = path.read_bytes()
    assert written.startswith(codecs.BOM_UTF8) == bom
    before, after = original.split(newline.encode()), written.split(newline.encode())
    if newline == "\n":
        assert b"\r" not in written
    else:
        assert written.count(b"\n") == written.count(b"\r\n")
    changed = [(a, b) for a, b in zip(before, after, strict=False) if a != b]
    assert len(before) == len(after) and [b for _, b in changed] == [
        b'p.add_argument("--workers", type=int, default=1)',
        b"loader = DataLoader(range(8), batch_size=4, num_workers=args.workers, persistent_workers=args.workers > 0)",
    ]
    assert path.with_name("train.py.orig").read_bytes() == original


def test_a_script_that_is_not_utf8_is_one_line(tmp_path, stall):
    path = tmp_path / "train.py"
    path.write_bytes(b"# \xff\n" + SCRIPT.encode())
    with pytest.raises(InputError) as exc:
        plan_fixes(path, [stall])
    assert "train.py" in exc.value.line() and "cannot read the script" in exc.value.line()


def test_a_pinned_memory_setting_of_the_script_that_is_replaced_is_said(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT.replace("num_workers=args.workers)", "pin_memory=args.pin)"))
    pinned = {"rule": "h2d-pageable-copy", "message": "", "fix": {"text": "pin_memory=True"}}
    [result] = plan_fixes(path, [pinned]).results
    assert result.status == PLACED and "pin_memory=args.pin (the script's own setting) becomes True" in result.note


def test_run_folders_whose_facts_are_not_files_are_passed_over(tmp_path, monkeypatch):
    """`advisor fix` looks for the script's last profile in ./advisor_runs/: a facts file that
    is a FIFO or leads to /dev/zero is passed over at once, never read."""
    from advisor.cli.fix import last_profile

    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    runs = tmp_path / "advisor_runs"
    for name, make in (("train-1", lambda p: os.mkfifo(p)), ("train-2", lambda p: p.symlink_to("/dev/zero"))):
        (runs / name).mkdir(parents=True)
        (runs / name / "x.pt.trace.json").write_text("{}")
        make(runs / name / "advisor_facts.json")
    monkeypatch.chdir(tmp_path)
    assert last_profile(path, runs_dir=runs) is None
