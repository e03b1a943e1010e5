"""`advisor profile`: real runs of real scripts under the real torch.profiler (no mocks).

Every run goes through a fresh process (`python -m advisor.cli.profile_main`, the profile command on
its own; one test through `python -m advisor profile`, the full CLI), because a capture
changes process-wide state (sys.modules['__main__'], multiprocessing's forkserver) the way a
real `advisor profile` process does. Windows and step counts are tiny to keep the file fast.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import statistics
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import orjson
import pytest
from conftest import REPO

SAMPLE = REPO / "sample_runs" / "resnet18_cifar" / "train.py"
# The scripts these tests profile import torch; the file itself does not (it collects without it).
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch (pip install 'torch-advisor[profile]')")
QUICK = ["--wait", "0", "--warmup", "1", "--active", "1", "--no-stack", "--after-steps", "5"]
STOPPED = 0  # advisor profile stopped the script after the window and wrote the report

TRAIN = """
import os, sys
import torch
from torch.utils.data import DataLoader, Dataset


class Numbers(Dataset):  # defined in the script: spawn workers must find __main__.Numbers
    def __len__(self):
        return 48

    def __getitem__(self, i):
        return torch.full((4,), float(i)), i % 2


def main():
    method = os.environ.get("START_METHOD") or None
    workers = int(os.environ.get("WORKERS", "0"))
    loader = DataLoader(Numbers(), batch_size=4, num_workers=workers, multiprocessing_context=method if workers else None)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    steps = 0
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        steps += 1
    print(f"finished {steps} steps as {__name__} argv={sys.argv[1:]}")


if __name__ == "__main__":
    main()
