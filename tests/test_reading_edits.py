"""The reading of a trace on real traces changed in one named way (tests/trace_edit.py):
one-time work added to a step, device records taken away, a HIP allocator churning inside a
single pass. Each expected figure comes from the edit and the trace's own events."""

from __future__ import annotations

import numpy as np
import pytest
from device_rules import COPY_RULES, KERNEL_RULES
from trace_edit import by_cat, clone, add_events, drop_events, events, insert_time, load_events, trace_path, write_trace

from advisor.analysis import analyze
from advisor.config import Config

B200 = "corpus/b200_ep_moe_syncless_fwd.json.gz"  # NVIDIA B200, 2 ProfilerSteps
MI300X_VIT = "corpus/mi300x_falconsai_vit_infer.json.gz"  # AMD MI300X, one step in the window


def _steps(doc) -> list[dict]:
    return sorted(events(doc, lambda e: str(e.get("name", "")).startswith("ProfilerStep#")), key=lambda e: e["ts"])


def _quiet_launch(doc, step: dict, name_prefix: str) -> dict:
    """The first launch call in `step` while no device activity runs (the device idle)."""
    dev = [(e["ts"], e["ts"] + e.get("dur", 0)) for e in events(doc, by_cat("kernel", "gpu_memcpy", "gpu_memset"))]
    for e in sorted(events(doc, lambda e: str(e.get("name", "")).startswith(name_prefix)), key=lambda e: e["ts"]):
        if not (step["ts"] <= e["ts"] < step["ts"] + step["dur"]):
            continue
        mid = e["ts"] + e.get("dur", 0) / 2
        if not any(s <= mid < t for s, t in dev):
            return e
    pytest.skip(f"no {name_prefix} call in {step['name']} while the device idles")


def test_a_first_launch_loading_a_library_is_reported_apart_and_never_saved_per_step(tmp_path):
    base = analyze(trace_path(B200), config=Config())
    doc = load_events(trace_path(B200))
    step = _steps(doc)[0]
    call = _quiet_launch(doc, step, "cudaLaunchKernel")
    added_ms = 600.0
    insert_time(doc, call["ts"] + call["dur"] / 2, added_ms * 1e3)  # the call lasts 600 ms longer
    a = analyze(write_trace(doc, tmp_path / "cold.json.gz"), config=Config())
    note = next(n for n in a.notes() if n.startswith("one-time work taken out of the steps"))
    assert "cudaLaunchKernel 600." in note
    # the steps are the run's own again: the 600 ms is in none of them, nor in any saving
    want = base.primary.steps["duration"].to_numpy(np.float64) / 1e6
    got = a.primary.steps["duration"].to_numpy(np.float64) / 1e6
    assert got == pytest.approx(want, rel=0.01, abs=0.05)
    assert max((f.saving_ms or 0.0) for f in a.findings) < want.mean()


def test_launches_without_kernel_records_warn_and_give_no_device_advice(tmp_path):
    doc = load_events(trace_path(B200))
    # every call of the CUDA runtime's or driver's API that launches a kernel: in this trace 500
    # cudaLaunchKernel and 30 cudaLaunchKernelExC (cuda_runtime), 160 cuLaunchKernelEx (cuda_driver)
    launch_api = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")
    launches = len(events(doc, lambda e: e.get("cat") in ("cuda_runtime", "cuda_driver") and e.get("name") in launch_api))
    assert launches == 690
    dropped = drop_events(doc, by_cat("kernel"))
    assert dropped > 0
    a = analyze(write_trace(doc, tmp_path / "no_kernels.json.gz"), config=Config())
    line = next(w for w in a.warnings if "the device's activity is missing" in w)
    assert f"{launches} kernel launches" in line, line
    assert not {f.rule for f in a.findings} & KERNEL_RULES


def test_copy_calls_without_copy_records_warn_and_give_no_copy_advice(tmp_path):
    doc = load_events(trace_path("misc/a100_80gb_train.json.gz"))
    calls = len(events(doc, lambda e: str(e.get("name", "")).startswith("cudaMemcpy")))
    assert drop_events(doc, by_cat("gpu_memcpy")) > 0 and calls >= 5
    a = analyze(write_trace(doc, tmp_path / "no_copies.json.gz"), config=Config())
    assert any("copy records are missing" in w and f"{calls} copy calls" in w for w in a.warnings)
    assert not {f.rule for f in a.findings} & COPY_RULES


def test_hip_allocator_churning_inside_one_pass_is_allocator_churn(tmp_path):
    """A window of one pass on an AMD GPU where the cache is given back and asked for again:
    20 hipFree + hipMalloc pairs of 1 ms each, while the device idles."""
    doc = load_events(trace_path(MI300X_VIT))
    step = _steps(doc)[0]
    launches = [e for e in sorted(events(doc, lambda e: e.get("name") == "hipLaunchKernel"), key=lambda e: e["ts"])
                if step["ts"] <= e["ts"] < step["ts"] + step["dur"]]
    picks = launches[5 : 5 + 40 : 2][:20]
    assert len(picks) == 20
    new = []
    for e in reversed(picks):  # from the last, so the earlier insertion points stay where they are
        at = e["ts"]
        insert_time(doc, at, 2_000.0)
        new += [
            clone(e, name="hipFree", ts=at, dur=1_000.0, args={"correlation": -1, "External id": -1}),
            clone(e, name="hipMalloc", ts=at + 1_000.0, dur=1_000.0, args={"correlation": -1, "External id": -1}),
        ]
    add_events(doc, new)
    a = analyze(write_trace(doc, tmp_path / "hip_churn.json.gz"), config=Config())
    f = next(f for f in a.findings + a.considered if f.rule == "allocator-churn")
    assert "20 hipMalloc and 20 hipFree" in f.message
    assert f.evidence["call_ms_after_warmup"] == pytest.approx(40.0, abs=0.5)
    # what the replay takes off the step with the calls gone: part of the 40 ms, never more
    assert 10.0 <= f.saving_alone_ms <= 40.5


@pytest.mark.parametrize("trace", ["corpus/a100_memcpy_pageable_10steps.json.gz", "corpus/a100_memcpy_pinned_10steps.json.gz"])
def test_a_tensor_made_empty_before_a_copy_is_its_destination_not_cpu_data(trace):
    """The copy benchmark makes `torch.empty` on the device and copies a 154 MB host tensor
    into it each step: no tensor is made on the CPU then copied."""
    doc = load_events(trace_path(trace))
    h2d = events(doc, lambda e: str(e.get("name", "")).startswith("Memcpy HtoD"))
    assert len(h2d) == 10 and all(e["args"].get("bytes") == 256 * 3 * 224 * 224 * 4 for e in h2d)
    a = analyze(trace_path(trace), config=Config())
    assert "cpu-tensor-then-copy" not in {f.rule for f in a.findings + a.considered}
    if "pageable" in trace:
        f = next(f for f in a.findings + a.considered if f.rule == "h2d-pageable-copy")
        assert f.evidence["mb_per_step"] == pytest.approx(154.14, abs=0.01)
