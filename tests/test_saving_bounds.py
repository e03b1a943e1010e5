"""Every promise is bounded by what its fix changes, on every trace the tests can reach.

A fix's saving is at most the time of what it changes on the replayed step: the device work
it removes or shortens, the launch gaps it closes, the host calls and host time it takes off,
the waits it removes and its share of the host time the trace does not show; never time
outside the window (device work queued before the first step), nor a cold window's first-call
host time. The bound here is computed from the step graph's measured times, apart from the
advisor's own (`RankReplay.removable`), and looser: it takes the largest step's parts and a
wait's whole replayed span. The step after a fix is never below the work the fix leaves (the
DataLoader's loading over its workers).

Each check runs over `public_traces()` and `own_runs()` (tests/corpus.py) and counts the
traces it asserted on: a check that found nothing to assert fails.
"""

from __future__ import annotations

import gzip
import json
import math
import re

import numpy as np
import pytest
from corpus import analysis_of, own_runs, public_traces
from conftest import SAMPLE_RUNS, SHARED_TRACES
from trace_edit import load_events

from advisor.metrics.one_time import cold_window
from advisor.whatif.graph import CALL
from advisor.whatif.replay import Change, replay_nodes

RUNS = public_traces() + own_runs()
# Runs with a replayed fix whose saving the check asserted on, at least: own_runs() alone has
# 24 of them (sample_runs and tests/data), ../shared/traces 13 more.
MIN_RUNS_WITH_FIXES = 20
SLACK_MS = 0.02  # rounding of the replay and of the findings' figures


def _bound_ms(replay, change: Change) -> float:
    """What `change` can take off a replayed step (ms), from the graph's measured times: per
    step, each part the change names; the largest step's total (or the mean's, never more)."""
    g = replay.graph
    n = len(g.step_ids)
    if n == 0:
        return 0.0
    block = replay.in_block(change)
    starts = g.step_host_start.astype(np.int64)
    lo, hi = int(min(starts.min(), g.step_start.min())), int(g.step_end.max())
    ends = np.append(starts[1:], hi)

    def step_of(ts) -> int:
        return int(min(max(np.searchsorted(starts, ts, side="right") - 1, 0), n - 1))

    per = np.zeros(n)
    op_of_row = {int(r): i for i, r in enumerate(g.device_row)}
    node_of_row = {int(r): i for i, r in enumerate(g.runtime_row) if r >= 0}
    launch_ts = g.h_ts[g.d_launch] if len(g.h_ts) else np.zeros(len(g.d_dur))
    launched_in = (g.h_kind[g.d_launch] == CALL) & (launch_ts >= lo) & (launch_ts <= hi) if len(g.h_ts) else np.zeros(len(g.d_dur), bool)
    in_window = ((g.d_step >= 0) | launched_in) & ~g.d_before_first_step
    for row, f in block.device_scale.items():
        i = op_of_row.get(int(row))
        if i is not None and in_window[i] and f < 1.0:
            per[step_of(launch_ts[i]) if g.d_step[i] < 0 else g.d_step[i]] += (1.0 - max(f, 0.0)) * g.d_dur[i]
    if block.device_scale_all < 1.0:
        per += (1.0 - block.device_scale_all) * float(g.d_dur[in_window].sum())
    for row in block.tight_launch:
        i = op_of_row.get(int(row))
        if i is not None and in_window[i]:
            per[step_of(launch_ts[i]) if g.d_step[i] < 0 else g.d_step[i]] += max(g.d_gap[i], 0) + max(g.d_delay[i] - g.d_latency[i], 0)
    cold = cold_window(replay.metrics)
    if not cold:
        for row, f in block.call_scale.items():
            i = node_of_row.get(int(row))
            if i is not None and lo <= g.h_ts[i] <= hi and f < 1.0:
                per[step_of(g.h_ts[i])] += (1.0 - max(f, 0.0)) * g.h_dur[i]
        if block.unwait:
            start, end, _, _ = replay_nodes(g, replay.base)  # the wait as long as the baseline's replay holds it
            for row in block.unwait:
                i = node_of_row.get(int(row))
                if i is not None and lo <= g.h_ts[i] <= hi:
                    per[step_of(g.h_ts[i])] += max(float(end[i] - start[i]), float(g.h_dur[i]))
        windows = [(s, e, share) for s, e, share in block.host_remove] + [(s, e, 1.0 - f) for s, e, f in block.host_own]
        for s, e, share in windows:
            if share > 0:
                s, e = np.asarray(s, np.int64), np.asarray(e, np.int64)
                for k in range(n):
                    per[k] += min(share, 1.0) * float(np.clip(np.minimum(e, ends[k]) - np.maximum(s, starts[k]), 0, None).sum())
        if block.host_scale < 1.0:
            per += (1.0 - block.host_scale) * float(np.clip(g.h_gap, 0, None).sum() + np.clip(g.h_dur, 0, None).sum())
        per += min(max(block.remainder_share, 0.0), 1.0) * (replay.remainder_ms + replay.step_host_ms) * 1e6
    bound = float(per.max()) / 1e6
    if block.per_sample > 1.0:
        bound += replay.baseline_ms * (1.0 - 1.0 / block.per_sample)
    return bound


