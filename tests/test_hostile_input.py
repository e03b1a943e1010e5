"""Hostile and damaged input, from real traces: gzip that lies, forged caches, no home folder.

Each test starts from a real trace (or a recorded run) and changes only what it names:
the gzip stream cut after 100 bytes, whitespace inflated inside a real trace (a gzip bomb),
cache entries written by the advisor and then forged or damaged. Memory is measured on a
fresh `advisor` process (its peak RSS, from getrusage), under `prlimit` where it is there.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import REPO, shared_trace, single_file

from advisor import cache as frame_cache

ALEXNET = "misc/a100_alexnet.json.gz"
MiB = 2**20
# What an `advisor report` process costs before it reads a byte (interpreter, pandas, pyarrow).
BASE_RSS = 350 * MiB


@pytest.fixture(autouse=True)
def private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))
    monkeypatch.delenv("ADVISOR_CACHE", raising=False)
    monkeypatch.delenv("ADVISOR_MAX_TRACE_BYTES", raising=False)


def run_measured(args: list[str], env: dict[str, str] | None = None, address_space: int | None = None) -> tuple[int, str, int]:
    """`advisor ARGS` in a fresh process: (exit code, stderr, its peak RSS in bytes).

    The peak is the child's own, measured by a small parent process (getrusage of its only
    child), optionally under `prlimit --as` (a hard memory cap, as a container would set)."""
    cmd = [sys.executable, "-m", "advisor", *args]
    if address_space is not None and shutil.which("prlimit"):
        cmd = ["prlimit", f"--as={address_space}", *cmd]
    probe = (
        "import resource, subprocess, sys\n"
        "p = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
        "sys.stdout.write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024) + '\\n' + str(p.returncode) + '\\n' + p.stderr)\n"
    )
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    out = subprocess.run([sys.executable, "-c", probe, *cmd], capture_output=True, text=True, env=full_env, timeout=300, check=True).stdout
    rss, code, err = out.split("\n", 2)
    return int(code), err, int(rss)


def real_trace_bytes() -> bytes:
    return gzip.decompress(shared_trace(ALEXNET).read_bytes())


def whitespace_bomb(path: Path, whitespace: int) -> Path:
    """A real trace with `whitespace` bytes of spaces before its last brace, as gzip members
    (valid gzip, valid JSON: the same report as the trace; about 1000:1 for the spaces)."""
    doc = real_trace_bytes()
    cut = doc.rindex(b"}")
    block = gzip.compress(b" " * (64 * MiB), compresslevel=9)
    with open(path, "wb") as f:
        f.write(gzip.compress(doc[:cut], compresslevel=1))
        for _ in range(whitespace // (64 * MiB)):
            f.write(block)
        f.write(gzip.compress(doc[cut:], compresslevel=1))
    return path


# --- 1. memory follows the real data ------------------------------------------------------------
def test_a_truncated_gzip_costs_no_memory_and_ends_in_one_line(tmp_path):
    """The first 100 bytes of a real .json.gz: the trailer's size field is then 4 bytes of the
    compressed stream (here read as ~GB); nothing may be sized from it."""
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(shared_trace(ALEXNET).read_bytes()[:100])
    code, err, rss = run_measured(["report", str(cut)], address_space=2 * 2**30)
    assert code == 2, err
    assert err.strip().splitlines() == [f"advisor: error: {cut}: truncated gzip (file cut short while being written?)"]
    assert rss < BASE_RSS, f"peak RSS {rss / MiB:.0f} MiB for a 100-byte file"


def test_a_gzip_bomb_stops_at_the_ceiling_in_one_line(tmp_path):
    # (not whitespace: that is squeezed while inflating, see below)
    bomb = inflated_inside_trace_events(tmp_path / "bomb.json.gz", b'{"ph": "X", "cat": "kernel", "name": "' + b"a" * 4096 + b'", "ts": 1, "dur": 1},', 256 * MiB)
    assert bomb.stat().st_size < 3 * MiB
    code, err, rss = run_measured(["report", str(bomb)], env={"ADVISOR_MAX_TRACE_BYTES": "128M"}, address_space=2 * 2**30)
    assert code == 2, err
    assert err.strip().splitlines() == [
        f"advisor: error: {bomb}: gzip inflates to more than 128.0 MiB of JSON (the limit; set ADVISOR_MAX_TRACE_BYTES to raise it)"
    ]
    assert rss < BASE_RSS + 128 * MiB, f"peak RSS {rss / MiB:.0f} MiB"


def test_under_the_ceiling_peak_memory_follows_the_decompressed_size(tmp_path):
    """A bomb below the ceiling is a (strange) valid trace: analysed, at a peak RSS bounded
    by what it really inflates to, not by what its trailer claims."""
    bomb = whitespace_bomb(tmp_path / "bomb.json.gz", 256 * MiB)
    real = len(gzip.decompress(bomb.read_bytes()))
    code, err, rss = run_measured(["report", "-f", "json", "-o", str(tmp_path / "r.json"), str(bomb)], env={"ADVISOR_CACHE": "off"})
    assert code == 0, err
    assert rss < BASE_RSS + 1.25 * real, f"peak RSS {rss / MiB:.0f} MiB for {real / MiB:.0f} MiB of JSON"
    report = orjson.loads((tmp_path / "r.json").read_bytes())
    code, err, _ = run_measured(["report", "-f", "json", "-o", str(tmp_path / "plain.json"), str(shared_trace(ALEXNET))], env={"ADVISOR_CACHE": "off"})
    assert code == 0, err
    assert report["summary"] == orjson.loads((tmp_path / "plain.json").read_bytes())["summary"]


def inflated_inside_trace_events(path: Path, filler: bytes, size: int) -> Path:
    """A real trace with SIZE bytes of FILLER right after `"traceEvents": [`, streamed as gzip
    (the filler compresses about 1000:1: a bomb of a few hundred KiB)."""
    doc = real_trace_bytes()
    cut = doc.index(b"[", doc.index(b'"traceEvents"')) + 1
    block = filler * (16 * MiB // len(filler))
    deflate = zlib.compressobj(9, zlib.DEFLATED, 31)
    with open(path, "wb") as f:
        f.write(deflate.compress(doc[:cut]))
        for _ in range(size // len(block)):
            f.write(deflate.compress(block))
        f.write(deflate.compress(doc[cut:]))
        f.write(deflate.flush())
    return path


def test_a_whitespace_bomb_inside_trace_events_costs_no_memory_by_default(tmp_path):
    """1 GiB of whitespace between the events of a real trace (a 1 MiB file) peaked at more
    than 1 GiB of RSS: the default ceiling was 16 GiB. Long whitespace is squeezed while
    inflating: the same report as the trace's, at the memory the trace itself costs."""
    bomb = inflated_inside_trace_events(tmp_path / "bomb.json.gz", b" \n\t ", 1024 * MiB)
    assert bomb.stat().st_size < 2 * MiB
    code, err, rss = run_measured(["report", "-f", "json", "-o", str(tmp_path / "r.json"), str(bomb)], env={"ADVISOR_CACHE": "off"})
    assert code == 0, err
    assert rss < BASE_RSS + 64 * MiB, f"peak RSS {rss / MiB:.0f} MiB"
    code, err, _ = run_measured(["report", "-f", "json", "-o", str(tmp_path / "plain.json"), str(shared_trace(ALEXNET))], env={"ADVISOR_CACHE": "off"})
    assert code == 0, err
    assert orjson.loads((tmp_path / "r.json").read_bytes())["summary"] == orjson.loads((tmp_path / "plain.json").read_bytes())["summary"]


