"""The CPU rules on AdvisorBench's own recordings: elementwise chains, attention with dropout,
the per-parameter optimizer and a DataLoader rebuilt every epoch.

tests/data/advisorbench_cpu/runs/<workload> were recorded on the 2-core machine with
`advisor profile --device cpu --warmup 2 --active 3 --no-memory benchmarks/advisorbench/workloads/<workload>.py`
(loader_per_epoch: the default window, `--no-stack`; inference_clean: the default window and memory), while other processes kept the machine
busy (steps 50-150x their unprofiled time): the tests below read counts and structure, which
the load does not change, and figures worked out from the raw events or the facts file.
"""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
from conftest import REPO

from advisor.analysis import analyze
from advisor.config import Config
from advisor.facts import typed_facts
from advisor.load.trace import load_trace
from advisor.metrics.attention import unfused_attention
from advisor.metrics.events import rank_events
from advisor.metrics.summary import compute_metrics

RUNS = REPO / "tests" / "data" / "advisorbench_cpu" / "runs"


def _events(run) -> list[dict]:
    (path,) = run.glob("*.pt.trace.json.gz")
    return [e for e in json.loads(gzip.decompress(path.read_bytes()))["traceEvents"] if e.get("ph") == "X"]


def _all(run, **options) -> dict:
    config = Config(rule_options=options) if options else None
    a = analyze(run, config=config) if config else analyze(run)
    return {f.rule: f for f in [*a.findings, *a.considered]}


# --- unfused-elementwise on a CPU ---------------------------------------------------------


def test_the_cpu_elementwise_chains_of_the_gated_mlp_are_counted_and_priced_in_parts():
    f = _all(RUNS / "mlp_elementwise", **{"unfused-elementwise": {"min_cpu_share": 0.0}})["unfused-elementwise"]
    ev = f.evidence
    # By hand from the raw events of a step (mlp_elementwise.py: 4 GatedBlocks, then a linear):
    # forward, one chain per block from `pow` to the residual `add` (16 ops; `chunk` is a view),
    # each between two `aten::linear`; backward, two per block: the gated GELU's (AddBackward0
    # ... MulBackward0) up to SplitBackward0's `aten::cat`, and the norm's from that `cat` to the
    # linear's AddmmBackward0 (`aten::mm`). LogSoftmaxBackward0 stands alone between
    # NllLossBackward0 and AddmmBackward0: no chain. 4 + 8 = 12.
    assert ev["chains_per_step"] == 12.0
    assert ev["device"] == "CPU" and ev["intermediates_from_shapes"] is True
    # forward: 4 x 16 ops; backward: the aten ops inside the chains' autograd nodes
    events = _events(RUNS / "mlp_elementwise")
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in events if e["name"].startswith("ProfilerStep#")]
    backward = [(e["ts"], e["ts"] + e["dur"]) for e in events if e["name"].startswith("autograd::engine::evaluate_function")]
    pows = [e for e in events if e["name"] == "aten::pow" and e.get("args", {}).get("Input Dims") == [[1024, 512], []]
            and any(a <= e["ts"] < b for a, b in steps) and not any(a <= e["ts"] < b for a, b in backward)]
    assert len(pows) / len(steps) == 4  # one norm per block per step: the forward chains' first ops
    assert ev["chain_ops_per_step"] >= 4 * 16
    # the promise is in its two parts, bounded by what the chains take, and never more
    parts = {p["part"]: p for p in ev["promise_parts"]}
    assert set(parts) == {"fusion", "dispatch"}
    assert 0 < f.saving_alone_ms <= ev["chain_window_ms_per_step"]
    assert abs(sum(p["ms"] for p in parts.values()) - ev["promise_parts_total_ms"]) < 0.01
    assert parts["fusion"]["ms"] <= parts["fusion"]["bound_ms"] + 1e-6
    assert "12 chains" in f.message and "0 chains" not in f.message and "fusion" in f.message