def _reported_alone(a, rule: str) -> float | None:
    """The report's saving alone of a rule's finding, where it was measured on the rank the
    view replays (the slowest; a finding of several ranks is its worst rank's)."""
    f = next((f for f in [*a.findings, *a.considered] if f.rule == rule), None)
    return None if f is None or f.rank not in (None, a.primary.rank) else f.saving_alone_ms


def test_every_saving_is_within_what_its_fix_changes():
    """Each replayed fix's saving alone (the report's figure and the replay's) and the saving of
    every fix together are within what the fixes change in the window."""
    asserted = []
    for name in RUNS:
        try:
            a = analysis_of(name)
        except pytest.skip.Exception:
            continue
        v = a.view
        if v.replay is None or not v.replay.available:
            continue
        replay = v.replay
        fixes = {r: f for r, f in v.stated.items() if f.change is not None}
        if not fixes:
            continue
        bounds = {}
        for rule, f in fixes.items():
            bounds[rule] = _bound_ms(replay, f.change)
            alone = replay.saving_ms(f.change)
            assert alone <= bounds[rule] + SLACK_MS, (name, rule, alone, bounds[rule])
            reported = _reported_alone(a, rule)
            if reported is not None:
                assert reported <= bounds[rule] + SLACK_MS, (name, rule, reported, bounds[rule])
        head = a.headline()
        if head is not None and head.all_fixes_saving_ms is not None and head.fixes:
            together = sum(bounds.get(r, math.inf) for r in head.fixes)
            assert head.all_fixes_saving_ms <= together + SLACK_MS, (name, head.fixes, head.all_fixes_saving_ms, together)
        asserted.append(name)
    assert len(asserted) >= MIN_RUNS_WITH_FIXES, asserted


def test_a_cold_window_promises_no_first_call_host_time():
    """In a window whose every step holds one-time work, a fix saves at most the device work it
    changes: the host's time there is first-call time, not a step's."""
    asserted = 0
    for name in RUNS:
        try:
            a = analysis_of(name)
        except pytest.skip.Exception:
            continue
        replay = a.view.replay
        if replay is None or not cold_window(replay.metrics):
            continue
        for rule, f in a.view.stated.items():
            if f.change is None:
                continue
            device_only = Change(device_scale=f.change.device_scale, tight_launch=f.change.tight_launch, device_scale_all=f.change.device_scale_all, per_sample=f.change.per_sample)
            assert replay.saving_ms(f.change) <= _bound_ms(replay, device_only) + SLACK_MS, (name, rule)
            asserted += 1
    if asserted == 0:
        pytest.skip("no trace with a cold window and a replayed fix among the recordings reached")


def _raw_loading_ms(run_dir) -> float | None:
    """The DataLoader's time per profiled step, from the raw trace: its spans over the steps."""
    trace = next((p for p in run_dir.glob("*.pt.trace.json*")), None)
    if trace is None:
        return None
    events = load_events(trace)["traceEvents"]
    steps = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#") and e.get("cat") == "user_annotation"]
    pattern = re.compile(r"^enumerate\(DataLoader\)#.*\.__next__$")
    spans = [e for e in events if pattern.match(str(e.get("name", ""))) and any(s["ts"] <= e["ts"] <= s["ts"] + s["dur"] for s in steps)]
    return sum(e["dur"] for e in spans) / 1000.0 / len(steps) if steps and spans else None


def test_the_step_after_a_fix_is_never_below_the_loading_it_leaves():
    """Loading L ms per batch with n workers still takes L/n per step: the DataLoader fix's
    replayed step, and the step with every fix, are never below it; and the floor the rule
    states is at least the raw trace's loading spread over every core of the machine."""
    asserted = []
    for name in own_runs():
        a = analysis_of(name)
        f = next((f for f in [*a.findings, *a.considered] if f.rule == "dataloader-stall"), None)
        stated = a.view.stated.get("dataloader-stall")
        if f is None or stated is None or stated.change is None or "leaves_ms" not in f.evidence:
            continue
        replay, modelled = a.stated_fixes()
        leaves = f.evidence["leaves_ms"]
        assert replay.replayed_ms(modelled["dataloader-stall"].change) >= leaves - 0.001, name
        head = a.headline()
        if head is not None and head.all_fixes_ms is not None and "dataloader-stall" in head.fixes:
            assert head.all_fixes_ms >= leaves - 0.001, (name, head.all_fixes_ms, leaves)
        facts = json.loads((SAMPLE_RUNS.parent / name / "advisor_facts.json").read_text())
        raw = _raw_loading_ms(SAMPLE_RUNS.parent / name)
        if raw is not None and facts.get("cpu_count"):
            assert leaves >= raw * replay.loader_scale / facts["cpu_count"] - 0.01, (name, leaves, raw)
        asserted.append(name)
    assert len(asserted) >= 3, asserted


