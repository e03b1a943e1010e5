"""CPU advice (issue 22, item 9): `inference_mode` for an inference loop that runs with grad mode
on, bf16 autocast for fp32 matrix ops on a CPU with native bf16.

The recordings are real: tests/data/cpu_inference_grad/infer.py (an 8-block MLP in eval mode,
one thread) profiled on a 2-core AMD EPYC (avx512_bf16) with `advisor profile --full`: at
batch 8 as it is (runs/grad: grad mode on) and with the fix (runs/inference_mode); at batch
256 under inference_mode in fp32 (runs/batch256) and with the forward under bf16 autocast
(runs/batch256_bf16). What each fix gains against what its rule promises is measured in
benchmarks/inference_mode_cost.py and benchmarks/cpu_bf16_speedup.py, not here.
"""

from __future__ import annotations

import gzip
import re
import shutil

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


def held_mb_from_raw(run) -> float:
    """MB the graph holds per step, from the trace file's own events: per ProfilerStep span, the
    rise of the CPU allocator's `Total Allocated` over its level before the step's first
    `[memory]` event, less the step's two largest allocations; the mean over the steps."""
    import gzip

    trace = orjson.loads(gzip.decompress(next(run.glob("*.pt.trace.json.gz")).read_bytes()))
    events = trace["traceEvents"]
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")]
    mem = sorted((e["ts"], e["args"]["Bytes"], e["args"]["Total Allocated"]) for e in events
                 if e.get("name") == "[memory]" and e["args"].get("Device Type") == 0)
    held = []
    for lo, hi in steps:
        inside = [m for m in mem if lo <= m[0] < hi]
        if not inside:
            continue
        base = inside[0][2] - inside[0][1]
        peak = max(m[2] for m in inside)
        top2 = sum(sorted(m[1] for m in inside if m[1] > 0)[-2:])
        held.append(max(peak - base - top2, 0))
    return sum(held) / len(held) / 1e6


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
    # The replayed saving is the nodes' bookkeeping at the rule's cost per node and the memory the
    # graph holds at its cost per MB (held MB derived here from the trace's raw memory events).
    held = held_mb_from_raw(GRAD)
    assert 0.1 < held < 0.4  # 8 blocks' activations of 8 x 256 floats (8 KiB each), a few per block
    assert abs(f.evidence["held_mb_per_step"] - held) < 0.002
    expected = NODES_PER_PASS * 2.0 / 1e3 + held * 100.0 / 1e3
    assert abs(f.saving_alone_ms - expected) < 0.1 * expected


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


# --- bf16 autocast on a CPU with native bf16 --------------------------------------------------
FP32, BF16 = RUNS / "batch256", RUNS / "batch256_bf16"
AUTOCAST = "cpu-autocast"


def with_facts(run, dest, edit):
    """The real run copied, its facts file edited by `edit` (a dict -> None)."""
    shutil.copytree(run, dest)
    facts = orjson.loads((dest / "advisor_facts.json").read_bytes())
    edit(facts)
    (dest / "advisor_facts.json").write_bytes(orjson.dumps(facts))
    return dest


def test_the_facts_record_the_cpus_bf16_flags():
    from advisor.capture.facts import CPU_FLAGS, cpu_flags

    facts = orjson.loads((FP32 / "advisor_facts.json").read_bytes())
    assert "avx512_bf16" in facts["cpu_features"]["flags"] and facts["cpu_features"]["capability"]
    assert facts["autocast"]["used"] is False
    assert cpu_flags("/nonexistent/cpuinfo") is None
    try:
        text = open("/proc/cpuinfo", encoding="utf-8").read()
    except OSError:
        return
    line = next(line for line in text.splitlines() if line.startswith("flags"))
    assert cpu_flags() == [f for f in CPU_FLAGS if f in line.split(":", 1)[1].split()]


