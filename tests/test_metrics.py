"""Step-time metrics on real traces, cross-checked live against the TensorBoard profiler
plugin (torch-tb-profiler) where its numbers are right, and against the raw events where
they are not (current-schema runtime and DataLoader time, which the plugin reports as 0)."""

from __future__ import annotations

import gzip

import numpy as np
import orjson
import pytest
from conftest import shared_trace, single_file

from advisor.analysis import analyze
from advisor.load.trace import load_trace
from advisor.metrics.breakdown import CATEGORIES
from advisor.metrics.intervals import covers, covers_bounds, merge, overlap_with, sorted_unique, total
from advisor.metrics.summary import compute_metrics

PLUGIN_ROLES = ["kernel", "memcpy", "memset", "communication", "runtime", "dataloader", "cpu_exec", "other"]


def plugin_breakdown(path):
    """Mean ms per category and per-step ms, as torch-tb-profiler 0.4.3 computes them."""
    data = pytest.importorskip("torch_tb_profiler.profiler.data", reason="torch-tb-profiler is not installed")
    profile = data.RunProfileData.parse("worker0", 0, str(path), None)
    costs = profile.avg_costs.costs
    per_step = [c.costs[8] / 1000.0 for c in profile.steps_costs]
    return {role: costs[i] / 1000.0 for i, role in enumerate(PLUGIN_ROLES)}, np.array(per_step), profile


@pytest.mark.parametrize("run", ["v100_resnet50_nw0", "v100_resnet50_nw4"])
def test_breakdown_agrees_with_tensorboard_plugin(run):
    path = single_file(shared_trace(run))
    theirs, their_steps, profile = plugin_breakdown(path)
    m = compute_metrics(load_trace(path))
    ours = m.breakdown_mean_ms
    step = float(m.step_ms.mean())
    assert len(m.steps) == len(their_steps)
    # every step but the last as the plugin spans it; the plugin stretches the last step to the
    # end of its device work, the advisor no further past its mark than the other steps' work
    # ran past theirs or its own work started into it (nw4's last ran 8.05 ms past its mark,
    # the others' at most 3.26 ms past theirs, its own first kernel 4.37 ms into its mark: it
    # ends 4.37 ms past its mark, 3.69 ms shorter), so it is never longer than the plugin's
    np.testing.assert_allclose(m.step_ms[:-1], their_steps[:-1], rtol=1e-3)
    assert m.step_ms[-1] <= their_steps[-1] * (1 + 1e-3)
    for cat in CATEGORIES:
        assert abs(ours[cat] - theirs[cat]) <= 0.02 * step, (cat, ours[cat], theirs[cat])
    # the categories add up to the step
    assert sum(ours.values()) == pytest.approx(step, rel=1e-6)
    # Tensor Core figures: both say 0% used; eligible share within 2 points of the plugin's
    assert m.tensor_core_kernel_share == pytest.approx(profile.tc_used_ratio / 100.0, abs=1e-6)
    assert m.tensor_core_eligible_share == pytest.approx(profile.tc_eligible_ops_kernel_ratio, abs=0.02)


def test_nw0_matches_published_anchor(nw0):
    """ANCHORS.md: DataLoader is 33.4% of the step on nw0; GPU (kernel-only) util 55.5%."""
    m = compute_metrics(load_trace(single_file(nw0)))
    bd = m.breakdown_mean_ms
    assert bd["dataloader"] / sum(bd.values()) == pytest.approx(0.334, abs=0.005)
    assert bd["kernel"] / sum(bd.values()) == pytest.approx(0.555, abs=0.005)
    # our utilisation counts copies and memsets too, so it is a little higher
    assert 0.555 < m.gpu_utilization < 0.58


def test_h2d_copies_are_pageable_19mb_at_10gbs(nw0):
    m = compute_metrics(load_trace(single_file(nw0)))
    h = m.h2d
    assert h["count"] == 12 and h["pageable_count"] == 12 and h["pinned_count"] == 0
    # one image batch (32×3×224×224 fp32) and one label batch (32 int64) per step
    frames = load_trace(single_file(nw0))
    from advisor.metrics.copies import h2d_copies

    sizes = sorted(h2d_copies(frames)["bytes"].astype(int).tolist())
    assert sizes == [32 * 8] * 6 + [32 * 3 * 224 * 224 * 4] * 6
    assert h["bytes"] == sum(sizes)
    assert 9 < h["bandwidth_gbps"] < 11


