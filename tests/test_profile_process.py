"""`advisor profile` and the process it runs: forks, SIGTERM, os.chdir, what torch prints, the
command line around the script, and a Python without torch. Real runs of small CPU scripts
under the real torch.profiler, each in a fresh process (see test_profile.py)."""

from __future__ import annotations

import gzip
import os
import signal
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from conftest import REPO
from test_profile import QUICK, STOPPED, TRAIN, advisor_lines, facts, profile, traces, write

pytest.importorskip("torch")

# A few steps of real training; STEP_HOOK runs at the end of step `step`.
LOOP = """
import os, signal, sys, time
import torch
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range({steps}):
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
{hook}
print("script finished", flush=True)
"""


def loop(path: Path, hook: str, steps: int = 12) -> Path:
    body = "\n".join("    " + line for line in hook.strip("\n").splitlines())
    return write(path, LOOP.format(steps=steps, hook=body))


def trace_steps(trace: Path) -> set[str]:
    doc = orjson.loads(gzip.decompress(trace.read_bytes()))
    return {e["name"] for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")}


def test_a_forked_child_that_calls_sys_exit_ends_with_its_code_and_the_parent_goes_on(tmp_path: Path):
    script = loop(tmp_path / "forks.py", """
if step == 2:  # inside the recorded window
    pid = os.fork()
    if pid == 0:
        print("child leaving", flush=True)
        sys.exit(3)
    print("child status", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
""")
    out = tmp_path / "run"
    r = profile(["--out", str(out), "--wait", "0", "--warmup", "1", "--active", "4", "--no-stack", "--full", str(script)], tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "child leaving" in r.stdout and "child status 3" in r.stdout  # plain Python's exit code
    assert r.stdout.count("script finished") == 1 and r.stderr.count("Findings, ranked") == 1  # one report, the parent's
    f = facts(out)
    assert len(f["step_times_ms"]) == 12 and f["profiled_steps"] == [1, 2, 3, 4]  # the child's steps are not counted
    [trace] = traces(out)
    assert trace_steps(trace) == {f"ProfilerStep#{k}" for k in (1, 2, 3, 4)}


def test_a_forked_child_that_runs_to_the_end_exits_0_and_an_error_in_it_exits_1(tmp_path: Path):
    script = loop(tmp_path / "forks.py", """
if step == 1:
    pid = os.fork()
    if pid == 0:
        if os.environ.get("FAIL"):
            raise ValueError("in the child")
        continue  # the child trains on to the end of the script
    print("child status", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
""", steps=6)
    for fail, code in (("", 0), ("1", 1)):
        out = tmp_path / f"run{fail}"
        r = profile(["--out", str(out), *QUICK, "--full", str(script)], tmp_path, env={"FAIL": fail}, timeout=300)
        assert r.returncode == 0, r.stderr
        assert f"child status {code}" in r.stdout
        assert ("ValueError: in the child" in r.stderr) == bool(fail)
        assert len(facts(out)["step_times_ms"]) == 6


def test_sigterm_during_the_window_keeps_what_was_recorded(tmp_path: Path):
    script = loop(tmp_path / "train.py", """
if step == 3:
    os.kill(os.getpid(), signal.SIGTERM)  # what a job scheduler sends on pre-emption
""", steps=100)
    out = tmp_path / "run"
    r = profile(["--out", str(out), "--wait", "0", "--warmup", "1", "--active", "5", "--no-stack", str(script)], tmp_path)
    assert r.returncode == -signal.SIGTERM  # ended by the signal, as plain Python is
    assert "script finished" not in r.stdout
    assert any("terminated (SIGTERM)" in line and "kept the trace of steps 1–3" in line for line in advisor_lines(r.stderr))
    f = facts(out)
    assert f["outcome"] == "terminated" and f["profiled_steps"] == [1, 2, 3] and f["exit_code"] == 143
    [trace] = traces(out)
    assert {"ProfilerStep#1", "ProfilerStep#2", "ProfilerStep#3"} <= trace_steps(trace)
    from advisor.analysis import analyze  # the report is left for later: the trace is complete

    assert analyze(out).summary()["steps"] == 3


def test_a_script_that_changes_directory_still_writes_where_announced(tmp_path: Path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    script = loop(tmp_path / "train.py", f"""
if step == 0:
    os.chdir({str(elsewhere)!r})
""")
    r = profile(["--out", "run", *QUICK, str(script)], tmp_path)
    assert r.returncode == STOPPED, r.stderr
    out = tmp_path / "run"
    assert len(traces(out)) == 1 and (out / "advisor_facts.json").is_file()
    assert list(elsewhere.iterdir()) == []
    assert "Findings, ranked" in r.stderr  # the report (on stderr) read the same folder
    r = profile([*QUICK, str(script)], tmp_path)  # the default out dir too
    assert r.returncode == STOPPED, r.stderr
    [run] = (tmp_path / "advisor_runs").iterdir()
    assert len(traces(run)) == 1 and list(elsewhere.iterdir()) == []


def test_torchs_own_lines_go_to_the_log_and_the_scripts_output_passes(tmp_path: Path):
    script = write(tmp_path / "train.py", """
        import sys, torch
        model = torch.nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        early = [torch.empty(8) for _ in range(50)]  # allocated before the profiler started
        for step in range(8):
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
            if step == 3:
                early.clear()  # freed while it records: torch warns about unknown blocks
            print(f"stdout of step {step}", flush=True)
            print(f"\\x1b[1mstderr of step {step}\\x1b[0m", file=sys.stderr, flush=True)
    """)
    out = tmp_path / "run"
    r = profile(["--out", str(out), "--wait", "1", "--warmup", "1", "--active", "4", "--no-stack", "--after-steps", "0", str(script)], tmp_path)
    assert r.returncode == STOPPED, r.stderr
    assert "USDT" not in r.stderr and "CPUAllocator" not in r.stderr and "profiler_st" not in r.stderr
    # the script's own lines are there, untouched (escape sequences included)
    assert [line for line in r.stderr.splitlines() if "of step" in line] == [f"\x1b[1mstderr of step {k}\x1b[0m" for k in range(5)]
    assert [line for line in r.stdout.splitlines() if "of step" in line] == [f"stdout of step {k}" for k in range(5)]
    log = (out / "advisor_profiler.log").read_text()
    assert "profiler_start" in log and "profiler_stop" in log and "Memory block of unknown size" in log


def test_options_between_the_script_and_double_dash_are_the_advisors(tmp_path: Path):
    script = write(tmp_path / "train.py", TRAIN)
    r = profile([str(script), "--out", "d", *QUICK, "--full", "--", "--lr", "1"], tmp_path, cli="advisor")
    assert r.returncode == 0, r.stderr
    assert "argv=['--lr', '1']" in r.stdout
    f = facts(tmp_path / "d")
    assert f["window"] == {"wait": 0, "warmup": 1, "active": 1, "repeat": 1} and not f["stopped_early"]
    # without `--`, everything after the script is the script's, as with `python train.py ...`
    r = profile(["--out", "e", *QUICK, "--full", str(script), "--out", "x"], tmp_path, cli="advisor")
    assert r.returncode == 0 and "argv=['--out', 'x']" in r.stdout and not (tmp_path / "x").exists()


def test_words_that_are_not_options_before_double_dash_are_refused(tmp_path: Path):
    script = write(tmp_path / "train.py", TRAIN)
    for args, says in (
        ([str(script), "--lr", "1", "--", "x"], "'--lr' stands between the script and `--`"),
        ([str(script), "0.1", "--", "x"], "'0.1' stands between the script and `--`"),
        (["--out", "a", str(script), "--out", "b", "--", "x"], "given both before and after the script"),
    ):
        r = profile(args, tmp_path, cli="advisor")
        assert r.returncode == 2, r.stderr
        [line] = r.stderr.strip().splitlines()
        assert line.startswith("advisor: error: ") and says in line
    assert not any((tmp_path / d).exists() for d in ("a", "b", "advisor_runs"))


def test_without_torch_profile_says_how_to_install_it(tmp_path: Path):
    hide = tmp_path / "hide_torch"
    write(hide / "sitecustomize.py", """
        import sys
        class NoTorch:  # the import system of a Python where torch is not installed
            def find_spec(self, name, path=None, target=None):
                if name == "torch" or name.startswith("torch."):
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        sys.meta_path.insert(0, NoTorch())
    """)
    script = write(tmp_path / "train.py", TRAIN)
    env = {"PYTHONPATH": os.pathsep.join([str(hide), str(REPO)])}
    for cli in ("advisor", "advisor.cli.profile_main"):
        r = profile([str(script)], tmp_path, env=env, cli=cli)
        assert r.returncode == 2, r.stderr
        [line] = r.stderr.strip().splitlines()
        assert "advisor profile needs PyTorch" in line and "pip install torch" in line and sys.executable in line
    assert not (tmp_path / "advisor_runs").exists()


def test_a_script_and_arguments_named_with_bytes_that_are_not_utf8(tmp_path: Path):
    script = write(tmp_path / "tr\udcffain.py", TRAIN)  # the file name's byte 0xff, as Python holds it
    out = tmp_path / "run\udcfe"
    r = subprocess.run(
        [sys.executable, "-m", "advisor", "profile", "--out", os.fsencode(out), *QUICK, os.fsencode(script), "--", b"--tag=\xfd"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, timeout=300,
    )
    assert r.returncode == STOPPED, r.stderr
    err = r.stderr.decode("utf-8")  # everything the advisor says is valid UTF-8
    assert f"profiling {tmp_path}/tr\\xffain.py on cpu" in err and f"→ {tmp_path}/run\\xfe" in err
    f = facts(out)
    assert f["script"] == f"{tmp_path}/tr\\xffain.py" and f["argv"][1:] == ["--tag=\\xfd"]
    assert len(traces(out)) == 1 and "Findings, ranked" in err  # the report, on stderr


CLOSES = """
import os, sys
import torch
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
{close}
for step in range(12):
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "steps.txt"), "w").write(str(step + 1))
"""


@pytest.mark.parametrize("close", ["sys.stdout.close()", "os.close(1)", "os.close(2)", "sys.stderr.close()", "os.close(1); os.close(2)"])
def test_a_script_that_closes_its_stdout_or_stderr_meets_the_fate_plain_python_gives_it(tmp_path: Path, close: str):
    """Closing fd 1 once ended in the advisor's own error (exit 3, "I/O operation on closed
    file"), closing fd 2 at the start killed the script after one step: the advisor wrote on
    the script's streams. Same exit code and all 12 steps as under plain Python, and the
    advisor's lines and report still reach the advisor's own stdout and stderr."""
    script = write(tmp_path / "closes.py", CLOSES.format(close=close))
    plain = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert (tmp_path / "steps.txt").read_text() == "12"
    (tmp_path / "steps.txt").unlink()
    out = tmp_path / "run"
    r = profile(["--out", str(out), "--wait", "0", "--warmup", "1", "--active", "2", "--no-stack", "--full", str(script)], tmp_path, timeout=300)
    assert r.returncode == plain.returncode, r.stderr
    assert (tmp_path / "steps.txt").read_text() == "12"
    assert len(facts(out)["step_times_ms"]) == 12
    assert "Findings, ranked" in r.stderr
    assert any("recording" in line for line in advisor_lines(r.stderr)), r.stderr
