"""Autocast's own costs, read from an fp32 run, against the bf16 run of the same training.

`../shared/whatif/h100_vit` holds the same ViT on an H100 in fp32 (`baseline`) and under
bf16 autocast (`bf16`), both recorded with input types and shapes. What the advisor predicts
from the fp32 trace alone is checked against what the bf16 trace recorded.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache

import numpy as np
import pytest

from advisor.analysis import analyze
from advisor.config import Config
from advisor.engine import all_rules, check_rank_rules
from advisor.facts import typed_facts
from advisor.metrics.autocast import autocast_casts
from advisor.metrics.hierarchy import op_tree
from advisor.metrics.unprofiled import unprofiled_steps
from advisor.whatif.replay import Change
from advisor.whatif.savings import rank_replay
from conftest import shared

HALF_OR_FP32 = ("float", "c10::BFloat16")


@lru_cache(maxsize=4)
def _analysis(run: str):
    return analyze(run, config=Config()).with_primary_frames()


def _primary(run):
    a = _analysis(str(run))
    return a, a.primary


def _dtype_casts_per_step(m) -> float:
    """`aten::_to_copy` ops per step whose tensor is fp32 or bf16 (casts, not index or H2D copies of ints)."""
    host = m.frames.host
    steps = m.steps
    inside = ((host["ts"] >= steps["host_start"].min()) & (host["ts"] < steps["host_end"].max())).to_numpy()
    copies = host[inside & (host["name"].astype(str) == "aten::_to_copy").to_numpy()]
    first = copies["input_types"].astype(str).map(lambda t: (json.loads(t) or [""])[0])
    return float(first.isin(HALF_OR_FP32).sum()) / len(steps)


def _window_medians_us(m) -> tuple[float, float]:
    """The bf16 run's own host cost of a forward cast (`aten::to` of an fp32 tensor that copies)
    and of a ToCopyBackward0 node, medians in its window."""
    tree = op_tree(m.frames)
    ops = tree.ops
    names = ops["name"].astype(str).to_numpy()
    dur = (ops["end"] - ops["ts"]).to_numpy(np.float64) / 1e3
    has_copy = np.zeros(len(ops), dtype=bool)
    child = np.nonzero(names == "aten::_to_copy")[0]
    has_copy[tree.parent[child][tree.parent[child] >= 0]] = True
    forward = (names == "aten::to") & has_copy & ops["input_types"].astype(str).str.startswith('["float"').to_numpy()
    backward = names == "autograd::engine::evaluate_function: ToCopyBackward0"
    return float(np.median(dur[forward])), float(np.median(dur[backward]))


def test_the_casts_read_from_the_fp32_run_are_the_casts_the_bf16_run_recorded():
    _, base = _primary(shared("whatif/h100_vit/baseline"))
    _, bf16 = _primary(shared("whatif/h100_vit/bf16"))
    casts = autocast_casts(base)
    assert casts is not None
    recorded = _dtype_casts_per_step(bf16) - _dtype_casts_per_step(base)
    assert recorded > 100
    assert casts.per_step() == pytest.approx(recorded, rel=0.05)
    # the backward's ToCopyBackward0 nodes: one per forward cast of a tensor that needs a gradient
    tree = op_tree(bf16.frames)
    nodes = tree.mask(re.compile(r"^autograd::engine::evaluate_function: ToCopyBackward0$")).sum() / len(bf16.steps)
    assert casts.per_step("backward") == pytest.approx(nodes, rel=0.05)
    # the input image is cast but needs no gradient: fewer backward casts than forward ones
    assert casts.per_step("backward") < casts.per_step("forward")


def test_a_cast_costs_the_host_what_the_bf16_run_measured():
    # The fp32 run has no casts: their cost is read from its own comparable ops (an op that
    # allocates and launches one copy; a backward node that passes its gradient on).
    _, base = _primary(shared("whatif/h100_vit/baseline"))
    _, bf16 = _primary(shared("whatif/h100_vit/bf16"))
    casts = autocast_casts(base)
    forward_us, backward_us = _window_medians_us(bf16)
    assert casts.copy_ns / 1e3 == pytest.approx(forward_us, rel=0.25)
    assert (casts.copy_ns + casts.node_ns) / 1e3 == pytest.approx(backward_us, rel=0.25)
    # and their bytes cost the device little next to the matrix kernels they speed up
    assert 0 < casts.device_ns().sum() / casts.n_steps / 1e6 < 0.1 * float(np.median(base.steps["duration"])) / 1e6


def _findings_with_changes(a):
    stated = check_rank_rules(all_rules(), a.primary, a.run_facts(), {}, len(a.ranks), [])
    return {f.rule: f for f in stated if f.change is not None}


def test_the_bf16_promise_is_net_of_the_casts_and_follows_tf32():
    a, base = _primary(shared("whatif/h100_vit/baseline"))
    found = _findings_with_changes(a)
    tc, tf32 = found["tensor-cores-unused"], found["tf32-disabled"]
    replay = rank_replay(base, a.run_facts())
    cost = tc.evidence["autocast_casts"]["replayed_cost_ms_per_step"]
    assert cost > 0.5 and "casts per step autocast adds" in tc.message
    # TF32 is off for the fp32 GEMMs: the advice is TF32 first, autocast after it
    assert "after allowing TF32" in tc.message and tc.evidence["promised_after_tf32_ms_per_step"] > 0
    promise = replay.saving_ms(tc.change)
    assert promise < replay.saving_ms(tf32.change)
    # autocast alone (TF32 left off) runs the same GEMMs at the bf16 rate: more than TF32 alone
    assert tc.evidence["autocast_without_tf32_replayed_ms"] > replay.saving_ms(tf32.change)
    # both fixes together save more than TF32 alone (attention reaches cuDNN's bf16 kernels)
    assert replay.saving_ms(Change.merge([tc.change, tf32.change])) > replay.saving_ms(tf32.change)


def test_the_all_run_is_still_what_the_baselines_fixes_replay_to():
    # baseline replayed with the fixes the `all` run applied, against that run's unprofiled steps
    a, base = _primary(shared("whatif/h100_vit/baseline"))
    found = _findings_with_changes(a)
    rules = ["dataloader-stall", "h2d-pageable-copy", "host-sync", "single-tensor-optimizer", "tensor-cores-unused", "tf32-disabled"]
    replay = rank_replay(base, a.run_facts())
    replayed = replay.replayed_ms(Change.merge([found[r].change for r in rules if r in found]))
    facts = json.loads((shared("whatif/h100_vit/all") / "advisor_facts.json").read_text())
    measured = float(np.median(unprofiled_steps(typed_facts(facts)).step_ms))
    assert replayed == pytest.approx(measured, rel=0.25)


def test_a_batch_moved_to_the_device_is_not_what_a_cast_costs():
    # V100 ResNet-50 (no facts file): its only aten::copy_ ops in the steps move the batch to the
    # device, blocking on pageable memory (~1.6 ms each). A cast copies on the device; taking
    # the batch's copy as its cost made autocast's 272 casts cost 429 ms per step.
    a = analyze(shared("traces/v100_resnet50_nw4")).with_primary_frames()
    m = a.primary
    tree = op_tree(m.frames)
    ops = tree.ops
    ts = ops["ts"].to_numpy(np.int64)
    hs, he = m.steps["host_start"].to_numpy(np.int64), m.steps["host_end"].to_numpy(np.int64)
    i = np.clip(np.searchsorted(hs, ts, side="right") - 1, 0, None)
    in_step = (ts >= hs[i]) & (ts < he[i])
    moves = ops[(ops["name"].astype(str) == "aten::copy_").to_numpy() & in_step]
    assert float((moves["end"] - moves["ts"]).median()) > 1e6  # what the casts were charged before
    casts = autocast_casts(m)
    # every conv and linear weight is cast each step (forward), and its gradient back (backward);
    # activations stay 16 bit through batch norm and the residual adds (both sides 16 bit), so
    # beyond the weights only the input batch and the odd fp32-list op's input are cast
    names = ops["name"].astype(str).to_numpy()
    weights = int((np.isin(names, ["aten::conv2d", "aten::linear"]) & in_step).sum()) / len(m.steps)
    assert weights >= 50  # ResNet-50: 53 convolutions and the classifier
    assert weights <= casts.per_step("forward") <= weights + 5
    assert weights - 5 <= casts.per_step("backward") + casts.per_step("promote") <= weights + 5
    assert casts.copy_ns < 0.1e6
    # the casts are charged what an op that launches one kernel costs this host, not the
    # DataLoader's CPU copies of whole images nor the batch's move: autocast is ranked, with
    # what it saves once the host fix ranked above it exposes the convolutions it speeds up
    f = next(f for f in a.findings if f.rule == "tensor-cores-unused")
    assert f.no_gain is None and f.saving_ms > 0.05 * a.primary.mean_step_ns / 1e6
