"""The shipped GPU logs of the reference scenario (H100, recorded with `advisor profile --full`).

Each log dir in sample_runs/resnet18_cifar/runs/gpu_* is one round of
benchmarks/follow_the_advice.py (see benchmarks/results/follow_the_advice_gpu*.txt): these
tests hold the advisor to what those real runs showed — the right first finding, a promised
saving that the next run kept, and nothing of high severity left at the end.
"""

from __future__ import annotations

import gzip
import statistics
import subprocess
import sys

import orjson
import pytest
from conftest import REPO, SAMPLE_RUNS

from advisor.analysis import Analysis, analyze
from advisor.render.json_report import to_json

RUNS = SAMPLE_RUNS / "resnet18_cifar" / "runs"


@pytest.fixture(scope="module")
def runs() -> dict[str, Analysis]:
    names = ("gpu_baseline", "gpu_workers", "gpu_compiled", "gpu_cudagraphs", "gpu_input_bound", "gpu_walk_final")
    return {name: analyze(RUNS / name) for name in names}


def facts(name: str) -> dict:
    return orjson.loads((RUNS / name / "advisor_facts.json").read_bytes())


def finding(a: Analysis, rule: str):
    return next((f for f in a.findings if f.rule == rule), None)


def median_step_ms(a: Analysis) -> float:
    return float(a.primary.steps["duration"].median()) / 1e6


def test_the_logs_are_real_h100_runs(runs):
    for name, a in runs.items():
        f = facts(name)
        assert a.primary.device.name == "NVIDIA H100 80GB HBM3" and a.primary.device.compute_capability == "9.0", name
        assert f["device"]["type"] == "cuda" and f["profiled_steps"] == [5, 6, 7], name
        assert a.primary.steps["step"].tolist() == [5, 6, 7], name
        assert len(f["loader_wait_ms"]) == len(f["step_times_ms"]) == 48, name


def after_median_ms(name: str) -> float:
    """Median unprofiled step after the window (the first one after it left out)."""
    f = facts(name)
    return statistics.median(f["step_times_ms"][max(f["profiled_steps"]) + 2 :])


def test_baseline_starves_on_its_input_and_the_workers_keep_the_promise(runs):
    base, workers = runs["gpu_baseline"], runs["gpu_workers"]
    top = base.findings[0]
    assert top.rule == "dataloader-stall" and top.severity == "high"
    assert top.evidence["estimate_ms"] == pytest.approx(base.primary.breakdown_mean_ms["dataloader"], abs=1e-3)
    assert top.saving_pct > 0.5  # most of the (replayed, unprofiled) step
    assert facts("gpu_baseline")["dataloaders"][0]["num_workers"] == 0
    assert "num_workers=15" in top.fix.snippet and "batch_size=32" in top.fix.snippet
    # The next round only raised num_workers. The promise is replayed on the step without the
    # profiler (the facts' steps after the window); the unprofiled median fell by about that.
    assert facts("gpu_workers")["dataloaders"][0]["num_workers"] == 15
    measured = after_median_ms("gpu_baseline") - after_median_ms("gpu_workers")
    assert 0.75 <= measured / top.saving_ms <= 1.25
    assert finding(workers, "dataloader-stall") is None


def test_cuda_graphs_keep_the_launch_bound_promise(runs):
    compiled, graphs = runs["gpu_compiled"], runs["gpu_cudagraphs"]
    launch = finding(compiled, "launch-bound")
    # first or second: a 4x batch (spare-gpu-memory) replays to about the same saving here
    assert launch in compiled.findings[:2] and "reduce-overhead" in launch.fix.text
    assert "set_to_none=True" in launch.fix.text  # CUDA graphs own the gradients
    assert facts("gpu_cudagraphs")["compile"]["modes"] == ["reduce-overhead"]
    measured = median_step_ms(compiled) - median_step_ms(graphs)
    # the promise of applying this fix alone (its ranked saving is what it adds on top of the fixes above it)
    assert 0.5 <= measured / (launch.saving_alone_ms or launch.saving_ms) <= 1.5
    assert finding(graphs, "launch-bound") is None and graphs.primary.gpu_utilization > 0.9


def test_the_end_of_the_walk_has_only_its_epoch_ends_left(runs):
    final = runs["gpu_walk_final"]
    # Batch 512 of 10,000 samples: an epoch is 20 steps, and each epoch end restarts the 15
    # workers (see test_rules_expert.py); nothing else of high severity is left.
    assert [f.rule for f in final.findings if f.severity == "high"] == ["epoch-end"]
    f = facts("gpu_walk_final")
    assert f["dataloaders"][0]["batch_size"] == 512 and f["autocast"]["dtypes"] == ["bfloat16"]
    assert final.primary.tensor_core_kernel_share > 0.3  # bf16 convolutions on Tensor Cores
    # Epoch ends (batch 512 of 10,000 samples) restart the workers and recompile for the last
    # short batch: after the window the mean wait is a quarter of the mean step, but those
    # steps are not a steady stall.
    after_wait, after_steps = f["loader_wait_ms"][9:], f["step_times_ms"][9:]
    assert statistics.mean(after_wait) / statistics.mean(after_steps) > 0.2
    assert finding(final, "dataloader-stall") is None
    for name in ("gpu_baseline", "gpu_workers"):  # eager runs keep Python stacks
        assert facts(name)["profiler"]["with_stack"] is True