def _measured_share(workload: str) -> float:
    """The share of the defect's median step its twin saved in AdvisorBench's pair (9
    alternations in fresh processes, benchmarks/results/advisorbench_cpu_pairs.json): the
    median paired saving over the defect's median step, as benchmarks/advisorbench/run.py scores it."""
    pair = json.loads((REPO / "benchmarks" / "results" / "advisorbench_cpu_pairs.json").read_text())[f"cpu/{workload}"]
    paired = [d - t for d, t in zip(pair["defect_ms"], pair["twin_ms"], strict=True)]
    return float(np.median(paired)) / float(np.median(pair["defect_ms"]))


def test_the_gated_mlp_is_promised_what_its_compiled_twin_measured():
    """mlp_elementwise_timed: the third of three profiles taken in a row on the idle 2-core
    machine with the default capture, `advisor profile --device cpu
    benchmarks/advisorbench/workloads/mlp_elementwise.py` (the script ran to its end, 34 steps).
    The model that priced the chains at the window's op times less the profiler's cost per
    event promised 64.1% on it (44.9% and 50.1% on the other two), against 41.4% measured."""
    run = RUNS / "mlp_elementwise_timed"
    f = _all(run)["unfused-elementwise"]
    ev = f.evidence
    # the chains are priced at the host's scale the unprofiled steps measured
    assert ev["unprofiled_scale"] is not None and ev["unprofiled_scale"] < 1.0
    assert ev["removed_ms_per_step"] <= ev["chain_window_ms_per_step"] * ev["unprofiled_scale"] + 1e-3
    # ±30% of the pair's measured share, the band AdvisorBench scores (paired runs 36.3% to 44.8%)
    assert f.saving_pct == pytest.approx(_measured_share("mlp_elementwise"), rel=0.30), f.saving_pct


@pytest.mark.parametrize("control", ["transformer_clean", "tabular_optimizer"])
def test_the_cpu_elementwise_rule_stays_under_the_benchmarks_floor_on_runs_without_that_defect(control):
    f = _all(RUNS / control).get("unfused-elementwise")
    assert f is None or f.saving_pct < 0.05


def test_no_chain_no_cpu_finding_on_a_compiled_or_chainless_run():
    # eager_attention_cpu/sdpa: a model of matmuls and SDPA's fused kernel; whatever fires,
    # never a promise of fusing zero chains.
    f = _all(REPO / "tests" / "data" / "eager_attention_cpu" / "runs" / "sdpa", **{"unfused-elementwise": {"min_cpu_share": 0.0}}).get("unfused-elementwise")
    assert f is None or f.evidence["chains_per_step"] > 0


# --- unfused-attention: dropout keeps SDPA on the math path on a CPU ----------------------


def test_attention_with_dropout_in_training_is_not_promised_a_fused_cpu_kernel():
    run = RUNS / "transformer_clean"
    events = _events(run)
    math = [e for e in events if e["name"] == "aten::_scaled_dot_product_attention_math"]
    drops = [e for e in events if e["name"] == "aten::bernoulli_"]
    # by hand: nn.TransformerEncoderLayer(dropout=0.1) in training: every math call draws a mask
    assert math and all(any(m["ts"] <= d["ts"] <= m["ts"] + m["dur"] and d["tid"] == m["tid"] for d in drops) for m in math)
    a = analyze(run)
    assert "unfused-attention" not in {f.rule for f in [*a.findings, *a.considered]}


@pytest.mark.parametrize(("run", "dropout"), [(RUNS / "transformer_clean", True), (REPO / "tests" / "data" / "eager_attention_cpu" / "runs" / "eager", False)])
def test_the_dropout_evidence_is_read_per_call(run, dropout):
    # transformer_clean: 4 encoder layers with dropout 0.1 in training, a mask drawn inside every
    # math call (see above); eager_attention_cpu/eager: no dropout anywhere in the model.
    (path,) = run.glob("*.pt.trace.json.gz")
    host = rank_events(compute_metrics(load_trace(path))).host
    calls = unfused_attention(host).calls
    assert len(calls) > 0 and calls["dropout"].tolist() == [dropout] * len(calls)


