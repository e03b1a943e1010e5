"""Behaviours first tested on public traces (../shared/traces), tested again on this project's own
recordings, so that a clone without the data set still checks them: the sample's H100 runs in
sample_runs/ and the two-rank gloo runs in tests/data/allreduce_gloo. Expected numbers are
recomputed here from the raw JSON events, independently of the advisor's frames."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import REPO, SAMPLE_RUNS
from trace_edit import by_cat, by_name, events, load_events, rename_events, write_trace

from advisor.analysis import Analysis, analyze
from advisor.config import Config
from advisor.render.json_report import to_json

PAGEABLE = "Memcpy HtoD (Pageable -> Device)"
RUNS = SAMPLE_RUNS / "resnet18_cifar" / "runs"
OWN_RUNS = sorted(p for p in RUNS.iterdir() if p.is_dir()) + sorted((REPO / "tests" / "data" / "allreduce_gloo" / "runs").iterdir()) + sorted(
    (REPO / "tests" / "data" / "quick_start_load" / "runs").iterdir()  # the quick start beside other work
)


def trace_of(run: Path) -> Path:
    (path,) = sorted(run.glob("*.pt.trace.json.gz"))
    return path


def run_analysis(path: Path, select: list[str] | None = None) -> Analysis:
    return analyze(path, config=Config(), select=select)


def host_steps(doc: dict) -> list[dict]:
    return sorted(
        (e for e in events(doc, by_cat("user_annotation")) if str(e.get("name", "")).startswith("ProfilerStep#")),
        key=lambda e: e["ts"],
    )


def test_pageable_copy_numbers_follow_the_raw_copies_on_the_h100_sample():
    run = RUNS / "gpu_workers"  # DataLoader(num_workers=8), pin_memory off: pageable batch copies
    doc = load_events(trace_of(run))
    copies = events(doc, by_name(PAGEABLE))
    n_steps = len(host_steps(doc))
    assert n_steps == 3 and len(copies) == 2 * n_steps  # images and labels, every step
    f = next(f for f in run_analysis(run).findings if f.rule == "h2d-pageable-copy")
    total_bytes = sum(e["args"]["bytes"] for e in copies)
    total_us = sum(e["dur"] for e in copies)
    assert f.evidence["pageable_copies_per_step"] == pytest.approx(len(copies) / n_steps)
    assert f.evidence["mb_per_step"] == pytest.approx(total_bytes / n_steps / 1e6, rel=1e-3)
    assert f.evidence["measured_gbps"] == pytest.approx(total_bytes / total_us / 1e3, rel=1e-2)
    assert f.evidence["dataloader_pin_memory"] == [False]  # from the run's facts file
    # Physics bound: the step with the fix still holds all of its device work but the copies'
    # time, so it saves at most the device's idle time plus the copies' own time.
    steps = host_steps(doc)
    start, end = steps[0]["ts"], steps[-1]["ts"] + steps[-1]["dur"]
    device = sorted(
        (e["ts"], e["ts"] + e["dur"])
        for e in events(doc, by_cat("kernel", "gpu_memcpy", "gpu_memset"))
        if start <= e["ts"] < end
    )
    busy_us, reach = 0.0, start
    for a, b in device:
        busy_us += max(0.0, b - max(a, reach))
        reach = max(reach, b)
    window_us = max(end, reach) - start
    idle_ms = (window_us - busy_us) / 1e3 / n_steps
    assert 0 < f.saving_ms <= idle_ms + total_us / 1e3 / n_steps


def test_pageable_copy_silent_once_the_sample_copies_are_pinned(tmp_path):
    doc = load_events(trace_of(RUNS / "gpu_workers"))
    assert rename_events(doc, by_name(PAGEABLE), "Memcpy HtoD (Pinned -> Device)") == 6
    a = run_analysis(write_trace(doc, tmp_path / "pinned.pt.trace.json.gz"), select=["h2d-pageable-copy"])
    assert not a.findings
    assert a.primary.h2d["pinned_count"] == 6


def test_zero_grad_memset_counts_the_kernels_zero_grad_launched():
    run = RUNS / "gpu_baseline"  # optimizer.zero_grad(set_to_none=False) in the sample's first walk step
    doc = load_events(trace_of(run))
    spans = [e for e in events(doc, by_cat("user_annotation")) if str(e.get("name", "")).startswith("Optimizer.zero_grad")]
    launches = {
        e["args"]["correlation"]
        for e in events(doc, by_cat("cuda_runtime", "cuda_driver"))
        if "Launch" in str(e.get("name")) and any(s["ts"] <= e["ts"] < s["ts"] + s["dur"] for s in spans)
    }
    kernels = [e for e in events(doc, by_cat("kernel")) if e.get("args", {}).get("correlation") in launches]
    n_steps = len(host_steps(doc))
    a = run_analysis(run)
    # ranked, or considered where what it saves on top of the fixes ranked above it is under 0.5% of the step
    f = next(f for f in [*a.findings, *a.considered] if f.rule == "zero-grad-memset")
    assert len(spans) == n_steps
    assert f.evidence["kernels_per_step"] == pytest.approx(len(kernels) / n_steps)
    assert f.evidence["kernel_ms_per_step"] == pytest.approx(sum(k["dur"] for k in kernels) / 1e3 / n_steps, abs=2e-3)
    assert f.evidence["zero_grad_ms_per_step"] == pytest.approx(sum(s["dur"] for s in spans) / 1e3 / n_steps, abs=2e-3)
    assert 0 < f.saving_alone_ms <= f.evidence["zero_grad_ms_per_step"]


@pytest.mark.parametrize("run", OWN_RUNS, ids=lambda p: p.name)
def test_rules_run_on_every_own_recording_with_sane_findings(run):
    a = run_analysis(run)
    step_ms = max(m.mean_step_ns for m in a.ranks) / 1e6
    for f in a.findings:
        assert f.severity in ("high", "medium", "low") and f.confidence in ("high", "medium", "low")
        assert f.message and f.fix.text, f.rule
        assert f.saving_ms is None or 0 <= f.saving_ms <= step_ms + 1e-6, (f.rule, f.saving_ms, step_ms)
    import orjson

    rendered = orjson.loads(to_json(a))  # every evidence value survives the JSON report
    assert [f["rule"] for f in rendered["findings"]] == [f.rule for f in a.findings]


@pytest.mark.parametrize("run", ["cpu_two_threads", "cpu_two_threads_full"])
def test_a_loader_worker_on_a_busy_two_core_cpu_run_is_paid_with_a_compute_thread(run):
    """The quick start on a 2-core machine (recorded here: 2 intra-op threads, num_workers=0;
    once with the window alone, once with `--full`'s unprofiled steps). No core is idle, so the
    fix trades a compute thread for the worker: the model's host work takes 1x to p/(p-1)x as
    long beside the loading. The replayed saving lies between that trade's two ends (the step
    now minus max(model at one thread fewer, loading)), never the whole DataLoader wait as if
    a core were free."""
    a = run_analysis(RUNS / run)
    facts = a.facts[0]
    assert facts["cpu_count"] == 2 and facts["torch_threads"]["intra_op"] == 2
    f = next(f for f in [*a.findings, *a.considered] if f.rule == "dataloader-stall")
    assert f.evidence["cores"]["free_cores"] == 0
    import re

    # the trade as the finding states it: "the model's R ms per step ... beside the L ms of loading"
    rest, loader = (float(x) for x in re.search(r"the model's ([\d.]+) ms per step .* beside the ([\d.]+) ms of loading", f.message).groups())
    worst = max(loader + rest - max(rest * 2, loader), 0.0)  # two threads -> one, perfect scaling
    best = loader + rest - max(rest, loader)  # the second thread gave the model nothing
    alone = f.saving_alone_ms if f.saving_alone_ms is not None else f.saving_ms
    # in the replay's units: the window's figures scaled to the replayed step
    scale = a.whatif[0].baseline_ms / a.whatif[0].measured_ms
    assert worst * scale * 0.95 - 0.5 <= alone <= best * scale * 1.05 + 0.5, (alone, worst, best, scale)
    assert alone < 0.75 * loader * scale  # not the loading time, as if a core were idle


def test_a_cpu_only_runs_host_explains_its_unprofiled_step():
    """Without device work nothing can hide host time: the profiler's cost comes out of the
    host by one scale that meets the unprofiled steps, and no untraced time is invented at the
    step's start (which a compute-thread trade would then not grow)."""
    a = run_analysis(RUNS / "cpu_two_threads_full")
    w = a.whatif[0]
    after = a.facts[0]["step_times_ms"]
    assert w.unprofiled_ms is not None and abs(w.baseline_ms - w.unprofiled_ms) <= 0.01 * w.unprofiled_ms
    assert 0.5 < w.host_scale < 1.0  # the window ran slower than the steps after it, not 20x slower
    assert w.untimed_host_ms < 0.01 * w.unprofiled_ms and w.remainder_ms < 0.01 * w.unprofiled_ms
    assert len(after) > 5
