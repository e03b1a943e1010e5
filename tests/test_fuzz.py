"""Fuzzing the whole pipeline with mutated real inputs: traces, facts files, cache entries, baselines.

Real traces from ../shared/traces are mutated the ways broken or odd profiler output looks:
cut short, keys dropped, values of the wrong type, NaN/Infinity literals, huge integers,
negative durations, shuffled events, duplicated ids, non-UTF-8 bytes, odd top-level shapes,
step spans that nest or overlap. `advisor.analysis.analyze` and the JSON and text renderers
must either work or raise InputError with one line that names the file; any other exception
fails the test, and so does a report whose numbers do not add up (check_report: every step's
breakdown sums to its duration, the summary's breakdown to the mean step, no negative time,
each finding's saving, and all fixes replayed together, within the step).

The same holds for the other files a report reads: a recorded run's `advisor_facts.json`
with values of the wrong type, cache entries (frames and analysis) with any value replaced,
and a baseline written by `advisor baseline` with any value replaced (`advisor gate` then
ends in a verdict or one line, exit 0, 1 or 2, never 3). Special files (FIFOs, links to
/dev/zero or to another folder, sparse files) where a log dir or the cache has files never
hang a command, never have gigabytes read, and never get another folder written or emptied.

Bounded for CI: a few hundred hypothesis examples on small traces (deterministic when CI is
set). A long run, any number of minutes over every harness, counting examples and failures:

    python tests/test_fuzz.py --minutes 25

and, with coverage guidance (atheris, if installed): python tests/test_fuzz.py -max_total_time=600
"""

from __future__ import annotations

import copy
import functools
import gzip
import inspect
import io
import json
import os
import random
import re
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import SAMPLE_RUNS, SHARED_TRACES, shared_trace

from advisor.errors import InputError

# Small real traces of every kind: current schema with steps, ROCm, CPU-only, 2021 schema, no steps.
SOURCES = [
    "misc/a100_triton.json.gz",
    "misc/amd_mi250_minitoy.json.gz",
    "misc/cpu_only.pt.trace.json.gz",
    "misc/old_schema_inference.json.gz",
    "misc/a100_alexnet.json.gz",
]
EVENT_KEYS = ["ph", "cat", "name", "ts", "dur", "tid", "pid", "args", "id"]
ARG_KEYS = [
    "External id", "external id", "correlation", "device", "stream", "grid", "block", "bytes", "Call stack",
    "Input Dims", "Device Type", "Device Id", "Bytes", "Total Allocated", "Total Reserved",
    "registers per thread", "shared memory", "blocks per SM", "warps per SM", "est. achieved occupancy %",
]
ODD_NAMES = ["", "ProfilerStep#", "ProfilerStep#-1", "ProfilerStep#99999999999999999999999", "[memory]",
             "Memcpy HtoD (Pageable -> Device)", "Memcpy ?? (a -> b)", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
             "cudaLaunchKernel", "ncclKernel_AllReduce", "名前\u0000\ud7ff", "x" * 5000]

have_traces = all((SHARED_TRACES / s).is_file() for s in SOURCES)
needs_traces = pytest.mark.skipif(
    not have_traces, reason="public traces not available: " + ", ".join(str(SHARED_TRACES / s) for s in SOURCES if not (SHARED_TRACES / s).is_file())
)

IN_CI = bool(os.environ.get("CI"))
FUZZ = settings(
    # 40 per harness in the test suite (ADVISOR_FUZZ_EXAMPLES for more; deterministic in CI: the
    # same ones every run); the long run below draws new ones for as long as it is given.
    max_examples=int(os.environ.get("ADVISOR_FUZZ_EXAMPLES", "40")),
    deadline=None,
    derandomize=IN_CI,
    database=None,
    # In CI a failure is reported as drawn (shrinking a whole-pipeline case can take minutes).
    phases=[Phase.explicit, Phase.generate] if IN_CI else list(Phase),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)


@functools.cache
def source_doc(name: str) -> dict[str, Any]:
    return json.loads(gzip.decompress((SHARED_TRACES / name).read_bytes()))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**30), 10**30) | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)


# --- mutations: each takes (doc, draw) and changes doc in place ------------------------------
def _events(doc: Any) -> list:
    evs = doc.get("traceEvents") if isinstance(doc, dict) else doc
    return evs if isinstance(evs, list) else []


def _pick(draw: Callable, evs: list) -> dict | None:
    dicts = [e for e in evs if isinstance(e, dict)]
    return draw(st.sampled_from(dicts)) if dicts else None


def _pick_many(draw: Callable, evs: list) -> list[dict]:
    dicts = [e for e in evs if isinstance(e, dict)]
    if not dicts:
        return []
    share = draw(st.sampled_from([0.01, 0.1, 0.5, 1.0]))
    rng = random.Random(draw(st.integers(0, 2**32)))
    return [e for e in dicts if rng.random() < share]


def drop_keys(doc, draw):
    for e in _pick_many(draw, _events(doc)):
        key = draw(st.sampled_from(EVENT_KEYS + ARG_KEYS))
        e.pop(key, None)
        if isinstance(e.get("args"), dict):
            e["args"].pop(key, None)


def wrong_types(doc, draw):
    for _ in range(draw(st.integers(1, 5))):
        e = _pick(draw, _events(doc))
        if e is None:
            return
        key = draw(st.sampled_from(EVENT_KEYS + ARG_KEYS))
        value = draw(json_values)
        if key in ARG_KEYS and isinstance(e.get("args"), dict):
            e["args"][key] = value
        else:
            e[key] = value


def nan_and_infinity(doc, draw):
    for e in _pick_many(draw, _events(doc)):
        key = draw(st.sampled_from(["ts", "dur", "bytes", "Bytes", "Total Allocated", "correlation"]))
        value = draw(st.sampled_from([float("nan"), float("inf"), float("-inf")]))
        if key in ("ts", "dur"):
            e[key] = value
        elif isinstance(e.get("args"), dict):
            e["args"][key] = value


def huge_integers(doc, draw):
    for e in _pick_many(draw, _events(doc)):
        key = draw(st.sampled_from(["ts", "dur", "tid", "correlation", "External id", "device", "stream", "Device Id"]))
        value = draw(st.sampled_from([1, -1])) * 10 ** draw(st.integers(17, 40))
        if key in ("ts", "dur", "tid"):
            e[key] = value
        elif isinstance(e.get("args"), dict):
            e["args"][key] = value


def negative_durations(doc, draw):
    for e in _pick_many(draw, _events(doc)):
        if isinstance(e.get("dur"), (int, float)):
            e["dur"] = -abs(e["dur"]) - draw(st.integers(0, 10))


def shuffle_events(doc, draw):
    evs = _events(doc)
    random.Random(draw(st.integers(0, 2**32))).shuffle(evs)


def duplicate_ids(doc, draw):
    value = draw(st.integers(-2, 5))
    for e in _pick_many(draw, _events(doc)):
        if isinstance(e.get("args"), dict):
            for key in ("correlation", "External id", "external id"):
                if key in e["args"]:
                    e["args"][key] = value
    evs = _events(doc)
    for e in _pick_many(draw, evs)[:200]:
        evs.append(copy.deepcopy(e))


def drop_event_kinds(doc, draw):
    evs = _events(doc)
    field = draw(st.sampled_from(["cat", "ph", "name"]))
    values = {e.get(field) for e in evs if isinstance(e, dict) and isinstance(e.get(field), str)}
    if values:
        gone = draw(st.sampled_from(sorted(values)))
        evs[:] = [e for e in evs if not (isinstance(e, dict) and e.get(field) == gone)]


def odd_names(doc, draw):
    for e in _pick_many(draw, _events(doc))[:50]:
        e["name"] = draw(st.sampled_from(ODD_NAMES))


def odd_top_level(doc, draw):
    what = draw(st.sampled_from(["deviceProperties", "distributedInfo", "traceEvents-item", "schemaVersion"]))
    if what == "traceEvents-item":
        _events(doc).insert(draw(st.integers(0, 5)), draw(json_values))
    elif isinstance(doc, dict):
        doc[what] = draw(json_values | st.just([{"id": "x", "totalGlobalMem": -1, "computeMajor": 1e300}]) | st.just({"rank": 1e300}))


def overlapping_steps(doc, draw):
    """Copies of ProfilerStep spans with other numbers, nested in or overlapping real steps."""
    evs = _events(doc)
    steps = [e for e in evs if isinstance(e, dict) and str(e.get("name", "")).startswith("ProfilerStep#") and isinstance(e.get("ts"), (int, float)) and isinstance(e.get("dur"), (int, float))]
    for _ in range(draw(st.integers(1, 4)) if steps else 0):
        e = draw(st.sampled_from(steps))
        shift = draw(st.floats(-1.0, 1.5)) * e["dur"]
        evs.append({**copy.deepcopy(e), "name": f"ProfilerStep#{draw(st.integers(0, 10**6))}", "ts": e["ts"] + shift, "dur": e["dur"] * draw(st.floats(0.0, 2.0))})


def far_timestamps(doc, draw):
    """A few events at times no profiling window has (int64-ns overflow territory and beyond)."""
    for e in _pick_many(draw, _events(doc))[:20]:
        e["ts"] = draw(st.sampled_from([9.2e15, 9.3e15, 5e16, 9.9e16, -9.3e15, 1e13]))


