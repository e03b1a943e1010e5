"""Daily use through the installed `advisor` program in a child process: one step time and
one throughput in every command, pipes a reader closes early, exit statuses a CI step can
trust, advice read from the run rather than from the machine the report runs on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SAMPLE_RUNS
from test_everyday import advisor, advisor_program

RUNS = SAMPLE_RUNS / "resnet18_cifar" / "runs"


# --- a closed pipe is not a failure -----------------------------------------------------------
def _into_closed_pipe(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """The command with its stdout a pipe whose reader has already gone: its first write
    meets EPIPE, whatever the output's size (deterministic, unlike `| head -1`)."""
    read, write = os.pipe()
    os.close(read)
    try:
        env = {k: v for k, v in os.environ.items() if k != "COLUMNS" and not k.startswith("GITHUB_")}
        return subprocess.run([*advisor_program(), *args], cwd=cwd, stdout=write, stderr=subprocess.PIPE, text=True, env=env, timeout=180)
    finally:
        os.close(write)


def _baseline(tmp_path: Path) -> None:
    r = advisor(["baseline", str(RUNS / "gpu_workers"), "-o", "perf/baseline.json"], tmp_path)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["report", str(RUNS / "cpu_baseline")],
        ["report", str(RUNS / "cpu_baseline"), "-f", "json"],
        ["diff", str(RUNS / "cpu_baseline"), str(RUNS / "cpu_workers")],
        ["gate", str(RUNS / "gpu_walk_final"), "--min-steps", "3"],
    ],
    ids=["report", "report-json", "diff", "gate-pass"],
)
def test_a_closed_pipe_ends_the_command_with_status_0(args, tmp_path):
    if args[0] == "gate":
        _baseline(tmp_path)
    for _ in range(2):  # made, then (report) served from the cache
        r = _into_closed_pipe(args, tmp_path)
        assert r.returncode == 0, r.stderr
        assert "Traceback" not in r.stderr and "BrokenPipe" not in r.stderr and "internal error" not in r.stderr


def test_a_failed_gate_stays_failed_when_its_pipe_closes(tmp_path):
    """The verdict is reached before the table is written: a closed pipe does not hide it."""
    _baseline(tmp_path)
    r = _into_closed_pipe(["gate", str(RUNS / "gpu_baseline"), "--min-steps", "3"], tmp_path)
    assert r.returncode == 1, r.stderr


@pytest.mark.skipif(not Path("/bin/bash").exists(), reason="needs bash for set -o pipefail")
def test_head_in_a_pipefail_shell_passes(tmp_path):
    _baseline(tmp_path)
    prog = " ".join(f"'{p}'" for p in advisor_program())
    script = (
        "set -o pipefail; "
        f"{prog} report '{RUNS / 'cpu_baseline'}' | head -1 && "
        f"{prog} diff '{RUNS / 'cpu_baseline'}' '{RUNS / 'cpu_workers'}' | head -1 && "
        f"{prog} gate '{RUNS / 'gpu_walk_final'}' --min-steps 3 | head -1"
    )
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS" and not k.startswith("GITHUB_")}
    r = subprocess.run(["/bin/bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines()[0].startswith("Run")


# --- the suite keeps out of the user's cache ----------------------------------------------------
def test_the_suite_caches_in_a_folder_of_its_own(tmp_path):
    """A report made by a test is cached (and its secret kept) in the session's temporary
    folder, never in the user's cache folder (~/.cache/torch-advisor or ADVISOR_CACHE's)."""
    import tempfile

    r = advisor(["report", str(RUNS / "cpu_workers")], tmp_path)
    assert r.returncode == 0, r.stderr
    r = advisor(["cache", "info"], tmp_path)
    assert r.returncode == 0, r.stderr
    temp = Path(tempfile.gettempdir()).resolve()
    shown = [Path(line.split(":", 1)[1].strip()) for line in r.stdout.splitlines() if line.startswith("cache:")]
    secret = [Path(w) for line in r.stdout.splitlines() if "secret" in line for w in line.split() if w.startswith("/")]
    assert shown and secret, r.stdout
    for p in [*shown, *secret]:
        assert temp in p.resolve().parents, f"{p} is not under {temp}"
        assert Path.home() / ".cache" not in p.resolve().parents
    assert "entries: 0 " not in r.stdout  # the report above was cached there


# --- small things stay small ---------------------------------------------------------------------
def test_version_imports_none_of_the_command_lines_modules(tmp_path):
    """`advisor --version` (the console script's entry point, and `python -m advisor`) prints
    the version without importing typer, rich, pandas, NumPy or torch."""
    from advisor.version import __version__

    probe = (
        "import sys; sys.argv = ['advisor', '--version']\n"
        "from advisor.__main__ import program\n"
        "program()\n"
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'typer', 'click', 'rich', 'pandas', 'numpy', 'torch', 'pyarrow', 'advisor.cli'})\n"
        "print(heavy, 'advisor.cli' in sys.modules)\n"
    )
    r = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [f"advisor {__version__}", "[] False"]
    r = subprocess.run([*advisor_program(), "--version"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout) == (0, f"advisor {__version__}\n")
    # the console script the package declares is that entry point
    from conftest import REPO

    try:
        import tomllib
    except ImportError:  # pragma: no cover - Python 3.10
        import tomli as tomllib

    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["advisor"] == "advisor.__main__:program"