def test_a_saving_past_its_bound_is_capped_and_says_which(monkeypatch):
    """Where the replay would promise more than the fix changes (a replay that reads a wait on
    work queued before the window as the fix's), the saving is capped at the bound and the
    cap names it; where the step would drop below what the fix leaves, likewise."""
    a = analysis_of("sample_runs/resnet18_cifar/runs/gpu_baseline")
    replay, modelled = a.stated_fixes()
    change = modelled["h2d-pageable-copy"].change
    bound = _bound_ms(replay, change)
    removed, parts = replay.removable(change)
    assert 0 < removed <= bound + SLACK_MS
    # a replay 30 ms shorter than it is: the promise stops at what the change removes
    real = type(replay)._replayed_ms
    monkeypatch.setattr(type(replay), "_replayed_ms", lambda self, c: real(self, c) - (30.0 if c is change else 0.0))
    replay._replayed.pop(id(change), None)
    assert replay.saving_ms(change) == pytest.approx(removed, abs=1e-6)
    why = replay.capped_by(change)
    assert why is not None and f"{removed:.2f} ms per step of what the fix changes" in why
    assert any(f"{what} {ms:.2f}" in why for what, ms in parts if ms >= 0.005)
    # a floor above the replayed step: the step stays at what the fix leaves
    other = modelled["dataloader-stall"].change
    replay._replayed.pop(id(other), None)
    step = replay.replayed_ms(other)
    replay._replayed.pop(id(other), None)
    replay.leaves(other, step + 5.0, "each batch still loads in 5 ms")
    assert replay.replayed_ms(other) == pytest.approx(step + 5.0)
    assert "the step the fix leaves: each batch still loads in 5 ms" in replay.capped_by(other)


# The public traces the issue names, found by their descriptions: each fix's promise within
# what it changes there (the checks above cover them once they are among the traces).
KNOWN_CASES = {
    "conv+LSTM inference on a Quadro RTX 6000 (unfused-elementwise promised 47.2 of a 61.4 ms step)": r"Quadro RTX 6000.*LSTM|LSTM.*Quadro RTX 6000",
    "a cold 3D-conv pass (first-call host time promised)": r"3D.?conv|conv3d",
    "a T4 loop making its input with torch.randn on the CPU": r"Tesla T4.*randn|randn.*T4",
}


@pytest.mark.parametrize("case", list(KNOWN_CASES))
def test_the_issues_public_cases_keep_their_bounds(case):
    described = ""
    for index in (SHARED_TRACES / "MANIFEST.md", SHARED_TRACES / "corpus" / "SOURCES.tsv"):
        described += index.read_text(encoding="utf-8") if index.exists() else ""
    rows = [line for line in described.splitlines() if re.search(KNOWN_CASES[case], line, re.IGNORECASE)]
    found = [m.group(1) for line in rows if (m := re.search(r"`(corpus/[^`*]+|misc/[^`*]+)`", line))]
    if not found:
        pytest.skip(f"public trace not available: {case} is not among {SHARED_TRACES} (MANIFEST.md, corpus/SOURCES.tsv)")
    for name in found:
        a = analysis_of(name)
        replay = a.view.replay
        for rule, f in a.view.stated.items():
            if f.change is not None:
                assert replay.saving_ms(f.change) <= _bound_ms(replay, f.change) + SLACK_MS, (name, rule)


