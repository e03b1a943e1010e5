"""The what-if replay: the step graph of a real trace replays to its measured steps, and a
fix replayed as a transformation moves the step the way the recorded fixed run moved."""

from __future__ import annotations

import numpy as np
import pytest

from advisor.load.trace import load_trace
from advisor.metrics.breakdown import DATALOADER_NAME, _matches
from advisor.metrics.summary import compute_metrics
from advisor.whatif.graph import build_graph
from advisor.whatif.replay import Change, calibrate, replay
from tests.conftest import SAMPLE_RUNS, shared


def _graph(directory):
    trace = next(p for p in sorted(directory.iterdir()) if ".pt.trace." in p.name or p.name.startswith("worker")) if directory.is_dir() else directory
    frames = load_trace(trace)
    m = compute_metrics(frames)
    return frames, m, build_graph(frames, m.steps)


@pytest.mark.parametrize(
    "where",
    ["traces/v100_resnet50_nw0", "traces/misc/a100_80gb_train.json.gz", "traces/misc/a100_nccl.json.gz", "whatif/h100_vit/pin_memory", "whatif/h100_vit/foreach"],
)
def test_unchanged_replay_reproduces_the_measured_steps(where):
    _, m, g = _graph(shared(where))
    measured = m.steps["duration"].to_numpy(np.float64)
    replayed = replay(g).step_ns
    assert len(replayed) == len(measured)
    assert abs(np.median(replayed) - np.median(measured)) <= 0.03 * np.median(measured)


def test_sample_gpu_run_replays_to_its_steps():
    _, m, g = _graph(SAMPLE_RUNS / "resnet18_cifar" / "runs" / "gpu_baseline")
    assert replay(g).median_ms == pytest.approx(float(np.median(m.steps["duration"])) / 1e6, rel=0.03)


def test_removing_the_dataloader_wait_replays_close_to_the_run_with_workers():
    # nw0 and nw4 are the same ResNet-50 training with num_workers=0 and 4.
    frames, _, g = _graph(shared("traces/v100_resnet50_nw0"))
    dl = frames.host[_matches(frames.host["name"], DATALOADER_NAME)]
    without = replay(g, Change(host_remove=[(dl["ts"].to_numpy(), dl["end"].to_numpy(), 1.0)])).median_ms
    _, m4, _ = _graph(shared("traces/v100_resnet50_nw4"))
    with_workers = float(np.median(m4.steps["duration"])) / 1e6
    assert replay(g).median_ms - without > 40  # the wait was a third of a 177 ms step
    assert without == pytest.approx(with_workers, rel=0.10)


def test_host_scale_matches_the_unprofiled_steps_and_never_touches_the_device():
    import json

    run = shared("whatif/h100_vit/bf16")
    _, m, g = _graph(run)
    facts = json.loads((run / "advisor_facts.json").read_text())
    after = float(np.median(facts["step_times_ms"][max(facts["profiled_steps"]) + 2 :]))
    scale = calibrate(g, after)
    assert 0.2 < scale < 0.9  # the window ran 1.7x slower than the steps after it
    assert replay(g, Change(host_scale=scale)).median_ms == pytest.approx(after, rel=0.03)
    # host time alone scaled to nothing: the step is the device's work, never less
    busy = m.utilization.mul(m.steps["duration"].to_numpy()).median() / 1e6
    assert replay(g, Change(host_scale=0.05)).median_ms >= busy * 0.97