def test_attention_inside_pytorchs_own_encoder_fast_path_is_not_the_users_to_replace():
    # inference_clean: nn.TransformerEncoderLayer in eval under inference_mode runs
    # aten::_transformer_encoder_layer_fwd, whose aten::_native_multi_head_attention runs
    # bmm, softmax, bmm inside it (by hand from the raw events below).
    run = RUNS / "inference_clean"
    events = _events(run)
    native = [e for e in events if e["name"] == "aten::_native_multi_head_attention"]
    # the attention's `aten::_softmax` is over the [4, 4, 32, 32] scores (the loop's own
    # `.softmax(-1)` of the [4, 2] outputs is not attention)
    softmax = [e for e in events if e["name"] == "aten::_softmax" and len((e.get("args", {}).get("Input Dims") or [[]])[0]) >= 3]
    assert native and softmax
    assert all(any(n["ts"] <= x["ts"] <= n["ts"] + n["dur"] for n in native) for x in softmax)
    assert "unfused-attention" not in _all(run, **{"unfused-attention": {"min_share": 0.0}})


def test_eager_attention_without_dropout_still_fires():
    # tests/data/eager_attention_cpu/runs/eager: softmax(q @ k.T) @ v with no dropout at all
    f = _all(REPO / "tests" / "data" / "eager_attention_cpu" / "runs" / "eager")["unfused-attention"]
    assert f.evidence["fused_kernel"] == "the flash attention CPU kernel"


# --- cpu-optimizer --------------------------------------------------------------------------


def test_the_per_parameter_sgd_is_priced_from_its_whole_update():
    run = RUNS / "tabular_optimizer"
    f = _all(run, **{"cpu-optimizer": {"min_share": 0.0}})["cpu-optimizer"]
    ev = f.evidence
    # tabular_optimizer.py: Linear(64, 128), 12 x (LayerNorm(128), Linear(128, 128)), Linear(128, 2):
    # 2 + 12 * 4 + 2 = 52 tensors; SGD with momentum and weight decay runs add (the decay),
    # mul_ and add_ (the momentum buffer) and add_ (the update) per tensor: 4 ops, 208 per step.
    assert ev["parameters"] == 52 and ev["distinct_ops"] == 4 and ev["ops_per_step"] == 208.0
    events = _events(run)
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in events if e["name"].startswith("ProfilerStep#")]
    spans = [e for e in events if e["name"] == "Optimizer.step#SGD.step" and any(a <= e["ts"] < b for a, b in steps)]
    span_ms = sum(e["dur"] for e in spans) / len(steps) / 1e3
    assert ev["optimizer_step_ms_per_step"] == pytest.approx(span_ms, rel=1e-3)
    # What goes is at most the per-parameter loop (by hand: the `_single_tensor_sgd` frames in
    # the spans), less one pass of its ops; more than the ops' fixed cost alone (the old model).
    # The run has no optimizer_step_ms (recorded before the capture timed it): no scale.
    loops = [e for e in events if e["name"].endswith(": _single_tensor_sgd")
             and any(s["ts"] <= e["ts"] and e["ts"] + e["dur"] <= s["ts"] + s["dur"] for s in spans)]
    loop_ms = sum(e["dur"] for e in loops) / len(steps) / 1e3
    removed = ev["removed_ms_per_step"]
    assert ev["unprofiled_scale"] == 1.0
    assert ev["fixed_cost_ms_per_step"] < removed < loop_ms - (ev["fixed_cost_ms_per_step"] + ev["arithmetic_ms_per_step"]) / 4 + 1e-3
    assert "fused=True" in f.fix.snippet