def _window_after_queued_work(path) -> None:
    """A one-step window opened while a 40 ms kernel launched before it still runs on another
    stream: the step launches ten 0.5 ms elementwise kernels and ends in a
    cudaDeviceSynchronize that waits for the earlier kernel (the conv+LSTM run's 42.6 ms sync)."""
    def x(name, cat, ts, dur, tid=1, pid=1, **args):
        return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}

    ev = [x("cudaLaunchKernel", "cuda_runtime", 0, 10, correlation=1),
          x("queued_before_the_window", "kernel", 20, 40_000, pid=0, tid=13, correlation=1, device=0, stream=13)]
    t = 150
    for k in range(10):
        ev += [x("aten::relu", "cpu_op", t, 30), x("cudaLaunchKernel", "cuda_runtime", t + 5, 10, correlation=2 + k),
               x("void at::native::vectorized_elementwise_kernel<4, relu>", "kernel", 170 + k * 500, 500, pid=0, tid=7, correlation=2 + k, device=0, stream=7)]
        t += 40
    ev.append(x("cudaDeviceSynchronize", "cuda_runtime", t, 40_030 - t, correlation=20))
    ev.append(x("ProfilerStep#1", "user_annotation", 100, 40_060 - 100))
    doc = {"schemaVersion": 1, "traceEvents": ev,
           "deviceProperties": [{"id": 0, "name": "Quadro RTX 6000", "totalGlobalMem": 24 * 2**30, "computeMajor": 7, "computeMinor": 5}]}
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))


def test_a_wait_on_work_queued_before_the_window_is_no_saving(tmp_path):
    """Taking the sync away replays 30+ ms shorter: the wait it removes is on the kernel queued
    before the window, which no fix of the step removes. The saving stops at what the sync
    holds of the window's own work (its 10 µs call and the kernels' last few µs), and says so."""
    run = tmp_path / "run"
    run.mkdir()
    _window_after_queued_work(run / "w.pt.trace.json.gz")
    from advisor.analysis import analyze
    from advisor.config import Config

    a = analyze(run, config=Config())
    replay = a.view.replay
    g = replay.graph
    calls = np.nonzero(g.h_kind == CALL)[0]
    sync = calls[np.argmax(g.h_dur[calls])]  # the 39.9 ms cudaDeviceSynchronize
    row = int(g.runtime_row[sync])
    change = Change(unwait={row}, call_scale={row: 0.0})
    assert replay.baseline_ms - replay._replayed_ms(change) > 30.0  # the replay alone: the earlier kernel's time
    # the window's own device work ends at 5.17 ms (10 kernels of 0.5 ms from 0.17 ms); the sync
    # returns 0.03 ms after the earlier kernel (40.02 ms): at most that, and its own call, is the fix's
    assert replay.saving_ms(change) <= 0.05 + SLACK_MS
    assert replay.saving_ms(change) <= _bound_ms(replay, change) + SLACK_MS
    assert "of what the fix changes in the window" in replay.capped_by(change)


def _cold_pass(path) -> None:
    """One cold 3D-conv pass: cuDNN's handle made inside it (30 ms, one-time work), one 10 ms
    convolution kernel, then 18.4 ms of first-call host work and a sync."""
    def x(name, cat, ts, dur, tid=1, pid=1, **args):
        return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}

    ev = [x("ProfilerStep#1", "user_annotation", 100, 59_000), x("aten::conv3d", "cpu_op", 150, 40_300),
          x("cudnnCreate", "cuda_runtime", 200, 30_000, correlation=1), x("cudaLaunchKernel", "cuda_runtime", 30_300, 10, correlation=2),
          x("implicit_convolve_3d_sgemm", "kernel", 30_320, 10_000, pid=0, tid=7, correlation=2, device=0, stream=7),
          x("aten::first_call_host_work", "cpu_op", 40_500, 18_400), x("cudaDeviceSynchronize", "cuda_runtime", 58_950, 20, correlation=3)]
    doc = {"schemaVersion": 1, "traceEvents": ev,
           "deviceProperties": [{"id": 0, "name": "Tesla T4", "totalGlobalMem": 16 * 2**30, "computeMajor": 7, "computeMinor": 5}]}
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))


def test_a_cold_pass_promises_its_device_work_not_its_first_call_host_time(tmp_path):
    """On a window of one cold pass, a fix that would take the step's host time away and halve
    its convolution replays 24 ms shorter: all but the kernel's 5 ms is first-call host time.
    The promise stops at the 5 ms of device work, and says so."""
    run = tmp_path / "run"
    run.mkdir()
    _cold_pass(run / "w.pt.trace.json.gz")
    from advisor.analysis import analyze
    from advisor.config import Config

    a = analyze(run, config=Config())
    replay = a.view.replay
    assert cold_window(replay.metrics)  # cudnnCreate's 30 ms cut out, its one step a first pass
    g = replay.graph
    change = Change(host_remove=[(g.step_host_start[:1], g.step_end[:1], 1.0)], device_scale={int(g.device_row[0]): 0.5})
    assert replay.baseline_ms - replay._replayed_ms(change) > 20.0  # the replay alone: host time of the first call
    assert replay.saving_ms(change) == pytest.approx(5.0, abs=0.01)  # half the 10 ms kernel
    assert "device work 5.00" in replay.capped_by(change)
