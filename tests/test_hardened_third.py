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

import advisor.cluster as cluster

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


# --- 6. files that are not files -----------------------------------------------------------------
@pytest.fixture
def within():
    """within(seconds, fn, *args): fn's result, or the test fails when it has not returned by then (a hang)."""
    import signal

    def run(seconds, fn, *args, **kwargs):
        def late(signum, frame):
            raise TimeoutError(f"still running after {seconds} s: a hang")

        old = signal.signal(signal.SIGALRM, late)
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            return fn(*args, **kwargs)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)

    return run


def _peak_rss() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "sparse"])
def test_a_facts_file_that_is_not_a_file_is_a_warning_not_a_hang(cli, tmp_path, within, kind):
    """The reproducers: an advisor_facts.json that is a FIFO hung the report; one linked to
    /dev/zero read 3.46 GB, then "internal error: MemoryError" (exit 70). Now the facts file is
    ignored with a warning naming it and what it is, and the report goes on (exit 0)."""
    log = _log_dir(tmp_path)
    facts = log / "advisor_facts.json"
    facts.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(facts)
    elif kind == "dev-zero":
        facts.symlink_to("/dev/zero")
    else:
        with open(facts, "wb") as f:
            f.truncate(6 * 2**30)  # 6 GB of nothing, on disk as a few blocks
    before = _peak_rss()
    for env in ({"ADVISOR_CACHE": "off"}, {"ADVISOR_CACHE": str(tmp_path / "cache")}):
        code, out, err = within(60, cli, ["report", str(log), "-f", "json"], env=env)
        assert code == 0, err
        warnings = [w for w in json.loads(out)["warnings"] if "advisor_facts.json" in w]
        assert len(warnings) == 1 and ("not a regular file" in warnings[0] or "too large" in warnings[0]), warnings
    assert _peak_rss() - before < 2**30, "nothing of the size of the file was read"


def test_advisor_fix_scanning_its_runs_skips_facts_that_are_not_files(tmp_path, within):
    """`advisor fix` looks for the script's last profile in advisor_runs/: a FIFO or a /dev/zero
    link there as a run's facts file is skipped, and the real run beside them is found."""
    from advisor.cli.fix import last_profile

    script = tmp_path / "train.py"
    script.write_text("print('train')\n")
    runs = tmp_path / "advisor_runs"
    for name, make in (("train-1", os.mkfifo), ("train-2", lambda p: p.symlink_to("/dev/zero"))):
        (runs / name).mkdir(parents=True)
        make(runs / name / "advisor_facts.json")
        (runs / name / "x.pt.trace.json").write_text("{}")
    assert within(20, last_profile, script, runs_dir=runs) is None
    good = runs / "train-3"
    good.mkdir()
    (good / "advisor_facts.json").write_text(json.dumps({"schema": "advisor/facts/v1", "script": str(script), "argv": [str(script)]}))
    (good / "x.pt.trace.json").write_text("{}")
    assert within(20, last_profile, script, runs_dir=runs) == good


@pytest.mark.parametrize("name", ["secret.key", "seal.json", "digest"])
def test_a_fifo_in_the_cache_never_hangs_a_report(cli, tmp_path, within, name):
    """The reproducer: a FIFO `secret.key` or `seal.json` in the cache hung every report. Each is
    read as a miss now (or as no secret): the report is made again."""
    cache = tmp_path / "cache"
    env = {"ADVISOR_CACHE": str(cache)}
    code, first, err = cli(["report", str(CPU_RUN), "-f", "json"], env=env)
    assert code == 0, err
    home = Path(os.environ["XDG_CACHE_HOME"]) / "torch-advisor"  # the secret and the remembered hashes live there
    if name == "secret.key":
        targets = [home / "secret.key"]
    elif name == "seal.json":
        targets = [p / "seal.json" for p in cache.iterdir() if p.is_dir() and (p / "seal.json").is_file()]
    else:
        targets = list((home / "digests").iterdir())
    assert targets
    for t in targets:
        t.unlink()
        os.mkfifo(t)
    for args in (["report", str(CPU_RUN), "-f", "json"], ["cache", "info"], ["cache", "clear"]):
        code, out, err = within(60, cli, args, env=env)
        assert code == 0, err
        if args[0] == "report":
            assert json.loads(out)["findings"] == json.loads(first)["findings"]
    assert all(t.exists() for t in targets), "a FIFO the advisor did not make is not removed"