def test_a_bomb_that_is_not_whitespace_stops_at_a_ratio_of_its_compressed_size(tmp_path):
    """512 MiB of one kernel name's letters from a 600 KiB file: refused by default once it
    inflates past 200 times its size (at least 256 MiB), one line, exit 2."""
    bomb = inflated_inside_trace_events(tmp_path / "bomb.json.gz", b'{"ph": "X", "cat": "kernel", "name": "' + b"a" * 4096 + b'", "ts": 1, "dur": 1},', 512 * MiB)
    code, err, rss = run_measured(["report", str(bomb)], env={"ADVISOR_CACHE": "off"})
    assert code == 2, err
    assert err.strip().splitlines() == [
        f"advisor: error: {bomb}: gzip inflates to more than 256.0 MiB of JSON, 200 times its compressed size (a gzip bomb?); set ADVISOR_MAX_TRACE_BYTES to raise the limit"
    ]
    assert rss < BASE_RSS + 300 * MiB, f"peak RSS {rss / MiB:.0f} MiB"


def test_a_bad_ceiling_setting_is_one_line(tmp_path, cli):
    code, _, err = cli(["report", str(shared_trace(ALEXNET))], tmp_path, {"ADVISOR_MAX_TRACE_BYTES": "lots"})
    assert code == 2
    assert err.strip() == "advisor: error: ADVISOR_MAX_TRACE_BYTES='lots': expected a size in bytes such as 500M or 8G"


