"""CPU inference advice (issue 22, item 9): `inference_mode` for an inference loop that runs with
grad mode on.

The recordings are real: tests/data/cpu_inference_grad/infer.py (an 8-block MLP in eval mode,
batch 8, one thread) profiled on a 2-core AMD EPYC with `advisor profile --full`, as it is
(runs/grad: grad mode on) and with the fix (runs/inference_mode). What the fix gains against
what the rule promises is measured in benchmarks/inference_mode_cost.py, not here.
"""

from __future__ import annotations

import numpy as np
import orjson
from conftest import REPO, SAMPLE_RUNS

from advisor.analysis import analyze
from advisor.config import Config

RUNS = REPO / "tests" / "data" / "cpu_inference_grad" / "runs"
GRAD, FIXED = RUNS / "grad", RUNS / "inference_mode"
RULE = "inference-mode"
# The script's model: 8 blocks of LayerNorm, Linear (t + addmm), GELU and a residual add,
# then a Linear head: the graph nodes one forward pass records with grad mode on.
NODES_PER_PASS = 8 * (1 + 2 + 1 + 1) + 2


def found(a, rule=RULE):
    return next((f for f in [*a.findings, *a.considered] if f.rule == rule), None)


def host_of(run):
    from advisor.metrics.events import rank_events

    return rank_events(analyze(run).with_primary_frames().primary).host


def test_the_trace_shows_which_ops_went_through_autograd():
    # The profiler gives an op autograd's sequence number when it is dispatched through
    # autograd with grad mode on: the grad-mode run's forward ops carry it, the fixed run's none.
    grad, fixed = host_of(GRAD), host_of(FIXED)
    with_seq = grad[grad["sequence"].to_numpy(np.int64) >= 0]
    assert {"aten::linear", "aten::addmm", "aten::layer_norm", "aten::gelu"} <= set(with_seq["name"].astype(str))
    assert (fixed["sequence"].to_numpy(np.int64) == -1).all()
    # A training run's forward ops carry it too.
    train = host_of(SAMPLE_RUNS / "cpu_transformer" / "runs" / "cpu_baseline")
    assert (train["sequence"].to_numpy(np.int64) >= 0).any()


def test_inference_mode_fires_on_the_grad_mode_run_and_speaks_of_latency():
    facts = orjson.loads((GRAD / "advisor_facts.json").read_bytes())
    assert facts["mode"] == "inference" and "--inference-mode" not in facts["argv"]
    a = analyze(GRAD)
    f = found(a)
    assert f is not None and f in a.findings, [x.rule for x in a.findings]
    # one forward pass per step: the model's own node count (the DataLoader's collate records none)
    assert f.evidence["graph_nodes_per_step"] == NODES_PER_PASS
    assert "torch.inference_mode()" in f.message and "latency" in f.message and "throughput" in f.message
    assert "with torch.inference_mode():" in f.fix.snippet
    assert not any("learning rate" in (x.message + x.fix.text).lower() for x in a.findings)
    # The replayed saving is the nodes' bookkeeping at the rule's cost per node, unprofiled.
    assert abs(f.saving_alone_ms - NODES_PER_PASS * 2.0 / 1e3) < 0.1 * NODES_PER_PASS * 2.0 / 1e3


def test_the_saving_follows_the_cost_per_node_and_adds_to_the_thread_advice():
    base = found(analyze(GRAD, select=[RULE]))
    double = found(analyze(GRAD, select=[RULE], config=Config(rule_options={RULE: {"node_us": 4.0}})))
    assert 1.8 < double.saving_alone_ms / base.saving_alone_ms < 2.2
    # More threads speed the ops' arithmetic, not autograd's bookkeeping: with cpu-threads'
    # fix ranked above it, the rule keeps most of its saving (it is not the same time).
    a = analyze(GRAD)
    f = found(a)
    assert f in a.findings and f.saving_ms > 0.5 * f.saving_alone_ms


def test_inference_mode_is_silent_where_autograd_records_nothing_or_the_run_trains():
    assert found(analyze(FIXED)) is None  # the same script under torch.inference_mode()
    assert found(analyze(SAMPLE_RUNS / "cpu_transformer" / "runs" / "cpu_inference")) is None
    # Training runs need their graph: never told to drop it.
    for run in (SAMPLE_RUNS / "cpu_transformer" / "runs" / "cpu_baseline", SAMPLE_RUNS / "resnet18_cifar" / "runs" / "cpu_baseline"):
        assert found(analyze(run, select=[RULE])) is None


def test_the_report_and_the_rule_page(cli):
    code, out, _ = cli(["report", str(GRAD)])
    assert code == 0 and "inference-mode" in out and "Top CPU ops (self time per step)" in out
    code, out, _ = cli(["explain", RULE])
    assert code == 0 and "Sequence number" in out and "node_us" in out
