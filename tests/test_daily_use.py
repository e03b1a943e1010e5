"""Daily use through the installed `advisor` program in a child process: one step time and
one throughput in every command, pipes a reader closes early, exit statuses a CI step can
trust, advice read from the run rather than from the machine the report runs on."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
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


def test_whatif_after_a_report_reads_the_cached_analysis_and_no_trace(cli, monkeypatch):
    """`advisor whatif` on a run already reported replays nothing and parses nothing: its
    figures are the stored analysis's, the same as a cold whatif prints."""
    import advisor.load.trace as trace_module
    from conftest import count_calls

    run = RUNS / "gpu_baseline"
    cold = cli(["whatif", str(run)], env={"ADVISOR_CACHE": "off"})
    assert cold[0] == 0, cold[2]
    code, _, err = cli(["report", str(run)])
    assert code == 0, err
    count_calls(monkeypatch, trace_module, "load_trace", "whatif loaded a trace the cached analysis holds").forbid()
    code, out, err = cli(["whatif", str(run)])
    assert code == 0, err
    assert out == cold[1]


# --- advice read from the run, with the machine's other work said --------------------------------
def test_other_work_is_the_cores_busy_time_less_the_scripts_own():
    """/proc/stat's busy ticks of the script's cores, less the script's own ticks, over the
    step's wall time: the cores other processes kept busy."""
    from advisor.capture.machine_load import cpu_busy_ticks, other_cores, process_ticks

    stat = (
        "cpu  500 0 100 9000 0 0 0 0 0 0\n"
        "cpu0 100 5 50 4000 30 1 2 3 0 0\n"  # busy 100+5+50+1+2+3 = 161 (idle, iowait not)
        "cpu1 200 0 20 4000 10 0 0 0 0 0\n"  # 220
        "cpu2 999 0 0 0 0 0 0 0 0 0\n"
        "intr 1 2 3\n"
    )
    assert cpu_busy_ticks(stat, {0, 1}) == 161 + 220
    assert cpu_busy_ticks(stat, None) == 161 + 220 + 999
    # /proc/PID/stat: a command name with spaces and a parenthesis; utime 40, stime 10, cutime 5, cstime 1
    own = "1234 (my (odd) script) R 1 1 1 0 -1 4194304 100 0 0 0 40 10 5 1 20 0 3 0 100"
    assert process_ticks(own) == 56 and process_ticks(own, with_reaped_children=False) == 50
    # 2 cores over 0.5 s at 100 ticks/s: 100 ticks busy, 30 of them the script's -> 1.4 cores of other work
    assert other_cores(100, 30, 0.5, 100.0) == pytest.approx(1.4)
    assert other_cores(10, 30, 0.5, 100.0) == 0.0 and other_cores(10, 3, 0.0, 100.0) is None


def _with_other_work(tmp_path: Path, run: Path, other: float | None) -> Path:
    """A copy of a recorded run whose facts say other processes kept `other` cores busy at each step."""
    import shutil

    import orjson

    out = tmp_path / f"{run.name}-{other}"
    shutil.copytree(run, out)
    facts = orjson.loads((out / "advisor_facts.json").read_bytes())
    facts["other_cpu_cores"] = None if other is None else [other] * len(facts["step_times_ms"])
    (out / "advisor_facts.json").write_bytes(orjson.dumps(facts))
    return out


@pytest.mark.parametrize("other", [None, 0.2, 1.2])
def test_the_dataloader_verdict_on_the_quick_start_reads_the_run_and_says_when_it_was_noisy(tmp_path, other):
    """The quick start as recorded (2 cores, 2 compute threads, no worker): the stall is
    ranked first from what the run recorded (cores and threads in its facts, times in its
    trace), whatever the machine running the report is doing; a window the facts say was timed
    beside other work keeps that verdict (the promise is the middle of the trade's gains, not
    op times inflated by waits for a core) and is called noisy, in the finding and the notes."""
    import advisor as api

    run = _with_other_work(tmp_path, RUNS / "cpu_two_threads", other)
    a = api.analyze(run)
    assert list(a.findings["rule"])[0] == "dataloader-stall"
    finding = a.findings.iloc[0]
    noisy = other is not None and other >= 0.5
    assert ("timed beside other work" in finding["message"]) == noisy
    report = a.to_dict()
    assert any("timed beside other work" in n for n in report["notes"]) == noisy
    ev = report["findings"][0]["evidence"]["cores"]
    assert ev["cores"] == 2 and ev["busy_main_threads"] == 2 and ev["other_cpu_cores"] == other
    if noisy:  # the middle of what the trade gives, between the model losing nothing and 2x
        assert f"other processes kept {other:.1f} of the 2 cores busy" in finding["message"]
        assert "The promise is the middle of what the trade gives" in finding["message"]