# --- 5. forged or damaged caches are misses ------------------------------------------------------
def copy_run(tmp_path: Path, name: str = "v100_resnet50_nw0") -> Path:
    run = tmp_path / name
    shutil.copytree(shared_trace(name), run, copy_function=shutil.copyfile)
    run.chmod(0o755)
    return run


def forge_kernel_names(entry: Path) -> None:
    """Rename every kernel in a frames entry and make one duration negative, keeping its key."""
    table = pq.read_table(entry / "device.parquet").to_pandas()
    table["name"] = table["name"].cat.rename_categories([f"forged_{i}" for i in range(len(table["name"].cat.categories))])
    pq.write_table(pa.Table.from_pandas(table, preserve_index=False), entry / "device.parquet")


def test_a_cache_shipped_inside_a_log_dir_is_never_served(tmp_path, cli, monkeypatch):
    """`tar`/`cp -a`/`rsync -a` keep mtimes: an `.advisor-cache/` that came with the traces is
    not read by default, and with ADVISOR_CACHE=beside an entry keyed the old way (size and
    mtime, which a copy keeps) is a miss: only the hash of the trace's bytes opens an entry."""
    run = copy_run(tmp_path)
    trace = single_file(run)
    code, plain, err = cli(["report", "-f", "json", str(run)], tmp_path, {"ADVISOR_CACHE": "off"})
    assert code == 0, err
    with monkeypatch.context() as m:  # an entry beside the trace, made by the advisor, then forged
        m.setenv("ADVISOR_CACHE", "beside")
        entry = frame_cache.write_cached(frame_cache.load_trace(trace))
    assert entry.parent == run / ".advisor-cache"
    forge_kernel_names(entry)
    code, out, err = cli(["report", "-f", "json", str(run)], tmp_path)
    assert (code, out) == (0, plain), err
    meta = orjson.loads((entry / "advisor_cache.json").read_bytes())
    st = trace.stat()
    meta["key"] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "advisor_version": meta["key"]["advisor_version"], "format": 1}
    (entry / "advisor_cache.json").write_bytes(orjson.dumps(meta))
    code, out, err = cli(["report", "-f", "json", str(run)], tmp_path, {"ADVISOR_CACHE": "beside"})
    assert (code, out) == (0, plain), err
    assert "forged_" not in out


def test_frames_entries_with_wrong_types_or_impossible_times_are_misses(tmp_path, monkeypatch):
    monkeypatch.setenv("ADVISOR_CACHE", "beside")
    trace = single_file(copy_run(tmp_path))
    fresh = frame_cache.load_cached(trace, min_parse_seconds=0)
    entry = frame_cache.frames_entry(trace)
    good = {p.name: p.read_bytes() for p in entry.iterdir()}
    key_digest = orjson.loads(good["seal.json"])["key"]

    def damage(table: str, change) -> None:
        df = pq.read_table(entry / f"{table}.parquet").to_pandas()
        change(df)
        pq.write_table(pa.Table.from_pandas(df, preserve_index=False), entry / f"{table}.parquet")

    cases = {
        "negative duration": lambda: damage("device", lambda d: d.__setitem__("dur", -d["dur"])),
        "end not start + duration": lambda: damage("host", lambda d: d.__setitem__("end", d["end"] + 5)),
        "times as floats": lambda: damage("runtime", lambda d: d.__setitem__("ts", d["ts"].astype("float64"))),
        "a kind that does not exist": lambda: damage("device", lambda d: d.__setitem__("kind", d["kind"].cat.rename_categories(["kernel", "memcpy", "gpu_magic"]))),
        "names as numbers": lambda: damage("host", lambda d: d.__setitem__("name", d["name"].cat.codes.astype("int64"))),
        "input dims not lists": lambda: damage("host", lambda d: d.__setitem__("input_dims", ["{}"] * len(d))),
        "a step twice": lambda: damage("steps", lambda d: d.__setitem__("step", 0)),
        "negative device memory": lambda: damage("device_properties", lambda d: d.__setitem__("total_memory_bytes", -1)),
        "a window of strings": lambda: (entry / "advisor_cache.json").write_bytes(
            orjson.dumps({**orjson.loads(good["advisor_cache.json"]), "window": ["0", "1"]})
        ),
        "metadata as a list": lambda: (entry / "advisor_cache.json").write_bytes(
            orjson.dumps({**orjson.loads(good["advisor_cache.json"]), "metadata": [1]})
        ),
    }
    for what, apply in cases.items():
        for name, data in good.items():
            (entry / name).write_bytes(data)
        assert frame_cache.read_cached(trace) is not None, "the undamaged entry must be a hit"
        apply()
        assert frame_cache.read_cached(trace) is None, what  # the seal no longer matches
        frame_cache.seal(entry, "frames", key_digest)  # sealed again with this installation's secret:
        assert frame_cache.read_cached(trace) is None, what  # the values' own checks refuse it
    for name, data in good.items():
        (entry / name).write_bytes(data)
    assert len(frame_cache.load_cached(trace).device) == len(fresh.device)