def test_current_schema_counts_runtime_and_dataloader():
    """The plugin reports runtime = 0 on current-schema traces; the raw events say otherwise."""
    path = shared_trace("misc/a100_80gb_train.json.gz")
    frames = load_trace(path)
    m = compute_metrics(frames)
    assert m.breakdown_mean_ms["runtime"] > 0
    doc = orjson.loads(gzip.decompress(path.read_bytes()))
    rt = [(e["ts"], e["ts"] + e["dur"]) for e in doc["traceEvents"] if e.get("cat") == "cuda_runtime" and e.get("ph") == "X"]
    # runtime time not hidden behind device work can never exceed the union of runtime calls
    s, e = np.array(rt).T * 1000
    assert m.breakdown["runtime"].sum() <= total(s.astype(np.int64) - int(frames.base_us * 1000), e.astype(np.int64) - int(frames.base_us * 1000))
    # pageable and pinned copies are both seen in this trace
    assert m.h2d["pageable_count"] > 0 and m.h2d["pinned_count"] > 0


def test_no_step_markers_and_nothing_repeating_is_one_step_and_said():
    a = analyze(shared_trace("misc/old_schema_inference.json.gz"))  # kernels and runtime calls only
    assert a.summary()["steps"] == 1
    assert any("no ProfilerStep markers: the whole trace window" in n for n in a.notes())


def test_peak_memory_is_device_memory_not_cpu(nw0):
    """This 2021 trace has only per-allocation sizes: the peak is the running sum's maximum
    over CUDA events (device type 1), never the CPU's (type 0)."""
    path = single_file(nw0)
    m = compute_metrics(load_trace(path))
    doc = orjson.loads(gzip.decompress(path.read_bytes()))
    mem = sorted((e["ts"], e["args"]["Bytes"]) for e in doc["traceEvents"] if e.get("name") == "[memory]" and e["args"].get("Device Type") == 1)
    running = np.cumsum([b for _, b in mem])
    assert m.peak_allocated == pytest.approx(running.max() - min(running.min(), 0))
    assert 0 < m.peak_allocated < m.device.total_memory_bytes


def test_two_ranks_run_step_time_is_slowest_rank():
    a = analyze(shared_trace("a100_two_ranks"))
    assert [m.rank for m in a.ranks] == [0, 1]
    per_rank = [m.steps.set_index("step")["duration"] for m in a.ranks]
    expected = np.maximum(per_rank[0].to_numpy(), per_rank[1].to_numpy()) / 1e6
    np.testing.assert_allclose(a.step_times_ms(), expected)
    d = a.to_dict()
    assert len(d["ranks"]) == 2 and d["summary"]["steps"] == len(expected)


def test_json_report_keys_and_nulls(nw0):
    a = analyze(nw0)
    d = a.to_dict()
    assert d["schema"] == "advisor/report/v1"
    s = d["summary"]
    assert set(s["breakdown_ms"]) == set(CATEGORIES)
    assert sum(s["breakdown_ms"].values()) == pytest.approx(s["step_time_ms"]["mean"], rel=1e-9)
    assert s["device_memory_bytes"] == 34084028416
    assert d["ranks"][0]["device"]["compute_capability"] == "7.0"
    cpu = analyze(shared_trace("misc/cpu_only.pt.trace.json.gz")).to_dict()["summary"]
    # a CPU-only trace cannot say anything about a GPU: null, not 0
    assert cpu["gpu_utilization"] is None and cpu["tensor_core_kernel_share"] is None
    assert cpu["device_memory_bytes"] is None


