"""`advisor view`: the advisor's own HTML report handed to the browser (or its path printed),
and, as an option, TensorBoard's profiler plugin serving the run the user pointed at."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import REPO, SAMPLE_RUNS
from trace_edit import trace_file, trace_path

from advisor.errors import InputError
from advisor.cli.tensorboard import profiler_logdir, start_tensorboard


def test_logdir_is_the_run_folder_or_the_trace_files_folder(tmp_path):
    run = trace_path("v100_resnet50_nw0")
    assert profiler_logdir(run) == run
    assert profiler_logdir(trace_file("v100_resnet50_nw0")) == run
    with pytest.raises(InputError, match="no such file"):
        profiler_logdir(tmp_path / "missing")


def test_tensorboard_lists_the_run_in_its_profiler_plugin():
    for module in ("tensorboard", "torch_tb_profiler"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} not installed (pip install 'torch-advisor[view]')")
    run = trace_path("v100_resnet50_nw0")
    server = start_tensorboard(run, host="127.0.0.1", port=0)  # any free port: tests may run in parallel
    try:
        assert server.url.endswith("/#pytorch_profiler") and ":0/" not in server.url
        base = server.url.split("/#")[0]
        runs: list[str] = []
        # A guard against a server that never lists it, not a measure: a busy machine may take
        # minutes for TensorBoard to load the run, or seconds to answer one request.
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and run.name not in runs:
            try:
                with urllib.request.urlopen(f"{base}/data/plugin/pytorch_profiler/runs", timeout=30) as r:
                    runs = json.loads(r.read())["runs"]
            except (TimeoutError, OSError):  # urllib.error.URLError and socket timeouts included
                pass
            time.sleep(0.5)
        assert runs == [run.name]  # the run itself, not its neighbours in ../shared/traces
    finally:
        server.stop()
    assert server.process.poll() is not None


# --- the advisor's own report in the browser (the default view) ----------------------------
def _view(args: list[str], tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("BROWSER", "DISPLAY", "WAYLAND_DISPLAY")}
    clean["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "advisor", "view", *args], cwd=tmp_path, env={**clean, "TMPDIR": str(tmp_path), **env},
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip


def test_view_opens_the_html_report_in_the_browser(tmp_path):
    run = SAMPLE_RUNS / "resnet18_cifar" / "runs" / "cpu_baseline"
    before = sorted(p.name for p in run.iterdir())
    seen = tmp_path / "browser-was-given.txt"
    browser = tmp_path / "browser.py"
    browser.write_text(f"import sys\nopen({str(seen)!r}, 'w').write(sys.argv[1])\n")
    r = _view([str(run)], tmp_path, {"BROWSER": f"{sys.executable} {browser} %s"})
    assert r.returncode == 0, r.stderr
    url = seen.read_text()
    assert url.startswith("file://")
    page = Path(urllib.request.url2pathname(url[len("file://"):]))
    assert page.is_relative_to(tmp_path) and page.suffix == ".html"  # the temporary folder, not beside the traces
    html = page.read_text(encoding="utf-8")
    assert html.startswith("<!DOCTYPE html>") and "dataloader-stall" in html and "http://" not in html.split("<body>")[0]
    assert sorted(p.name for p in run.iterdir() if not p.name.startswith(".advisor-cache")) == [n for n in before if not n.startswith(".advisor-cache")]


def test_view_without_a_browser_prints_the_path(tmp_path):
    run = SAMPLE_RUNS / "resnet18_cifar" / "runs" / "gpu_baseline"
    r = _view([str(run), "-o", "mine.html"], tmp_path, {})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(tmp_path / "mine.html")
    assert "launch-bound" in (tmp_path / "mine.html").read_text(encoding="utf-8")
    r = _view([str(run), "--no-browser"], tmp_path, {"BROWSER": "false %s"})
    path = Path(r.stdout.strip())
    assert r.returncode == 0 and path.is_file() and path.is_relative_to(tmp_path)


def test_view_of_a_missing_run_is_one_line_and_exit_2(tmp_path):
    r = _view([str(tmp_path / "nothing")], tmp_path, {})
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "advisor: error:" in r.stderr


def test_view_refuses_an_output_not_named_html_before_any_work(tmp_path):
    """`-o report.txt` would put a page of HTML under a text name: one line, exit 2, nothing written."""
    run = SAMPLE_RUNS / "resnet18_cifar" / "runs" / "cpu_baseline"
    for name in ("report.txt", "report"):
        r = _view([str(run), "--no-browser", "-o", str(tmp_path / name)], tmp_path, {})
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert name in r.stderr and ".html" in r.stderr and "Traceback" not in r.stderr
        assert not (tmp_path / name).exists()
    r = _view([str(run), "--no-browser", "-o", str(tmp_path / "report.HTML")], tmp_path, {})
    assert r.returncode == 0 and (tmp_path / "report.HTML").read_text().lstrip().lower().startswith("<!doctype html"), r.stderr


def _predicted_name(run: Path) -> str:
    """The report's file name for a run, as anyone can compute it from the run's path."""
    import hashlib

    return f"{run.name}-{hashlib.sha256(str(run.resolve()).encode()).hexdigest()[:10]}.html"


def test_view_never_writes_through_a_link_planted_in_the_shared_temporary_folder(tmp_path):
    """Another local user plants links where the report would go: in the shared folder the
    advisor once used, and (as root, chown'd to another user) in a per-user folder they made
    first. The victim's file stays as it was; the report goes to a folder only the user owns."""
    run = SAMPLE_RUNS / "resnet18_cifar" / "runs" / "cpu_baseline"
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    shared = tmp_path / "torch-advisor-view"
    shared.mkdir(mode=0o777)
    (shared / _predicted_name(run)).symlink_to(victim)
    if os.geteuid() == 0:  # only root can give a folder to another user
        theirs = tmp_path / f"torch-advisor-view-{os.geteuid()}"
        theirs.mkdir(mode=0o777)
        (theirs / _predicted_name(run)).symlink_to(victim)
        os.chown(theirs, 65534, 65534)
        os.lchown(theirs / _predicted_name(run), 65534, 65534)
    r = _view([str(run), "--no-browser"], tmp_path, {"BROWSER": "false %s"})
    assert r.returncode == 0, r.stderr
    assert victim.read_text() == "mine"
    page = Path(r.stdout.strip())
    assert page.is_file() and not page.is_symlink() and "dataloader-stall" in page.read_text(encoding="utf-8")
    folder = page.parent.stat()
    assert folder.st_uid == os.geteuid() and folder.st_mode & 0o777 == 0o700
