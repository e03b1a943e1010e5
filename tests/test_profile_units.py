"""Fast, in-process checks of the capture package's parts, and of the recorded sample logs."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import orjson
import pytest
from conftest import REPO

from advisor.cli.profile import prepare_out_dir
from advisor.capture.progress import Window, step_span
from advisor.capture.runner import Target, check_target
from advisor.leaving import exit_status
from advisor.errors import InputError

SAMPLE_RUNS = REPO / "sample_runs" / "resnet18_cifar" / "runs"


@pytest.mark.filterwarnings("ignore:Profiler won.t be using warmup")
def test_window_phases_match_torch_schedule():
    from torch.profiler import ProfilerAction, schedule

    for wait, warmup, active, repeat in [(1, 3, 5, 1), (0, 1, 1, 1), (2, 0, 3, 2), (1, 4, 3, 1)]:
        w = Window(wait, warmup, active, repeat)
        torch_schedule = schedule(wait=wait, warmup=warmup, active=active, repeat=repeat)
        names = {
            ProfilerAction.NONE: "wait", ProfilerAction.WARMUP: "warmup",
            ProfilerAction.RECORD: "record", ProfilerAction.RECORD_AND_SAVE: "record",
        }
        for k in range(w.length):
            assert w.phase(k) == names[torch_schedule(k)], (wait, warmup, active, repeat, k)
        assert w.phase(w.length) == "done" and torch_schedule(w.length) == ProfilerAction.NONE
    assert Window(1, 3, 5, 1).recorded(9) == [4, 5, 6, 7, 8]
    assert Window(1, 3, 5, 1).recorded(6) == [4, 5]
    assert Window(1, 1, 2, 2).recorded(8) == [2, 3, 6, 7]
    assert step_span([4, 5, 6]) == "steps 4–6" and step_span([2]) == "step 2" and step_span([]) == "none"


def test_exit_codes_are_pythons():
    assert exit_status(None) == 0 and exit_status(3) == 3 and exit_status(-1) == 255 and exit_status(256 + 4) == 4
    assert exit_status("a message") == 1  # printed to stderr, like Python does


def test_target_names_and_checks(tmp_path: Path, monkeypatch):
    assert Target("script", "dir/train.py").stem == "train"
    assert Target("module", "pkg.sub.run").stem == "run" and Target("module", "pkg.__main__").stem == "pkg"
    assert Target("module", "pkg.run", ["a"]).display == "-m pkg.run"
    with pytest.raises(InputError, match="no such file"):
        check_target(Target("script", str(tmp_path / "absent.py")))
    with pytest.raises(InputError, match="is a directory"):
        check_target(Target("script", str(tmp_path)))
    with pytest.raises(InputError, match="not a module name"):
        check_target(Target("module", "not-a-module"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "apkg").mkdir()
    (tmp_path / "apkg" / "__init__.py").write_text("")
    with pytest.raises(InputError, match="without a __main__"):
        check_target(Target("module", "apkg"))
    with pytest.raises(InputError, match="no module named apkg.nothing"):
        check_target(Target("module", "apkg.nothing"))
    (tmp_path / "apkg" / "run.py").write_text("")
    check_target(Target("module", "apkg.run"))


def test_out_dir_is_always_new(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    a = prepare_out_dir(None, "train")
    b = prepare_out_dir(None, "train")
    # absolute, resolved once: the script may os.chdir() before the trace is written
    assert a != b and a.parent == b.parent == tmp_path / "advisor_runs" and a.name.startswith("train-")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert prepare_out_dir(empty, "x") == empty
    (empty / "something").write_text("keep me")
    with pytest.raises(InputError, match="not empty"):
        prepare_out_dir(empty, "x")
    with pytest.raises(InputError, match="not a directory"):
        prepare_out_dir(empty / "something", "x")


def test_script_module_is_main_and_everything_is_put_back(tmp_path: Path):
    """Run in a child so sys.modules['__main__'] games cannot touch pytest's process."""
    script = tmp_path / "probe.py"
    script.write_text("import sys, os\nprint(__name__, sys.argv, sys.modules['__main__'].__file__ == __file__, sys.path[0] == os.path.dirname(os.path.abspath(__file__)))\n")
    code = textwrap.dedent(f"""
        import sys
        from advisor.capture.runner import Target, run
        main, argv, path = sys.modules['__main__'], list(sys.argv), list(sys.path)
        outcome = run(Target("script", {str(script)!r}, ["--x", "1"]))
        assert sys.modules['__main__'] is main and sys.argv == argv and sys.path == path
        print(outcome.how, outcome.exit_code)
    """)
    r = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [f"__main__ ['{script}', '--x', '1'] True True", "finished 0"]


# -- the recorded sample logs ---------------------------------------------------------------

@pytest.mark.parametrize("run, workers", [("cpu_baseline", 0), ("cpu_workers", 2)])
def test_sample_logs_are_there_and_small(run: str, workers: int):
    d = SAMPLE_RUNS / run
    if not d.is_dir():
        pytest.skip(f"{d} not recorded")
    traces = sorted(d.glob("*.pt.trace.json.gz"))
    assert len(traces) == 1 and traces[0].stat().st_size < 700_000
    facts = orjson.loads((d / "advisor_facts.json").read_bytes())
    assert facts["schema"] == "advisor/facts/v1"
    assert facts["dataloaders"][0]["num_workers"] == workers and facts["dataloaders"][0]["batch_size"] == 32
    assert facts["profiled_steps"] == [5, 6, 7] and facts["stopped_early"]
    doc = json.loads(gzip.decompress(traces[0].read_bytes()))
    steps = sorted({e["name"] for e in doc["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")})
    assert steps == ["ProfilerStep#5", "ProfilerStep#6", "ProfilerStep#7"]


def test_sample_logs_are_read_by_tensorboards_profiler_plugin(tmp_path: Path):
    pytest.importorskip("torch_tb_profiler")
    runs = [SAMPLE_RUNS / r for r in ("cpu_baseline", "cpu_workers") if (SAMPLE_RUNS / r).is_dir()]
    if not runs:
        pytest.skip("sample logs not recorded")
    check = tmp_path / "tb_check.py"  # the plugin's cache starts a multiprocessing Manager: needs a real __main__
    check.write_text(textwrap.dedent("""
        import os, sys
        from torch_tb_profiler import consts, io
        from torch_tb_profiler.profiler.data import RunProfileData

        if __name__ == "__main__":
            cache = io.Cache()
            for d in sys.argv[1:]:
                for name in sorted(os.listdir(d)):
                    m = consts.WORKER_PATTERN.match(name)
                    if not m:
                        continue
                    data = RunProfileData.parse(m.group(1), m.group(2)[1:] if m.group(2) else None, os.path.join(d, name), cache)
                    data.process()
                    print(os.path.basename(d), ",".join(data.steps_names), data.avg_costs is not None)
    """))
    r = subprocess.run([sys.executable, str(check), *map(str, runs)], check=False, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[: len(runs)] == [f"{d.name} 5,6,7 True" for d in runs]