def test_the_profile_extra_declares_what_the_sample_imports():
    """`pip install '.[profile]'` can run the shipped sample: every third-party module its
    script imports unconditionally is in the base install or the `profile` extra."""
    import ast

    from conftest import REPO

    try:
        import tomllib
    except ImportError:  # pragma: no cover - Python 3.10
        import tomli as tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = {re.split(r"[<>=!~; \[]", d, maxsplit=1)[0].lower() for d in [*project["dependencies"], *project["optional-dependencies"]["profile"]]}
    tree = ast.parse((REPO / "sample_runs" / "resnet18_cifar" / "train.py").read_text())
    optional = {n.lineno for t in ast.walk(tree) if isinstance(t, ast.Try) for s in t.body for n in ast.walk(s)}
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and node.lineno not in optional:
            modules |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.lineno not in optional:
            modules.add(node.module.split(".")[0])
    distribution = {"PIL": "pillow", "numpy": "numpy", "torch": "torch"}
    third_party = modules - set(sys.stdlib_module_names) - {"__future__"}
    assert third_party == {"PIL", "numpy", "torch"}, third_party
    assert {distribution[m] for m in third_party} <= declared


# --- one step time and one throughput everywhere -------------------------------------------------
def _rate(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:,.1f}" if x >= 10 else f"{x:,.2f}"


def _mean_and_batch(run: Path) -> tuple[float, int]:
    """The mean of the run's steps (the API's per-step frame) and the batch its facts file records."""
    import json

    import advisor as api

    steps = api.analyze(run).steps
    batch = json.loads((run / "advisor_facts.json").read_text())["dataloaders"][0]["batch_size"]
    return float(steps["duration_ms"].mean()), batch