def impossible_sizes(doc, draw):
    """Copy sizes, memory totals and device memory no machine has."""
    value = draw(st.sampled_from([-1, -(2**40), 2**53, 2**64, 2**64 + 5, 1e308]))
    for e in _pick_many(draw, _events(doc)):
        if isinstance(e.get("args"), dict):
            for key in ("bytes", "Bytes", "Total Allocated", "Total Reserved"):
                if key in e["args"]:
                    e["args"][key] = value
    if isinstance(doc, dict) and isinstance(doc.get("deviceProperties"), list):
        for p in doc["deviceProperties"]:
            if isinstance(p, dict):
                p[draw(st.sampled_from(["totalGlobalMem", "computeMajor", "numSms"]))] = draw(st.sampled_from([-1, -5.5, 0, 2**64, 1e308]))


MUTATIONS = [drop_keys, wrong_types, nan_and_infinity, huge_integers, negative_durations, shuffle_events,
             duplicate_ids, drop_event_kinds, odd_names, odd_top_level, overlapping_steps, far_timestamps, impossible_sizes]


def serialize(doc: Any, draw: Callable) -> bytes:
    """JSON with NaN/Infinity literals (as Python writes them), then byte-level damage."""
    data = json.dumps(doc, allow_nan=True, ensure_ascii=draw(st.booleans())).encode("utf-8", "surrogatepass")
    damage = draw(st.sampled_from(["none", "none", "none", "truncate", "non_utf8", "gzip", "gzip_truncated"]))
    if damage == "truncate":
        data = data[: draw(st.integers(0, len(data)))]
    elif damage == "non_utf8":
        pos = [i for i in range(len(data)) if data[i : i + 1] == b'"'][1::2][:2000]
        if pos:
            at = draw(st.sampled_from(pos))
            data = data[:at] + draw(st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\x80abc"])) + data[at:]
    elif damage.startswith("gzip"):
        data = gzip.compress(data, compresslevel=1)
        if damage == "gzip_truncated":
            data = data[: draw(st.integers(0, len(data) - 1))]
    return data


def check_report(analysis: Any, report: dict[str, Any]) -> None:
    """The numbers of a finished report add up: each step's breakdown is its duration, the
    summary's breakdown is the mean step, no time is negative, each saving and the replay
    with every fix fit in the step."""
    import numpy as np

    for m in analysis.ranks:
        bd = m.breakdown.to_numpy(np.int64)
        duration = m.steps["duration"].to_numpy(np.int64)
        assert (duration >= 0).all() and (bd >= 0).all(), "negative time in a step"
        assert np.array_equal(bd.sum(axis=1), duration), "a step's breakdown does not add up to the step"
        assert (m.steps["end"] >= m.steps["start"]).all()
    for summary in [report["summary"], *(r["summary"] for r in report["ranks"])]:
        if summary["steps"]:
            mean = summary["step_time_ms"]["mean"]
            total = sum(summary["breakdown_ms"].values())
            assert abs(total - mean) <= 1e-6 * max(mean, 1.0), f"breakdown {total} ms against a mean step of {mean} ms"
    # Each saving is its fix replayed alone, so savings overlap and their sum means nothing (no
    # report shows it); what must hold is that no fix, nor all of them together, saves more
    # than the step they are replayed on (the longest measured step, or the replayed one).
    replayed = {w.rank: w for w in analysis.whatif}
    for m in analysis.ranks:
        if not len(m.steps):
            continue
        w = replayed.get(m.rank)
        longest = max(float(m.steps["duration"].max()) / 1e6, w.baseline_ms if w else 0.0)
        for f in report["findings"]:
            if f["rank"] in (m.rank, None) and f["saving_ms"] is not None:
                assert f["saving_ms"] <= longest * (1 + 1e-6) + 1e-6, f"{f['rule']} saves {f['saving_ms']} ms of a {longest} ms step"
        if w is not None and w.all_fixes_ms is not None:
            assert 0 <= w.all_fixes_ms <= w.baseline_ms * (1 + 1e-6) + 1e-6
    for f in report["findings"]:
        assert f["saving_ms"] is None or f["saving_ms"] >= 0


def check_pipeline(path: Path) -> None:
    """analyze + both renderers must work, or fail with a one-line InputError naming the file."""
    from rich.console import Console

    from advisor.analysis import analyze
    from advisor.render.json_report import to_json
    from advisor.render.text import render_text

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            analysis = analyze(path)
            report = json.loads(to_json(analysis))
            render_text(analysis, Console(file=io.StringIO(), width=120), verbose=True)
    except InputError as exc:
        line = exc.line()
        assert "\n" not in line and str(path) in line, line
        return
    check_report(analysis, report)


_WORK_DIRS: list[Path] = []


def _work_dir(prefix: str) -> Path:
    """A temporary folder for a cached helper's files, removed when the test process ends
    (the helpers are cached for the session, so no fixture's teardown can own it)."""
    import atexit
    import shutil

    d = Path(tempfile.mkdtemp(prefix=prefix))
    if not _WORK_DIRS:
        atexit.register(lambda: [shutil.rmtree(w, ignore_errors=True) for w in _WORK_DIRS])
    _WORK_DIRS.append(d)
    return d


@pytest.fixture(scope="module")
def fuzz_dir():
    with tempfile.TemporaryDirectory(prefix="advisor-fuzz-") as d:
        yield Path(d)


def _write(fuzz_dir: Path, data: bytes, gz: bool) -> Path:
    folder = Path(tempfile.mkdtemp(dir=fuzz_dir))
    path = folder / ("trace.pt.trace.json.gz" if gz else "trace.pt.trace.json")
    path.write_bytes(data)
    return path


def _mutated_trace(data: st.DataObject, fuzz_dir: Path) -> Path:
    doc = copy.deepcopy(source_doc(data.draw(st.sampled_from(SOURCES))))
    for _ in range(data.draw(st.integers(1, 3))):
        data.draw(st.sampled_from(MUTATIONS))(doc, data.draw)
    raw = serialize(doc, data.draw)
    return _write(fuzz_dir, raw, raw[:2] == b"\x1f\x8b")


@needs_traces
@FUZZ
@given(data=st.data())
def test_pipeline_survives_mutated_real_traces(data, fuzz_dir, monkeypatch):
    monkeypatch.setenv("ADVISOR_CACHE", "off")
    check_pipeline(_mutated_trace(data, fuzz_dir))


@needs_traces
@settings(FUZZ, max_examples=FUZZ.max_examples + FUZZ.max_examples // 4)
@given(data=st.data())
def test_loader_survives_mutated_real_traces(data, fuzz_dir):
    from advisor.load.trace import load_trace

    path = _mutated_trace(data, fuzz_dir)
    try:
        frames = load_trace(path)
    except InputError as exc:
        assert "\n" not in exc.line() and str(path) in exc.line()
        return
    for name in ("host", "runtime", "device"):
        df = getattr(frames, name)
        assert (df["dur"] >= 0).all() and (df["end"] >= df["ts"]).all()


# --- the other files a report reads: facts, cache entries, baselines --------------------------
RECORDED_RUN = SAMPLE_RUNS / "resnet18_cifar" / "runs" / "cpu_baseline"  # a real `advisor profile` run
have_recorded_run = RECORDED_RUN.is_dir()
needs_recorded_run = pytest.mark.skipif(not have_recorded_run, reason=f"recorded run not found at {RECORDED_RUN}")


def json_paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    """Every place in a JSON document (keys of objects, indexes of lists), the root excluded."""
    out = []
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for k, v in items:
        out.append((*prefix, k))
        out += json_paths(v, (*prefix, k))
    return out


def mutate_json(doc: Any, draw: Callable) -> Any:
    """Replace, drop or wrap the values at 1 to 4 places of a JSON document (in place)."""
    for _ in range(draw(st.integers(1, 4))):
        paths = json_paths(doc)
        if not paths:
            return doc
        path = draw(st.sampled_from(paths))
        parent = functools.reduce(lambda d, k: d[k], path[:-1], doc)
        how = draw(st.sampled_from(["replace", "replace", "drop", "wrap", "negate"]))
        if how == "drop":
            del parent[path[-1]]
        elif how == "wrap":
            parent[path[-1]] = [parent[path[-1]]]
        elif how == "negate" and isinstance(parent[path[-1]], (int, float)) and not isinstance(parent[path[-1]], bool):
            parent[path[-1]] = -parent[path[-1]] - 1
        else:
            parent[path[-1]] = draw(json_values | st.sampled_from([1e308, -1, 2**64, "", [], {}, [[]]]))
    return doc


def run_cli(args: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    """`advisor ARGS` in this process: (exit code, stdout, stderr)."""
    import contextlib

    from advisor.cli import main

    out, err = io.StringIO(), io.StringIO()
    old = {k: os.environ.get(k) for k in [*env, "COLUMNS"]}
    os.environ.update({"COLUMNS": "200", **env})
    argv, sys.argv = sys.argv, ["advisor", *args]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                main()
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = argv
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return code, out.getvalue(), err.getvalue()


def assert_one_line_error(code: int, err: str) -> None:
    assert code != 70 and "internal error" not in err, err
    if code == 2:
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("advisor: error: "), err


@needs_recorded_run
@FUZZ
@given(data=st.data())
def test_pipeline_survives_mutated_facts_of_a_recorded_run(data, fuzz_dir, monkeypatch):
    """A recorded run's advisor_facts.json with values of the wrong type or impossible ones."""
    monkeypatch.setenv("ADVISOR_CACHE", "off")
    folder = Path(tempfile.mkdtemp(dir=fuzz_dir))
    trace = next(RECORDED_RUN.glob("*.pt.trace.json.gz"))
    os.symlink(trace, folder / trace.name)
    facts = json.loads((RECORDED_RUN / "advisor_facts.json").read_text())
    mutate_json(facts, data.draw)
    (folder / "advisor_facts.json").write_text(json.dumps(facts, allow_nan=True))
    check_pipeline(folder)


@functools.cache
def _cache_source(kind: str) -> tuple[bytes, ...]:
    """(entry file name, bytes)... of the entry the advisor writes for the recorded run."""
    import shutil

    from advisor import cache as analysis_cache
    from advisor import cache as frame_cache

    work = _work_dir("advisor-fuzz-cache-")
    old = os.environ.get("ADVISOR_CACHE")
    os.environ["ADVISOR_CACHE"] = str(work / "cache")
    try:
        run = work / "run"
        shutil.copytree(RECORDED_RUN, run)
        if kind == "frames":
            frame_cache.load_cached(next(run.glob("*.json.gz")), min_parse_seconds=0)
        else:
            saved, analysis_cache.MIN_ANALYSIS_SECONDS = analysis_cache.MIN_ANALYSIS_SECONDS, 0.0
            try:
                assert run_cli(["report", "-f", "json", str(run)], {})[0] == 0
            finally:
                analysis_cache.MIN_ANALYSIS_SECONDS = saved
        entry = next(p for p in (work / "cache").iterdir() if (p.name.startswith("analysis-") == (kind == "analysis")))
        return (str(run), str(entry), *[p.name for p in sorted(entry.iterdir())])
    finally:
        if old is None:
            os.environ.pop("ADVISOR_CACHE", None)
        else:
            os.environ["ADVISOR_CACHE"] = old


@needs_recorded_run
@FUZZ
@given(data=st.data())
def test_reports_survive_mutated_cache_entries(data):
    """A frames or analysis entry of the recorded run with values replaced (its JSON, its stored
    view's MessagePack, or a Parquet table's column) and sealed again with this installation's secret (so the values'
    own checks are what is tried): the report is still made, and its numbers add up."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    kind = data.draw(st.sampled_from(["frames", "analysis"]))
    run, entry, *names = _cache_source(kind)
    entry = Path(entry)
    backup = {n: (entry / n).read_bytes() for n in names}
    try:
        name = data.draw(st.sampled_from([n for n in names if n != "seal.json"]))
        if name.endswith(".json"):
            doc = json.loads(backup[name])
            (entry / name).write_text(json.dumps(mutate_json(doc, data.draw), allow_nan=True))
        elif name.endswith(".msgpack"):  # the stored view: its values replaced, or its bytes cut
            import msgspec

            try:
                doc = msgspec.msgpack.decode(backup[name])
                (entry / name).write_bytes(msgspec.msgpack.encode(mutate_json(doc, data.draw)))
            except (msgspec.DecodeError, TypeError, ValueError, OverflowError):  # not MessagePack any more
                (entry / name).write_bytes(backup[name][: len(backup[name]) // 2])
        else:
            df = pq.read_table(entry / name).to_pandas()
            if len(df.columns):
                col = data.draw(st.sampled_from(list(df.columns)))
                value = data.draw(st.sampled_from([-1, 0, 2**62, -(2**62), 1e308, float("nan"), "x", None, True]))
                try:
                    df[col] = [value] * len(df)
                    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), entry / name)
                except (pa.ArrowException, TypeError, ValueError):
                    (entry / name).write_bytes(b"PAR1 not parquet")
        from advisor.cache import seal

        seal(entry, kind, json.loads(backup["seal.json"])["key"])
        code, out, err = run_cli(["report", "-f", "json", run], {"ADVISOR_CACHE": str(entry.parent)})
        assert code == 0, err
        from advisor.analysis import analyze

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            before = os.environ.get("ADVISOR_CACHE")
            os.environ["ADVISOR_CACHE"] = str(entry.parent)
            try:
                analysis = analyze(run, cache=True)
            finally:  # the suite's own cache folder back (tests/conftest.py), not the user's
                if before is None:
                    os.environ.pop("ADVISOR_CACHE", None)
                else:
                    os.environ["ADVISOR_CACHE"] = before
        check_report(analysis, json.loads(out))
    finally:
        for n, b in backup.items():
            (entry / n).write_bytes(b)


@functools.cache
def _plain_report(run: str) -> str:
    code, out, err = run_cli(["report", "-f", "json", run], {"ADVISOR_CACHE": "off"})
    assert code == 0, err
    return out


@functools.cache
def _other_run_entry() -> tuple[str, ...]:
    """(entry folder, file names...) of the analysis entry of another run (a shared trace)."""
    import shutil

    from advisor import cache as store

    work = _work_dir("advisor-fuzz-other-")
    run = work / "other"
    run.mkdir()
    shutil.copyfile(shared_trace("misc/a100_alexnet.json.gz"), run / "a100_alexnet.json.gz")
    saved, store.MIN_ANALYSIS_SECONDS = store.MIN_ANALYSIS_SECONDS, 0.0
    try:
        assert run_cli(["report", "-f", "json", str(run)], {"ADVISOR_CACHE": str(work / "cache")})[0] == 0
    finally:
        store.MIN_ANALYSIS_SECONDS = saved
    entry = next((work / "cache").glob("analysis-*"))
    return (str(entry), *[p.name for p in sorted(entry.iterdir())])


@needs_recorded_run
@needs_traces
@FUZZ
@given(data=st.data())
def test_forged_cache_entries_are_never_served(data):
    """Forged entries, as whoever ships a log dir (or shares a cache folder) could make them
    without this installation's secret: values edited in place (a finding's message or saving,
    any JSON value, a Parquet file's bytes), another run's entry under this key (its seal as it
    is, or naming this key), or an entry sealed with another secret. Each is a miss: the report
    is the one made afresh, byte for byte."""
    import shutil

    from advisor.cache import seal

    kind = data.draw(st.sampled_from(["frames", "analysis"]))
    run, entry, *names = _cache_source(kind)
    entry = Path(entry)
    plain = _plain_report(run)
    backup = {n: (entry / n).read_bytes() for n in names}
    key_digest = json.loads(backup["seal.json"])["key"]
    meta_name = "analysis.json" if kind == "analysis" else "advisor_cache.json"
    try:
        how = data.draw(st.sampled_from(["edit finding", "edit value", "flip a byte", "foreign entry", "foreign sealed as ours", "other secret"]))
        if how == "edit finding" and kind == "analysis":
            doc = json.loads(backup[meta_name])
            finding = doc["findings"][data.draw(st.integers(0, len(doc["findings"]) - 1))]
            field = data.draw(st.sampled_from(["message", "saving_ms", "title", "severity"]))
            finding[field] = data.draw({"message": st.text(max_size=40), "title": st.text(max_size=20), "saving_ms": st.floats(0, 1e3), "severity": st.sampled_from(["low", "medium", "high"])}[field])
            (entry / meta_name).write_text(json.dumps(doc))
        elif how in ("edit value", "edit finding"):
            doc = json.loads(backup[meta_name])
            (entry / meta_name).write_text(json.dumps(mutate_json(doc, data.draw), allow_nan=True))
        elif how == "flip a byte":
            name = data.draw(st.sampled_from([n for n in names if n != "seal.json"]))
            raw = bytearray(backup[name])
            i = data.draw(st.integers(0, len(raw) - 1))
            raw[i] ^= data.draw(st.integers(1, 255))
            (entry / name).write_bytes(bytes(raw))
        elif how.startswith("foreign"):
            other, *other_names = _other_run_entry()
            for n in names:
                (entry / n).unlink()
            for n in other_names:
                (entry / n).write_bytes((Path(other) / n).read_bytes())
            if how == "foreign sealed as ours":
                doc = json.loads((entry / "seal.json").read_bytes())
                doc["key"], doc["kind"] = key_digest, kind
                (entry / "seal.json").write_text(json.dumps(doc))
        else:
            doc = json.loads(backup[meta_name])
            if kind == "analysis" and doc["findings"]:
                doc["findings"][0]["message"] = "sealed elsewhere"
            (entry / meta_name).write_text(json.dumps(doc))
            seal(entry, kind, key_digest, key=data.draw(st.binary(min_size=32, max_size=32)))
        if kind == "frames":  # the report must reach the frames entry: no analysis entry before it
            for done in entry.parent.glob("analysis-*"):
                shutil.rmtree(done)
        code, out, err = run_cli(["report", "-f", "json", run], {"ADVISOR_CACHE": str(entry.parent)})
        assert code == 0, err
        assert out == plain, how
    finally:
        for p in entry.iterdir():
            if p.name not in backup:
                p.unlink()
        for n, b in backup.items():
            (entry / n).write_bytes(b)


@functools.cache
def _baseline_source() -> str:
    work = _work_dir("advisor-fuzz-baseline-")
    target = work / "baseline.json"
    code, _, err = run_cli(["baseline", str(RECORDED_RUN), "-o", str(target)], {"ADVISOR_CACHE": "off"})
    assert code == 0, err
    return target.read_text()


@needs_recorded_run
@FUZZ
@given(data=st.data())
def test_gate_survives_mutated_baselines(data, fuzz_dir):
    """A baseline `advisor baseline` wrote, with values replaced: the gate gives a verdict
    (exit 0 or 1) or one line (exit 2), never an internal error."""
    doc = mutate_json(json.loads(_baseline_source()), data.draw)
    path = Path(tempfile.mkdtemp(dir=fuzz_dir)) / "baseline.json"
    path.write_text(json.dumps(doc, allow_nan=True))
    code, _, err = run_cli(["gate", str(RECORDED_RUN), "--baseline", str(path)], {"ADVISOR_CACHE": "off"})
    assert code in (0, 1, 2), (code, err)
    assert_one_line_error(code, err)


# --- outputs: devices, FIFOs and links are written into, inputs never replaced --------------
def _node_kind(path: Path) -> str:
    import stat

    try:
        st_l = os.lstat(path)
    except FileNotFoundError:
        return "missing"
    if stat.S_ISLNK(st_l.st_mode):
        return "link->" + _node_kind(Path(os.path.realpath(path)))
    return {stat.S_IFREG: "file", stat.S_IFDIR: "dir", stat.S_IFIFO: "fifo", stat.S_IFCHR: "chardev"}.get(stat.S_IFMT(st_l.st_mode), "other")


def _make_node(kind: str, path: Path) -> None:
    if kind == "file":
        path.write_text("earlier contents\n")
    elif kind == "dir":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "chardev":
        os.mknod(path, 0o666 | 0o020000, os.makedev(1, 3))  # /dev/null's numbers
    elif kind.startswith("link->"):
        target = path.with_name(path.name + ".target")
        _make_node(kind.removeprefix("link->"), target)
        os.symlink(target.name, path)


def _output_command(draw: Callable, out: Path, baseline: str) -> list[str]:
    which = draw(st.sampled_from(["report", "report-text", "gate-json", "gate-junit", "baseline"]))
    run = str(RECORDED_RUN)
    return {
        "report": ["report", run, "-f", "json", "-o", str(out)],
        "report-text": ["report", run, "-f", "text", "-o", str(out)],
        "gate-json": ["gate", run, "-b", baseline, "--json", str(out)],
        "gate-junit": ["gate", run, "-b", baseline, "--junit", str(out)],
        "baseline": ["baseline", run, "-o", str(out)],
    }[which]


@needs_recorded_run
@FUZZ
@given(data=st.data())
def test_outputs_onto_devices_fifos_and_links_never_replace_them(data, fuzz_dir):
    """-o, --json and --junit onto a new file, a file, a folder, a FIFO (read, or with no
    reader), a character device (as root) or a link to one: a regular file is written or
    replaced, anything else is written into or refused in one line; none is turned into
    something else, and no temp file is left beside it."""
    import threading

    kinds = ["missing", "file", "dir", "fifo", "fifo-no-reader", "link->file", "link->fifo"] + (["chardev", "link->chardev"] if os.geteuid() == 0 else [])
    kind = data.draw(st.sampled_from(kinds))
    folder = Path(tempfile.mkdtemp(dir=fuzz_dir))
    out = folder / "out.json"  # a report file's name says its format (`-o out` is refused for that)
    _make_node(kind.replace("-no-reader", ""), out)
    before = _node_kind(out)
    baseline = folder / "b.json"
    baseline.write_text(_baseline_source())
    reader = None
    got: list[bytes] = []
    if kind in ("fifo", "link->fifo"):
        target = os.path.realpath(out)

        def read() -> None:
            with open(target, "rb") as fh:
                got.append(fh.read())

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
    args = _output_command(data.draw, out, str(baseline))
    code, _, err = run_cli(args, {"ADVISOR_CACHE": "off"})
    if reader is not None:
        if code == 2:  # refused before opening it: let the reader go
            with open(os.path.realpath(out), "wb"):
                pass
        reader.join(timeout=60)
        assert not reader.is_alive()
    assert code in (0, 1, 2), (code, err)
    assert_one_line_error(code, err)
    after = _node_kind(out)
    assert after == ("file" if before == "missing" and code != 2 else before), (kind, before, after, err)
    if kind in ("fifo", "link->fifo", "chardev", "link->chardev", "missing", "file", "link->file"):
        assert code in (0, 1), (kind, err)  # written (into it)
    if reader is not None:
        assert got and got[0].strip(), kind
    assert not [p.name for p in folder.iterdir() if p.name.startswith(".advisor-")], list(folder.iterdir())


# --- special files in log dirs and caches: no hang, no gigabytes read, nothing of others touched ----
SPECIAL_PLACES = ["facts", "trace", "beside-cache", "secret", "seal", "entry-file", "digest", "entry", "foreign-entry"]
SPECIAL_KINDS = ["fifo", "dev-zero", "sparse", "dir", "dangling", "link->victim-dir", "link->victim-file"]


@functools.cache
def _populated_cache() -> str:
    """A cache (ADVISOR_CACHE folder and user cache with its secret and hashes) holding the
    recorded run's entries, made once; each example works on a copy."""
    work = _work_dir("advisor-fuzz-special-")
    env = {"ADVISOR_CACHE": str(work / "cache"), "XDG_CACHE_HOME": str(work / "xdg")}
    code, _, err = run_cli(["report", "-f", "json", str(RECORDED_RUN)], env)
    assert code == 0, err
    return str(work)


def _snapshot(folder: Path) -> dict[str, bytes | None]:
    return {p.relative_to(folder).as_posix(): (p.read_bytes() if p.is_file() and not p.is_symlink() else None) for p in sorted(folder.rglob("*"))}


def _within(seconds: float, fn: Callable, *args: Any) -> Any:
    """fn(*args), or TimeoutError when it has not returned in time (a FIFO read would hang)."""
    import signal

    def late(signum, frame):
        raise TimeoutError(f"still running after {seconds} s: a hang")

    old = signal.signal(signal.SIGALRM, late)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return fn(*args)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@needs_recorded_run
@settings(FUZZ, max_examples=max(FUZZ.max_examples // 2, 1))
@given(data=st.data())
def test_special_files_in_log_dirs_and_caches_never_hang_or_reach_elsewhere(data, fuzz_dir):
    """A FIFO, a link to /dev/zero, a sparse 6 GiB file, a folder, a dangling link or a link to
    someone else's folder or file, put where a report reads or the cache keeps its files (the
    facts file, a trace, `.advisor-cache` beside the traces, the secret, a seal, an entry's
    file, a remembered hash, an entry, a folder named like one): `report`, `cache info` and
    `cache clear` end (exit 0, or 2 with one line) without hanging or reading gigabytes, the
    node is left where it was (the advisor did not make it; only an entry whose seal still
    holds is removed whole, the node inside it with it, never what a link in it points to),
    and nothing in the other folder is written, replaced or removed."""
    import resource
    import shutil

    place, kind = data.draw(st.sampled_from(SPECIAL_PLACES)), data.draw(st.sampled_from(SPECIAL_KINDS))
    folder = Path(tempfile.mkdtemp(dir=fuzz_dir))
    state = folder / "state"
    shutil.copytree(_populated_cache(), state, symlinks=True)
    cache, xdg = state / "cache", state / "xdg"
    home = xdg / "torch-advisor"
    log = folder / "log"
    log.mkdir()
    for p in RECORDED_RUN.iterdir():
        if p.name.endswith(".json.gz"):
            os.symlink(p, log / p.name)
        elif p.is_file():
            shutil.copyfile(p, log / p.name)
    victim = folder / "victim"
    (victim / "analysis-0000").mkdir(parents=True)
    (victim / "analysis-0000" / "seal.json").write_text('{"kind": "analysis"}')
    (victim / "notes.txt").write_text("someone else's\n")
    before = _snapshot(victim)
    entries = sorted(p for p in cache.iterdir() if p.name.startswith(("analysis-", "frames-")))
    target = {
        "facts": log / "advisor_facts.json",
        "trace": log / "extra.pt.trace.json",
        "beside-cache": log / ".advisor-cache",
        "secret": home / "secret.key",
        "seal": entries[0] / "seal.json",
        "entry-file": entries[0] / data.draw(st.sampled_from(sorted(p.name for p in entries[0].iterdir() if p.name != "seal.json"))),
        "digest": sorted((home / "digests").iterdir())[0],
        "entry": entries[0],
        "foreign-entry": cache / ("analysis-" + "ab" * 20),
    }[place]
    if target.is_dir() and not target.is_symlink():
        shutil.rmtree(target)
    elif os.path.lexists(target):
        target.unlink()
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "dev-zero":
        os.symlink("/dev/zero", target)
    elif kind == "sparse":
        with open(target, "wb") as f:
            f.truncate(6 * 2**30)
    elif kind == "dir":
        target.mkdir()
    elif kind == "dangling":
        os.symlink(folder / "nowhere", target)
    else:
        os.symlink(victim if kind == "link->victim-dir" else victim / "notes.txt", target)
    env = {
        "ADVISOR_CACHE": "beside" if place == "beside-cache" else str(cache),
        "XDG_CACHE_HOME": str(xdg),
        "ADVISOR_CACHE_MAX_BYTES": data.draw(st.sampled_from(["1", "2G"])),
    }
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    for args in (["report", "-f", "json", str(log)], ["cache", "info", str(log)], ["cache", "clear", str(log)]):
        code, _, err = _within(60, run_cli, args, env)
        assert code in (0, 2), (place, kind, args, code, err)
        assert_one_line_error(code, err)
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - peak
    assert grown < 2**30, (place, kind, f"peak RSS grew {grown / 2**20:.0f} MiB")
    assert _snapshot(victim) == before, (place, kind)
    if place != "entry-file":  # inside an entry still sealed, the whole entry is the advisor's to remove
        assert os.path.lexists(target), (place, kind, "removed a node the advisor did not make")


_INPUT_NAMES = ["trace", "facts", "pyproject.toml", "baseline", "budget", "other-facts", "fresh"]


@needs_recorded_run
@FUZZ
@given(data=st.data())
def test_outputs_never_replace_a_file_the_command_read(data, fuzz_dir):
    """Every command with every output option, aimed at any file it reads (the trace, the
    run's facts, the config, the baseline given or configured, a budget file, the baseline
    run's facts) or at a fresh name: an input is never changed (one line, exit 2)."""
    import shutil

    work = Path(tempfile.mkdtemp(dir=fuzz_dir))
    run = work / "run"
    shutil.copytree(RECORDED_RUN, run)
    other = work / "other"
    shutil.copytree(RECORDED_RUN, other)
    (work / "b.json").write_text(_baseline_source())
    (work / "budget.toml").write_text("max_step_time_ms = 100000\n")
    configured = data.draw(st.booleans())
    (work / "pyproject.toml").write_text('[tool.advisor.gate]\nbaseline = "b.json"\n' if configured else "[tool.advisor]\nignore = []\n")
    paths = {
        "trace": next(run.glob("*.pt.trace.json.gz")),
        "facts": run / "advisor_facts.json",
        "pyproject.toml": work / "pyproject.toml",
        "baseline": work / "b.json",
        "budget": work / "budget.toml",
        "other-facts": other / "advisor_facts.json",
    }
    inputs = {name: p.read_bytes() for name, p in paths.items()}
    target = data.draw(st.sampled_from(_INPUT_NAMES))
    out = paths.get(target, work / "fresh.json")
    if data.draw(st.booleans()):  # the same file by another spelling
        out = Path(os.path.relpath(out, work))
    command = data.draw(st.sampled_from(["report", "gate-json", "gate-junit", "gate-budget", "gate-other", "baseline"]))
    args = {
        "report": ["report", "run", "-f", "json", "-o", str(out)],
        "gate-json": ["gate", "run", *([] if configured else ["-b", "b.json"]), "--json", str(out)],
        "gate-junit": ["gate", "run", *([] if configured else ["-b", "b.json"]), "--junit", str(out)],
        "gate-budget": ["gate", "run", "--budget", "budget.toml", "--json", str(out)],
        "gate-other": ["gate", "run", "-b", "other", "--junit", str(out)],
        "baseline": ["baseline", "run", "-o", str(out)],
    }[command]
    cwd = os.getcwd()
    os.chdir(work)
    try:
        code, _, err = run_cli(args, {"ADVISOR_CACHE": "off"})
    finally:
        os.chdir(cwd)
    assert code in (0, 1, 2), (code, err)
    assert_one_line_error(code, err)
    reads = {"trace", "facts", "pyproject.toml"} | {
        "report": set(),
        "gate-json": {"baseline"},
        "gate-junit": {"baseline"},
        "gate-budget": {"budget"} | ({"baseline"} if configured else set()),
        "gate-other": {"other-facts"},
        "baseline": set(),
    }[command]
    for name in reads:
        assert paths[name].read_bytes() == inputs[name], (args, name, err)
    if target in reads:
        from advisor.output import REPORT_SUFFIXES

        # `report -o trace.json.gz` is refused first for its suffix, which names no report format
        by_suffix = command == "report" and Path(out).suffix.lower() not in REPORT_SUFFIXES
        said = "a report file is named for its format" if by_suffix else "is one of the files this command reads"
        assert code == 2 and said in err, (args, err)


_HOSTILE_PIECES = ["::", "##[", "error", "warning", "set-output name=x", " ", "\n", "\r", "\t", "\x1b", "\x1b[2J", "\x1b]0;t\x07",
                   "\x07", "\x00", "\x9b", "\x85", "\u2028", "\u202e", ":", "#", "[", "]", "%", "a", "x" * 30, "::error::", "##[error]"]


@needs_traces
@FUZZ
@given(data=st.data())
def test_trace_strings_never_issue_ci_commands(data, fuzz_dir):
    """A kernel name and a device name built from CI command pieces and control characters,
    in a small real trace, shown by report (text, -v, markdown) and gate (terminal, GitHub
    annotations, JUnit) at any width: no line a runner reads as a command, no control
    character, whatever the wrapping."""
    doc = copy.deepcopy(source_doc("misc/a100_alexnet.json.gz"))
    hostile = "".join(data.draw(st.lists(st.sampled_from(_HOSTILE_PIECES), min_size=1, max_size=12)))
    kernels = [e for e in doc["traceEvents"] if isinstance(e, dict) and e.get("cat") == "kernel"]
    for e in kernels[: data.draw(st.integers(1, 50))]:
        e["name"] = hostile + " " + e["name"]
    for d in doc.get("deviceProperties") or []:
        d["name"] = data.draw(st.sampled_from([hostile, "A100 " + hostile]))
    folder = Path(tempfile.mkdtemp(dir=fuzz_dir))
    trace = folder / "trace.json"
    trace.write_text(json.dumps(doc))
    columns = str(data.draw(st.integers(20, 140)))
    junit = folder / "g.xml"
    args = data.draw(st.sampled_from([
        ["report", str(trace)], ["report", str(trace), "-v"], ["report", str(trace), "-f", "markdown", "-v"],
        ["gate", str(trace), "--max-step-time-ms", "0.001", "--junit", str(junit)],
    ]))
    code, out, err = run_cli(args, {"ADVISOR_CACHE": "off", "COLUMNS": columns, "GITHUB_ACTIONS": "true"})
    assert code in (0, 1, 2), (code, err)
    assert_one_line_error(code, err)
    texts = [out, err] + ([junit.read_text(encoding="utf-8")] if junit.exists() else [])
    for text in texts:
        assert not re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202e]", text.replace("\n", "")), repr(text[:200])
        for line in text.splitlines():
            assert "##[" not in line, line
            if line.startswith(("::error title=advisor gate", "::warning title=advisor gate")):
                continue
            assert not line.lstrip().startswith("::"), line


# --- advisor fix over generated call shapes ---------------------------------------------------
# Findings as `advisor fix` reads them from a report (one worker asked for, the optimizer's
# multi-tensor step, set_to_none, pinned memory), and scripts generated around the calls they
# edit: positional and keyword arguments in any mix, a bare generator as the only argument,
# `*args` and `**kwargs`, one line or one argument per line, trailing commas, comments after
# arguments, the closing bracket on its own line, num_workers from a literal, an argparse
# switch, a plain name or a config object, or passed sixth by position; LF, CRLF or CR line
# endings, with or without a BOM.
FIX_FINDINGS = [
    {"rule": "dataloader-stall", "message": "", "fix": {"text": "set num_workers=2"}},
    {"rule": "single-tensor-optimizer", "message": "", "fix": {"text": "foreach=True"}},
    {"rule": "zero-grad-memset", "message": "", "fix": {"text": "set_to_none=True"}},
    {"rule": "h2d-pageable-copy", "message": "", "fix": {"text": "pin_memory=True"}},
]
_WORKERS = {  # num_workers's value -> the lines that set it up
    "0": [], "2": [], "4": [],
    "args.workers": ["import argparse", "p = argparse.ArgumentParser()", 'p.add_argument("--workers", type=int, default=0)', "args = p.parse_args([])"],
    "w": ["w = 0"],
    "cfg.workers": ["class cfg:", "    workers = 0"],
}  # fmt: skip


BARE = ("x for x in", "p for p in")  # a generator without its own parentheses: only as a call's sole argument


def _call(draw: Callable, name: str, args: list[str], indent: str = "") -> list[str]:
    """The source lines of one call, in a drawn layout."""
    layout = draw(st.sampled_from(["line", "per-line", "hanging"])) if args else "line"
    trailing = draw(st.booleans()) and args and not any(a.startswith(BARE) for a in args)  # a bare generator takes no comma
    comment = [draw(st.sampled_from(["", "  # note", "  # (a, b=1)"])) for _ in args]
    if layout == "line":
        return [f"{indent}{name}(" + ", ".join(args) + ("," if trailing else "") + ")" + comment[-1:][0] if args else f"{indent}{name}()"]
    if layout == "per-line":
        lines = [f"{indent}{name}(" + draw(st.sampled_from(["", "  # open"]))]
        for i, a in enumerate(args):
            comma = "," if i < len(args) - 1 or trailing else ""
            lines.append(f"{indent}    {a}{comma}{comment[i]}")
        lines.append(f"{indent})")
        return lines
    first, rest = args[0], args[1:]
    head = f"{indent}{name}("
    lines = [head + first + ("," if rest or trailing else "") + (comment[0] if rest else "")]
    for i, a in enumerate(rest):
        comma = "," if i < len(rest) - 1 or trailing else ""
        lines.append(" " * len(head) + a + comma + (comment[i + 1] if i < len(rest) - 1 else ""))
    lines[-1] += ")"
    return lines


def _script(draw: Callable) -> tuple[str, list[tuple[int, int]]]:
    """(source with LF endings, the line ranges (1-based, inclusive) of the statements the fixes may edit)."""
    lines = [draw(st.sampled_from(["", "# a training script", '"""Docstring."""']))]
    lines += ["import torch", "from torch.utils.data import DataLoader", ""]
    workers = draw(st.sampled_from(sorted(_WORKERS)))
    editable: list[tuple[int, int]] = []
    for line in _WORKERS[workers]:
        lines.append(line)
        if "add_argument" in line or line == "w = 0":
            editable.append((len(lines), len(lines)))
    lines += ["ds = [torch.zeros(2) for _ in range(8)]", "device = 'cpu'", "model = torch.nn.Linear(2, 2)"]

    def statement(prefix: str, name: str, positional: list[str], keywords: list[tuple[str, str]], indent: str = "", star: bool = False) -> None:
        body = _call(draw, name, positional + [f"{k}={v}" for k, v in keywords] + (["**{}"] if star else []), indent)
        body[0] = body[0][: len(indent)] + prefix + body[0][len(indent):]
        start = len(lines) + 1
        lines.extend(body)
        editable.append((start, len(lines)))

    opt_pos = draw(st.sampled_from([["model.parameters()"], ["list(model.parameters())", "0.1"], ["(p for p in model.parameters())"]]))
    opt_kw = draw(st.lists(st.sampled_from([("lr", "0.1"), ("weight_decay", "0.0"), ("foreach", "False"), ("foreach", "None")]), max_size=2, unique_by=lambda kv: kv[0]))
    if draw(st.booleans()):
        opt_pos, opt_kw = ["p for p in model.parameters() if p.requires_grad"], []
    statement("opt = ", "torch.optim.AdamW", opt_pos, opt_kw)
    dl_pos = draw(st.sampled_from([["ds"], ["ds", "4"], ["(x for x in ds)"], ["*[ds]"], []]))
    if draw(st.integers(0, 3)) == 0:
        dl_pos = ["ds", "4", "False", "None", "None"]
    dl_kw = [("num_workers", workers)] if draw(st.booleans()) or workers not in ("0", "2", "4") else []
    if len(dl_pos) == 5 and dl_kw:  # num_workers sixth by position (then pin_memory eighth, sometimes)
        dl_pos, dl_kw = dl_pos + [workers] + draw(st.sampled_from([[], ["None", "False"], ["None", "True"]])), []
    dl_kw += draw(st.lists(st.sampled_from([("batch_size", "4"), ("shuffle", "False"), ("persistent_workers", "False"), ("pin_memory", "False")]), max_size=3, unique_by=lambda kv: kv[0]))
    if not dl_pos:
        dl_kw = [("dataset", "ds"), *dl_kw]
    plain = 0 if dl_pos[:1] == ["*[ds]"] else len(dl_pos)
    dl_kw = [(k, v) for k, v in dl_kw if k not in _LOADER_PARAMETERS[:plain]]  # the script runs: nothing given twice
    if draw(st.integers(0, 3)) == 0:
        dl_pos, dl_kw = ["x for x in ds"], []
    statement("loader = ", "DataLoader", dl_pos, dl_kw, star=bool(dl_kw) and draw(st.integers(0, 9)) == 0)  # **kwargs: the fix is not placed
    lines.append("for x in loader:")
    if draw(st.booleans()):
        statement("x = ", "x.to", ["device"], draw(st.sampled_from([[], [("non_blocking", "False")]])), indent="    ")
    statement("", "opt.zero_grad", [], draw(st.sampled_from([[], [("set_to_none", "False")], [("set_to_none", "True")]])), indent="    ")
    lines.append("    opt.step()  # the step")
    lines.append("")
    return "\n".join(lines), editable


# torch.utils.data.DataLoader's parameters that may be given by position (its signature in
# PyTorch 2.x: the rest are keyword-only).
_LOADER_PARAMETERS = ("dataset", "batch_size", "shuffle", "sampler", "batch_sampler", "num_workers", "collate_fn",
                      "pin_memory", "drop_last", "timeout", "worker_init_fn", "multiprocessing_context", "generator")


def _no_argument_given_twice(source: bytes) -> None:
    """No DataLoader call of SOURCE passes a parameter by position and by keyword (compile()
    accepts it; the call fails with "got multiple values for argument" when it runs)."""
    import ast

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "DataLoader":
            plain = 0
            for a in node.args:
                if isinstance(a, ast.Starred):
                    break
                plain += 1
            twice = set(_LOADER_PARAMETERS[:plain]) & {k.arg for k in node.keywords}
            assert not twice, (twice, ast.unparse(node))


@FUZZ
@given(data=st.data())
def test_fix_writes_code_that_compiles_and_changes_only_the_fixs_lines(data):
    """A generated script, fixed and written as `advisor fix --write` writes it: the written
    file compiles, keeps its line endings and byte order mark, differs from the original only
    in the lines of the statements the fixes edit, and fixing it again changes nothing."""
    import codecs
    import difflib

    from advisor.cli.fix import write_fixed
    from advisor.fix import plan_fixes

    text, editable = _script(data.draw)
    newline = data.draw(st.sampled_from(["\n", "\r\n", "\r"]))
    bom = data.draw(st.booleans())
    original = (codecs.BOM_UTF8 if bom else b"") + text.replace("\n", newline).encode()
    compile(original, "train.py", "exec")  # the generated script itself is valid Python
    folder = Path(tempfile.mkdtemp(prefix="advisor-fuzz-fix-"))
    try:
        path = folder / "train.py"
        path.write_bytes(original)
        chosen = data.draw(st.lists(st.sampled_from(FIX_FINDINGS), min_size=1, max_size=4, unique_by=lambda f: f["rule"]))
        plan = plan_fixes(path, chosen)
        if not plan.changed:
            return
        write_fixed(plan, plan.fixed_bytes(), force=False)  # InputError here (it would not compile) fails the test
        written = path.read_bytes()
        assert (folder / "train.py.orig").read_bytes() == original
        compile(written, "train.py", "exec")
        _no_argument_given_twice(written)
        assert written.startswith(codecs.BOM_UTF8) == bom
        if newline == "\r\n":
            assert written.count(b"\n") == written.count(b"\r\n"), written
        elif newline == "\r":
            assert b"\n" not in written and written.endswith(b"\r"), written
        else:
            assert b"\r" not in written, written
        before = original.decode("utf-8-sig").split(newline)
        after = written.decode("utf-8-sig").split(newline)
        allowed = {n for a, b in editable for n in range(a, b + 1)}
        for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, before, after, autojunk=False).get_opcodes():
            if tag == "equal":
                continue
            touched = set(range(i1 + 1, i2 + 1)) if i2 > i1 else {i1, i1 + 1}  # an insertion: beside an edited line
            assert touched & allowed if i2 == i1 else touched <= allowed, (tag, before[i1:i2], after[j1:j2], text)
        again = plan_fixes(path, chosen)
        assert not again.changed, (again.diff(), text)
    finally:
        import shutil

        shutil.rmtree(folder, ignore_errors=True)


# --- the loader's chunk edges: the typed decode and its fallback agree -------------------------
# A trace the typed decoder refuses (a value of an odd type) is decoded again CHUNK_EVENTS
# events at a time, each refused event cleaned up alone and the typed decode resumed after it
# (advisor.load.decode._decode_chunk). Generated traces of about one or two chunks, with odd
# events put at and around the chunk edges, must give the frames of the lenient reading (every
# chunk cleaned up whole), batched or not, or the same one-line refusal.
def _odd(change: Callable[[dict, int], None]) -> Callable[[list, int, int], None]:
    """A change to one event of a list, made where the event is still an object."""
    def apply(events: list, at: int, n: int) -> None:
        if isinstance(events[at], dict):
            change(events[at], n)
    return apply


ODD_EVENTS: dict[str, Callable[[list, int, int], None]] = {
    "dur as text": _odd(lambda e, n: e.update(dur=str(e.get("dur")))),
    "unknown ph": _odd(lambda e, n: e.update(ph="Q")),
    "ph quoting a path": _odd(lambda e, n: e.update(ph=f"- at `$[{n}]`")),
    "ph quoting a field path": _odd(lambda e, n: e.update(ph=f"x - at `$[{n}].ph`")),
    "args as a list": _odd(lambda e, n: e.update(args=[1, 2])),
    "external id as text": _odd(lambda e, n: e.update(args={"External id": str(n)})),
    "huge integer": _odd(lambda e, n: e.update(tid=10**30)),
    "lone surrogate in the name": _odd(lambda e, n: e.update(name=f"{e.get('name')}\ud800")),
    "NaN duration": _odd(lambda e, n: e.update(dur=float("nan"))),
    "not an object": lambda events, at, n: events.__setitem__(at, [n]),
}


def _chunk_edge_trace(draw: Callable) -> bytes:
    from advisor.load.decode import CHUNK_EVENTS

    n = draw(st.sampled_from([CHUNK_EVENTS - 1, CHUNK_EVENTS, CHUNK_EVENTS + 1, 2 * CHUNK_EVENTS - 1, 2 * CHUNK_EVENTS + 1]) | st.integers(1, 2 * CHUNK_EVENTS + 100))
    events: list[Any] = []
    for i in range(n):
        if i % 2:
            events.append({"ph": "X", "cat": "kernel", "name": f"k{i % 5}", "pid": 0, "tid": 7, "ts": 10 * i + 2, "dur": 3, "args": {"External id": i, "device": 0, "stream": 7}})
        else:
            events.append({"ph": "X", "cat": "cpu_op", "name": f"aten::op{i % 7}", "pid": 1, "tid": 1, "ts": 10 * i, "dur": 5, "args": {"External id": i + 1}})
    edges = [0, 1, CHUNK_EVENTS - 2, CHUNK_EVENTS - 1, CHUNK_EVENTS, CHUNK_EVENTS + 1, 2 * CHUNK_EVENTS - 1, 2 * CHUNK_EVENTS, n - 1]
    places = draw(st.lists(st.sampled_from([p for p in edges if 0 <= p < n]) | st.integers(0, n - 1), min_size=1, max_size=12))  # past REJECTED_ALONE too
    for at in places:
        ODD_EVENTS[draw(st.sampled_from(sorted(ODD_EVENTS)))](events, at, draw(st.integers(0, 3 * CHUNK_EVENTS)))
    doc: dict[str, Any] = {"traceEvents": events}
    if draw(st.booleans()):  # a lone surrogate in the document's last string
        doc["traceName"] = "run\ud83d"
    return json.dumps(doc, allow_nan=True, separators=(",", ":")).encode()


@settings(FUZZ, max_examples=max(FUZZ.max_examples // 2, 1))
@given(data=st.data())
def test_chunked_decoding_agrees_with_the_lenient_reading_at_chunk_edges(data, monkeypatch):
    from advisor.load import decode
    from advisor.load.trace import frames_from_bytes
    from test_load import assert_same_frames

    raw = _chunk_edge_trace(data.draw)
    path = Path("edges.pt.trace.json")
    sizes = data.draw(st.sampled_from([{}, {"batch_threshold": 0, "batch_bytes": data.draw(st.sampled_from([4096, 65536, 1 << 20]))}]))

    def frames(**kw: int) -> Any:
        try:
            return frames_from_bytes(path, bytearray(raw), **kw)
        except InputError as exc:
            assert "\n" not in exc.line() and str(path) in exc.line()
            return exc.line()

    typed = frames(**sizes)
    monkeypatch.setattr(decode, "REJECTED_ALONE", 0)  # every chunk a refused event is in, cleaned up whole
    lenient = frames(**sizes)
    whole = frames()  # the document at once (its own fallback: the lenient reading of all of it)
    for other in (lenient, whole):
        if isinstance(typed, str) or isinstance(other, str):
            assert typed == other
        else:
            assert_same_frames(typed, other)


# --- the roofline's shapes: no cost from a shape no run has, no rate past the device ------------
ROOFLINE_OPS = [
    ("aten::mm", 2), ("aten::addmm", 3), ("aten::bmm", 2), ("aten::baddbmm", 3), ("aten::linear", 3), ("aten::_scaled_mm", 5),
    ("aten::convolution", 3), ("aten::convolution_backward", 4), ("aten::_scaled_dot_product_flash_attention", 3),
    ("aten::_flash_attention_forward", 3), ("aten::native_layer_norm", 4), ("aten::native_batch_norm", 5), ("aten::_softmax", 1),
    ("aten::add", 2), ("aten::mul", 2), ("aten::relu", 1), ("aten::sum", 1), ("aten::_fused_adam_", 5), ("aten::_foreach_add_", 2),
]
_DIM = st.integers(-3, 70) | st.sampled_from([0, 1, 4095, 4096, 10**6, 10**12, 2**62]) | st.sampled_from([True, False, 2.0, -1.5, None, "8"])
_SHAPE = st.lists(_DIM, min_size=0, max_size=5)
_DTYPES = ["float", "c10::BFloat16", "c10::Half", "c10::Float8_e4m3fn", "long int", "bool", "", "Scalar", "odd"]
_CONCRETE = st.sampled_from(["", "[1, 1]", "[0, 0]", "[2, 2]", "[-1, -1]", "[3]", "1", "0", "-1", "True", "False", "[True, True, False]", "[64]", "1e400", "[", "None"])


def _roofline_inputs(draw: Callable) -> tuple[str, tuple, list, list]:
    op, n = draw(st.sampled_from(ROOFLINE_OPS))
    dims: list[Any] = [draw(_SHAPE | st.lists(_SHAPE, max_size=3)) if op.startswith(("aten::_fused", "aten::_foreach")) else draw(_SHAPE) for _ in range(n)]
    if draw(st.booleans()):  # a real-looking shape beside the odd ones
        dims[0] = draw(st.lists(st.integers(1, 512), min_size=2, max_size=4))
    types = tuple(draw(st.lists(st.sampled_from(_DTYPES), min_size=0, max_size=n + 1)))
    concrete = [draw(_CONCRETE) for _ in range(draw(st.integers(0, 16)))]
    if draw(st.integers(0, 2)) == 0:  # shapes of one rank with the scalar arguments a convolution takes
        op, n = draw(st.sampled_from([("aten::convolution", 3), ("aten::convolution_backward", 4), ("aten::_scaled_dot_product_flash_attention", 3), ("aten::bmm", 2)]))
        rank = draw(st.integers(3, 5))
        dims = [draw(st.lists(st.integers(0, 9), min_size=rank, max_size=rank)) for _ in range(n)]
        types = ("float",) * n
        ints = st.sampled_from(["[1]", "[2]", "[0]", "[-1]", "[3]", "[1, 1]", "[2, 2]", "[0, 0]", "[-1, -1]", "[5, 5]"])
        concrete = ["", "", "", draw(ints), draw(ints), draw(ints), draw(st.sampled_from(["False", "True"])), draw(ints), "1", "", ""]
    return op, types, dims, concrete


def _unusable(shape: Any) -> bool:
    """Not a shape a run records: not a list, a dimension that is not a whole number >= 0
    (bools included), or a list of tensor shapes none of which is usable."""
    if not isinstance(shape, list):
        return True
    if shape and all(isinstance(s, list) for s in shape):
        return all(_unusable(s) for s in shape)
    return any(type(x) is not int or x < 0 for x in shape)


@settings(FUZZ, max_examples=FUZZ.max_examples * 5)
@given(data=st.data())
def test_op_cost_is_none_or_non_negative_for_any_shape(data):
    """Any Input Dims, types and scalar arguments: no exception, and a cost that is None or
    non-negative FLOPs and bytes; an op whose every input shape has a negative or non-integer
    dimension is never costed."""
    from advisor.metrics.op_cost import op_cost

    op, types, dims, concrete = _roofline_inputs(data.draw)
    cost = op_cost(op, types, dims, concrete)
    if cost is None:
        return
    assert cost.flops >= 0 and cost.bytes >= 0, (op, types, dims, concrete, cost)
    assert not re.search(r"(?<![\w.])-\d", cost.shape), (op, dims, concrete, cost)  # no negative dimension, read or derived
    assert not all(_unusable(s) for s in dims), (op, dims, cost)


@FUZZ
@given(data=st.data())
def test_the_roofline_never_shows_a_rate_past_the_device(data):
    """A kernel table of generated ops (odd shapes, any kernel time down to 0.001 µs) on a
    device from the table, or one it does not know: every row the roofline keeps is within
    twice the device's fastest peak and CACHE_SLACK times its bandwidth (the bounds past which
    it leaves a row out, with a note), with non-negative FLOPs, bytes and time."""
    import numpy as np
    import pandas as pd

    from advisor.metrics.devices import PRECISIONS, known_devices
    from advisor.metrics.roofline import CACHE_SLACK, roofline

    device = data.draw(st.sampled_from([c.name for c in known_devices()] + ["Mystery GPU", None]))
    rows = []
    for i in range(data.draw(st.integers(1, 12))):
        op, types, dims, concrete = _roofline_inputs(data.draw)
        for _ in range(data.draw(st.integers(1, 3))):  # kernels of the op
            rows.append({"ts": 1000 * i + len(rows), "dur": data.draw(st.sampled_from([1, 2, 10, 1000, 10**6])), "op": op,
                         "op_input_types": "[" + ", ".join(f'"{t}"' for t in types) + "]", "op_input_dims": dims,
                         "op_concrete_inputs": concrete, "external_id": i, "name": f"kernel_{i}", "precision": ""})
    k = pd.DataFrame(rows)
    steps = pd.DataFrame({"start": np.array([0], dtype=np.int64), "end": np.array([10**9], dtype=np.int64)})
    roof, kernel_row, table = roofline(k, steps, device, True)
    if len(table) == 0:
        return
    ceiling = roof.device
    devices = [ceiling] if ceiling is not None else known_devices()
    max_tflops = 2 * max((c.peak_tflops(p) or 0.0) for c in devices for p in PRECISIONS)
    max_tbps = CACHE_SLACK * ceiling.memory_tbps if ceiling is not None else 50.0
    assert (table["tflops"] <= max_tflops).all() and (table["tbps"] <= max_tbps).all(), table[["op", "shape", "tflops", "tbps"]]
    assert (table["flops"] >= 0).all() and (table["bytes"] >= 0).all() and (table["time_ms"] >= 0).all()
    assert len(kernel_row) == len(k) and kernel_row.max() < len(table)


# --- one fixed case per failure class (regressions, no randomness) ---------------------------
def _doc_with(change: Callable[[dict], None]) -> dict:
    doc = copy.deepcopy(source_doc("misc/amd_mi250_minitoy.json.gz"))
    change(doc)
    return doc


def _every_event(fn: Callable[[dict], None]) -> Callable[[dict], None]:
    def change(doc: dict) -> None:
        for e in doc["traceEvents"]:
            fn(e)
    return change


FIXED_CASES: dict[str, Callable[[], bytes]] = {
    "NaN and Infinity literals": lambda: json.dumps(_doc_with(_every_event(lambda e: e.update(ts=float("nan")) if e.get("cat") == "kernel" else e.update(dur=float("inf")) if e.get("cat") == "cpu_op" else None))).encode(),
    "huge integers": lambda: json.dumps(_doc_with(_every_event(lambda e: e.update(ts=10**40, tid=10**30) if e.get("ph") == "X" and e.get("cat") == "cuda_runtime" else None))).encode(),
    "negative durations": lambda: json.dumps(_doc_with(_every_event(lambda e: e.update(dur=-5) if "dur" in e else None))).encode(),
    "args of the wrong type": lambda: json.dumps(_doc_with(_every_event(lambda e: e.update(args=[1, 2]) if e.get("cat") == "kernel" else None))).encode(),
    "names that are numbers": lambda: json.dumps(_doc_with(_every_event(lambda e: e.update(name=7)))).encode(),
    "duplicated correlation ids": lambda: json.dumps(_doc_with(_every_event(lambda e: e["args"].update(correlation=1) if isinstance(e.get("args"), dict) else None))).encode(),
    "unsorted events": lambda: json.dumps(_doc_with(lambda d: d["traceEvents"].reverse())).encode(),
    "non-UTF-8 bytes in a name": lambda: json.dumps(source_doc("misc/amd_mi250_minitoy.json.gz")).encode().replace(b'"name": "', b'"name": "\xff\xfe', 5),
    "events that are not objects": lambda: json.dumps(_doc_with(lambda d: d["traceEvents"].extend([1, "x", None, [2]]))).encode(),
    "no timestamps at all": lambda: json.dumps(_doc_with(_every_event(lambda e: e.pop("ts", None)))).encode(),
    "a bare event array": lambda: json.dumps(source_doc("misc/amd_mi250_minitoy.json.gz")["traceEvents"]).encode(),
    "only metadata events": lambda: json.dumps(_doc_with(lambda d: d.update(traceEvents=[e for e in d["traceEvents"] if e.get("ph") == "M"]))).encode(),
    "step markers with odd numbers": lambda: json.dumps(_doc_with(_every_event(lambda e: e.update(name="ProfilerStep#99999999999999999999999") if e.get("cat") == "user_annotation" else None))).encode(),
    "odd rank and device properties": lambda: json.dumps(_doc_with(lambda d: d.update(distributedInfo={"rank": float("nan")}, deviceProperties=[{"id": "0", "totalGlobalMem": "lots", "computeMajor": 1e300}]))).encode(),
}


@needs_traces
@pytest.mark.parametrize("case", sorted(FIXED_CASES))
def test_odd_but_valid_traces_are_analysed_or_refused_in_one_line(case, tmp_path, monkeypatch):
    monkeypatch.setenv("ADVISOR_CACHE", "off")
    path = tmp_path / "trace.pt.trace.json"
    path.write_bytes(FIXED_CASES[case]())
    check_pipeline(path)


# --- coverage-guided fuzzing with atheris (optional, not part of the test run) ---------------
def _atheris_main() -> None:  # pragma: no cover - run by hand
    import atheris

    # imported here, instrumented, so libFuzzer gets coverage feedback from the pipeline
    with atheris.instrument_imports(include=["advisor"]):
        import advisor.analysis
        import advisor.render.json_report
        import advisor.render.text  # noqa: F401

    docs = [source_doc(s) for s in SOURCES]
    work = _work_dir("advisor-atheris-")
    os.environ["ADVISOR_CACHE"] = "off"

    def one_input(buf: bytes) -> None:
        fdp = atheris.FuzzedDataProvider(buf)
        doc = copy.deepcopy(docs[fdp.ConsumeIntInRange(0, len(docs) - 1)])
        evs = doc["traceEvents"]
        for _ in range(fdp.ConsumeIntInRange(0, 8)):
            if not evs:
                break
            e = evs[fdp.ConsumeIntInRange(0, len(evs) - 1)]
            key = (EVENT_KEYS + ARG_KEYS)[fdp.ConsumeIntInRange(0, len(EVENT_KEYS + ARG_KEYS) - 1)]
            target = e["args"] if key in ARG_KEYS and isinstance(e.get("args"), dict) else e
            choice = fdp.ConsumeIntInRange(0, 4)
            target[key] = [None, fdp.ConsumeInt(16), fdp.ConsumeFloat(), fdp.ConsumeUnicodeNoSurrogates(8), [fdp.ConsumeInt(4)]][choice]
        data = json.dumps(doc).encode()
        cut = fdp.ConsumeIntInRange(0, 3)
        if cut == 0:
            data = data[: fdp.ConsumeIntInRange(0, len(data))]
        path = work / "trace.pt.trace.json"
        path.write_bytes(data)
        check_pipeline(path)

    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


# --- the long run: every harness, for as long as asked ---------------------------------------
LONG_RUN_HARNESSES = [
    "test_pipeline_survives_mutated_real_traces",
    "test_loader_survives_mutated_real_traces",
    "test_pipeline_survives_mutated_facts_of_a_recorded_run",
    "test_reports_survive_mutated_cache_entries",
    "test_gate_survives_mutated_baselines",
    "test_outputs_onto_devices_fifos_and_links_never_replace_them",
    "test_outputs_never_replace_a_file_the_command_read",
    "test_trace_strings_never_issue_ci_commands",
    "test_fix_writes_code_that_compiles_and_changes_only_the_fixs_lines",
    "test_special_files_in_log_dirs_and_caches_never_hang_or_reach_elsewhere",
    "test_chunked_decoding_agrees_with_the_lenient_reading_at_chunk_edges",
    "test_op_cost_is_none_or_non_negative_for_any_shape",
    "test_the_roofline_never_shows_a_rate_past_the_device",
]


def _counted(inner: Callable, count: list[int], work: Path) -> Callable:
    """The harness body with its fixtures made here (a temp folder, a MonkeyPatch), counted."""
    params = set(inspect.signature(inner).parameters)

    def counted(data):
        count[0] += 1
        kwargs: dict[str, Any] = {"data": data}
        mp = pytest.MonkeyPatch()
        if "fuzz_dir" in params:
            kwargs["fuzz_dir"] = Path(tempfile.mkdtemp(dir=work))
        if "monkeypatch" in params:
            kwargs["monkeypatch"] = mp
        try:
            inner(**kwargs)
        finally:
            mp.undo()

    return counted


def long_run(minutes: float, batch: int = 25) -> int:  # pragma: no cover - run by hand
    """Run every harness in turn, `batch` random examples at a time (no shrinking, no
    database), until `minutes` have passed; print examples and failures per harness.
    Exit status 1 when any example failed (a crash, or a report that does not add up)."""
    import time
    import traceback

    os.environ.setdefault("ADVISOR_CACHE", "off")
    counts = {name: [0, 0] for name in LONG_RUN_HARNESSES}
    failures: list[str] = []
    work = _work_dir("advisor-fuzz-long-")
    deadline = time.monotonic() + minutes * 60
    rounds = 0
    while time.monotonic() < deadline:
        rounds += 1
        for name in LONG_RUN_HARNESSES:
            counted = _counted(globals()[name].hypothesis.inner_test, counts[name], work)
            test = settings(max_examples=batch, deadline=None, database=None, phases=[Phase.generate],
                            suppress_health_check=list(HealthCheck))(given(data=st.data())(counted))
            try:
                test()
            except Exception:  # noqa: BLE001 - recorded and reported, the run goes on
                counts[name][1] += 1
                failures.append(f"{name}: {traceback.format_exc(limit=-3)}")
            if time.monotonic() >= deadline:
                break
        print(f"round {rounds}: " + ", ".join(f"{n.removeprefix('test_')} {c[0]} examples/{c[1]} failed" for n, c in counts.items()), flush=True)
    total, failed = sum(c[0] for c in counts.values()), sum(c[1] for c in counts.values())
    print(f"{minutes:g} min: {total} examples over {len(counts)} harnesses, {failed} failing batch(es)")
    for f in failures:
        print(f)
    return 1 if failed else 0


if __name__ == "__main__":  # pragma: no cover
    if len(sys.argv) >= 3 and sys.argv[1] == "--minutes":
        sys.exit(long_run(float(sys.argv[2])))
    _atheris_main()