def test_the_per_parameter_sgd_is_promised_what_its_fused_twin_measured():
    """tabular_optimizer_timed: recorded on the 2-core machine (load average 0.7; its facts read
    0 or 1.3-1.4 other cores per 5 ms window step, /proc's 10 ms ticks, 0 after it) with the default capture,
    `advisor profile --device cpu --no-memory benchmarks/advisorbench/workloads/tabular_optimizer.py`,
    which times the optimizer's step in the steps after the window (the script ran to its end,
    36 steps). The measurement: AdvisorBench's pair of the same script and its fused twin, 9
    alternations in fresh processes (benchmarks/results/advisorbench_cpu_pairs.json)."""
    run = RUNS / "tabular_optimizer_timed"
    facts = json.loads((run / "advisor_facts.json").read_text())
    measured_share = _measured_share("tabular_optimizer")
    f = _all(run)["cpu-optimizer"]
    ev = f.evidence
    # By hand from the raw events: the spans' time outside `_single_tensor_sgd` (the step's
    # wrappers and `_init_group`) stays with a fused update
    events = _events(run)
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in events if e["name"].startswith("ProfilerStep#")]
    spans = [e for e in events if e["name"] == "Optimizer.step#SGD.step" and any(a <= e["ts"] < b for a, b in steps)]
    loops = [e for e in events if e["name"].endswith(": _single_tensor_sgd")
             and any(s["ts"] <= e["ts"] and e["ts"] + e["dur"] <= s["ts"] + s["dur"] for s in spans)]
    span_ms = sum(e["dur"] for e in spans) / len(steps) / 1e3
    assert len(loops) == len(spans) == len(steps) == 5
    assert ev["outside_the_loop_ms_per_step"] == pytest.approx(span_ms - sum(e["dur"] for e in loops) / len(steps) / 1e3, abs=2e-3)
    # the replay holds the spans at the optimizer's unprofiled time: the median of the facts'
    # optimizer_step_ms after the window (the first step after it, which writes the trace, left out)
    after = facts["optimizer_step_ms"][max(facts["profiled_steps"]) + 2:]
    assert ev["unprofiled_scale"] == pytest.approx(float(np.median(after)) / span_ms, abs=2e-3)
    assert ev["unprofiled_scale"] < 0.8  # the profiler inflated the per-parameter loop
    # The promise, as a share of the step without the profiler, against the pair's: ±30%, the
    # band AdvisorBench scores (the paired runs spread from 4.6% to 9.7%).
    assert f.saving_pct == pytest.approx(measured_share, rel=0.30), (f.saving_pct, measured_share)