def test_cpu_autocast_fires_on_fp32_linear_layers_and_is_silent_under_autocast():
    a = analyze(FP32)
    f = found(a, AUTOCAST)
    assert f is not None and f in a.findings
    assert f.evidence["cpu_flags"] == ["avx512_bf16"]
    # the model's 9 linear layers (8 blocks and the head), one forward pass per step
    assert f.evidence["calls_per_step"] == 9 and list(f.evidence["fp32_matrix_ops"]) == ["aten::linear"]
    # 256 x 256 -> 256 products: about 0.6 of their fp32 time under autocast (the rule's table)
    assert 0.5 < f.evidence["autocast_over_fp32"] < 0.7
    assert 'torch.autocast("cpu", dtype=torch.bfloat16)' in f.fix.snippet and "avx512_bf16" in f.message
    assert "learning rate" not in f.message.lower() and "(and the loss)" not in f.message  # an inference run
    after = analyze(BF16)
    assert found(after, AUTOCAST) is None
    assert orjson.loads((BF16 / "advisor_facts.json").read_bytes())["autocast"]["dtypes"] == ["bfloat16"]


def test_cpu_autocast_needs_the_cpus_own_word(tmp_path):
    # The same trace without the flags in its facts: the trace cannot say what the CPU supports.
    no_flags = with_facts(FP32, tmp_path / "no_flags", lambda f: f.pop("cpu_features"))
    assert found(analyze(no_flags), AUTOCAST) is None
    # A CPU without avx512_bf16 / amx_bf16: silent too.
    avx2 = with_facts(FP32, tmp_path / "avx2", lambda f: f["cpu_features"].update(flags=["avx2", "avx512f"]))
    assert found(analyze(avx2), AUTOCAST) is None


def test_a_malformed_cpu_record_is_read_as_unknown_with_a_warning(tmp_path):
    bad = with_facts(FP32, tmp_path / "bad", lambda f: f.update(cpu_features={"capability": 3, "flags": "avx512_bf16"}))
    a = analyze(bad)
    assert found(a, AUTOCAST) is None
    assert any("cpu_features.flags" in w and "read as unknown" in w for w in a.warnings)


def test_cpu_autocast_is_silent_where_the_products_are_too_small_to_gain(tmp_path):
    # Batch 8: 8 x 256 -> 256 products of ~25 us, which autocast makes slower (the casts and
    # the bf16 kernel's fixed cost): told the CPU has bf16, the rule still says nothing.
    small = with_facts(GRAD, tmp_path / "small", lambda f: f.update(cpu_features={"capability": "AVX512", "flags": ["avx512f", "avx512_bf16"]}))
    loose = Config(rule_options={AUTOCAST: {"min_share": 0.0}})
    assert found(analyze(small, config=loose, select=[AUTOCAST]), AUTOCAST) is None
    # while the fp32 run at batch 256, with the same facts, is told
    assert found(analyze(FP32, config=loose, select=[AUTOCAST]), AUTOCAST) is not None


def test_cpu_autocast_page_shows_the_table_the_code_uses():
    from advisor.engine import builtin_rules

    rule = next(r for r in builtin_rules() if r.id == AUTOCAST)
    rows = re.findall(r"^\| (\d+) \| ([0-9.]+) \| ([0-9.]+) \|$", rule.doc, flags=re.M)
    assert len(rows) == len(rule.module.RATIO_TABLE)
    assert [(int(t), float(r)) for t, r, _ in rows] == [(t, r) for t, r in rule.module.RATIO_TABLE]
    assert [(int(t), float(r)) for t, _, r in rows] == [(t, r) for t, r in rule.module.BF16_TABLE]


