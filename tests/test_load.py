"""The trace loader on the real traces in ../shared/traces.

What is checked against what: frame sizes against a plain `json` count of the raw events (an
independent reading of the same file), copy sizes and bandwidths against MANIFEST.md, bad
input through the real CLI entry point (one line, exit 2, no traceback), the Parquet cache
and the parallel loader against a fresh parse.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import pytest
from conftest import REPO, SHARED_TRACES, shared_trace, single_file

from advisor import cache as frame_cache
from advisor.load import decode
from advisor.load.decode import read_trace_bytes
from advisor.load.discover import find_run
from advisor.ranks import load_frames
from advisor.load.trace import frames_from_bytes, load_trace

FRAMES = ("host", "runtime", "device", "memory", "steps", "device_properties", "syncs")
HOST = {"cpu_op", "operator", "user_annotation", "python_function", "python"}
RUNTIME = {"cuda_runtime", "runtime", "cuda_driver", "mtia_runtime"}
DEVICE = {"kernel", "gpu_memcpy", "memcpy", "gpu_memset", "memset", "mtia_ccp_events"}
MTIA_BOOKKEEPING = ("event_wait", "event_record", "synchronize")


def all_trace_files() -> list[Path]:
    if not SHARED_TRACES.is_dir():
        return []
    return sorted(p for p in SHARED_TRACES.rglob("*.json.gz") if ".advisor-cache" not in p.parts)


def own_trace_files() -> list[Path]:
    """This project's own recordings (sample_runs/, tests/data/): checked with or without ../shared."""
    roots = (REPO / "sample_runs", REPO / "tests" / "data")
    return sorted(p for root in roots for p in root.rglob("*.pt.trace.json.gz"))


TRACE_FILES = all_trace_files()
needs_traces = pytest.mark.skipif(not TRACE_FILES, reason=f"public traces not available: {SHARED_TRACES} is absent")


@pytest.fixture(autouse=True)
def private_cache(tmp_path_factory, monkeypatch):
    """Cache entries of this file's tests go to a temporary user cache, never into ../shared."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))
    monkeypatch.delenv("ADVISOR_CACHE", raising=False)


def raw_events(path: Path) -> list[dict]:
    """The events as Python's own json module reads them (independent of the loader)."""
    doc = json.loads(gzip.decompress(path.read_bytes()))
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    return [e for e in events if isinstance(e, dict)]


def expected_counts(path: Path) -> dict[str, int]:
    counts = {"host": 0, "runtime": 0, "device": 0, "memory": 0}
    for e in raw_events(path):
        cat = str(e.get("cat", "")).lower()
        timed = isinstance(e.get("ts"), (int, float)) and isinstance(e.get("dur"), (int, float)) and e["dur"] >= 0
        if e.get("name") == "[memory]":
            counts["memory"] += 1
        elif e.get("ph") != "X" or not timed:
            continue
        elif cat in HOST:
            counts["host"] += 1
        elif cat in RUNTIME:
            counts["runtime"] += 1
        elif cat in DEVICE and not (cat == "mtia_ccp_events" and str(e.get("name")).startswith(MTIA_BOOKKEEPING)):
            counts["device"] += 1
    return counts


def assert_same_frames(a, b) -> None:
    for name in FRAMES:
        x, y = getattr(a, name), getattr(b, name)
        if x is None or y is None:
            assert x is None and y is None, name
            continue
        pd.testing.assert_frame_equal(x, y, obj=name)
    assert (a.schema, a.base_us, a.window, a.distributed) == (b.schema, b.base_us, b.window, b.distributed)