def test_interval_overlap_matches_brute_force():
    rng = np.random.default_rng(0)
    s = rng.integers(0, 10_000, 500)
    e = s + rng.integers(0, 300, 500)
    ms, me = merge(s, e)
    covered = np.zeros(11_000, dtype=bool)
    for a, b in zip(s, e, strict=True):
        covered[a:b] = True
    lo = rng.integers(0, 10_000, 50)
    hi = lo + rng.integers(0, 2_000, 50)
    got = overlap_with(ms, me, lo, hi)
    want = [covered[a:b].sum() for a, b in zip(lo, hi, strict=True)]
    np.testing.assert_array_equal(got, want)


def test_covers_bounds_reads_intervals_as_covers_does(nw0):
    """covers_bounds (the intervals' ends looked up in the bounds) equals covers (every segment
    looked up in the intervals): on the nw0 trace's merged device and host intervals against
    its steps, and on generated intervals that touch, overlap, repeat or have no length (which
    covers reads its own way)."""
    frames = load_trace(single_file(nw0))
    dev, host = frames.device, frames.host
    ds, de = merge(dev["ts"].to_numpy(np.int64), dev["end"].to_numpy(np.int64))
    hs, he = merge(host["ts"].to_numpy(np.int64), host["end"].to_numpy(np.int64))
    steps = frames.steps
    ss, se = steps["start"].to_numpy(np.int64), steps["end"].to_numpy(np.int64)
    b = sorted_unique(np.concatenate([ds, de, hs, he, ss, se]))
    assert len(ds) > 1000 and len(ss) >= 2
    for s, e in ((ds, de), (hs, he), (ss, se)):
        np.testing.assert_array_equal(covers_bounds(b, s, e), covers(s, e, b[:-1]))
    rng = np.random.default_rng(3)
    for _ in range(300):
        n = int(rng.integers(0, 40))
        s = np.sort(rng.integers(0, 200, n))
        e = s + rng.integers(0, 30, n)
        if rng.random() < 0.5:
            s, e = merge(s, e)
            if len(s) > 1 and rng.random() < 0.5:
                e[:-1] = np.minimum(e[:-1], s[1:])  # some touch their successor
        b = sorted_unique(np.concatenate([s, e, rng.integers(0, 250, 20)]))
        np.testing.assert_array_equal(covers_bounds(b, s, e), covers(s, e, b[:-1]))


@pytest.mark.parametrize("rel", ["v100_resnet50_nw0", "corpus/b200_ep_moe_ref_fwd.json.gz", "corpus/a100_sam_amg_compile_cudagraph.json.gz"])
def test_innermost_op_is_the_last_started_op_open_on_the_thread(rel):
    """OpTree.innermost (threads grouped once, each op's parent walked up) finds, for every
    runtime call, the op on its thread that started last among those open at the call: checked
    one call at a time, with the thread ids given as text and as the trace's own values."""
    from advisor.metrics.breakdown import text_of
    from advisor.metrics.hierarchy import op_tree

    path = shared_trace(rel)
    frames = load_trace(single_file(path) if path.is_dir() else path)
    tree = op_tree(frames)
    op_ts, op_end = tree.ops["ts"].to_numpy(np.int64), tree.ops["end"].to_numpy(np.int64)
    rt = frames.runtime.iloc[:2000]
    ts, tid = rt["ts"].to_numpy(np.int64), text_of(rt["tid"])
    want = np.full(len(ts), -1)
    for i in range(len(ts)):
        open_ = np.flatnonzero((tree.thread == str(tid[i])) & (op_ts <= ts[i]) & (ts[i] < op_end))
        if len(open_):
            want[i] = open_[-1]
    assert (want >= 0).mean() > 0.5
    np.testing.assert_array_equal(tree.innermost(ts, tid), want)
    np.testing.assert_array_equal(tree.innermost(ts, tid.astype(str)), want)
    mixed = np.array([int(t) if i % 2 and str(t).isdigit() else t for i, t in enumerate(tid)], dtype=object)  # 7 and "7": one thread
    np.testing.assert_array_equal(tree.innermost(ts, mixed), want)


