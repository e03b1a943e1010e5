"""The analysis cache: a second report of an unchanged run comes from it, byte for byte the
report the full path writes (checked against `ADVISOR_CACHE=off` on real traces), and any
change that could change the answer (a rule option, the trace file, a facts file) misses it.

A hit is proved by making the loader fail: a report that loads frames cannot come back.
"""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path

import numpy as np
import orjson
import pytest
from conftest import shared_trace

from advisor import analysis, analysis_cache
from advisor.analysis_cache import Unstorable, from_plain, to_plain

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

    class Counter:
        n = 0
        forbidden = False

        def forbid(self, on: bool = True) -> None:
            self.forbidden = on

    counter = Counter()
    real = analysis.analyze_ranks

    def counted(*args, **kwargs):
        assert not counter.forbidden, "frames loaded: the analysis cache was missed"
        counter.n += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(analysis, "analyze_ranks", counted)
    return counter


def copy_run(name: str, tmp_path: Path) -> Path:
    run = tmp_path / name
    # The traces alone: a vendored folder may hold cache entries of earlier reports.
    shutil.copytree(shared_trace(name), run, copy_function=shutil.copyfile, ignore=shutil.ignore_patterns(".advisor-cache"))
    run.chmod(0o755)  # the shared folder is read-only; the copy must not be
    return run


def entries(run: Path) -> list[Path]:
    """The analysis entries in the (temporary) user cache folder, where they go by default."""
    return sorted((Path(os.environ["XDG_CACHE_HOME"]) / "torch-advisor" / "analysis").glob("analysis-*"))


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
    assert orjson.loads(fresh_report()) == base
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
    assert code == 0 and loads.n >= 6
    assert len(entries(run)) == 1, "one entry per run, replaced"


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
        user = Path(os.environ["XDG_CACHE_HOME"]) / "torch-advisor" / "analysis"
        assert len(list(user.glob("analysis-*"))) == 1
        loads.forbid()
        assert cli(["report", "-f", "json", str(run)], tmp_path, {"ADVISOR_CACHE": "beside"})[0] == 0
    finally:
        run.chmod(0o755)


def test_html_never_reads_the_cache(tmp_path, cli, monkeypatch):
    run = copy_run("v100_resnet50_nw0", tmp_path)
    assert cli(["report", "-f", "json", str(run)], tmp_path)[0] == 0

    def no(*_a, **_k):
        raise AssertionError("the HTML report needs frames, not a cached analysis")

    monkeypatch.setattr(analysis, "read_analysis", no)
    code, _, err = cli(["report", "-f", "html", "-o", str(tmp_path / "r.html"), str(run)], tmp_path)
    assert code == 0, err


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
