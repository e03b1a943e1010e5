"""`advisor fix --verify`: the original sample and its fixed copy run without the profiler,
alternating, and the measured saving is set against the finding's promise.

The promise is read from the finding (the sample's CPU recording, 2 cores: one DataLoader
worker); whether it is kept depends on this machine (a worker shares two cores with the
training), so the test checks that the verdict follows from the measured steps, not which
verdict it is. The record is a baseline `advisor gate` reads.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
from pathlib import Path

import pytest

from advisor.analysis import analyze
from advisor.schemas import check
from conftest import SAMPLE_RUNS

SAMPLE = SAMPLE_RUNS / "resnet18_cifar"
RUN = SAMPLE / "runs" / "cpu_baseline"


def stall_share() -> float:
    return next(f for f in analyze(RUN).to_dict()["findings"] if f["rule"] == "dataloader-stall")["saving_share"]


@pytest.fixture(scope="module")
def verified(tmp_path_factory):
    pytest.importorskip("torch")
    from advisor.cli import main  # noqa: F401  (the command is registered on demand)

    tmp = tmp_path_factory.mktemp("verify")
    record = tmp / "verify.json"
    import subprocess
    import sys

    cmd = [
        sys.executable, "-m", "advisor", "fix", str(SAMPLE / "train.py"), "--from", str(RUN), "--select", "dataloader-stall",
        "--verify", "--steps", "8", "--warmup", "3", "-o", str(record), "--", "--cpu-variant",
    ]  # fmt: skip
    import os

    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, env={**os.environ, "OMP_NUM_THREADS": "1"}, cwd=tmp)
    return done, json.loads(record.read_text()) if record.exists() else None


def test_verify_prints_the_promise_the_measured_saving_and_a_verdict(verified):
    done, record = verified
    assert record is not None, done.stderr[-3000:]
    # the exit status follows the verdict: 0 kept, 1 missed (a CI step fails on a missed promise)
    assert done.returncode == {"kept": 0, "missed": 1}[record["verify"]["fixes"][0]["verdict"]], done.stderr[-3000:]
    report = analyze(RUN).to_dict()
    stall = next(f for f in report["findings"] if f["rule"] == "dataloader-stall")
    # the promise of applying this fix alone: its saving alone, as a share of the replay's step
    promised_ms = stall["saving_alone_ms"] if stall.get("saving_alone_ms") is not None else stall["saving_ms"]
    promised_pct = promised_ms / report["whatif"]["baseline_ms"]
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["fix", "safety", "promised", "original", "ms", "fixed", "ms", "measured", "saving", "verdict"]
    row = next(line for line in lines if line.startswith("dataloader-stall  "))
    assert f"{promised_ms:.1f} ms ({100 * promised_pct:.0f}%)" in row  # the finding's own promise
    [fix] = record["verify"]["fixes"]
    assert row.split()[-1] == fix["verdict"] and fix["verdict"] in ("kept", "missed")
    assert fix["promised_ms"] == pytest.approx(promised_ms, abs=1e-3) and fix["promised_share"] == pytest.approx(promised_pct, abs=1e-3)
    # The last lines say why, in the figures measured.
    assert any(line.startswith(f"dataloader-stall: {fix['verdict']}: measured ") for line in lines)


def test_verify_alternates_the_runs_and_its_figures_follow_from_the_steps(verified):
    done, record = verified
    v = record["verify"]
    assert [(r["variant"], r["round"]) for r in v["runs"]] == [("original", 1), ("dataloader-stall", 1), ("original", 2), ("dataloader-stall", 2)]
    assert all(len(r["step_times_ms"]) == 8 and not r["error"] for r in v["runs"])
    original = [t for r in v["runs"] if r["variant"] == "original" for t in r["step_times_ms"]]
    fixed = [t for r in v["runs"] if r["variant"] == "dataloader-stall" for t in r["step_times_ms"]]
    [fix] = v["fixes"]
    saving = statistics.median(original) - statistics.median(fixed)
    assert fix["saving_ms"] == pytest.approx(saving, abs=1e-3)
    rounds = [statistics.median(v["runs"][i]["step_times_ms"]) - statistics.median(v["runs"][i + 1]["step_times_ms"]) for i in (0, 2)]
    assert fix["round_savings_ms"] == pytest.approx(rounds, abs=1e-3)
    share = saving / statistics.median(original)
    kept = share >= v["kept_share"] * stall_share() and min(rounds) > 0
    assert fix["verdict"] == ("kept" if kept else "missed")
    # The fixed copy is the baseline: its steps, the findings it left (none: the one was fixed).
    assert record["step_times_ms"] == pytest.approx(fixed)
    assert record["findings"] == [] and math.isclose(record["metrics"]["step_time_median_ms"], statistics.median(fixed), rel_tol=1e-6)


def test_verify_record_fits_its_schema_and_the_gate_reads_it(verified, cli, tmp_path):
    _, record = verified
    jsonschema = pytest.importorskip("jsonschema")
    from advisor.schemas import json_schema

    jsonschema.Draft202012Validator(json_schema("verify")).validate(record)
    check("verify", record)
    path = tmp_path / "verify.json"
    path.write_text(json.dumps(record))
    # The original run judged against the fixed copy's baseline: a verdict (pass or fail), not bad input.
    code, out, err = cli(["gate", str(RUN), "--baseline", str(path), "--json", str(tmp_path / "gate.json")])
    assert code in (0, 1), err
    result = json.loads((tmp_path / "gate.json").read_text())
    assert result["baseline"]["kind"] == "baseline" and result["baseline"]["steps"] == 16


def test_verify_with_nothing_placed_is_one_line(cli, tmp_path):
    code, out, err = cli(["fix", str(SAMPLE / "train.py"), "--from", str(SAMPLE / "runs" / "cpu_workers"), "--select", "zero-grad-memset", "--verify"])
    assert code == 2 and "nothing to verify" in err.strip().splitlines()[-1]


# --- the fixed copy runs as the script; a failed run writes no record; -o checked first -------
BESIDE = """\
import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader

rows = Path(__file__).with_name("rows.txt").read_text().split()  # a file beside the script
if len(sys.argv) > 1 and sys.argv[1] == "--fail":
    sys.exit(3)
data = [torch.full((4,), float(r)) for r in rows]
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(data, batch_size=2)
for epoch in range(50):
    for x in loader:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
"""
PLAIN_RUN = Path(__file__).resolve().parent / "data" / "fix" / "runs" / "plain_loop_cpu"


def _beside(tmp_path: Path) -> Path:
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "rows.txt").write_text(" ".join(str(i) for i in range(16)))
    (folder / "train.py").write_text(BESIDE)
    return folder / "train.py"


def _verify(cli, script: Path, *extra: str) -> tuple[int, str, str]:
    return cli(["fix", str(script), "--from", str(PLAIN_RUN), "--select", "dataloader-stall", "--verify", "--steps", "3", "--warmup", "1", "--rounds", "1", *extra],
               cwd=script.parent.parent, env={"OMP_NUM_THREADS": "1"})


def test_verify_runs_the_fixed_copy_as_the_script_and_leaves_no_file(cli, tmp_path):
    """The fixed copy reads a file beside the script through __file__, as the original does;
    nothing is written beside the script, and nothing is left behind."""
    pytest.importorskip("torch")
    script = _beside(tmp_path)
    before = sorted(p.name for p in script.parent.iterdir())
    code, out, err = _verify(cli, script)
    runs = [line for line in err.splitlines() if line.startswith("advisor: round 1/1 ")]
    assert len(runs) == 2 and not any("failed" in line for line in runs), err
    assert code in (0, 1) and out.splitlines()[-1].split(": ")[1] in ("kept", "missed"), err
    assert sorted(p.name for p in script.parent.iterdir()) == before


def test_a_failed_verification_exits_4_and_writes_no_record(cli, tmp_path):
    pytest.importorskip("torch")
    script = _beside(tmp_path)
    record = tmp_path / "verify.json"
    code, out, err = _verify(cli, script, "-o", str(record), "--", "--fail")
    assert code == 4, err
    assert "dataloader-stall: failed: " in out and not record.exists()
    assert f"no record written to {record}: the fixed copy did not run its steps" in err


def test_an_output_that_is_one_of_the_runs_files_is_refused_before_measuring(cli, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(PLAIN_RUN, run)
    facts = run / "advisor_facts.json"
    before = facts.read_bytes()
    script = _beside(tmp_path)
    code, out, err = cli(["fix", str(script), "--from", str(run), "--select", "dataloader-stall", "--verify", "-o", str(facts)])
    assert code == 2 and "is one of the files this command reads" in err and len(err.strip().splitlines()) == 1
    assert "round" not in err and out == "" and facts.read_bytes() == before


# --- a process the script forks never holds the run; --timeout -----------------------------
FORKS = """\
import os
import sys
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader

if os.fork() == 0:  # a logger or a watchdog that outlives the script, holding its stdout and stderr
    Path(sys.argv[1]).joinpath(f"child-{os.getpid()}").write_text("")
    time.sleep(600)
    os._exit(0)
data = [torch.full((4,), float(r)) for r in range(16)]
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(data, batch_size=2)
for epoch in range(50):
    for x in loader:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is not running: it waits for its parent (not this process) to read its status
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] == "Z")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the reproducer forks")
def test_a_process_the_script_forks_does_not_hold_the_run(cli, tmp_path):
    """The reproducer: a script that forks a child sleeping past its own end (a logger, a
    watchdog) made every run wait on the stderr pipe the child held, for the 900 s timeout, then
    "did not finish N steps". Each run now ends with the script's process (within --timeout 60,
    a guard only: the child sleeps 600 s), every round measures its steps, and the children of
    both runs are ended with them."""
    pytest.importorskip("torch")
    folder = tmp_path / "project"
    folder.mkdir()
    script = folder / "train.py"
    script.write_text(FORKS)
    children = tmp_path / "children"
    children.mkdir()
    code, out, err = _verify(cli, script, "--timeout", "60", "--", str(children))
    runs = [line for line in err.splitlines() if line.startswith("advisor: round 1/1 ")]
    assert len(runs) == 2 and not any("failed" in line for line in runs), err
    assert code in (0, 1), err
    pids = [int(p.name.split("-")[1]) for p in children.iterdir()]
    assert len(pids) == 2, pids
    import time

    deadline = time.monotonic() + 10  # a killed process is gone once its new parent has read its status
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in pids), [Path(f"/proc/{pid}/stat").read_text() for pid in pids if _alive(pid)]


# A daemon's double fork: the grandchild leaves the run's session (setsid) and its parent
# exits, so ending the session does not reach it.
LEAVES_THE_SESSION = FORKS.replace(
    """if os.fork() == 0:  # a logger or a watchdog that outlives the script, holding its stdout and stderr
    Path(sys.argv[1]).joinpath(f"child-{os.getpid()}").write_text("")
    time.sleep(600)
    os._exit(0)""",
    """if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        Path(sys.argv[1]).joinpath(f"child-{os.getpid()}").write_text("")
        time.sleep(600)
    os._exit(0)""",
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="adopting a run's orphans is Linux's (prctl)")
def test_a_process_that_leaves_the_runs_session_is_ended_with_the_run(cli, tmp_path):
    """A watchdog started as a daemon (fork, setsid, fork) is in no session of the run's: ending
    the session left it sleeping beside the next run. The advisor adopts it and ends it."""
    pytest.importorskip("torch")
    assert "setsid" in LEAVES_THE_SESSION
    folder = tmp_path / "project"
    folder.mkdir()
    script = folder / "train.py"
    script.write_text(LEAVES_THE_SESSION)
    children = tmp_path / "children"
    children.mkdir()
    code, out, err = _verify(cli, script, "--timeout", "60", "--", str(children))
    assert code in (0, 1), err
    pids = [int(p.name.split("-")[1]) for p in children.iterdir()]
    assert len(pids) == 2, pids
    import time

    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in pids), [Path(f"/proc/{pid}/stat").read_text() for pid in pids if _alive(pid)]


def test_a_run_past_the_timeout_is_stopped_and_failed(cli, tmp_path):
    """--timeout sets how long a run may take: a script that never reaches its steps is stopped
    after it, the run failed with the limit named (exit 4)."""
    pytest.importorskip("torch")
    folder = tmp_path / "project"
    folder.mkdir()
    script = folder / "train.py"
    script.write_text("import time\n" + BESIDE.replace("rows = ", "time.sleep(600)\nrows = "))
    (folder / "rows.txt").write_text("1 2 3 4")
    code, out, err = _verify(cli, script, "--timeout", "2")
    assert code == 4, err
    assert "failed: did not finish 4 steps in 2 s (--timeout)" in err, err


@pytest.mark.parametrize("value, why", [("0", "above 0"), ("-5", "above 0"), ("nan", "above 0"), ("inf", "above 0")])
def test_a_timeout_that_is_no_time_is_refused_in_one_line(cli, tmp_path, value, why):
    script = _beside(tmp_path)
    code, out, err = cli(["fix", str(script), "--from", str(PLAIN_RUN), "--verify", "--timeout", value])
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--timeout" in err and why in err, err
    code, out, err = cli(["fix", str(script), "--from", str(PLAIN_RUN), "--timeout", "30"])
    assert code == 2 and "add --verify" in err, err