def test_the_fused_sgd_promise_is_pinned_by_hand():
    """tabular_optimizer_timed (above): the promise worked out by hand from the raw events and
    the facts, within 7%, where the pair's ±30% band lets a 15% error pass
    (benchmarks/mutation_check.py scales it by 1.15 and 0.85: this test fails under both).

    The model (rules/cpu_optimizer.py): a fused update keeps the step's time outside the
    per-parameter loop (the spans less their `_single_tensor_sgd` frames, 0.278 ms a step) and one
    pass over each tensor (the loop's 208 ops, 4 per tensor, over 4: 0.122 ms); the optimizer's
    span runs at its unprofiled time (the facts' median `optimizer_step_ms` after the window, 0.684
    ms, over the window's mean span, 1.137 ms: x0.602), and keeps 0.400 ms of those 0.684: 58.4%.
    The replay takes the window's median step, the fifth (7.16 ms), whose span is 1.045 ms: it
    loses 41.6% of 1.045 x 0.602 ms, 0.26 ms (the fused twin measured 7.0% of a 4.1 ms step, 0.29 ms)."""
    run = RUNS / "tabular_optimizer_timed"
    events = _events(run)
    facts = json.loads((run / "advisor_facts.json").read_text())
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e["name"].startswith("ProfilerStep#"))
    spans = sorted((e for e in events if e["name"] == "Optimizer.step#SGD.step" and any(a <= e["ts"] < b for a, b in steps)), key=lambda e: e["ts"])
    loops = [e for e in events if e["name"].endswith(": _single_tensor_sgd") and any(s["ts"] <= e["ts"] and e["ts"] + e["dur"] <= s["ts"] + s["dur"] for s in spans)]
    inside = sorted((e for e in events if e["name"].startswith("aten::") and any(lo["tid"] == e["tid"] and lo["ts"] <= e["ts"] and e["ts"] + e["dur"] <= lo["ts"] + lo["dur"] for lo in loops)), key=lambda e: e["ts"])
    ops, end = [], -1.0
    for e in inside:  # the loop's own ops, not the ops they call
        if e["ts"] >= end:
            ops.append(e)
            end = e["ts"] + e["dur"]
    assert len(steps) == len(spans) == len(loops) == 5 and len(ops) == 5 * 52 * 4
    span_ms = [e["dur"] / 1e3 for e in spans]
    kept = (sum(span_ms) - sum(e["dur"] for e in loops) / 1e3) / 5 + sum(e["dur"] for e in ops) / 1e3 / 5 / 4
    scale = float(np.median(facts["optimizer_step_ms"][max(facts["profiled_steps"]) + 2 :])) / float(np.mean(span_ms))
    share = 1.0 - kept / (float(np.mean(span_ms)) * scale)
    median_step = sorted(range(5), key=lambda i: steps[i][1] - steps[i][0])[2]
    expected = share * span_ms[median_step] * scale
    assert 0.2 < expected < 0.35
    f = _all(run)["cpu-optimizer"]
    assert f.saving_alone_ms == pytest.approx(expected, rel=0.07), (f.saving_alone_ms, expected)


# --- epoch-end: a DataLoader built anew every epoch -----------------------------------------


def test_a_dataloader_rebuilt_every_epoch_is_one_loader_whose_workers_restart():
    run = RUNS / "loader_per_epoch"
    facts = json.loads((run / "advisor_facts.json").read_text())
    # three DataLoader objects, one per epoch, each begun once: at steps 0, 3 and 6
    assert [d["epoch_starts"] for d in facts["dataloaders"]] == [[0], [3], [6]]
    f = _all(run, **{"epoch-end": {"min_share": 0.0}})["epoch-end"]
    ev = f.evidence
    assert ev["epoch_starts"] == [3, 6] and ev["persistent_workers"] is False and ev["steps_per_epoch"] == 3
    # By hand from the facts: 96 samples in batches of 32 (no short batch); the window is steps
    # 4-8. Step 3, the step before the window, holds the profiler's start and is left out while
    # boundary 6 is there to measure: its wait for the batch over the typical wait of the
    # window's steps of no boundary (5 and 8); step 7 waits no more than typical (or it is
    # added too, until the wait is back to typical).
    w = np.array(facts["loader_wait_ms"])
    typical = np.median(w[[5, 8]])
    extra6 = max(w[6] - typical, 0.0) + (max(w[7] - typical, 0.0) if w[7] > 2 * typical + 1.0 else 0.0)
    assert ev["worker_restart_ms"] == [pytest.approx(round(extra6, 1), abs=0.15)]
    assert "persistent_workers=True" in f.fix.snippet


def test_epoch_boundaries_of_one_rebuilt_loader_from_the_typed_facts():
    from advisor.metrics.epochs import _driver_loader

    facts = typed_facts(json.loads((RUNS / "loader_per_epoch" / "advisor_facts.json").read_text()))
    assert _driver_loader(facts.dataloaders).epoch_starts == [0, 3, 6]