def test_cpu_autocast_on_a_training_run_counts_the_backward_products():
    # sample_runs/cpu_transformer/train.py --threads 1, recorded with advisor profile --full
    # --active 3 (tests/data/cpu_transformer_train/runs/fp32): AdamW training in fp32.
    run = REPO / "tests" / "data" / "cpu_transformer_train" / "runs" / "fp32"
    a = analyze(run)
    f = found(a, AUTOCAST)
    assert f is not None and f in a.considered and f not in a.findings
    assert "(and the loss)" in f.message
    # its promise ran 1.2-2.4x the measured gain on this model's training (the benchmark): not
    # ranked, low confidence, the reason given; the inference run's finding is ranked
    assert f.confidence == "low" and "Not ranked" in (f.no_gain or "")
    inference = found(analyze(FP32), AUTOCAST)
    assert inference.confidence == "medium" and inference.no_gain is None
    # Each product of the forward pass has two in the backward pass (the gradients of its
    # input and of its weight), counted at the cast-free bf16 ratio.
    ev = f.evidence
    forward = ev["calls_per_step"] - ev["backward_calls_per_step"]
    assert forward > 0 and ev["backward_calls_per_step"] == 2 * forward
    assert {"aten::mm", "aten::linear"} <= set(ev["fp32_matrix_ops"])


# --- AdvisorBench's inference workloads (benchmarks/advisorbench/workloads) ---------------------
# Recorded with `advisor profile --full` on the 2-core Xeon (avx512_bf16, amx_bf16) while other
# work kept about 1.8 of its cores busy: their step times are inflated (noisy windows), their
# counts (nodes, allocations, layer calls) are the scripts' own.
BENCH_RUNS = REPO / "tests" / "data" / "advisorbench_cpu"
CNN_GRAD = BENCH_RUNS / "inference_threads"  # the 4-conv CNN, batch 8, one thread, grad mode on
TR_GRAD, TR_FIXED = BENCH_RUNS / "transformer_inference", BENCH_RUNS / "transformer_inference_fixed"
# Bytes the CNN's graph saves for a backward at batch 8 (by hand): each conv's output (for its
# batch norm) and each ReLU's output (for itself and the next conv): 2 x 8x16x32x32 floats,
# 2 x 8x32x16x16 twice over (conv2, conv3), 2 x 8x64x8x8; the batch norms' outputs are freed.
CNN_SAVED = 4 * 8 * (2 * 16 * 32 * 32 + 2 * 2 * 32 * 16 * 16 + 2 * 64 * 8 * 8)
CNN_LARGEST = 2 * 4 * 8 * 16 * 32 * 32  # the two largest allocations: two 8x16x32x32 outputs


def inference_mode_of(run):
    a = analyze(run, select=[RULE], config=Config(rule_options={RULE: {"min_share": 0.0}}))
    return found(a)


def test_the_cnn_graph_holds_its_saved_activations_and_the_promise_counts_them():
    f = inference_mode_of(CNN_GRAD)
    assert f is not None
    # 4 x (conv, batch norm, ReLU), the pooling's mean, the flatten's view, the head's t and addmm
    assert f.evidence["graph_nodes_per_step"] == 16
    held = held_mb_from_raw(CNN_GRAD)
    assert abs(f.evidence["held_mb_per_step"] - held) < 0.002
    # at the step's peak the saved tensors are alive and at most one batch-norm output (8x16x32x32) beside them
    low, high = (CNN_SAVED - CNN_LARGEST) / 1e6, (CNN_SAVED + 4 * 8 * 16 * 32 * 32 - CNN_LARGEST) / 1e6 + 0.01
    assert low <= held <= high, (low, held, high)
    assert f.evidence["fast_path_layers_per_step"] == 0
    expected = 16 * 2.0 / 1e3 + held * 100.0 / 1e3
    assert abs(f.evidence["estimate_ms"] - expected) < 0.01 * expected
    # The old promise (the nodes alone, 0.03 ms) was 2.7% of the 1.2 ms unprofiled step this
    # workload measured on the idle machine (benchmarks/results/advisorbench_cpu.txt) and under
    # the 18% that `inference_mode` gained on the same CNN at two threads (0.9 -> 0.7 ms): the
    # held memory is most of the saving.
    assert f.evidence["held_ms"] > 3 * f.evidence["graph_ms"]
    assert "MB of activations" in f.message


