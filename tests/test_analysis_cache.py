"""The analysis cache: a second report of an unchanged run comes from it, byte for byte the
report the full path writes (checked against `ADVISOR_CACHE=off` on real traces), and any
change that could change the answer (a rule option, the trace file, a facts file) misses it.

A hit is proved by making the loader fail: a report that loads frames cannot come back.
"""

from __future__ import annotations

import math
import os
import re
import shutil
from pathlib import Path

import numpy as np
import orjson
import pytest
from conftest import count_calls, shared_trace

from advisor import analysis
from advisor import cache as analysis_cache
from advisor.cache import Unstorable, from_plain, to_plain

REPORTS = (["-f", "json"], ["-v"], ["-f", "markdown", "-v"])


@pytest.fixture(autouse=True)
def private_cache(tmp_path_factory, monkeypatch):
    """Entries go beside the copied runs or to a temporary user cache; every analysis is stored."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))
    monkeypatch.delenv("ADVISOR_CACHE", raising=False)
    monkeypatch.setattr(analysis_cache, "MIN_ANALYSIS_SECONDS", 0.0)


@pytest.fixture
def loads(monkeypatch):
    """How many times frames were loaded; `loads.forbid()` makes loading fail (only a hit passes)."""
    return count_calls(monkeypatch, analysis, "analyze_ranks", "frames loaded: the analysis cache was missed")


def copy_run(name: str, tmp_path: Path) -> Path:
    run = tmp_path / name
    # The traces alone: a vendored folder may hold cache entries of earlier reports.
    shutil.copytree(shared_trace(name), run, copy_function=shutil.copyfile, ignore=shutil.ignore_patterns(".advisor-cache"))
    run.chmod(0o755)  # the shared folder is read-only; the copy must not be
    return run


def entries(run: Path) -> list[Path]:
    """The analysis entries in the (temporary) user cache folder, where they go by default."""
    return sorted((Path(os.environ["XDG_CACHE_HOME"]) / "torch-advisor").glob("analysis-*"))


@pytest.mark.parametrize("name", ["v100_resnet50_nw0", "a100_two_ranks"])
def test_second_report_from_the_cache_is_byte_identical(name, tmp_path, cli, loads):
    run = copy_run(name, tmp_path)
    for args in REPORTS:
        loads.forbid(False)
        first = cli(["report", *args, str(run)], tmp_path)
        loads.forbid()
        second = cli(["report", *args, str(run)], tmp_path)
        loads.forbid(False)
        off = cli(["report", *args, str(run)], tmp_path, {"ADVISOR_CACHE": "off"})
        assert first[0] == second[0] == off[0] == 0, (first[2], second[2], off[2])
        assert second[1] == off[1] and first[1] == off[1], args
    assert len(entries(run)) == 1 and not (run / ".advisor-cache").exists(), "nothing beside the user's traces"
    assert not list(entries(run)[0].glob("*.pkl")) and not list(entries(run)[0].glob("*.pickle"))
    # gate reads the same entry; its verdict is the full path's
    gate = ["gate", str(run), "--max-step-time-ms", "1", "--max-severity", "low"]
    loads.forbid()
    cached = cli(gate, tmp_path)
    loads.forbid(False)
    assert cached == cli(gate, tmp_path, {"ADVISOR_CACHE": "off"})
    assert cached[0] == 1


def test_changes_that_change_the_answer_miss_the_cache(tmp_path, cli, loads):
    run = copy_run("v100_resnet50_nw0", tmp_path)
    work = tmp_path / "project"
    work.mkdir()
    report = ["report", "-f", "json", str(run)]

    def fresh_report() -> str:
        before = loads.n
        code, out, err = cli(report, work)
        assert code == 0, err
        assert loads.n == before + 1, "the cache was not invalidated"
        loads.forbid()
        assert cli(report, work)[1] == out, "the new answer was not stored"
        loads.forbid(False)
        return out

    base = orjson.loads(fresh_report())
    assert any(f["rule"] == "dataloader-stall" for f in base["findings"])
    # a rule option in the config found from the working directory
    (work / "advisor.toml").write_text('[rules.dataloader-stall]\nmin_share = 0.99\n')
    tuned = orjson.loads(fresh_report())
    assert not any(f["rule"] == "dataloader-stall" for f in tuned["findings"])
    (work / "advisor.toml").unlink()
    loads.forbid()  # the first answer's entry is still there (an entry per key, kept under the cap)
    assert orjson.loads(cli(report, work)[1]) == base
    loads.forbid(False)
    # the trace touched (same bytes, new mtime): the key is the bytes, so still a hit
    trace = next(run.glob("*.json.gz"))
    st = trace.stat()
    os.utime(trace, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    loads.forbid()
    assert orjson.loads(cli(report, work)[1]) == base
    loads.forbid(False)
    # the same events, other bytes (gzip level 9), with the old size and mtime put back: a miss
    import gzip

    data = gzip.decompress(trace.read_bytes())
    trace.write_bytes(gzip.compress(data, compresslevel=9))
    os.utime(trace, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert orjson.loads(fresh_report()) == base
    # a facts file appears
    (run / "advisor_facts.json").write_bytes(orjson.dumps({"schema": "advisor/facts/v1", "dataloaders": [{"batch_size": 32}]}))
    fresh_report()
    # --select is part of the key
    code, out, _ = cli([*report[:-1], "--select", "gpu-idle", str(run)], work)
    assert code == 0 and loads.n == 5
    assert len(entries(run)) == 5, "an entry per answer: two option sets, other bytes, a facts file, --select"


def test_a_damaged_entry_falls_back_to_the_full_path(tmp_path, cli, loads):
    run = copy_run("v100_resnet50_nw0", tmp_path)
    report = ["report", "-f", "json", str(run)]
    good = cli(report, tmp_path)[1]
    entry = entries(run)[0]
    for damage in ("0.steps.parquet", "analysis.json"):
        (entry / damage).write_bytes(b"PAR1 broken")
        before = loads.n
        code, out, err = cli(report, tmp_path)
        assert (code, out) == (0, good), err
        assert loads.n == before + 1
        entry = entries(run)[0]  # rewritten whole


def test_a_forged_replay_summary_is_a_miss(tmp_path, cli, loads):
    # The fuzz harness's finds: a summary whose step with every fix is a list, negative, or
    # longer than the replayed step is not what the replay makes; the report is made again.
    run = copy_run("v100_resnet50_nw0", tmp_path)
    report = ["report", "-f", "json", str(run)]
    good = cli(report, tmp_path)[1]
    meta = entries(run)[0] / "analysis.json"
    original = orjson.loads(meta.read_bytes())
    assert original["whatif"][0]["all_fixes_ms"] is not None
    for forged in ([], -1, original["whatif"][0]["baseline_ms"] * 2):
        doc = orjson.loads(meta.read_bytes())
        doc["whatif"][0]["all_fixes_ms"] = forged
        meta.write_bytes(orjson.dumps(doc))
        before = loads.n
        code, out, err = cli(report, tmp_path)
        assert (code, out) == (0, good), err
        assert loads.n == before + 1, forged
        meta = entries(run)[0] / "analysis.json"


def copy_trace(trace: str, tmp_path: Path, folder: str) -> Path:
    """A run folder holding a copy of one shared trace file."""
    run = tmp_path / folder
    run.mkdir(parents=True)
    shutil.copyfile(shared_trace(trace), run / Path(trace).name)
    return run


def test_a_forged_entry_is_never_served(tmp_path, cli, loads):
    """An entry's seal binds it to the traces' bytes and this installation's secret: a finding's
    message or saving edited inside it, or another run's entry put under this run's key, gives
    the report made afresh, not the forged one."""
    run = copy_run("v100_resnet50_nw0", tmp_path)
    report = ["report", "-f", "json", str(run)]
    good = cli(report, tmp_path)[1]
    entry = entries(run)[0]
    original = (entry / "analysis.json").read_bytes()
    doc = orjson.loads(original)
    assert doc["findings"] and any(f["saving_ms"] for f in doc["findings"])

    def forged_and_missed(edit) -> None:
        d = orjson.loads(original)
        edit(d)
        (entry / "analysis.json").write_bytes(orjson.dumps(d))
        before = loads.n
        code, out, err = cli(report, tmp_path)
        assert (code, out) == (0, good), err
        assert loads.n == before + 1, "the forged entry was served"
        assert "FORGED" not in out

    forged_and_missed(lambda d: d["findings"][0].update(message="FORGED: buy a bigger GPU"))
    forged_and_missed(lambda d: d["findings"][0].update(saving_ms=d["findings"][0]["saving_ms"] / 2 + 0.5))
    forged_and_missed(lambda d: d["warnings"].append("FORGED warning"))
    # another run's entry (its own files and seal) put under this run's key
    other = copy_trace("misc/a100_alexnet.json.gz", tmp_path, "other")
    assert cli(["report", "-f", "json", str(other)], tmp_path)[0] == 0
    (foreign,) = [e for e in entries(run) if e != entry]
    for p in entry.iterdir():
        p.unlink()
    for p in foreign.iterdir():
        shutil.copyfile(p, entry / p.name)
    before = loads.n
    code, out, err = cli(report, tmp_path)
    assert (code, out) == (0, good), err
    assert loads.n == before + 1, "another run's entry was served"
    # ... and with its seal rewritten to name this run's key (without the secret, the MAC cannot follow)
    seal = orjson.loads((foreign / "seal.json").read_bytes())
    seal["key"] = orjson.loads((entry / "seal.json").read_bytes())["key"]
    for p in foreign.iterdir():
        shutil.copyfile(p, entry / p.name)
    (entry / "seal.json").write_bytes(orjson.dumps(seal))
    before = loads.n
    code, out, err = cli(report, tmp_path)
    assert (code, out) == (0, good), err
    assert loads.n == before + 1
    # sealed with another installation's secret: a miss too
    from advisor.cache import seal as seal_entry

    d = orjson.loads(original)
    d["findings"][0]["message"] = "forged elsewhere"
    (entry / "analysis.json").write_bytes(orjson.dumps(d))
    seal_entry(entry, "analysis", orjson.loads((entry / "seal.json").read_bytes())["key"], key=os.urandom(32))
    before = loads.n
    assert cli(report, tmp_path)[1] == good and loads.n == before + 1


def test_two_copies_of_a_trace_share_one_entry(tmp_path, cli, loads):
    first = copy_trace("misc/a100_alexnet.json.gz", tmp_path, "a/run")
    second = copy_trace("misc/a100_alexnet.json.gz", tmp_path, "b/run")
    report = ["report", "-f", "json"]
    assert cli([*report, str(first)], tmp_path)[0] == 0
    loads.forbid()
    code, out, err = cli([*report, str(second)], tmp_path)
    loads.forbid(False)
    assert code == 0, err
    assert orjson.loads(out)["files"] == [str(second / "a100_alexnet.json.gz")], "the report names the copy it read"
    assert out == cli([*report, str(second)], tmp_path, {"ADVISOR_CACHE": "off"})[1]
    assert len(entries(first)) == 1


def test_the_secret_is_private_and_one_others_can_read_is_not_used(tmp_path, cli, loads):
    run = copy_trace("misc/a100_alexnet.json.gz", tmp_path, "run")
    report = ["report", "-f", "json", str(run)]
    good = cli(report, tmp_path)[1]
    key = Path(os.environ["XDG_CACHE_HOME"]) / "torch-advisor" / "secret.key"
    assert key.stat().st_mode & 0o777 == 0o600 and key.stat().st_size == 32
    key.chmod(0o644)
    before = loads.n
    assert cli(report, tmp_path)[1] == good and loads.n == before + 1, "an entry sealed with a readable secret was served"
    key.chmod(0o600)
    loads.forbid()
    assert cli(report, tmp_path)[1] == good


def test_the_cache_keeps_under_its_cap_least_recently_used_first(tmp_path, cli, loads, monkeypatch):
    runs = [copy_trace(t, tmp_path, f"run{i}") for i, t in enumerate(["misc/a100_alexnet.json.gz", "misc/amd_mi250_minitoy.json.gz", "misc/a100_triton.json.gz"])]
    for run in runs[:2]:
        assert cli(["report", "-f", "json", str(run)], tmp_path)[0] == 0
    sizes = {e.path: e.bytes for e in analysis_cache.entries(Path(os.environ["XDG_CACHE_HOME"]) / "torch-advisor")}
    assert len(sizes) == 2
    # run0 read again (a hit marks it used); a third entry over a cap of two entries evicts run1, the least recently used
    loads.forbid()
    assert cli(["report", "-f", "json", str(runs[0])], tmp_path)[0] == 0
    loads.forbid(False)
    monkeypatch.setenv("ADVISOR_CACHE_MAX_BYTES", str(int(sum(sizes.values()) + min(sizes.values()) * 0.5)))
    assert cli(["report", "-f", "json", str(runs[2])], tmp_path)[0] == 0
    loads.forbid()
    assert cli(["report", "-f", "json", str(runs[0])], tmp_path)[0] == 0
    loads.forbid(False)
    before = loads.n
    assert cli(["report", "-f", "json", str(runs[1])], tmp_path)[0] == 0
    assert loads.n == before + 1, "the least recently used entry was kept"


def test_cache_info_and_clear(tmp_path, cli, loads):
    run = copy_trace("misc/a100_alexnet.json.gz", tmp_path, "run")
    root = Path(os.environ["XDG_CACHE_HOME"]) / "torch-advisor"
    code, out, err = cli(["cache", "info"], tmp_path)
    assert code == 0, err
    assert f"cache: {root}\n" in out and "entries: 0 (0 frames, 0 analyses)" in out
    assert cli(["report", "-f", "json", str(run)], tmp_path)[0] == 0
    code, out, _ = cli(["cache", "info"], tmp_path)
    # the analysis is stored; the parsed frames too when parsing took half a second (a busy
    # machine's business, not this test's): counted apart, and in the total
    counts = re.search(r"entries: (\d+) \((\d+) frames, 1 analyses\)", out)
    assert counts and int(counts[1]) == int(counts[2]) + 1 and str(root / "secret.key") in out, out
    code, out, _ = cli(["cache", "clear"], tmp_path)
    n = int(counts[1])
    assert code == 0 and out.startswith(f"cache: {root}: removed {n} entr{'y' if n == 1 else 'ies'} ("), out
    assert not entries(run) and (root / "secret.key").is_file()
    before = loads.n
    assert cli(["report", "-f", "json", str(run)], tmp_path)[0] == 0 and loads.n == before + 1
    code, out, _ = cli(["cache", "info"], tmp_path, {"ADVISOR_CACHE": "off"})
    assert out == "cache: off (ADVISOR_CACHE=off): nothing is cached\n"


def test_cache_off_and_read_only_runs_write_nothing_beside_them(tmp_path, cli, loads):
    run = copy_run("v100_resnet50_nw0", tmp_path)
    assert cli(["report", "-f", "json", str(run)], tmp_path, {"ADVISOR_CACHE": "off"})[0] == 0
    assert not (run / ".advisor-cache").exists() and not entries(run)
    # beside only when asked
    assert cli(["report", "-f", "json", str(run)], tmp_path, {"ADVISOR_CACHE": "beside"})[0] == 0
    assert len(list((run / ".advisor-cache").glob("analysis-*"))) == 1 and not entries(run)
    shutil.rmtree(run / ".advisor-cache")
    run.chmod(0o555)
    try:
        assert cli(["report", "-f", "json", str(run)], tmp_path, {"ADVISOR_CACHE": "beside"})[0] == 0
        assert not (run / ".advisor-cache").exists()
        user = Path(os.environ["XDG_CACHE_HOME"]) / "torch-advisor"
        assert len(list(user.glob("analysis-*"))) == 1
        loads.forbid()
        assert cli(["report", "-f", "json", str(run)], tmp_path, {"ADVISOR_CACHE": "beside"})[0] == 0
    finally:
        run.chmod(0o755)


def test_html_reads_the_cached_analysis_and_no_trace(tmp_path, cli, monkeypatch):
    # The HTML report's timeline, memory and top ops come with the analysis (its stored view):
    # after a JSON report, the HTML report is made from the cached analysis, no trace loaded,
    # and it is the page a cold run writes.
    import advisor.load.trace as trace_module

    run = copy_run("v100_resnet50_nw0", tmp_path)
    code, _, err = cli(["report", "-f", "html", "-o", str(tmp_path / "cold.html"), str(run)], tmp_path, env={"ADVISOR_CACHE": "off"})
    assert code == 0, err
    assert cli(["report", "-f", "json", str(run)], tmp_path)[0] == 0
    read = count_calls(monkeypatch, analysis, "read_analysis", "")
    loads = count_calls(monkeypatch, trace_module, "load_trace", "the HTML report loaded a trace the cached analysis holds")
    loads.forbid()
    code, _, err = cli(["report", "-f", "html", "-o", str(tmp_path / "r.html"), str(run)], tmp_path)
    assert code == 0, err
    assert read.n == 1
    assert (tmp_path / "r.html").read_text() == (tmp_path / "cold.html").read_text()


def test_values_come_back_with_their_types():
    value = {
        "nan": math.nan, "inf": -math.inf, "f": np.float64(0.1), "i": np.int64(3), "b": np.bool_(True),
        "t": (1, "a", (2.5,)), "by_step": {3: 1.5, 7: None}, TAG_DICT: 1, "l": [1, [2, {"x": None}]],
    }
    back = from_plain(orjson.loads(orjson.dumps(to_plain(value))))
    assert back.keys() == value.keys()
    assert math.isnan(back["nan"]) and back["inf"] == -math.inf
    assert back["t"] == (1, "a", (2.5,)) and isinstance(back["t"][2], tuple)
    assert back["by_step"] == {3: 1.5, 7: None} and back[TAG_DICT] == 1
    assert {k: v for k, v in back.items() if k not in ("nan",)} == {k: v for k, v in value.items() if k not in ("nan",)}
    for odd in (np.arange(3), {1, 2}, np.float32(0.5), object()):
        with pytest.raises(Unstorable):
            to_plain({"x": odd})


TAG_DICT = analysis_cache.TAG