"""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def profile(args: list[str], cwd: Path, env: dict | None = None, cli: str = "advisor.cli.profile_main", timeout: int = 300,
            sigint_default: bool = False) -> subprocess.CompletedProcess:
    """The command in a child process. The timeout is a guard against a hung child, not a
    measure: on a 2-core machine beside other work, torch's threads and spawned workers (each
    importing torch) can take minutes where an idle machine takes seconds. `sigint_default`:
    the child starts with Ctrl-C's default action, as from a terminal, even where the test run
    itself was started with SIGINT ignored (a background job of a non-interactive shell: Python
    then keeps it ignored and raises no KeyboardInterrupt)."""
    full_env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])), **(env or {})}
    reset = (lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)) if sigint_default else None
    return subprocess.run(
        [sys.executable, "-m", cli, *([] if cli == "advisor.cli.profile_main" else ["profile"]), *args],
        cwd=cwd, env=full_env, check=False, capture_output=True, text=True, timeout=timeout, preexec_fn=reset,
    )


def facts(out: Path, name: str = "advisor_facts.json") -> dict:
    data = orjson.loads((out / name).read_bytes())
    assert data["schema"] == "advisor/facts/v1"
    return data


def traces(out: Path) -> list[Path]:
    return sorted(out.glob("*.pt.trace.json.gz"))


def advisor_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("advisor:")]


# -- the sample, end to end -----------------------------------------------------------------

@needs_torch
def test_profile_the_sample_writes_trace_and_facts(tmp_path: Path):
    out = tmp_path / "run"
    # one step timed after the window (the sample's CPU steps are slow; the default 5 are tested below)
    r = profile(["--out", str(out), "--wait", "1", "--warmup", "1", "--active", "2", "--after-steps", "1", str(SAMPLE), "--", "--cpu-variant", "--steps", "50"], tmp_path)
    assert r.returncode == STOPPED, r.stderr
    [trace] = traces(out)
    doc = json.loads(gzip.decompress(trace.read_bytes()))
    steps = {e["name"] for e in doc["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")}
    assert steps == {"ProfilerStep#2", "ProfilerStep#3"}
    assert any(e.get("cat") == "python_function" for e in doc["traceEvents"])  # with_stack by default
    f = facts(out)
    assert f["argv"] == [str(SAMPLE), "--cpu-variant", "--steps", "50"]
    assert f["dataloaders"] == [{
        "batch_size": 32, "num_workers": 0, "pin_memory": False, "persistent_workers": False, "prefetch_factor": None,
        "dataset_len": 10000, "dataset_class": "FakeCIFAR10", "multiprocessing_context": None, "drop_last": False,
        "batches_per_epoch": 313, "epoch_starts": [0],  # ceil(10,000 / 32); the one epoch began at step 0
    }]
    assert f["cpu_count"] == len(os.sched_getaffinity(0))
    assert f["device"]["type"] == "cpu" and f["versions"]["torch"]
    assert f["optimizers"] == [{"class": "SGD", "foreach": None, "fused": None}]
    assert f["zero_grad_set_to_none"] is False
    assert f["autocast"] == {"used": False, "dtypes": []} and f["compile"] == {"used": False, "modes": []}
    assert f["window"] == {"wait": 1, "warmup": 1, "active": 2, "repeat": 1}
    # the window's 4 steps and the one timed after it without the profiler (--after-steps 1)
    assert len(f["step_times_ms"]) == 4 + 1 and all(t > 0 for t in f["step_times_ms"])
    assert f["device_step_times_ms"] is None  # no CUDA device: nothing for the device clock to time
    assert f["profiled_steps"] == [2, 3] and f["step_source"] == "optimizer"
    assert f["stopped_early"] is True and f["outcome"] == "stopped"
    assert any("stopped" in line and "on purpose" in line and "and 1 step timed after it" in line for line in advisor_lines(r.stderr))
    assert "step 20" not in r.stdout  # the script's own output: it was stopped at step 5


@needs_torch
def test_full_cli_passes_script_options_after_double_dash(tmp_path: Path):
    pytest.importorskip("advisor.cli")
    script = write(tmp_path / "train.py", TRAIN)
    out = tmp_path / "run"
    r = profile(["--out", str(out), *QUICK, "--full", str(script), "--", "--device", "x", "-v"], tmp_path, cli="advisor")
    assert r.returncode == 0, r.stderr
    assert "finished 12 steps as __main__ argv=['--device', 'x', '-v']" in r.stdout
    assert len(facts(out)["step_times_ms"]) == 12


# -- DataLoader workers under every start method, Dataset defined in the script -------------

@needs_torch
@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_workers_with_a_dataset_defined_in_the_script(tmp_path: Path, method: str):
    script = write(tmp_path / "train.py", TRAIN)
    out = tmp_path / "run"
    r = profile(["--out", str(out), *QUICK, "--full", str(script)], tmp_path, env={"START_METHOD": method, "WORKERS": "1"})
    assert r.returncode == 0, r.stderr
    assert "finished 12 steps as __main__" in r.stdout
    f = facts(out)
    assert f["dataloaders"][0]["num_workers"] == 1
    assert f["dataloaders"][0]["multiprocessing_context"] == method
    assert f["dataloaders"][0]["dataset_class"] == "Numbers"
    assert len(traces(out)) == 1


@needs_torch
def test_module_mode_with_spawn_workers(tmp_path: Path):
    write(tmp_path / "pkg" / "__init__.py", "")
    write(tmp_path / "pkg" / "train.py", TRAIN)
    out = tmp_path / "run"
    r = profile(["--out", str(out), *QUICK, "--full", "-m", "pkg.train", "--", "a", "b"], tmp_path, env={"START_METHOD": "spawn", "WORKERS": "1"})
    assert r.returncode == 0, r.stderr
    assert "finished 12 steps as __main__ argv=['a', 'b']" in r.stdout
    assert facts(out)["script"] == "-m pkg.train"


# -- the script's own failures come back as they are ----------------------------------------

@needs_torch
def test_script_traceback_and_exit_code_come_back(tmp_path: Path):
    script = write(tmp_path / "fails.py", """
        import torch
        def helper():
            raise ValueError("boom in the script")
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            model(torch.ones(1, 2)).sum().backward()
            opt.step()
        helper()
    """)
    out = tmp_path / "run"
    r = profile(["--out", str(out), "--wait", "0", "--warmup", "1", "--active", "5", "--no-stack", str(script)], tmp_path)
    assert r.returncode == 1
    tb = r.stderr[r.stderr.index("Traceback (most recent call last):"):]
    assert 'fails.py", line 10, in <module>' in tb and 'line 4, in helper' in tb
    assert "ValueError: boom in the script" in tb
    assert "advisor" not in tb.split("ValueError: boom in the script")[0]  # none of our frames
    f = facts(out)
    assert f["outcome"] == "error" and f["exit_code"] == 1 and len(f["step_times_ms"]) == 3


@needs_torch
def test_a_window_recorded_and_reported_exits_0_so_set_e_and_and_go_on(tmp_path: Path):
    """Stopping the script after the window is the command's purpose: exit 0 once the window
    is recorded and the report written (a shell's `set -e` and `&&` go on); a script that
    fails after the window under --full ends with its own status."""
    script = write(tmp_path / "train.py", TRAIN + "\nsys.exit(5)\n")
    cmd = f"set -e; {sys.executable} -m advisor.cli.profile_main --out run --wait 0 --warmup 1 --active 2 --no-stack --after-steps 5 -o r.json train.py && echo next"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    r = subprocess.run(["/bin/sh", "-c", cmd], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == "next"
    assert orjson.loads((tmp_path / "r.json").read_bytes())["summary"]["steps"] == 2
    f = facts(tmp_path / "run")
    assert f["outcome"] == "stopped"
    if sys.platform.startswith("linux"):  # per step, the cores other processes kept busy (/proc)
        assert len(f["other_cpu_cores"]) == len(f["step_times_ms"]) and all(v >= 0 for v in f["other_cpu_cores"] if v is not None)
    r = profile(["--out", "full", "--wait", "0", "--warmup", "1", "--active", "2", "--no-stack", "--full", str(script)], tmp_path)
    assert r.returncode == 5, r.stderr  # the script's own sys.exit(5), after its 12 steps
    assert "finished 12 steps" in r.stdout


@needs_torch
def test_sys_exit_code_and_failure_before_the_first_step(tmp_path: Path):
    script = write(tmp_path / "exits.py", "import sys\nprint('bye')\nsys.exit(7)\n")
    r = profile(["--out", str(tmp_path / "a"), str(script)], tmp_path)
    assert r.returncode == 7 and "bye" in r.stdout
    assert facts(tmp_path / "a")["step_times_ms"] == []
    script = write(tmp_path / "early.py", "import torch\nraise RuntimeError('before any step')\n")
    r = profile(["--out", str(tmp_path / "b"), str(script)], tmp_path)
    assert r.returncode == 1 and "RuntimeError: before any step" in r.stderr
    assert traces(tmp_path / "b") == [] and facts(tmp_path / "b")["outcome"] == "error"


# -- bad input ------------------------------------------------------------------------------

@needs_torch
def test_missing_script_is_one_line_and_exit_2(tmp_path: Path):
    r = profile(["--out", str(tmp_path / "run"), "nope.py"], tmp_path)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == ["advisor: error: nope.py: no such file"]
    assert not (tmp_path / "run").exists()
    r = profile(["-m", "no_such_module_here"], tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "no module named" in r.stderr


@needs_torch
def test_never_writes_into_an_existing_run_or_an_unwritable_place(tmp_path: Path):
    script = write(tmp_path / "train.py", TRAIN)
    old = tmp_path / "old_run"
    old.mkdir()
    (old / "advisor_facts.json").write_text("precious")
    r = profile(["--out", str(old), str(script)], tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "not empty" in r.stderr
    assert (old / "advisor_facts.json").read_text() == "precious" and len(list(old.iterdir())) == 1
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    r = profile(["--out", str(blocker / "run"), str(script)], tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "cannot create the log directory" in r.stderr
    assert blocker.read_text() == "x"


@needs_torch
def test_default_out_dir_is_new_every_time(tmp_path: Path):
    script = write(tmp_path / "nosteps.py", "print('no training here')\n")
    for _ in range(2):
        r = profile([str(script)], tmp_path)
        assert r.returncode == 0, r.stderr
    runs = sorted((tmp_path / "advisor_runs").iterdir())
    assert len(runs) == 2 and all(p.name.startswith("nosteps-") for p in runs)
    assert all((p / "advisor_facts.json").is_file() for p in runs)


# -- steps, window, stopping ----------------------------------------------------------------

@needs_torch
def test_stops_after_the_window_unless_full(tmp_path: Path):
    script = write(tmp_path / "train.py", TRAIN)
    r = profile(["--out", str(tmp_path / "cut"), "--wait", "1", "--warmup", "1", "--active", "2", "--no-stack", "--after-steps", "0", str(script)], tmp_path)
    assert r.returncode == STOPPED, r.stderr
    assert "finished" not in r.stdout
    f = facts(tmp_path / "cut")
    assert f["stopped_early"] and len(f["step_times_ms"]) == 4 and f["profiled_steps"] == [2, 3]
    # 5 steps timed after the window without the profiler, then the run stops: the report
    # measures the profiler's cost on them (the first one after it left out)
    r = profile(["--out", str(tmp_path / "after"), "--wait", "1", "--warmup", "1", "--active", "2", "--no-stack", "--after-steps", "5", "-o",
                 str(tmp_path / "after.json"), str(script)], tmp_path)
    assert r.returncode == STOPPED, r.stderr
    assert "finished" not in r.stdout
    assert "and 5 steps timed after it without the profiler" in r.stderr
    f = facts(tmp_path / "after")
    assert f["stopped_early"] and len(f["step_times_ms"]) == 4 + 5 and f["profiled_steps"] == [2, 3]
    overhead = json.loads((tmp_path / "after.json").read_text())["profiler_overhead"]
    assert overhead["unprofiled_steps"] == 4
    assert overhead["unprofiled_median_ms"] == pytest.approx(statistics.median(f["step_times_ms"][5:]), abs=1e-3)
    r = profile(["--out", str(tmp_path / "full"), "--wait", "1", "--warmup", "1", "--active", "2", "--no-stack", "--full", str(script)], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "finished 12 steps" in r.stdout
    f = facts(tmp_path / "full")
    assert not f["stopped_early"] and len(f["step_times_ms"]) == 12 and f["profiled_steps"] == [2, 3]
    assert f["outcome"] == "finished"


@needs_torch
@pytest.mark.parametrize(("pause_s", "after"), [(0.04, "2 s"), (0.0, "100 steps")])
def test_by_default_the_steps_after_the_window_are_timed_for_two_seconds_or_a_hundred_steps(tmp_path: Path, pause_s: float, after: str):
    """The steps right after the trace is written run slower than the run's pace: a short step
    is timed for at least 2 s, at most 100 steps (and never fewer than 5)."""
    script = write(tmp_path / "train.py", f"""
        import time, torch
        model = torch.nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(400):
            model(torch.randn(8, 4)).sum().backward()
            opt.step()
            time.sleep({pause_s})
    """)
    r = profile(["--out", str(tmp_path / "run"), "--wait", "1", "--warmup", "1", "--active", "2", "--no-stack", str(script)], tmp_path)
    assert r.returncode == STOPPED, r.stderr
    f = facts(tmp_path / "run")
    window = 4
    timed = f["step_times_ms"][window:]
    if after == "2 s":  # 40 ms steps: about 50 of them, the last one crossing 2 s
        assert sum(timed) >= 2000 > sum(timed[:-1]), timed
        assert 30 <= len(timed) < 100
    else:
        assert len(timed) == 100 and sum(timed) < 2000
    # the optimizer's step is timed on every step, as the steps are
    assert len(f["optimizer_step_ms"]) == len(f["step_times_ms"])
    assert all(0 < o < t for o, t in zip(f["optimizer_step_ms"][1:], f["step_times_ms"][1:], strict=True))


def test_every_rank_of_a_multi_process_run_stops_after_the_same_count_of_steps():
    """A rank that stops on its own clock would leave the others waiting in a collective for it:
    with several ranks the stretch after the window is a count, however long its steps took."""
    from advisor.capture.launch import rank_argv
    from advisor.capture.runner import Target
    from advisor.capture.session import AFTER_STEPS, CaptureOptions, after_done

    assert not after_done(AFTER_STEPS, 0.1, None, 1) and after_done(AFTER_STEPS, 0.1, None, 2)
    assert not after_done(AFTER_STEPS - 1, 60.0, None, 2) and not after_done(AFTER_STEPS - 1, 60.0, None, 1)
    assert after_done(3, 0.0, 3, 1) and not after_done(2, 60.0, 3, 1)
    argv = rank_argv(Target("script", "train.py", []), CaptureOptions(out_dir=Path("out"), world_size=2))
    assert "--after-steps" not in argv  # every rank takes the same default count
    argv = rank_argv(Target("script", "train.py", []), CaptureOptions(out_dir=Path("out"), after_steps=7, world_size=2))
    assert argv[argv.index("--after-steps") + 1] == "7"


@needs_torch
def test_dataloader_batches_are_steps_when_there_is_no_optimizer(tmp_path: Path):
    script = write(tmp_path / "infer.py", """
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        model = torch.nn.Linear(4, 2)
        with torch.no_grad():
            for (x,) in DataLoader(TensorDataset(torch.randn(40, 4)), batch_size=4):
                model(x)
    """)
    out = tmp_path / "run"
    r = profile(["--out", str(out), *QUICK, str(script)], tmp_path)
    assert r.returncode == STOPPED, r.stderr
    f = facts(out)
    assert f["step_source"] == "dataloader" and f["stopped_early"] and len(traces(out)) == 1
    assert f["mode"] == "inference"


INFER = """
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)).eval()
batches = [torch.randn(8, 16) for _ in range(12)]
model(torch.randn(1, 16))                     # a warm-up call, from another line
flip = torch.nn.Identity()
with torch.no_grad():
    for x in batches:
        y = model(x) + model(flip(-x))        # test-time augmentation: two calls per iteration
        print("batch", int(y.argmax(1).sum()))