# --- both schemas, every device kind ---------------------------------------------------------
@pytest.mark.parametrize("path", own_trace_files() + TRACE_FILES, ids=lambda p: p.name)
def test_frames_hold_every_profiler_event_of_the_file(path):
    frames = load_trace(path)
    expected = expected_counts(path)
    assert {k: len(getattr(frames, k)) for k in expected} == expected
    for name in ("host", "runtime", "device"):
        df = getattr(frames, name)
        assert df["ts"].dtype == np.int64 and df["dur"].dtype == np.int64
        assert isinstance(df["name"].dtype, pd.CategoricalDtype)
        assert (np.diff(df["ts"].to_numpy()) >= 0).all(), f"{name} not sorted by start"
        assert (df["end"] == df["ts"] + df["dur"]).all()
    # total device time agrees with the raw durations (µs -> ns)
    raw_device_us = sum(
        e["dur"]
        for e in raw_events(path)
        if e.get("ph") == "X" and str(e.get("cat", "")).lower() in DEVICE and isinstance(e.get("dur"), (int, float))
        and not str(e.get("name")).startswith(MTIA_BOOKKEEPING)
    )
    assert frames.device["dur"].sum() == pytest.approx(raw_device_us * 1000, rel=1e-9, abs=len(frames.device))


@needs_traces
def test_schema_generations_are_told_apart():
    assert load_trace(single_file(shared_trace("v100_resnet50_nw0"))).schema == "2021"
    assert load_trace(shared_trace("misc/old_schema_inference.json.gz")).schema == "2021"
    assert load_trace(shared_trace("misc/a100_80gb_train.json.gz")).schema == "current"


@needs_traces
def test_rocm_and_mtia_traces_count_as_device_activity():
    amd = load_trace(shared_trace("misc/amd_mi250_minitoy.json.gz"))
    assert set(amd.device["kind"]) >= {"kernel", "memcpy"} and amd.has_device
    mtia = load_trace(shared_trace("misc/mtia_inference.json.gz"))
    assert mtia.has_device and len(mtia.runtime) > 0
    names = mtia.device["name"].astype(str)
    assert not names.str.startswith(MTIA_BOOKKEEPING).any()
    # MTIA DMA commands are copies, the rest of its command-processor work is compute
    assert (mtia.device.loc[names.str.startswith("dma").to_numpy(), "kind"] == "memcpy").all()
    assert (mtia.device["kind"] == "kernel").any()
    cpu = load_trace(shared_trace("misc/cpu_only.pt.trace.json.gz"))
    assert not cpu.has_device and len(cpu.host) > 0


@needs_traces
def test_pageable_batch_copies_match_the_manifest():
    """MANIFEST.md: each batch is copied from pageable memory, ~19 MB at ~10 GB/s."""
    dev = load_trace(single_file(shared_trace("v100_resnet50_nw0"))).device
    htod = dev[(dev["copy_kind"] == "HtoD") & (dev["copy_src"] == "Pageable")]
    big = htod[htod["bytes"] > 1e6]
    assert len(big) >= 5
    assert big["bytes"].median() == pytest.approx(19.3e6, rel=0.05)
    assert big["bandwidth_gbps"].median() == pytest.approx(10, rel=0.25)
    assert (big["copy_dst"] == "Device").all()


@needs_traces
@pytest.mark.parametrize("name", ["misc/a100_80gb_train.json.gz", "misc/mtia_inference.json.gz", "a100_two_ranks/rank-0.json.gz"])
def test_batched_decoding_gives_the_same_frames(name):
    """Large files are decoded in batches to bound memory; the frames must not change."""
    path = shared_trace(name)
    data = read_trace_bytes(path)
    whole = frames_from_bytes(path, data)
    batched = frames_from_bytes(path, data, batch_threshold=0, batch_bytes=256 * 1024)
    assert_same_frames(whole, batched)


def _rejected_events(data: bytes) -> int:
    """How many events the typed decoder refuses, each decoded on its own (an independent count)."""
    import msgspec

    events = msgspec.json.decode(data)["traceEvents"]
    one = msgspec.json.Decoder(decode.Event)
    rejected = 0
    for e in events:
        try:
            one.decode(msgspec.json.encode(e))
        except msgspec.ValidationError:
            rejected += 1
    return rejected