# --- 6. no home folder: no cache, and the report goes on -----------------------------------------
def test_no_home_and_no_passwd_entry_means_no_cache_not_a_failed_report(tmp_path, cli, monkeypatch):
    import pwd

    def no_entry(uid):
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    monkeypatch.delenv("HOME", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setattr(pwd, "getpwuid", no_entry)
    assert frame_cache.user_cache_root() is None
    run = copy_run(tmp_path)
    code, out, err = cli(["report", "-f", "json", str(run)], tmp_path)
    assert code == 0, err
    assert orjson.loads(out)["summary"]["steps"] > 0
    assert sorted(p.name for p in run.iterdir()) == sorted(p.name for p in shared_trace("v100_resnet50_nw0").iterdir())
    assert not (tmp_path / "~").exists()


# --- 9. parseable input never ends in an internal error ------------------------------------------
HOST_CATS = {"cpu_op", "user_annotation", "python_function", "operator", "python"}


def edited_trace(tmp_path: Path, change, source: str = ALEXNET, name: str = "run") -> Path:
    """A run folder holding a real trace changed by `change(doc)`."""
    doc = orjson.loads(real_trace_bytes() if source == ALEXNET else gzip.decompress(shared_trace(source).read_bytes()))
    change(doc)
    folder = tmp_path / name
    folder.mkdir()
    (folder / "trace.json").write_text(json.dumps(doc))  # json: integers of 64 bits and more too
    return folder


def report_json(cli, path: Path, cwd: Path) -> dict:
    code, out, err = cli(["report", "-f", "json", str(path)], cwd, {"ADVISOR_CACHE": "off"})
    assert code == 0, err
    return orjson.loads(out)


def htod_copies(doc: dict) -> list[dict]:
    return [e for e in doc["traceEvents"] if str(e.get("cat", "")).lower() in ("gpu_memcpy", "memcpy") and "HtoD" in str(e.get("name"))]


def one_window(doc: dict) -> None:
    """Edit: drop the harness's inner ranges (`[param|...|forward]`, `[param|clear_cache]`), so
    that nothing repeats and the whole window, set-up copies included, is the one step."""
    doc["traceEvents"] = [
        e for e in doc["traceEvents"] if not (str(e.get("cat", "")).lower() == "user_annotation" and str(e.get("name", "")) != "[param|cuda]")
    ]


def assert_adds_up(report: dict) -> None:
    s = report["summary"]
    assert abs(sum(s["breakdown_ms"].values()) - s["step_time_ms"]["mean"]) < 1e-6 * s["step_time_ms"]["mean"]


def test_device_events_without_host_events_are_analysed(tmp_path, cli):
    run = edited_trace(tmp_path, lambda d: d.update(traceEvents=[e for e in d["traceEvents"] if str(e.get("cat", "")).lower() not in HOST_CATS]))
    report = report_json(cli, run, tmp_path)
    doc = orjson.loads((run / "trace.json").read_bytes())
    assert report["summary"]["h2d"]["count"] == len(htod_copies(doc)) == 16
    assert_adds_up(report)


def test_copy_sizes_of_64_bits_and_more_are_unknown_with_a_warning(tmp_path, cli):
    def huge(doc):
        one_window(doc)  # the 16 copies are set-up: in a step only when the window is one
        for e in htod_copies(doc):
            e["args"]["bytes"] = 2**64 + 5

    report = report_json(cli, edited_trace(tmp_path, huge), tmp_path)
    h2d = report["summary"]["h2d"]
    assert h2d["count"] == 16 and h2d["bytes"] is None and h2d["bandwidth_gbps"] is None
    assert report["warnings"] == ["trace.json: 16 device event(s) have a byte count no copy can have (negative, or 2**53 and more): read as unknown"]


def test_negative_compute_capability_with_pageable_copies(tmp_path, cli):
    def negative(doc):
        one_window(doc)
        for p in doc["deviceProperties"]:
            p["computeMajor"] = -1

    report = report_json(cli, edited_trace(tmp_path, negative), tmp_path)
    assert report["summary"]["h2d"]["pageable_count"] == 16
    assert report["ranks"][0]["device"]["compute_capability"] is None
    assert any("compute capability of device(s) [0, 1, 2, 3, 4, 5, 6, 7] is not a possible version" in w for w in report["warnings"])
    plain = report_json(cli, edited_trace(tmp_path, one_window, name="plain"), tmp_path)
    assert report["summary"]["step_time_ms"] == plain["summary"]["step_time_ms"]


def without_file_permissions(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """Run as root without the capabilities that bypass file permissions (a plain user's view)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "ADVISOR_CACHE": "off"}
    return subprocess.run(["setpriv", "--bounding-set=-dac_override,-dac_read_search", sys.executable, "-m", "advisor", *cmd],
                          capture_output=True, text=True, cwd=cwd, env=env, timeout=300, check=False)


needs_permissions = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv to drop the capabilities that bypass file permissions")


@needs_permissions
def test_an_unsearchable_parent_folder_and_an_unreadable_trace_are_one_line(tmp_path):
    locked = tmp_path / "locked"
    run = locked / "run"
    run.mkdir(parents=True)
    trace = run / "trace.json.gz"
    shutil.copyfile(shared_trace(ALEXNET), trace)
    locked.chmod(0o600)  # readable, not searchable
    try:
        inside = without_file_permissions(["report", "-f", "json", "trace.json.gz"], cwd=run)  # config lookup walks up through it
        assert inside.returncode == 0, inside.stderr
        assert orjson.loads(inside.stdout)["summary"]["steps"] == 1  # the harness's measured iteration
        for target in (trace, run):
            p = without_file_permissions(["report", str(target)], cwd=tmp_path)
            assert (p.returncode, p.stderr) == (2, f"advisor: error: {target}: cannot read: Permission denied\n")
    finally:
        locked.chmod(0o755)
    trace.chmod(0o000)
    try:
        for cmd in (["report", str(trace)], ["diff", str(trace), str(trace)], ["baseline", str(trace), "-o", str(tmp_path / "b.json")]):
            p = without_file_permissions(cmd, cwd=tmp_path)
            assert (p.returncode, p.stderr) == (2, f"advisor: error: {trace}: cannot read: Permission denied\n"), cmd
    finally:
        trace.chmod(0o644)


RECORDED_RUN = REPO / "sample_runs" / "resnet18_cifar" / "runs" / "gpu_baseline"
# The five crash sites of the bad-input campaign, and values no run can have.
BAD_FACTS = {
    "dataloaders": [[]],
    "cpu_count": [4],
    "device": {"compute_capability": "-1.0", "total_memory_bytes": -5},
    "world_size": "2",
    "optimizers": [["SGD"]],
    "step_times_ms": [1e308, -3],
    "autocast": {"used": "yes", "dtypes": [16]},
    "profiler": 5,  # read for the profiler-overhead note of a run with steps after its window
    "mode": "eval",
}


@pytest.mark.parametrize("key", sorted(BAD_FACTS))
def test_facts_of_the_wrong_type_are_read_as_unknown_with_a_warning(key, tmp_path, cli):
    """Each bad value gives the report of the same run with that value null (or its list
    without the bad items), plus a warning naming the file and the field."""
    facts = orjson.loads((RECORDED_RUN / "advisor_facts.json").read_bytes())
    trace = next(RECORDED_RUN.glob("*.pt.trace.json.gz"))

    def run_with(value, name):
        folder = tmp_path / name
        folder.mkdir()
        shutil.copyfile(trace, folder / trace.name)
        (folder / "advisor_facts.json").write_bytes(orjson.dumps({**facts, key: value}))
        return report_json(cli, folder, tmp_path)

    bad = run_with({**facts[key], **BAD_FACTS[key]} if key == "device" else BAD_FACTS[key], "bad")
    nulled = {"dataloaders": [], "optimizers": [], "device": {**facts["device"], "compute_capability": None, "total_memory_bytes": None},
              "autocast": {"used": None, "dtypes": None}}.get(key)
    good = run_with(nulled, "nulled")
    assert bad["findings"] == good["findings"] and bad["summary"] == good["summary"]
    facts_path = tmp_path / "bad" / "advisor_facts.json"
    assert any(w.startswith(f"{facts_path}: {key}") and w.endswith("read as unknown") for w in bad["warnings"]), bad["warnings"]
    assert_adds_up(bad)


# --- 10. impossible values never give exit 0 with wrong numbers -------------------------------------
def test_timestamps_beyond_int64_nanoseconds_are_left_out_with_a_warning(tmp_path, cli):
    """A few kernels at 9.3e15 µs (2264 AD; ns past int64 relative to the rest): the report is
    that of the trace without those kernels, and says it left them out."""
    def far(doc):
        for e in [e for e in doc["traceEvents"] if e.get("cat") == "kernel"][:5]:
            e["ts"] = 9.3e15

    def gone(doc):
        kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"][:5]
        doc["traceEvents"] = [e for e in doc["traceEvents"] if not any(e is k for k in kernels)]

    bad = report_json(cli, edited_trace(tmp_path, far, name="far"), tmp_path)
    clean = report_json(cli, edited_trace(tmp_path, gone, name="gone"), tmp_path)
    assert bad["summary"] == clean["summary"] and bad["findings"] == clean["findings"]
    assert bad["warnings"] == ["trace.json: left out 5 event(s) timed more than 11.6 days away from the rest of the trace (impossible timestamps)"]


def test_nested_and_overlapping_step_spans_leave_the_breakdown_adding_up(tmp_path, cli):
    """Two extra ProfilerStep spans with other numbers, one nested in step 7, one across steps
    8 and 9, on the V100 ResNet-50 trace: the six real steps remain (mean 177.59 ms, the
    TensorBoard plugin's figure in ANCHORS.md) and the breakdown adds up."""
    def extra_steps(doc):
        steps = sorted((e for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#") and e.get("ph") == "X"), key=lambda e: e["ts"])
        a, b, c = steps[2], steps[3], steps[4]
        doc["traceEvents"].append({**a, "name": "ProfilerStep#900", "ts": a["ts"] + a["dur"] * 0.25, "dur": a["dur"] * 0.5})
        doc["traceEvents"].append({**b, "name": "ProfilerStep#901", "ts": b["ts"] + b["dur"] * 0.5, "dur": b["dur"] * 0.5 + c["dur"] * 0.5})

    run = edited_trace(tmp_path, extra_steps, source="v100_resnet50_nw0/" + single_file(shared_trace("v100_resnet50_nw0")).name)
    report = report_json(cli, run, tmp_path)
    assert report["summary"]["steps"] == 6
    assert round(report["summary"]["step_time_ms"]["mean"], 2) == 177.59
    assert_adds_up(report)
    assert report["warnings"] == ["trace.json: left out 2 ProfilerStep span(s) repeated, nested in or overlapping another step: each instant counts in one step"]


def test_negative_device_memory_is_unknown_with_a_warning(tmp_path, cli):
    def negative(doc):
        for p in doc["deviceProperties"]:
            p["totalGlobalMem"] = -5

    report = report_json(cli, edited_trace(tmp_path, negative), tmp_path)
    assert report["summary"]["device_memory_bytes"] is None
    assert any("device memory (totalGlobalMem) of device(s) [0, 1, 2, 3, 4, 5, 6, 7] is not a possible size" in w for w in report["warnings"])


def baseline_of_recorded_run(cli, tmp_path: Path) -> dict:
    target = tmp_path / "baseline.json"
    code, _, err = cli(["baseline", str(RECORDED_RUN), "-o", str(target)], tmp_path, {"ADVISOR_CACHE": "off"})
    assert code == 0, err
    return orjson.loads(target.read_bytes())


@pytest.mark.parametrize("steps, problem", [
    ("1e308", "'step_times_ms' holds 1e+308, not a possible step time (0, or 1e-06 to 1e+09 ms)"),
    ("negative", "'step_times_ms' holds -5.0, not a possible step time (0, or 1e-06 to 1e+09 ms)"),
    ("1e-300", "'step_times_ms' holds 1e-300, not a possible step time (0, or 1e-06 to 1e+09 ms)"),
    ("2M", "2000000 step times, more than the 10000 a baseline may hold (a profiled window has tens)"),
])
def test_baselines_with_impossible_step_times_are_refused_in_one_line(steps, problem, tmp_path, cli):
    doc = baseline_of_recorded_run(cli, tmp_path)
    n = len(doc["step_times_ms"])
    doc["step_times_ms"] = {"1e308": [1e308] * n, "negative": [-5.0] * n, "1e-300": [1e-300] * n, "2M": doc["step_times_ms"] * (2_000_000 // n) + doc["step_times_ms"][: 2_000_000 % n]}[steps]
    path = tmp_path / "forged.json"
    path.write_bytes(orjson.dumps(doc))
    code, _, err = cli(["gate", str(RECORDED_RUN), "--baseline", str(path)], tmp_path, {"ADVISOR_CACHE": "off"})
    assert (code, err) == (2, f"advisor: error: {path}: not a valid baseline: {problem}\n")


# --- 11. smaller things --------------------------------------------------------------------------
def test_a_utf8_byte_order_mark_is_skipped(tmp_path, cli):
    run = tmp_path / "bom"
    run.mkdir()
    (run / "trace.json").write_bytes(b"\xef\xbb\xbf" + real_trace_bytes())
    assert report_json(cli, run, tmp_path)["summary"] == report_json(cli, shared_trace(ALEXNET), tmp_path)["summary"]


def test_trailing_garbage_is_named_where_it_is(tmp_path, cli):
    """The ROCm trace has stream ids as strings (a value the typed decoder refuses and the
    lenient one accepts): the error must name the garbage, not that field."""
    data = gzip.decompress(shared_trace("misc/amd_mi250_minitoy.json.gz").read_bytes())
    path = tmp_path / "trace.json"
    path.write_bytes(data + b" x")
    code, _, err = cli(["report", str(path)], tmp_path, {"ADVISOR_CACHE": "off"})
    prefix = f"advisor: error: {path}: invalid JSON: trailing characters (byte "
    assert code == 2 and err.startswith(prefix) and err.endswith(")\n"), err
    assert len(data) <= int(err[len(prefix) : -2]) <= len(data) + 2  # at the garbage, not at a value


def test_rules_option_says_it_runs_python_files(cli, tmp_path):
    for command in ("report", "rules", "explain", "gate", "baseline", "diff"):
        code, out, _ = cli([command, "--help"], tmp_path, {"COLUMNS": "400"})
        assert code == 0 and "executed as Python with your permissions" in " ".join(out.split()), command
    assert "**`--rules DIR` runs the Python\nfiles in DIR**" in (REPO / "README.md").read_text()


# --- 5. analysis-cache entries with values of the wrong type ---------------------------------------
def _wrong_type(value):
    """A JSON value of another type than `value`."""
    if isinstance(value, bool):
        return "true"
    if isinstance(value, (int, float)):
        return "12"
    if isinstance(value, str):
        return 12
    if isinstance(value, list):
        return {"0": value}
    if isinstance(value, dict):
        return [value]
    return {"x": 1}  # null


TYPED_RANK_FIELDS = ["rank", "file_index", "metadata", "distributed", "has_device", "device", "tensor_core_kernel_share",
                     "tensor_core_eligible_share", "h2d", "d2h", "peak_memory", "notes"]
TYPED_FINDING_FIELDS = ["rule", "severity", "title", "message", "saving_ms", "saving_share", "confidence", "evidence", "fix", "causes", "rank"]


def test_type_corrupted_analysis_entries_are_misses(tmp_path, cli, monkeypatch):
    """Every typed field of a real entry given a value of another type: the report is the one
    the full path writes (the entry is a miss), never exit 3 (5 of 24 such entries were)."""
    from advisor import cache as analysis_cache

    monkeypatch.setattr(analysis_cache, "MIN_ANALYSIS_SECONDS", 0.0)
    run = tmp_path / "run"
    shutil.copytree(RECORDED_RUN, run)
    report = ["report", "-f", "json", str(run)]
    code, plain, err = cli(report, tmp_path, {"ADVISOR_CACHE": "off"})
    assert code == 0, err
    assert cli(report, tmp_path)[1] == plain
    (entry,) = (Path(os.environ["XDG_CACHE_HOME"]) / "torch-advisor").glob("analysis-*")
    good = (entry / "analysis.json").read_bytes()
    meta = orjson.loads(good)
    assert meta["findings"], "the recorded run has findings to corrupt"
    places = [("ranks", 0, k) for k in TYPED_RANK_FIELDS] + [("findings", 0, k) for k in TYPED_FINDING_FIELDS] + [("warnings",), ("ranks",), ("findings",)]
    assert len(places) == 26
    from advisor.load.discover import find_run

    key, files = analysis_cache.AnalysisKey(meta["key"]), find_run(run)
    assert analysis_cache.read_analysis_entry(entry, key, files) is not None, "the undamaged entry is a hit"

    def write_sealed(doc) -> None:  # sealed again with this installation's secret: the values' own checks must refuse it
        (entry / "analysis.json").write_bytes(orjson.dumps(doc))
        assert analysis_cache.read_analysis_entry(entry, key, files) is None  # the seal no longer matches
        analysis_cache.seal(entry, "analysis", key.digest)

    for place in places:
        doc = orjson.loads(good)
        parent = doc
        for k in place[:-1]:
            parent = parent[k]
        parent[place[-1]] = _wrong_type(parent[place[-1]])
        write_sealed(doc)
        assert analysis_cache.read_analysis_entry(entry, key, files) is None, place
        code, out, err = cli(report, tmp_path)
        assert (code, out) == (0, plain), (place, err)
    # well typed but impossible (found by the long fuzz run): no rank, a rank twice, savings over the step
    for change in (lambda d: d.update(ranks=[]), lambda d: d["ranks"].append(d["ranks"][0]),
                   lambda d: d["findings"][0].update(saving_ms=1e9)):
        doc = orjson.loads(good)
        change(doc)
        write_sealed(doc)
        assert analysis_cache.read_analysis_entry(entry, key, files) is None
        code, out, err = cli(report, tmp_path)
        assert (code, out) == (0, plain), err


def test_a_tiny_but_possible_baseline_prints_a_factor_not_a_300_digit_percentage(tmp_path, cli):
    doc = baseline_of_recorded_run(cli, tmp_path)
    doc["step_times_ms"] = [1e-6] * len(doc["step_times_ms"])  # 1 ns steps: possible, if absurd
    path = tmp_path / "tiny.json"
    path.write_bytes(orjson.dumps(doc))
    code, out, err = cli(["gate", str(RECORDED_RUN), "--baseline", str(path)], tmp_path, {"ADVISOR_CACHE": "off"})
    assert code in (0, 1), err
    assert not re.search(r"\d{12}", out + err), out
    assert re.search(r"\(\d\.\d\de\+\d\dx\)", out), out


def test_one_kernel_name_with_a_lone_surrogate_keeps_the_trace(tmp_path, cli):
    """`"\\ud800"` in one kernel's name (valid JSON, not valid Unicode) rejected the whole
    trace ("malformed trace events"); the character becomes U+FFFD and the rest is read."""
    doc = orjson.loads(real_trace_bytes())
    kernel = next(e for e in doc["traceEvents"] if e.get("cat") == "kernel")
    kernel["name"] = "MARK" + kernel["name"]
    run = tmp_path / "surrogate"
    run.mkdir()
    (run / "trace.json").write_bytes(orjson.dumps(doc).replace(b"MARK", b"\\ud800", 1))
    report = report_json(cli, run, tmp_path)
    assert report["summary"] == report_json(cli, shared_trace(ALEXNET), tmp_path)["summary"]


def test_a_baseline_of_the_whole_file_system_is_refused_without_walking_it(tmp_path, cli):
    code, _, err = cli(["gate", str(RECORDED_RUN), "--baseline", "/"], tmp_path, {"ADVISOR_CACHE": "off"})
    assert (code, err) == (2, "advisor: error: /: holds more than 5,000 folders: not a torch.profiler log dir; give the run's own folder or trace file\n")


def test_whitespace_is_squeezed_where_a_sample_could_hold_a_run_and_only_there():
    """Inflating skips the whitespace count on a piece whose every 128th byte shows no 8
    whitespace bytes in a row (a run of 1024 would show at least 8): a real trace's pieces
    come back as they are, and with runs of 1024-1100 mixed whitespace bytes put anywhere
    into them the result is the full test's (count, then squeeze the runs)."""
    import random

    from advisor.load.decode import SQUEEZE_RUN, _squeezed

    runs = REPO / "sample_runs" / "resnet18_cifar" / "runs" / "gpu_baseline"
    data = gzip.decompress(next(runs.glob("*.pt.trace.json.gz")).read_bytes())

    def full(piece: bytes) -> bytes:
        if len(piece) < SQUEEZE_RUN or 2 * (len(piece) - len(piece.translate(None, b" \t\r\n"))) < len(piece):
            return piece
        return re.sub(rb"[ \t\r\n]{%d,}" % SQUEEZE_RUN, b" ", piece)

    pieces = [data[i : i + MiB] for i in range(0, len(data), MiB)]
    assert all(_squeezed(p) is p for p in pieces)
    rng = random.Random(5)
    for _ in range(200):
        piece = bytearray(rng.choice(pieces)[: rng.randint(2_000, 40_000)])
        for _ in range(rng.randint(1, 30)):  # mostly whitespace or not, depending on how many
            at = rng.randint(0, len(piece))
            piece[at:at] = bytes(rng.choice(b" \t\r\n") for _ in range(rng.randint(SQUEEZE_RUN - 8, SQUEEZE_RUN + 76)))
        assert _squeezed(bytes(piece)) == full(bytes(piece))