"""


def test_inference_loop_with_no_optimizer_and_no_dataloader_is_profiled(tmp_path: Path):
    """A torch.no_grad() loop over a list of tensors: each iteration is a step, the run is
    inference, the window is recorded and `advisor profile` reports it."""
    script = write(tmp_path / "infer.py", INFER)
    out = tmp_path / "run"
    r = profile(["--out", str(out), "--full", "--wait", "1", "--warmup", "1", "--active", "3", "--no-stack", str(script)], tmp_path, cli="advisor")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("batch ") == 12  # the script ran all its iterations, unchanged
    f = facts(out)
    assert f["step_source"] == "forward" and f["mode"] == "inference" and f["optimizers"] == []
    # A step ends where the next iteration calls the model: 12 iterations, 11 step ends.
    assert len(f["step_times_ms"]) == 11 and f["profiled_steps"] == [2, 3, 4]
    [trace] = traces(out)
    doc = json.loads(gzip.decompress(trace.read_bytes()))
    steps = sorted(e["name"] for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#"))
    assert steps == ["ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"]
    # Each recorded step holds exactly one iteration: two model calls (four Linear layers).
    linears = [e for e in doc["traceEvents"] if e.get("name") == "aten::linear"]
    assert len(linears) == 3 * 4
    assert "Step time" in r.stderr and re.search(r"over\s+3\s+steps", r.stderr)  # the report: on stderr
    assert any("recorded as inference" in line for line in advisor_lines(r.stderr))


def test_modules_called_in_forked_workers_do_not_count_steps(tmp_path: Path):
    """A dataset that calls a module per sample, in fork workers (a copy of the hooks): the
    workers must not count steps of their own; the loop's batches are the steps."""
    script = write(tmp_path / "infer_workers.py", """
        import torch
        from torch.utils.data import DataLoader, Dataset

        class Normalised(Dataset):
            def __init__(self):
                self.norm = torch.nn.LayerNorm(16)
            def __len__(self):
                return 64
            def __getitem__(self, i):
                return self.norm(torch.randn(16))

        def main():
            model = torch.nn.Linear(16, 4).eval()
            loader = DataLoader(Normalised(), batch_size=4, num_workers=2, multiprocessing_context="fork")
            with torch.no_grad():
                print("batches", sum(1 for x in loader if model(x) is not None))

        if __name__ == "__main__":
            main()
    """)
    out = tmp_path / "run"
    r = profile(["--out", str(out), "--full", *QUICK, str(script)], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "batches 16" in r.stdout
    f = facts(out)
    # Every request for a batch after the first ends a step, the one that ends the epoch included.
    assert f["step_source"] == "dataloader" and f["mode"] == "inference" and len(f["step_times_ms"]) == 16


def test_a_training_loop_is_not_cut_at_its_model_calls(tmp_path: Path):
    """Gradient accumulation: two forward/backward per optimizer step; steps stay optimizer steps."""
    script = write(tmp_path / "accum.py", """
        import torch
        model = torch.nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for i in range(16):
            model(torch.randn(8, 4)).sum().backward()
            if i % 2 == 1:
                opt.step(); opt.zero_grad()
    """)
    out = tmp_path / "run"
    r = profile(["--out", str(out), "--full", *QUICK, str(script)], tmp_path)
    assert r.returncode == 0, r.stderr
    f = facts(out)
    assert f["step_source"] == "optimizer" and f["mode"] == "training" and len(f["step_times_ms"]) == 8


@needs_torch
def test_no_steps_found_is_said_and_facts_are_kept(tmp_path: Path):
    script = write(tmp_path / "nosteps.py", "import torch\nprint('sum', torch.ones(3).sum().item())\n")
    out = tmp_path / "run"
    r = profile(["--out", str(out), str(script)], tmp_path)
    assert r.returncode == 0 and "sum 3.0" in r.stdout
    assert any("no steps found" in line for line in advisor_lines(r.stderr))
    assert facts(out)["step_times_ms"] == [] and traces(out) == []


@needs_torch
def test_ctrl_c_during_the_window_keeps_what_was_captured(tmp_path: Path):
    script = write(tmp_path / "train.py", """
        import os, signal, torch
        model = torch.nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(100):
            if step == 3:
                os.kill(os.getpid(), signal.SIGINT)
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
    """)
    out = tmp_path / "run"
    r = profile(["--out", str(out), "--wait", "0", "--warmup", "1", "--active", "5", "--no-stack", str(script)], tmp_path,
                sigint_default=True)
    assert r.returncode == 130
    assert any("interrupted" in line for line in advisor_lines(r.stderr))
    f = facts(out)
    assert f["outcome"] == "interrupted" and f["profiled_steps"] == [1, 2]
    assert len(traces(out)) == 1


@needs_torch
def test_script_with_its_own_profiler_is_not_profiled_twice(tmp_path: Path):
    script = write(tmp_path / "own.py", """
        import torch
        from torch.profiler import profile, schedule, tensorboard_trace_handler
        model = torch.nn.Linear(8, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        sched = schedule(wait=1, warmup=1, active=2, repeat=1)
        with profile(schedule=sched, on_trace_ready=tensorboard_trace_handler("./own_log", use_gzip=True)) as prof:
            for _ in range(6):
                model(torch.randn(4, 8)).sum().backward()
                opt.step()
                prof.step()
        print("own profiler done")
    """)
    out = tmp_path / "run"
    r = profile(["--out", str(out), "--wait", "0", "--warmup", "1", "--active", "1", str(script)], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "own profiler done" in r.stdout  # not cut short: its window is its own
    assert any("own torch.profiler" in line for line in advisor_lines(r.stderr))
    theirs = sorted((tmp_path / "own_log").iterdir())
    assert len(theirs) == 1
    assert [p.name for p in traces(out)] == [theirs[0].name]  # only their trace, linked in
    f = facts(out)
    assert f["own_profiler"]["used"] and f["profiled_steps"] == [] and len(f["step_times_ms"]) == 6


@needs_torch
def test_facts_record_autocast_compile_and_scaler_and_hooks_are_undone(tmp_path: Path):
    script = write(tmp_path / "flags.py", """
        import torch
        model = torch.nn.Linear(4, 2)
        compiled = torch.compile(model, mode="reduce-overhead")  # lazy: never run here
        opt = torch.optim.SGD(model.parameters(), lr=0.1, foreach=True)
        scaler = torch.amp.GradScaler("cpu")
        torch.backends.cudnn.benchmark = True
        for _ in range(3):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(torch.randn(2, 4)).float().sum()
            opt.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
    """)
    check = tmp_path / "check.py"
    check.write_text(textwrap.dedent(f"""
        import torch, torch.utils.data.dataloader as dl
        from torch.optim.optimizer import Optimizer
        before = (torch.compile, Optimizer._patch_step_function, Optimizer.zero_grad, dl.DataLoader.__iter__,
                  dl._BaseDataLoaderIter.__next__, torch.amp.autocast_mode.autocast.__enter__, torch.amp.GradScaler.step)
        from advisor.capture.runner import Target
        from advisor.capture.session import CaptureOptions, capture
        from pathlib import Path
        out = Path({str(tmp_path / 'run')!r}); out.mkdir()
        result = capture(Target("script", {str(script)!r}), CaptureOptions(out_dir=out, wait=0, warmup=1, active=1, after_steps=0, with_stack=False, progress=False))
        after = (torch.compile, Optimizer._patch_step_function, Optimizer.zero_grad, dl.DataLoader.__iter__,
                 dl._BaseDataLoaderIter.__next__, torch.amp.autocast_mode.autocast.__enter__, torch.amp.GradScaler.step)
        assert all(a is b for a, b in zip(before, after)), [a for a, b in zip(before, after) if a is not b]
        assert not getattr(torch.optim.SGD.step, "__advisor_wrapper__", False)
        from torch.optim.optimizer import _global_optimizer_post_hooks
        assert not _global_optimizer_post_hooks
        print("undone", result.outcome.how)
    """))
    r = subprocess.run([sys.executable, str(check)], cwd=tmp_path, check=False, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "undone stopped" in r.stdout
    f = facts(tmp_path / "run")
    assert f["autocast"] == {"used": True, "dtypes": ["bfloat16"]}
    assert f["compile"] == {"used": True, "modes": ["reduce-overhead"]}
    assert f["grad_scaler"] is True and f["cudnn_benchmark"] is True and f["zero_grad_set_to_none"] is True
    assert f["optimizers"] == [{"class": "SGD", "foreach": True, "fused": None}]
    assert len(f["step_times_ms"]) == 2 and f["step_source"] == "optimizer"


# -- several processes ----------------------------------------------------------------------

@needs_torch
def test_torchrun_two_ranks_gloo(tmp_path: Path):
    script = write(tmp_path / "ddp.py", """
        import torch, torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        dist.init_process_group("gloo")
        model = DDP(torch.nn.Linear(8, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(10):
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
        dist.destroy_process_group()
    """)
    out = tmp_path / "run"
    r = profile(["--out", str(out), "--nproc-per-node", "2", *QUICK, str(script)], tmp_path)
    assert r.returncode == 0, r.stderr
    names = sorted(p.name for p in out.iterdir())
    logs = [n for n in names if n.endswith(".log")]  # what torch printed while it profiled, per rank
    assert set(logs) <= {"advisor_profiler.rank0.log", "advisor_profiler.rank1.log"}
    names = [n for n in names if n not in logs]
    assert names[:2] == ["advisor_facts.rank0.json", "advisor_facts.rank1.json"]
    assert [n.split(".")[0] for n in names[2:]] == ["rank0", "rank1"]
    for rank in (0, 1):
        f = facts(out, f"advisor_facts.rank{rank}.json")
        assert f["rank"] == rank and f["world_size"] == 2 and f["parallel"]["ddp"] and f["stopped_early"]


def _cuda_available() -> bool:
    """Asked only when the test runs: collecting this file must not need torch."""
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@needs_torch
@pytest.mark.skipif("not _cuda_available()", reason="needs torch with a CUDA device")
def test_cuda_device_is_profiled(tmp_path: Path):
    out = tmp_path / "run"
    r = profile(["--out", str(out), "--device", "cuda", "--wait", "1", "--warmup", "1", "--active", "2", str(SAMPLE), "--", "--steps", "10"], tmp_path)
    assert r.returncode == STOPPED, r.stderr  # stopped after the window, as without a GPU
    f = facts(out)
    assert f["device"]["type"] == "cuda" and f["device"]["compute_capability"] and f["device"]["max_memory_allocated_bytes"]
    # the device clock times every step after the one that first touched CUDA
    device = f["device_step_times_ms"]
    assert len(device) == len(f["step_times_ms"]) and all(t is not None and t > 0 for t in device[2:])
    doc = json.loads(gzip.decompress(traces(out)[0].read_bytes()))
    assert any(e.get("cat") == "kernel" for e in doc["traceEvents"])


@needs_torch
def test_compiled_model_is_recorded_without_stacks_unless_asked(tmp_path: Path):
    """The stack tracer costs more than a compiled step, so a compiled model is recorded without it."""
    script = write(tmp_path / "compiled.py", """
        import torch
        model = torch.compile(torch.nn.Linear(8, 2), backend="eager")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(6):
            opt.zero_grad()
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
    """)
    for name, extra, stacks in (("auto", [], False), ("forced", ["--stack"], True)):
        out = tmp_path / name
        r = profile(["--out", str(out), "--wait", "1", "--warmup", "1", "--active", "2", *extra, str(script)], tmp_path)
        assert r.returncode == STOPPED, r.stderr
        f = facts(out)
        assert f["compile"]["used"] and f["profiler"]["with_stack"] is stacks
        assert any("stack" in n and "torch.compile" in n for n in f["notes"]) is not stacks
        [trace] = traces(out)
        doc = json.loads(gzip.decompress(trace.read_bytes()))
        assert any(e.get("cat") == "python_function" for e in doc["traceEvents"]) is stacks
        steps = sorted(e["name"] for e in doc["traceEvents"] if e.get("name", "").startswith("ProfilerStep#"))
        assert steps == ["ProfilerStep#2", "ProfilerStep#3"] and f["profiled_steps"] == [2, 3]


@needs_torch
@pytest.mark.parametrize("loop", ["training", "inference"])
def test_a_compiled_model_keeps_its_one_graph_under_the_profiler(tmp_path: Path, loop: str):
    """The advisor's hooks must not change the compiled model it records: no graph break at
    its submodules (each a hook Dynamo may not trace), no recompile when the hooks go."""
    body = {
        "training": """
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for _ in range(8):
                opt.zero_grad()
                model(torch.randn(4, 8)).sum().backward()
                opt.step()
        """,
        "inference": """
            with torch.no_grad():
                for _ in range(8):
                    model(torch.randn(4, 8))
        """,
    }[loop]
    script = write(tmp_path / "compiled.py", textwrap.dedent("""
        import json, sys
        import torch, torch.nn as nn
        from torch._dynamo.utils import counters
        model = torch.compile(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.GELU(), nn.Linear(16, 2)), backend="eager")
    """) + textwrap.dedent(body) + textwrap.dedent("""
        with open(sys.argv[1], "w") as fh:
            json.dump({"graph_breaks": sum(counters["graph_break"].values()), "graphs": counters["stats"]["unique_graphs"]}, fh)
    """))
    out = tmp_path / "run"
    r = profile(["--out", str(out), "--full", "--wait", "1", "--warmup", "1", "--active", "2", str(script), "--", str(tmp_path / "dynamo.json")], tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "dynamo.json").read_text()) == {"graph_breaks": 0, "graphs": 1}
    f = facts(out)
    # steps still found: the optimizer's, or the loop's calls of the compiled model (from its second call)
    assert (f["step_source"], len(f["step_times_ms"]), f["mode"]) == (
        ("optimizer", 8, "training") if loop == "training" else ("forward", 7, "inference")
    )


@needs_torch
def test_dataloader_stall_hidden_by_prefetching_is_found_after_the_window(tmp_path: Path):
    """Workers fill their prefetch buffer during a slow first step; the window trains from it,
    and only the unprofiled steps after it show the input pipeline cannot keep up."""
    script = write(tmp_path / "prefetched.py", """
        import time
        import torch
        from torch.utils.data import DataLoader, Dataset

        class SlowReads(Dataset):
            def __len__(self):
                return 10_000

            def __getitem__(self, index):
                time.sleep(0.02)  # 20 ms of I/O per sample: 40 ms per batch from two workers
                return torch.randn(8), 0

        def main():
            loader = DataLoader(SlowReads(), batch_size=4, num_workers=2, prefetch_factor=4)
            model = torch.nn.Linear(8, 2)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for step, (x, _) in enumerate(loader):
                if step == 0:
                    time.sleep(2.0)  # start-up (a compile, say): the workers fill 8 batches meanwhile
                opt.zero_grad()
                model(x).sum().backward()
                opt.step()
                time.sleep(0.005)
                if step == 40:
                    break

        if __name__ == "__main__":
            main()
    """)
    out = tmp_path / "run"
    r = profile(["--out", str(out), "--wait", "1", "--warmup", "1", "--active", "2", "--full", "--no-stack", str(script)], tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr
    f = facts(out)
    waits, steps = f["loader_wait_ms"], f["step_times_ms"]
    assert len(waits) == len(steps) == 41 and f["profiled_steps"] == [2, 3]
    # hidden in the window, plain after it (relative: a loaded machine slows every step)
    after = statistics.mean(waits[5:])
    assert after > 20 and max(waits[2:4]) < 0.5 * after
    doc = json.loads(subprocess.run(
        [sys.executable, "-m", "advisor", "report", str(out), "--format", "json", "--select", "dataloader-stall"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, check=True, timeout=120,
    ).stdout)
    [stall] = doc["findings"]
    assert stall["rule"] == "dataloader-stall" and "prefetched batches hid it" in stall["message"]
    # the steady steps after the window (the first after it left out), as the rule's page says:
    # a step over 5x the upper quartile (a hiccup of a busy machine) is not the steady state
    after_steps, after_waits = steps[5:], waits[5:]
    cut = 5 * statistics.quantiles(after_steps, n=4, method="inclusive")[2]
    steady = [i for i, t in enumerate(after_steps) if t <= cut]
    assert len(steady) >= 30
    assert stall["evidence"]["unprofiled_steps"] == len(steady)
    mean_wait = statistics.mean(after_waits[i] for i in steady)
    assert stall["saving_share"] == pytest.approx(mean_wait / statistics.mean(after_steps[i] for i in steady), rel=1e-3)
    assert stall["evidence"]["unprofiled_wait_ms_per_step"] == pytest.approx(mean_wait, abs=1e-3)