def test_the_transformer_layers_take_the_fused_path_only_with_grad_off():
    grad, fixed = host_of(TR_GRAD), host_of(TR_FIXED)
    fused = "aten::_transformer_encoder_layer_fwd"
    assert (grad["name"].astype(str) == fused).sum() == 0
    # under inference_mode: one fused call per layer per step, 4 layers (nn.TransformerEncoder(num_layers=4))
    calls = fixed[fixed["name"].astype(str) == fused]
    assert len(calls) == 4 * len(rank_steps(TR_FIXED))
    f = inference_mode_of(TR_GRAD)
    assert f is not None and f.evidence["fast_path_layers_per_step"] == 4
    # the fused part is window time inside the 4 layers' spans (raw events) not covered by their products and norms
    layers = layer_ms_from_raw(TR_GRAD)
    assert 0 < f.evidence["fast_path_window_ms"] < layers
    assert f.evidence["fast_path_ms"] > f.evidence["graph_ms"] + f.evidence["held_ms"]
    assert abs(f.evidence["held_mb_per_step"] - held_mb_from_raw(TR_GRAD)) < 0.002
    assert "fused inference path" in f.message


def rank_steps(run):
    from advisor.metrics.events import rank_events

    return rank_events(analyze(run).with_primary_frames().primary).steps


def layer_ms_from_raw(run) -> float:
    """ms per step in `nn.Module: TransformerEncoderLayer_*` spans, from the trace file's own events."""
    import gzip

    trace = orjson.loads(gzip.decompress(next(run.glob("*.pt.trace.json.gz")).read_bytes()))
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    steps = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]
    layers = [e for e in events if re.match(r"nn\.Module: TransformerEncoderLayer_\d+$", str(e.get("name", "")))]
    inside = [e for e in layers if any(s["ts"] <= e["ts"] < s["ts"] + s["dur"] for s in steps)]
    return sum(e["dur"] for e in inside) / len(steps) / 1e3


def test_cpu_autocast_on_a_convolution_inference_loop_is_considered_not_ranked():
    """AdvisorBench's inference_threads (4 convolutions and one linear layer, batch 8): most of
    the fp32 matrix time is in convolutions, which the per-call table overpromised on two such
    loops (benchmarks/results/advisorbench_cpu_unseeded.txt); the finding is listed with its
    estimate and the reason, not ranked. The linear MLP at batch 256 stays ranked (above)."""
    events = [e for e in orjson.loads(gzip.decompress(next(CNN_GRAD.glob("*.pt.trace.json.gz")).read_bytes()))["traceEvents"]
              if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    conv = sum(e["dur"] for e in events if e["name"] == "aten::conv2d")
    linear = sum(e["dur"] for e in events if e["name"] == "aten::linear")
    assert conv > 2 * linear > 0  # from the raw events: convolutions hold most of it
    a = analyze(CNN_GRAD)
    assert AUTOCAST not in {f.rule for f in a.findings}
    f = next(f for f in a.considered if f.rule == AUTOCAST)
    assert f.no_gain and "convolutions" in f.no_gain and f.evidence["estimate_ms"] > 0


def test_cpu_autocast_is_not_ranked_where_it_would_turn_off_the_native_transformer_path():
    """AdvisorBench's inference_clean (a TransformerEncoder under inference_mode): its layers take
    PyTorch's native fast path, which autocast turns off; that loop measured 38% slower under
    bf16 autocast (benchmarks/results/advisorbench_cpu_unseeded.txt). Told to report any saving,
    the rule lists it as considered with that reason, never ranked."""
    run = BENCH_RUNS / "runs" / "inference_clean"
    events = [e for e in orjson.loads(gzip.decompress(next(run.glob("*.pt.trace.json.gz")).read_bytes()))["traceEvents"]
              if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    native = sum(e["name"] in ("aten::_transformer_encoder_layer_fwd", "aten::_native_multi_head_attention") for e in events)
    assert native > 0
    a = analyze(run, config=Config(rule_options={AUTOCAST: {"min_share": 0.0}}))
    assert AUTOCAST not in {f.rule for f in a.findings}
    f = next(f for f in a.considered if f.rule == AUTOCAST)
    assert f.evidence["native_transformer_fast_path_calls"] == native
    assert "fast path" in f.no_gain