def test_nearest_and_outermost_ancestor_walk_the_parents(nw0):
    """OpTree.nearest_ancestor (positions dropped from the walk once answered) gives, for every
    op, the first and the last ancestor-or-self with a hit found by following `parent` one op
    at a time."""
    import re

    from advisor.metrics.hierarchy import op_tree

    tree = op_tree(load_trace(single_file(nw0)))
    hit = tree.mask(re.compile(r"^(aten::(to|copy_|_to_copy|convolution|linear)|Optimizer\.|autograd::engine)"))
    assert 0 < hit.mean() < 0.5
    pos = np.arange(len(tree.ops))
    nearest, outermost = np.full(len(pos), -1), np.full(len(pos), -1)
    for i in pos:
        j = i
        while j >= 0:
            if hit[j]:
                outermost[i] = j
                if nearest[i] < 0:
                    nearest[i] = j
            j = tree.parent[j]
    assert (nearest >= 0).mean() > 0.2 and (outermost != nearest).any()
    np.testing.assert_array_equal(tree.nearest_ancestor(pos, hit), nearest)
    np.testing.assert_array_equal(tree.nearest_ancestor(pos, hit, outermost=True), outermost)
    some = np.concatenate([pos[::7], [-1, -1]])
    np.testing.assert_array_equal(tree.nearest_ancestor(some, hit), np.append(nearest[::7], [-1, -1]))


def test_windows_of_one_worker_are_not_ranks(nw0, tmp_path):
    """Two files from one worker (the handler's `<worker>.<ts>` names): the real nw0 trace and
    a copy cut to its first two steps (a partial last window). One rank, the full window."""
    src = single_file(nw0)
    doc = orjson.loads(gzip.decompress(src.read_bytes()))
    steps = sorted(e["ts"] for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#"))
    cut = steps[2]
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("ts", 0) < cut]
    (tmp_path / "worker0.1000.pt.trace.json.gz").write_bytes(src.read_bytes())
    (tmp_path / "worker0.2000.pt.trace.json.gz").write_bytes(gzip.compress(orjson.dumps(doc)))
    a = analyze(tmp_path)
    assert len(a.ranks) == 1
    assert a.summary()["steps"] == 6
    assert any("2 profiling windows from worker worker0" in w for w in a.warnings)


def test_row_groups_number_tuples_as_a_multiindex_does():
    """`row_groups` codes each row's tuple of values in order of first appearance, a missing
    value being a value of its own, as pandas' MultiIndex.factorize does (on generated columns
    of ints, strings and missing values)."""
    import pandas as pd

    from advisor.metrics.breakdown import row_groups

    rng = np.random.default_rng(7)
    for _ in range(100):
        n = int(rng.integers(1, 300))
        cols = []
        for _ in range(int(rng.integers(1, 5))):
            if rng.random() < 0.5:
                cols.append(rng.integers(-1, 5, n))
            else:
                col = np.array([["a", "b", "", None][x] for x in rng.integers(0, 4, n)], dtype=object)
                col[np.equal(col, None)] = np.nan
                cols.append(col)
        assert np.array_equal(row_groups(cols), pd.MultiIndex.from_arrays(cols).factorize()[0])


def test_name_group_is_pandas_extract_once_per_distinct_name():
    """The optimizer's bound-method calls, read once per distinct Python frame name, are what
    pandas' str.extract reads in every row of a run recorded with stacks (this project's own)."""
    from conftest import SAMPLE_RUNS

    from advisor.metrics.breakdown import name_group
    from advisor.metrics.host_device import BUILTIN_CALL

    trace = next((SAMPLE_RUNS / "heldout_h200" / "vit" / "baseline").glob("*.pt.trace.json.gz"))
    host = load_trace(trace).host
    py = host[host["kind"] == "python"]["name"]
    ours = name_group(py, BUILTIN_CALL)
    theirs = py.astype(str).str.extract(BUILTIN_CALL, expand=False)
    assert (theirs.notna()).sum() > 100  # bound-method calls are there to find
    assert [v if isinstance(v, str) else None for v in theirs] == ours.tolist()
    as_text = py.astype(object)  # the same on a column that is not categorical
    assert name_group(as_text, BUILTIN_CALL).tolist() == ours.tolist()