def test_an_all_reduce_between_elementwise_ops_ends_their_chain():
    """The per-tensor all-reduce loop over gloo (tests/data/allreduce_gloo/runs/manual): each
    gradient's `div_` sits between two `c10d::allreduce_` calls, 74.6 ms of the step in all.
    No chain spans an all-reduce, so the chains' window holds none of that time, and the first
    fix is the bucketed all-reduce (the defect the script was written with)."""
    run = REPO / "tests" / "data" / "allreduce_gloo" / "runs" / "manual"
    a = analyze(run, config=Config(rule_options={"unfused-elementwise": {"min_cpu_share": 0.0}}))
    assert a.findings[0].rule == "unbucketed-allreduce"
    f = next((f for f in [*a.findings, *a.considered] if f.rule == "unfused-elementwise"), None)
    if f is None:
        return
    # from the raw events (rank 0): each step's time outside its all-reduce calls bounds the chains' window
    (path,) = sorted(run.glob("*.pt.trace.json*"))[:1]
    raw = [e for e in json.loads(gzip.decompress(path.read_bytes()) if path.name.endswith(".gz") else path.read_bytes())["traceEvents"] if e.get("ph") == "X"]
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in raw if str(e.get("name", "")).startswith("ProfilerStep#")]
    reduces = [(e["ts"], e["ts"] + e["dur"]) for e in raw if e.get("name") == "c10d::allreduce_"]
    outside = [(b - a) - sum(min(y, b) - max(x, a) for x, y in reduces if x < b and y > a) for a, b in steps]
    assert steps and reduces
    assert f.evidence["chain_window_ms_per_step"] <= max(outside) / 1e3, (f.evidence["chain_window_ms_per_step"], outside)


def test_a_restarted_workers_wait_is_epoch_ends_alone_and_its_share_is_of_the_mean_step():
    """loader_per_epoch on an idle 2-core machine (`loader_per_epoch_quiet`, the default
    `advisor profile`: the window is steps 4-8, steps 9-13 timed after it without the profiler).
    A new DataLoader with one worker every 3 steps: the first step of each epoch waits ~22 ms
    for the new worker, the others ~1-2 ms. That wait is epoch-end's (persistent_workers removes
    it); more workers would not, so dataloader-stall must not claim it a second time. Slow
    steps recur, so the replay prices the mean step, and a share is of the unprofiled steps'
    mean, not of their median, which leaves the restarts out (it read 83%)."""
    run = RUNS / "loader_per_epoch_quiet"
    facts = json.loads((run / "advisor_facts.json").read_text())
    assert facts["profiled_steps"] == [4, 5, 6, 7, 8]
    assert sorted(s for d in facts["dataloaders"] for s in d["epoch_starts"]) == [0, 3, 6, 9, 12]
    # From the raw events: each profiled step's time in the DataLoader's __next__ spans.
    events = _events(run)
    steps = sorted((e["ts"], e["ts"] + e["dur"], e["name"]) for e in events if e["name"].startswith("ProfilerStep#"))
    spans = [(e["ts"], e["dur"]) for e in events if "DataLoader" in e["name"] and "__next__" in e["name"]]
    wait = {int(n.split("#")[1]): sum(d for ts, d in spans if s0 <= ts < s1) / 1e3 for s0, s1, n in steps}
    others = [wait[k] for k in (4, 5, 7, 8)]
    assert wait[6] > 10 * np.median(others)  # step 6 waits for the restarted worker
    after = np.array(facts["step_times_ms"][10:])  # the first step after the window is left out
    # With the restart's wait the loader's share would be well over the rule's 5%; without it,
    # under it.
    assert np.mean(list(wait.values())) / after.mean() > 0.10
    assert np.mean([*others, np.median(others)]) / after.mean() < 0.05
    a = analyze(run)
    ranked = {f.rule: f for f in a.findings}
    assert "dataloader-stall" not in ranked
    f = ranked["epoch-end"]
    assert a.headline().statistic == "mean"
    assert f.saving_pct == pytest.approx(f.saving_ms / after.mean(), rel=2e-3)