@needs_traces
@pytest.mark.parametrize("name", ["corpus/mi300x_qwen15_05b_chat_infer.json.gz", "misc/amd_mi250_minitoy.json.gz"])
@pytest.mark.parametrize("batched", [False, True])
def test_an_odd_value_sends_only_the_events_around_it_down_the_lenient_path(name, batched, monkeypatch):
    """AMD's runtime calls write `bytes` (and an old ROCm `stream`) as text, which the typed
    decoder refuses. The frames are those of cleaning up every event, and only the refused
    events and their neighbours in a chunk are cleaned up, not the whole trace."""
    path = shared_trace(name)
    data = bytes(read_trace_bytes(path))
    rejected = _rejected_events(data)
    assert rejected > 0  # the trace holds such values (else this test checks nothing)
    cleaned = []
    real_clean = decode._clean_event
    monkeypatch.setattr(decode, "_clean_event", lambda e: cleaned.append(1) or real_clean(e))
    sizes = {"batch_threshold": 0, "batch_bytes": 64 * 1024} if batched else {}
    frames = frames_from_bytes(path, bytearray(data), **sizes)
    events = len(orjson.loads(data)["traceEvents"])
    assert len(cleaned) <= rejected + decode.CHUNK_EVENTS * (rejected // decode.REJECTED_ALONE)
    assert len(cleaned) < events / 4 or events < 4 * decode.CHUNK_EVENTS
    monkeypatch.setattr(decode, "REJECTED_ALONE", 0)  # every chunk cleaned up whole: the lenient reading
    assert_same_frames(frames_from_bytes(path, bytearray(data), **sizes), frames)


# --- inputs: files, run folders, folders of runs ----------------------------------------------
@needs_traces
def test_plain_json_and_gzip_and_both_suffixes_load_alike(tmp_path):
    src = shared_trace("misc/a100_alexnet.json.gz")
    raw = gzip.decompress(src.read_bytes())
    variants = {
        "a.json": raw,
        "b.pt.trace.json": raw,
        "c.json.gz": src.read_bytes(),
        "d.pt.trace.json.gz": gzip.compress(raw),
    }
    loaded = []
    for name, data in variants.items():
        (tmp_path / name).write_bytes(data)
        loaded.append(load_trace(tmp_path / name))
    for other in loaded[1:]:
        for frame in ("host", "runtime", "device"):
            pd.testing.assert_frame_equal(getattr(loaded[0], frame), getattr(other, frame))
    # a folder with these four is one run of four files
    assert len(find_run(tmp_path).files) == 4


def _copy_run(src_files: list[Path], folder: Path, names: list[str] | None = None, mtime: float | None = None) -> None:
    folder.mkdir(parents=True)
    for i, src in enumerate(src_files):
        target = folder / (names[i] if names else src.name)
        shutil.copyfile(src, target)
        if mtime is not None:
            os.utime(target, (mtime, mtime))


@needs_traces
def test_folder_of_runs_reports_the_newest_and_says_so(tmp_path, cli):
    """Newest by the time tensorboard_trace_handler writes into each trace's name, which a
    clone keeps, not by modification times (here the other way round, as a checkout may
    leave them); traces whose names carry no time: the command asks which run."""
    alexnet, triton = shared_trace("misc/a100_alexnet.json.gz"), shared_trace("misc/a100_triton.json.gz")
    _copy_run([alexnet], tmp_path / "log" / "older", ["host_1.1600000000000000000.pt.trace.json.gz"], mtime=1_700_000_000)
    _copy_run([triton], tmp_path / "log" / "newer", ["host_2.1700000000000.pt.trace.json.gz"], mtime=1_600_000_000)  # ms, older torch
    code, out, err = cli(["report", "--format", "json", str(tmp_path / "log")])
    assert code == 0, err
    report = json.loads(out)
    assert report["run"] == "newer"
    assert any("'newer' (the newest, by the time in its trace file names)" in n and "--run" in n for n in report["notes"])
    _copy_run([alexnet], tmp_path / "log" / "custom", ["trace.json.gz"], mtime=1_800_000_000)
    code, _, err = cli(["report", str(tmp_path / "log")])
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "holds 3 runs" in err and "--run NAME" in err and "custom, newer, older" in err
    code, out, err = cli(["report", "--format", "json", "--run", "older", str(tmp_path / "log")])
    assert code == 0, err
    report = json.loads(out)
    assert report["run"] == "older" and report["files"][0].endswith("host_1.1600000000000000000.pt.trace.json.gz")
    assert any("'older' (as asked)" in n for n in report["notes"])
    code, _, err = cli(["report", "--run", "nope", str(tmp_path / "log")])
    assert code == 2 and "no run named 'nope'" in err and "newer" in err


@needs_traces
def test_ranks_come_from_distributed_info_then_file_names_then_order(tmp_path):
    from advisor.analysis import analyze

    two = sorted(shared_trace("a100_two_ranks").glob("*.json.gz"))
    assert [m.rank for m in analyze(shared_trace("a100_two_ranks")).ranks] == [0, 1]
    # without distributedInfo: the number in the file name
    for src, name in zip(two, ["worker7.pt.trace.json", "worker3.pt.trace.json"], strict=True):
        doc = orjson.loads(gzip.decompress(src.read_bytes()))
        doc.pop("distributedInfo")
        (tmp_path / "named").mkdir(exist_ok=True)
        (tmp_path / "named" / name).write_bytes(orjson.dumps(doc))
    assert sorted(m.rank for m in analyze(tmp_path / "named").ranks) == [3, 7]
    # neither: file order
    (tmp_path / "plain").mkdir()
    for name, src in zip(["first.json", "second.json"], sorted((tmp_path / "named").iterdir()), strict=True):
        shutil.copyfile(src, tmp_path / "plain" / name)
    assert sorted(m.rank for m in analyze(tmp_path / "plain").ranks) == [0, 1]


# --- bad input: one line naming the file, exit 2, no traceback ---------------------------------
def _bad_inputs(tmp: Path) -> dict[str, tuple[Path, str]]:
    """name -> (path to report, words the error line must contain)."""
    good = shared_trace("misc/a100_alexnet.json.gz").read_bytes()
    raw = gzip.decompress(good)
    (tmp / "empty_dir").mkdir()
    (tmp / "no_traces").mkdir()
    (tmp / "no_traces" / "notes.txt").write_text("not a trace")
    (tmp / "cut.json.gz").write_bytes(good[: len(good) // 2])
    (tmp / "cut.pt.trace.json").write_bytes(raw[: int(len(raw) * 0.6)])
    (tmp / "other.json").write_text('{"hello": "world", "items": [1, 2, 3]}')
    (tmp / "noevents.json").write_text('{"schemaVersion": 1, "traceEvents": []}')
    (tmp / "zero.json").write_bytes(b"")
    (tmp / "garbage.json.gz").write_bytes(b"\x1f\x8b" + b"\x00" * 64)
    return {
        "missing path": (tmp / "does_not_exist", "no such file or directory"),
        "empty directory": (tmp / "empty_dir", "directory is empty"),
        "directory without traces": (tmp / "no_traces", "no trace files"),
        "truncated gzip": (tmp / "cut.json.gz", "truncated gzip"),
        "truncated JSON": (tmp / "cut.pt.trace.json", "truncated JSON"),
        "not a Chrome trace": (tmp / "other.json", "not a Chrome trace"),
        "no events": (tmp / "noevents.json", "trace has no events"),
        "empty file": (tmp / "zero.json", "file is empty"),
        "corrupt gzip": (tmp / "garbage.json.gz", "gzip"),
    }


@needs_traces
def test_every_bad_input_is_one_line_and_exit_2(tmp_path, cli):
    for label, (path, words) in _bad_inputs(tmp_path).items():
        code, out, err = cli(["report", str(path)])
        lines = [line for line in err.splitlines() if line.strip()]
        assert code == 2, (label, code, err)
        assert len(lines) == 1, (label, err)
        assert str(path) in lines[0] and words in lines[0], (label, lines[0])
        assert "Traceback" not in err and out == "", label


@needs_traces
def test_bad_input_in_a_fresh_process_has_no_traceback(tmp_path):
    bad = _bad_inputs(tmp_path)
    for label in ("truncated JSON", "not a Chrome trace"):
        path, words = bad[label]
        p = subprocess.run([sys.executable, "-m", "advisor", "report", str(path)], check=False, capture_output=True, text=True, timeout=120, cwd=REPO)
        assert p.returncode == 2, p.stderr
        assert p.stderr.strip().count("\n") == 0 and words in p.stderr and "Traceback" not in p.stderr


@needs_traces
def test_a_broken_rank_is_skipped_with_a_warning(tmp_path, cli):
    ranks = sorted(shared_trace("a100_two_ranks").glob("*.json.gz"))
    run = tmp_path / "job"
    run.mkdir()
    shutil.copyfile(ranks[0], run / ranks[0].name)
    (run / ranks[1].name).write_bytes(ranks[1].read_bytes()[:5000])
    code, out, err = cli(["report", "--format", "json", str(run)])
    assert code == 0, err
    report = json.loads(out)
    assert [r["rank"] for r in report["ranks"]] == [0]
    warning = [w for w in report["warnings"] if ranks[1].name in w]
    assert warning and "truncated gzip" in warning[0]


@needs_traces
def test_report_never_imports_torch(tmp_path):
    code = (
        "import sys\n"
        "sys.argv = ['advisor', 'report', '--format', 'json', '-o', sys.argv[2], sys.argv[1]]\n"
        "from advisor.cli import main\n"
        "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n"
    )
    script = tmp_path / "check_imports.py"
    script.write_text(code)
    trace = single_file(shared_trace("v100_resnet50_nw0"))
    p = subprocess.run([sys.executable, str(script), str(trace), str(tmp_path / "r.json")], check=False, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines()[-1] == "[]"


# --- cache ----------------------------------------------------------------------------------
@needs_traces
def test_cache_beside_the_trace_round_trips_and_follows_the_bytes(tmp_path, monkeypatch):
    monkeypatch.setenv("ADVISOR_CACHE", "beside")
    trace = tmp_path / "run" / "worker0.pt.trace.json.gz"
    trace.parent.mkdir()
    shutil.copyfile(single_file(shared_trace("v100_resnet50_nw0")), trace)
    fresh = frame_cache.load_cached(trace, min_parse_seconds=0)
    entry = frame_cache.frames_entry(trace)
    assert entry.parent == trace.parent / ".advisor-cache"
    assert (entry / "advisor_cache.json").is_file() and (entry / "host.parquet").is_file() and (entry / "seal.json").is_file()
    assert not list(entry.glob("*.pkl")) and not list(entry.glob("*.pickle"))
    cached = frame_cache.read_cached(trace)
    assert cached is not None
    assert_same_frames(fresh, cached)
    assert cached.host["input_dims"].map(lambda v: v is None or isinstance(v, list)).all()
    assert cached.host["input_dims"].tolist() == fresh.host["input_dims"].tolist()
    # the cache folder is not a run and holds no traces
    assert find_run(trace.parent).files == [trace]
    # a touched trace (same bytes, new mtime) is still the same trace
    st = trace.stat()
    os.utime(trace, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert frame_cache.read_cached(trace) is not None
    # other bytes with the old size and mtime put back (what `cp -a` of another run does) miss
    data = bytearray(trace.read_bytes())
    data[-8:-4] = bytes(4)  # the gzip CRC: still the same size
    trace.write_bytes(bytes(data))
    os.utime(trace, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert frame_cache.read_cached(trace) is None
    shutil.copyfile(single_file(shared_trace("v100_resnet50_nw0")), trace)
    # a damaged entry is a miss, not an error
    frame_cache.load_cached(trace, min_parse_seconds=0)
    (entry / "device.parquet").write_bytes(b"PAR1 broken")
    assert frame_cache.read_cached(trace) is None
    assert_same_frames(frame_cache.load_cached(trace, min_parse_seconds=0), fresh)


@needs_traces
def test_cache_goes_to_the_user_cache_folder_by_default(tmp_path, monkeypatch):
    trace = tmp_path / "run" / "a100.json.gz"
    trace.parent.mkdir()
    shutil.copyfile(shared_trace("misc/a100_alexnet.json.gz"), trace)
    frame_cache.load_cached(trace, min_parse_seconds=0)
    assert sorted(p.name for p in trace.parent.iterdir()) == ["a100.json.gz"], "nothing beside the user's traces"
    user_root = Path(os.environ["XDG_CACHE_HOME"]) / "torch-advisor"
    assert len(list(user_root.glob("frames-*"))) == 1 and frame_cache.read_cached(trace) is not None
    # without XDG_CACHE_HOME: ~/.cache/torch-advisor; a relative XDG_CACHE_HOME is ignored (XDG spec)
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert frame_cache.user_cache_root() == tmp_path / "home" / ".cache" / "torch-advisor"
    # ADVISOR_CACHE='~/x' is the home's x, never a literal '~' folder
    monkeypatch.setenv("ADVISOR_CACHE", "~/advisor-cache")
    monkeypatch.chdir(tmp_path)
    assert frame_cache.load_cached(trace, min_parse_seconds=0) is not None
    assert len(list((tmp_path / "home" / "advisor-cache").iterdir())) == 1
    assert not (tmp_path / "~").exists()


@needs_traces
def test_cache_falls_back_to_the_user_cache_then_to_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("ADVISOR_CACHE", "beside")
    folder = tmp_path / "readonly"
    folder.mkdir()
    trace = folder / "a100.json.gz"
    shutil.copyfile(shared_trace("misc/a100_alexnet.json.gz"), trace)
    folder.chmod(0o555)
    try:
        frame_cache.load_cached(trace, min_parse_seconds=0)
        assert not (folder / ".advisor-cache").exists()
        user_root = Path(os.environ["XDG_CACHE_HOME"]) / "torch-advisor"
        assert len(list(user_root.glob("frames-*"))) == 1
        assert frame_cache.read_cached(trace) is not None
        # nowhere writable: no cache, and the frames still load
        blocked = tmp_path / "blocked"
        blocked.write_text("a file where the cache folder should be")
        monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
        frames = frame_cache.load_cached(trace, min_parse_seconds=0)
        assert len(frames.device) > 0 and frame_cache.read_cached(trace) is None
        monkeypatch.setenv("ADVISOR_CACHE", "off")
        assert frame_cache.write_cached(frames) is None
    finally:
        folder.chmod(0o755)


# --- parallel -------------------------------------------------------------------------------
@needs_traces
def test_parallel_loading_matches_serial_and_reports_each_file(tmp_path):
    paths = [shared_trace("misc/a100_80gb_train.json.gz"), shared_trace("misc/a100_nccl.json.gz"), tmp_path / "broken.json"]
    paths[2].write_text('{"traceEvents": [{"ph": "X", "cat": "kernel"')
    seen = []
    parallel = load_frames(paths, workers=2, progress=seen.append)
    assert sorted(seen) == sorted(paths)
    assert [r.path for r in parallel] == paths
    assert parallel[2].frames is None and "truncated JSON" in parallel[2].error.line()
    for result, path in zip(parallel[:2], paths[:2], strict=True):
        assert result.error is None
        assert_same_frames(result.frames, load_trace(path))