@pytest.mark.parametrize("name", ["gpu_compiled", "gpu_cudagraphs", "gpu_input_bound", "gpu_walk_final"])
def test_compiled_runs_are_recorded_without_python_stacks(name):
    f = facts(name)
    assert f["compile"]["used"] and f["profiler"]["with_stack"] is False
    assert any("torch.compile" in n for n in f["notes"])
    [trace] = (RUNS / name).glob("*.pt.trace.json.gz")
    events = orjson.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    assert not any(e.get("cat") == "python_function" for e in events)


def test_profiler_overhead_is_measured_against_the_unprofiled_steps(runs):
    a = runs["gpu_workers"]
    f = facts("gpu_workers")
    overhead = a.profiler_overhead()
    assert overhead is not None and overhead.unprofiled_steps == 48 - 9
    assert overhead.unprofiled_median_ms == pytest.approx(statistics.median(f["step_times_ms"][9:]))
    # the window's median as the report shows it everywhere (the trace's steps, the replay's "window median"),
    # not the facts file's clock for the same steps: one window median per report
    assert overhead.window_median_ms == pytest.approx(statistics.median(a.primary.steps["duration"] / 1e6))
    assert overhead.window_median_ms == pytest.approx(a.headline().measured_ms)
    assert overhead.slowdown > 1.25  # Python stacks on an eager model
    [note] = [n for n in a.notes() if "profiler slowed" in n]
    assert f"{overhead.slowdown:.1f}x" in note and "--no-stack" in note
    doc = orjson.loads(to_json(a))
    assert doc["profiler_overhead"]["unprofiled_steps"] == 39


def test_diff_from_the_baseline_to_the_end_of_the_walk():
    r = subprocess.run(
        [sys.executable, "-m", "advisor", "diff", str(RUNS / "gpu_baseline"), str(RUNS / "gpu_walk_final"), "--format", "json"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 0, r.stderr
    doc = orjson.loads(r.stdout)
    resolved = {f["rule"] for f in doc["findings"]["resolved"]}
    assert {"dataloader-stall", "spare-gpu-memory", "h2d-pageable-copy", "launch-bound"} <= resolved
    # Batch 32 took 313 steps per epoch: the baseline's 48 steps never reached an epoch end;
    # batch 512 crossed two, and their cost is what the walk leaves.
    assert [f["rule"] for f in doc["findings"]["new"]] == ["epoch-end"] and doc["findings"]["remaining"] == []


def test_a_stall_the_window_hid_is_found_in_the_steps_after_it(runs):
    """CUDA graphs made the step so short that 15 workers could not keep up, but the window
    trained from the batches they had prefetched during compilation."""
    a = runs["gpu_input_bound"]
    assert a.primary.breakdown_mean_ms["dataloader"] / (a.primary.mean_step_ns / 1e6) < 0.01
    stall = a.findings[0]
    assert stall.rule == "dataloader-stall" and stall.severity == "high"
    assert "prefetched batches hid it" in stall.message and "uint8" in stall.fix.text
    assert "PILToTensor" in stall.fix.snippet  # not "more workers": the cores are used
    f = facts("gpu_input_bound")
    after = stall.evidence["unprofiled_wait_ms_per_step"] / stall.evidence["unprofiled_step_ms"]
    assert stall.saving_pct == pytest.approx(after, rel=1e-3) and after > 0.3
    assert stall.evidence["unprofiled_steps"] >= 30 and max(f["loader_wait_ms"][5:8]) < 1


def test_mangled_cutlass_convolutions_count_as_tensor_core_kernels():
    """cuDNN's runtime-fused cutlass convs appear under their mangled C++ names in CUPTI."""
    from advisor.metrics.precision import read_kernel_name

    [trace] = (RUNS / "gpu_walk_final").glob("*.pt.trace.json.gz")
    events = orjson.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    mangled = {e["name"] for e in events if e.get("cat") == "kernel" and e["name"].startswith("_ZN17cutlass")}
    convs = {n for n in mangled if "ImplicitGemmConvolution" in n}
    assert convs and all(read_kernel_name(n).unit == "tensor" for n in convs)
    assert {read_kernel_name(n).precision for n in convs} <= {"tf32", "bf16"}  # cutlass::tfloat32_t / bfloat16_t operands
