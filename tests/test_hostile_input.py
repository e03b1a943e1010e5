"""Hostile and damaged input, from real traces: gzip that lies, forged caches, no home folder.

Each test starts from a real trace (or a recorded run) and changes only what it names:
the gzip stream cut after 100 bytes, whitespace inflated inside a real trace (a gzip bomb),
cache entries written by the advisor and then forged or damaged. Memory is measured on a
fresh `advisor` process (its peak RSS, from getrusage), under `prlimit` where it is there.
"""

from __future__ import annotations

import gzip
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import REPO, shared_trace, single_file

from advisor.load import cache as frame_cache

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
    bomb = whitespace_bomb(tmp_path / "bomb.json.gz", 1024 * MiB)
    assert bomb.stat().st_size < 3 * MiB
    code, err, rss = run_measured(["report", str(bomb)], env={"ADVISOR_MAX_TRACE_BYTES": "128M"}, address_space=2 * 2**30)
    assert code == 2, err
    assert err.strip().splitlines() == [
        f"advisor: error: {bomb}: gzip inflates to more than 128 MiB of JSON (the limit; set ADVISOR_MAX_TRACE_BYTES to raise it)"
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
    assert entry == run / ".advisor-cache" / trace.name
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
    entry = trace.parent / ".advisor-cache" / trace.name
    good = {p.name: p.read_bytes() for p in entry.iterdir()}

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
        assert frame_cache.read_cached(trace) is None, what
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