def test_a_sparse_plain_trace_larger_than_half_the_memory_is_refused_before_it_is_read(tmp_path):
    """The reproducer: a sparse 6 GB plain trace (`truncate -s 6G`) reached 6.4 GB resident
    before exit 2 (plain files were capped at 16 GiB only). A plain trace larger than half the
    memory available is refused in one line before a byte of it is read (here the available
    memory is made 2 GiB, so the 6 GB file is over it on any machine)."""
    import subprocess
    import sys

    from conftest import REPO

    trace = tmp_path / "big.pt.trace.json"
    with open(trace, "wb") as f:
        f.truncate(6 * 2**30)
    probe = (
        "import resource, sys\n"
        "import advisor.load.decode as d\n"
        "d._available_memory = lambda: 2 * 2**30\n"
        "from advisor.cli import main\n"
        "sys.argv = ['advisor', 'report', sys.argv[1]]\n"
        "try:\n    main()\nexcept SystemExit as e:\n    code = e.code\n"
        # VmHWM is this process's own peak (ru_maxrss keeps the forking test worker's across exec)
        "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM:')]\n"
        "print(code, int(hwm[0].split()[1]) * 1024 if hwm else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "ADVISOR_CACHE": "off"}
    p = subprocess.run([sys.executable, "-c", probe, str(trace)], capture_output=True, text=True, env=env, timeout=120)
    code, rss = p.stdout.split()
    assert code == "2", p.stderr
    [line] = p.stderr.strip().splitlines()
    assert str(trace) in line and "more than half the memory available" in line and "ADVISOR_MAX_TRACE_BYTES" in line, line
    assert int(rss) < 1024 * 2**20, f"peak RSS {int(rss) / 2**20:.0f} MiB: the file was read"


# --- 7. numbers from broken traces, and where the report goes --------------------------------------
def test_report_dash_o_dash_writes_stdout_not_a_file_named_dash(cli, tmp_path):
    """The reproducer: `report -o -` wrote a file named `-`. It is stdout, as without -o, in every format."""
    code, plain, err = cli(["report", str(CPU_RUN), "-f", "json"], cwd=tmp_path, env={"ADVISOR_CACHE": "off"})
    assert code == 0, err
    for fmt in ("json", "md", "text", "html"):
        code, out, err = cli(["report", str(CPU_RUN), "-f", fmt, "-o", "-"], cwd=tmp_path, env={"ADVISOR_CACHE": "off"})
        assert code == 0, err
        assert not (tmp_path / "-").exists() and not list(tmp_path.iterdir()), list(tmp_path.iterdir())
        if fmt == "json":
            assert out == plain
        elif fmt == "html":
            assert out.lstrip().lower().startswith("<!doctype html")
        else:
            assert "dataloader-stall" in out


def test_a_loading_bound_cpu_run_is_never_promised_a_step_below_its_loading(tmp_path):
    """The reproducer: a loading-bound CPU script (2 cores, 2 compute threads, num_workers=0)
    read "a step of 37.9 to 37.9 ms ... ~34.5 ms" and was promised a step shorter than the
    loading that remains. Built from this project's 2-thread recording with 300 ms inserted
    into each DataLoader span: the one worker the fix adds still loads every batch, so the
    replayed step is at least the loading, and the message states one step time, not a range
    of one number, and no step time that the replayed saving then overwrites."""
    import re
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from trace_edit import events, insert_time, load_events, write_trace

    from advisor.analysis import analyze
    from advisor.config import Config

    src = SAMPLE_RUNS / "resnet18_cifar" / "runs" / "cpu_two_threads"
    (tmp_path / "advisor_facts.json").write_bytes((src / "advisor_facts.json").read_bytes())
    doc = load_events(next(src.glob("*.pt.trace.json.gz")))
    spans = sorted((e for e in events(doc) if "DataLoader" in str(e.get("name", "")) and e.get("ph") == "X"), key=lambda e: e["ts"])
    assert spans
    for e in reversed(spans):
        insert_time(doc, e["ts"] + e["dur"] / 2, 300_000.0)
    write_trace(doc, tmp_path / "loading.pt.trace.json.gz")
    a = analyze(tmp_path, config=Config(), cache=False)
    f = next(f for f in [*a.findings, *a.considered] if f.rule == "dataloader-stall")
    assert f.evidence["cores"]["free_cores"] == 0
    loading = float(re.search(r"beside the ([\d.]+) ms of loading", f.message).group(1))
    assert loading > 300 * 0.9  # the inserted time is loading
    assert not re.search(r"a step of ([\d.]+) to \1 ms", f.message), f.message
    assert f"a step of {loading:.1f} ms" in f.message, f.message
    w = a.whatif[0]
    scale = w.baseline_ms / w.measured_ms  # the replay's units
    alone = f.saving_alone_ms if f.saving_alone_ms is not None else f.saving_ms
    assert w.baseline_ms - alone >= loading * scale * 0.98, (w.baseline_ms, alone, loading, scale)


GPU_RUN = SAMPLE_RUNS / "resnet18_cifar" / "runs" / "gpu_baseline"  # this project's H100 recording


def _edited_gpu_run(tmp_path: Path, name: str, edit, as_json_text: bool = False) -> Path:
    """GPU_RUN's trace with `edit(doc)` applied, alone in a folder (its facts file left out)."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from trace_edit import load_events, write_trace

    doc = load_events(next(GPU_RUN.glob("*.pt.trace.json*")))
    edit(doc)
    folder = tmp_path / name
    folder.mkdir()
    if as_json_text:  # Python's json writes NaN and Infinity, as a broken exporter might
        (folder / "t.pt.trace.json").write_text(json.dumps(doc))
    else:
        write_trace(doc, folder / "t.pt.trace.json")
    return folder


def _report(cli, folder: Path) -> dict:
    code, out, err = cli(["report", str(folder), "-f", "json"], env={"ADVISOR_CACHE": "off"})
    assert code == 0, err
    return json.loads(out)


def _kernels(doc) -> list[dict]:
    return [e for e in doc["traceEvents"] if e.get("cat") == "kernel" and e.get("ph") == "X"]


def test_correlation_ids_that_are_all_one_never_merge_the_steps(cli, tmp_path):
    """The reproducer: every correlation id set to 1 made 8 steps of 9.9 ms one of 75.04 ms
    (every kernel was charged to the first launch). The ids are dropped with a warning and the
    steps are those of the recording: as many, as long (within 1%)."""
    def all_one(doc):
        for e in doc["traceEvents"]:
            if isinstance(e.get("args"), dict) and "correlation" in e["args"]:
                e["args"]["correlation"] = 1

    clean = _report(cli, _edited_gpu_run(tmp_path, "clean", lambda doc: None))
    ones = _report(cli, _edited_gpu_run(tmp_path, "ones", all_one))
    assert ones["summary"]["steps"] == clean["summary"]["steps"] >= 2
    a, b = ones["summary"]["step_time_ms"]["mean"], clean["summary"]["step_time_ms"]["mean"]
    assert abs(a - b) <= 0.01 * b, (a, b)
    assert sum("correlation ids are not unique" in w for w in ones["warnings"]) == 1, ones["warnings"]
    assert not any("correlation" in w for w in clean["warnings"])


@pytest.mark.parametrize(
    "field, value",
    [("ts", -1.0), ("ts", float("nan")), ("ts", 1e20), ("dur", -5.0), ("dur", float("nan")), ("dur", 1e20)],
)
def test_kernels_with_impossible_times_are_left_out_with_a_warning_that_counts_them(cli, tmp_path, field, value):
    """The reproducer: a kernel with a negative, NaN or 1e20 ts or dur was dropped silently (GPU
    utilisation 50.5% -> 44.2%, no warning). Five such kernels: the report is that of the
    trace without them, and one warning says 5 events were left out."""
    picked = []

    def broken(doc):
        ks = _kernels(doc)
        for e in ks[10:15]:
            e[field] = value
            picked.append((e["ts"], e["name"]))

    def removed(doc):
        ks = _kernels(doc)[10:15]
        doc["traceEvents"] = [e for e in doc["traceEvents"] if not any(e is k for k in ks)]

    bad = _report(cli, _edited_gpu_run(tmp_path, "bad", broken, as_json_text=True))
    gone = _report(cli, _edited_gpu_run(tmp_path, "gone", removed))
    assert len(picked) == 5
    assert bad["summary"] == gone["summary"] and [f["rule"] for f in bad["findings"]] == [f["rule"] for f in gone["findings"]]
    said = [w for w in bad["warnings"] if "left out 5 event(s)" in w]
    assert len(said) == 1, bad["warnings"]


def test_a_copy_faster_than_any_link_is_not_reported_as_measured(cli, tmp_path):
    """The reproducer: a 2^52-byte copy in 1 µs was reported as measured (4.5 PB/s). Its bytes
    read as unknown, with a warning; the report is that of the trace whose copy has no byte count."""
    def huge(doc):
        c = next(e for e in doc["traceEvents"] if e.get("cat") == "gpu_memcpy" and "HtoD" in e.get("name", ""))
        c["args"]["bytes"], c["dur"] = 2**52, 1.0

    def unknown(doc):
        c = next(e for e in doc["traceEvents"] if e.get("cat") == "gpu_memcpy" and "HtoD" in e.get("name", ""))
        del c["args"]["bytes"]
        c["dur"] = 1.0

    bad = _report(cli, _edited_gpu_run(tmp_path, "huge", huge))
    base = _report(cli, _edited_gpu_run(tmp_path, "unknown", unknown))
    assert bad["summary"] == base["summary"]
    assert sum("move more bytes than any link can" in w and w.split(": ", 1)[1].startswith("1 copy") for w in bad["warnings"]) == 1, bad["warnings"]
    assert "4503599627370496" not in json.dumps(bad)


def test_a_peak_larger_than_the_device_is_not_reported_as_measured(cli, tmp_path):
    """The reproducer: a 5 TB peak on an 80 GB device was reported as the run's peak memory.
    Memory figures larger than the device (its totalGlobalMem in the trace) read as unknown, with
    one warning; the peak is the largest possible one recorded."""
    def memory_events(doc):
        return [e for e in doc["traceEvents"] if e.get("name") == "[memory]" and isinstance(e.get("args"), dict) and e["args"].get("Device Type") == 1]

    def five_tb(doc):
        memory_events(doc)[len(memory_events(doc)) // 2]["args"]["Total Allocated"] = 5 * 10**12

    clean_doc = {}

    def keep(doc):
        clean_doc.update(doc)

    clean = _report(cli, _edited_gpu_run(tmp_path, "clean", keep))
    bad = _report(cli, _edited_gpu_run(tmp_path, "five_tb", five_tb))
    device_memory = clean_doc["deviceProperties"][0]["totalGlobalMem"]
    expected = max(e["args"]["Total Allocated"] for e in memory_events(clean_doc))  # from the raw events
    assert 0 < expected < device_memory
    assert clean["summary"]["peak_memory_bytes"] == expected
    assert bad["summary"]["peak_memory_bytes"] == expected, bad["summary"]["peak_memory_bytes"]
    assert sum("larger than the device's own memory" in w and "impossible" in w for w in bad["warnings"]) == 1, bad["warnings"]


def test_a_sparse_trace_is_refused_whatever_the_memory(cli, tmp_path):
    """The same 6 GB of holes where half the memory would hold it: refused as a sparse file, in
    one line, without reading it (no profiler writes a file that is mostly holes)."""
    trace = tmp_path / "big.pt.trace.json"
    with open(trace, "wb") as f:
        f.truncate(6 * 2**30)
    if os.stat(trace).st_blocks * 512 * 256 >= os.stat(trace).st_size:
        pytest.skip("this file system does not keep holes")
    before = _peak_rss()
    code, out, err = cli(["report", str(trace)], env={"ADVISOR_CACHE": "off"})
    assert code == 2, out + err
    [line] = err.strip().splitlines()
    assert str(trace) in line and ("sparse file" in line or "half the memory" in line), line
    assert _peak_rss() - before < 2**30


def test_a_folder_left_half_written_by_the_advisor_is_still_its_own_to_remove(cli, tmp_path):
    """A run that died while writing an entry leaves `.analysis-<digest>.tmp-<pid>-<random>`
    with its marker (an HMAC under the secret): `cache clear` removes it; the same folder with
    a marker the secret did not make, or none, stays."""
    import advisor.cache as store

    cache = tmp_path / "cache"
    env = {"ADVISOR_CACHE": str(cache)}
    code, _, err = cli(["report", str(CPU_RUN), "-f", "json"], env=env)
    assert code == 0, err
    key = store.secret()
    assert key is not None
    ours, forged, bare = (cache / f".analysis-{c * 40}.tmp-1-00000000" for c in "abc")
    for folder, mark in ((ours, store._making_mark(key)), (forged, "0" * 64), (bare, None)):
        folder.mkdir()
        (folder / "analysis.json").write_text("{}")
        if mark is not None:
            (folder / store.MAKING_FILE).write_text(mark)
    assert not any(p.name == store.MAKING_FILE for e in cache.iterdir() if not e.name.startswith(".") for p in e.iterdir())
    code, _, err = cli(["cache", "clear"], env=env)
    assert code == 0, err
    assert not ours.exists() and forged.is_dir() and bare.is_dir()