def test_every_command_and_format_gives_the_mean_step_and_its_throughput(cli, tmp_path):
    """One definition of step time (the mean step) and throughput (batch / mean step), with
    one rounding, in report (text, Markdown, HTML, JSON), diff, whatif, gate and the API."""
    import json

    import advisor as api

    before, after = RUNS / "gpu_baseline", RUNS / "gpu_walk_final"
    b_mean, b_bs = _mean_and_batch(before)
    a_mean, a_bs = _mean_and_batch(after)
    assert abs(b_mean - float(np.median(api.analyze(before).steps["duration_ms"]))) > 1  # mean and median differ here
    b_rate, a_rate = b_bs / b_mean * 1000, a_bs / a_mean * 1000

    code, out, err = cli(["report", str(before)])
    assert code == 0, err
    assert f"Step time        {b_mean:.2f} ms mean (median " in out
    assert f"Throughput       {_rate(b_rate)} samples/s (batch {b_bs} / {b_mean:.2f} ms mean step)" in out
    code, out, _ = cli(["report", str(before), "-f", "md"])
    assert f"{b_mean:.2f} ms/step (mean)" in out and f" · {_rate(b_rate)} samples/s · " in out
    code, out, _ = cli(["report", str(before), "-f", "html", "-o", str(tmp_path / "r.html")])
    page = (tmp_path / "r.html").read_text()
    assert f"{_rate(b_rate)} samples/s" in page and "Step time (mean)" in page and "median step time" not in page
    code, out, _ = cli(["report", str(before), "-f", "json"])
    doc = json.loads(out)
    assert doc["summary"]["step_time_ms"]["mean"] == pytest.approx(b_mean, abs=0.01)
    alone = {f["rule"]: f["saving_alone_ms"] for f in doc["findings"]}

    code, out, _ = cli(["diff", str(before), str(after)])
    assert f"{b_mean:.2f} ms → {a_mean:.2f} ms mean" in out
    assert f"{_rate(b_rate)} → {_rate(a_rate)} samples/s, from the mean step" in out
    code, out, _ = cli(["diff", str(before), str(after), "-f", "md"])
    assert f"| throughput (mean step) | {_rate(b_rate)} samples/s | {_rate(a_rate)} samples/s |" in out

    code, out, _ = cli(["whatif", str(before)])
    assert f"Measured step    {b_mean:.2f} ms mean over the profiled window" in out
    for rule, ms in alone.items():  # the report's own figure for each fix alone, rounded alike
        if ms is not None and f"  {rule} " in out:
            assert re.search(rf"  {re.escape(rule)}\s+alone:\s+{ms:.2f} ms/step", out), (rule, ms, out)

    r = advisor(["gate", str(after), "--max-ms-per-sample", "1", "--min-samples-per-s", "1", "--max-step-time-ms", "1000"], tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    per_sample = next(line for line in r.stdout.splitlines() if line.startswith("time per sample "))
    assert f"{1000 * a_mean / a_bs:.1f} µs/sample" in per_sample and f"{_rate(a_rate)} samples/s" in per_sample
    assert f"{_rate(a_rate)} samples/s" in next(line for line in r.stdout.splitlines() if line.startswith("throughput "))
    assert f"{a_mean:.2f} ms" in next(line for line in r.stdout.splitlines() if line.startswith("mean step time "))

    assert f"{b_mean:.2f} ms mean step" in repr(api.analyze(before))


def test_the_gates_per_sample_line_is_one_over_its_throughput(tmp_path):
    """Against a baseline of another batch size, the per-sample figure and the throughput
    beside it are the same measurement (mean step / samples per step, and its inverse)."""
    r = advisor(["baseline", str(RUNS / "gpu_workers"), "-o", "base.json"], tmp_path)
    assert r.returncode == 0, r.stderr
    r = advisor(["gate", str(RUNS / "gpu_walk_final"), "--baseline", "base.json", "--min-steps", "3"], tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    row = next(line for line in r.stdout.splitlines() if line.startswith("time per sample vs baseline"))
    pairs = re.search(r"mean step per sample ([\d.]+) µs -> ([\d.]+) µs .*throughput ([\d,]+) -> ([\d,]+) samples/s", row)
    assert pairs, row
    for us, rate in ((pairs[1], pairs[3]), (pairs[2], pairs[4])):
        assert 1e6 / float(us) == pytest.approx(float(rate.replace(",", "")), rel=2e-3)
    assert "the test on each step: median per sample" in row  # the statistic, labelled as such


def test_the_documented_failing_gate_runs_on_the_shipped_runs(tmp_path):
    """docs/gate.md's first example runs on a copy of sample_runs/ (what a clone has) and
    prints the lines it shows, with the gate's exit status 1."""
    import shutil

    from conftest import REPO
    from test_everyday import _shown_commands

    text = (REPO / "docs" / "gate.md").read_text(encoding="utf-8")
    blocks = _shown_commands(text, "<!-- gate failing example -->")
    assert [c[0][:2] for c in blocks] == [["advisor", "baseline"], ["advisor", "gate"]]
    shutil.copytree(REPO / "sample_runs", tmp_path / "sample_runs")
    for (cmd, shown), expected in zip(blocks, (0, 1), strict=True):
        assert all(not a.startswith("/") and "shared" not in a for a in cmd)
        r = advisor(cmd[1:], tmp_path)
        assert r.returncode == expected, r.stdout + r.stderr
        printed = [line.rstrip() for line in (r.stdout + r.stderr).splitlines()]
        for line in shown:
            if line.strip() and not line.startswith("━"):
                assert line.rstrip() in printed, f"docs/gate.md shows a line the command does not print: {line!r}\n{printed}"


def test_the_documented_diff_runs_on_the_shipped_runs(tmp_path):
    """docs/reports.md's `advisor diff` example runs on a copy of sample_runs/ and prints the
    lines it shows, in order."""
    import shutil

    from conftest import REPO

    text = (REPO / "docs" / "reports.md").read_text(encoding="utf-8")
    body = re.search(r"<!-- diff example -->\n```console\n\$ (advisor [^\n]+)\n(.*?)```", text, re.S)
    assert body, "no diff example"
    cmd = body[1].split()
    assert all(not a.startswith("/") and "shared" not in a for a in cmd)
    shutil.copytree(REPO / "sample_runs", tmp_path / "sample_runs")
    r = advisor(cmd[1:], tmp_path)
    assert r.returncode == 0, r.stderr
    printed = [line.rstrip() for line in r.stdout.splitlines()]
    at = 0
    for line in body[2].splitlines():
        if line in ("...", ""):
            continue
        assert line.rstrip() in printed[at:], f"docs/reports.md shows a line the command does not print after line {at}: {line!r}"
        at = printed.index(line.rstrip(), at) + 1


# --- docs a clone can follow -------------------------------------------------------------------------
def test_the_readme_says_what_the_shared_data_set_is_and_names_every_source():
    """The README tells a clone what ../shared is and names every public repository the data
    set's manifest and corpus/SOURCES.tsv take traces from (read from the data set itself)."""
    from conftest import BESIDE, REPO

    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "../shared/traces/" in readme and "MANIFEST.md" in readme and "corpus/SOURCES.tsv" in readme
    sources = BESIDE / "traces" / "corpus" / "SOURCES.tsv"
    manifest = BESIDE / "traces" / "MANIFEST.md"
    if not sources.is_file() or not manifest.is_file():
        pytest.skip(f"the data set is not beside the clone: {sources.parent.parent} (the README's pointers are checked above)")
    lines = sources.read_text(encoding="utf-8").splitlines()
    header = lines[0].split("\t")
    repos = {row.split("\t")[header.index("repo")] for row in lines[1:] if row.strip()}
    # the manifest's own tables: the source column names "owner/name `path`"
    repos |= set(re.findall(r"\| ([A-Za-z0-9][\w.-]*/[\w.-]+) `", manifest.read_text(encoding="utf-8")))
    repos = {r for r in repos if "/" in r}
    short = {"HTA": "facebookresearch/HolisticTraceAnalysis"}
    assert repos, "no repository read from the data set"
    missing = sorted(r for r in repos if r not in readme and not any(k in r for k in short if short[k] in readme))
    assert not missing, f"the README does not name: {missing}"


def test_sample_readmes_point_only_at_files_a_clone_has():
    """Every file a sample README names is in the repository (beside the README or from its
    root); the data set's files are named as such (../shared/, said to be outside it)."""
    from conftest import REPO

    readmes = sorted(SAMPLE_RUNS.glob("*/README.md"))
    assert readmes
    for readme in readmes:
        text = readme.read_text(encoding="utf-8")
        assert "SCENARIO.md" not in text
        for ref in re.findall(r"`([\w./-]+\.(?:md|py|sh|txt|toml))`", text):
            if ref.startswith("../shared/"):
                assert "not in this repository" in text, (readme, ref)
                continue
            assert (REPO / ref).exists() or (readme.parent / ref).exists(), f"{readme.relative_to(REPO)} names {ref}, which a clone lacks"


def test_the_sample_readme_tables_say_what_the_advisor_says_now():
    """sample_runs/resnet18_cifar/README.md: the first finding of each GPU log, the CPU logs'
    step, DataLoader share and throughput, as the advisor gives them for the shipped runs."""
    import json

    import advisor as api

    text = (SAMPLE_RUNS / "resnet18_cifar" / "README.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `(gpu_\w+)` \| [^|]* \| `([\w-]+)`([^|]*)\|", text, re.M)
    assert {r[0] for r in rows} == {p.name for p in RUNS.glob("gpu_*")}
    for run, rule, rest in rows:
        a = api.analyze(RUNS / run)
        assert a.findings["rule"].iloc[0] == rule, (run, list(a.findings["rule"]))
        if run == "gpu_baseline":  # "54 ms of a 79 ms mean step"
            loader = float(a.breakdown.set_index("category").loc["dataloader", "ms_per_step"])
            assert f"{loader:.0f} ms of a {a.steps['duration_ms'].mean():.0f} ms mean step" in rest
    cpu = re.findall(r"^\| `(cpu_\w+)` \([^)]*\) \| (\d+) ms \| (\d+) % \((\d+) ms\) \| (\d+) samples/s \|", text, re.M)
    assert {r[0] for r in cpu} == {"cpu_baseline", "cpu_workers"}
    for run, step, share, loader_ms, rate in cpu:
        a = api.analyze(RUNS / run)
        mean = float(a.steps["duration_ms"].mean())
        loader = float(a.breakdown.set_index("category").loc["dataloader", "ms_per_step"])
        batch = json.loads((RUNS / run / "advisor_facts.json").read_text())["dataloaders"][0]["batch_size"]
        assert (int(step), int(loader_ms), int(rate)) == (round(mean), round(loader), round(batch / mean * 1000)), run
        assert int(share) == round(100 * loader / mean), run


def test_a_folder_of_sample_runs_reports_the_one_recorded_last_whatever_the_checkout_did(tmp_path):
    """`advisor report sample_runs/resnet18_cifar`: ten runs, which a clone checks out at one
    time; the report is of the run whose trace names the latest recording time (derived here
    from the names), even when modification times say the opposite, and says how it chose."""
    import json
    import shutil

    folder = tmp_path / "resnet18_cifar"
    shutil.copytree(SAMPLE_RUNS / "resnet18_cifar", folder)
    recorded = {}
    for trace in folder.glob("runs/*/*.pt.trace.json.gz"):
        recorded[trace.parent.name] = int(trace.name.split(".")[1])
    assert len(recorded) >= 10
    newest = max(recorded, key=recorded.get)
    for i, run in enumerate(sorted(recorded, key=recorded.get, reverse=True)):  # newest recording, oldest file
        for f in (folder / "runs" / run).iterdir():
            os.utime(f, (1_600_000_000 + i * 1000, 1_600_000_000 + i * 1000))
    r = advisor(["report", str(folder), "-f", "json"], tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["run"] == f"runs/{newest}"
    assert any(f"reporting 'runs/{newest}' (the newest, by the time in its trace file names)" in n for n in doc["notes"])


def test_whatif_offers_the_closest_rule_for_a_misspelt_apply(tmp_path):
    r = advisor(["whatif", str(RUNS / "cpu_baseline"), "--apply", "dataloader-stal"], tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "unknown rule 'dataloader-stal' in --apply (did you mean 'dataloader-stall'?)" in r.stderr


def _sample_labels() -> list:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    from conftest import REPO

    labels = tomllib.loads((REPO / "tests" / "data" / "labels" / "sample_runs.toml").read_text(encoding="utf-8"))["run"]
    return [pytest.param(label, id=label["name"], marks=[pytest.mark.xfail(strict=True, reason=SAMPLE_MISSES[label["name"]])] if label["name"] in SAMPLE_MISSES else []) for label in labels]


# Sample runs whose first ranked finding is not their label's first fix, with what the advisor ranks.
SAMPLE_MISSES: dict[str, str] = {
    "gpu_workers": "h2d-pageable-copy ranks first (each batch copied from pageable memory), launch-bound second",
    "gpu_cudagraphs": "dataloader-stall ranks first: after the window the steps waited for their batches; h2d-copy-volume second",
    "gpu_walk_final": "epoch-end is ranked: an epoch is 20 steps, and each new one restarts the workers",
}


@pytest.mark.parametrize("label", _sample_labels())
def test_each_sample_gpu_run_gets_its_labelled_first_fix(label):
    """tests/data/labels/sample_runs.toml: the first fix of each sample GPU run, written from
    what the run did, never from the report (the README's table says what the advisor says)."""
    import advisor as api

    ranked = list(api.analyze(RUNS / label["name"]).findings["rule"])
    if label["first_fix"]:
        assert ranked and ranked[0] in label["first_fix"], (label["first_fix"], ranked)
    else:
        assert not ranked, (label["no_fix_reason"], ranked)
