"""unfused-attention on real recordings: attention written out by hand fires, fused SDPA stays silent.

The CPU recordings are tests/data/eager_attention_cpu (its attend.py says how they were made):
the same two-block self-attention model, once with softmax(q @ k.T) @ v, once with
F.scaled_dot_product_attention (the flash CPU kernel).
"""

from __future__ import annotations

import gzip
import json

import pytest
from conftest import REPO, shared_trace
from trace_edit import by_name, load_events, rename_events, trace_path, write_trace

from advisor.analysis import analyze
from advisor.engine import builtin_rules

RUNS = REPO / "tests" / "data" / "eager_attention_cpu" / "runs"
RULE = "unfused-attention"


def _all_findings(path) -> dict:
    a = analyze(path)
    return {f.rule: f for f in [*a.findings, *a.considered]}


def _eager_attention_from_raw_events(run) -> tuple[int, float, float]:
    """Steps, and per step the µs from each q@k.T product's start to the next probs@v product's
    end and the µs of those products, read from the raw trace: the model's only 4-D matmuls,
    [4, 4, 256, 32] @ [4, 4, 32, 256] then [4, 4, 256, 256] @ [4, 4, 256, 32]."""
    (path,) = run.glob("*.pt.trace.json.gz")
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in events if str(e.get("name", "")).startswith("ProfilerStep#") and e.get("ph") == "X"]
    steps = sorted(set(steps))
    mm = sorted((e for e in events if e.get("name") == "aten::matmul" and len((e.get("args", {}).get("Input Dims") or [[]])[0]) == 4), key=lambda e: e["ts"])
    qk = [e for e in mm if e["args"]["Input Dims"][1] == [4, 4, 32, 256]]
    pv = [e for e in mm if e["args"]["Input Dims"][1] == [4, 4, 256, 32]]
    span = products = 0.0
    for first in qk:
        if not any(a <= first["ts"] < b for a, b in steps):
            continue
        second = next(e for e in pv if e["ts"] > first["ts"])
        span += second["ts"] + second["dur"] - first["ts"]
        products += first["dur"] + second["dur"]
    return len(steps), span, products


def test_eager_softmax_qkv_on_the_cpu_is_named_and_priced_from_its_own_ops():
    f = _all_findings(RUNS / "eager")[RULE]
    ev = f.evidence
    n_steps, span_us, products_us = _eager_attention_from_raw_events(RUNS / "eager")
    assert ev["calls_per_step"] == 2.0  # two attention blocks, one forward each per step
    # 2·B·H·L·S·(D + Dv) = 2·16·256·256·64 per call, two calls per step
    assert ev["gflops_per_step"] == pytest.approx(2 * 2 * 16 * 256 * 256 * 64 / 1e9, abs=1e-3)
    assert ev["dtypes"] == ["fp32"] and ev["fused_kernel"] == "the flash attention CPU kernel"
    assert ev["unfused_ms_per_step"] == pytest.approx(span_us / n_steps / 1e3, rel=1e-3)
    # no device table on a CPU: the fused kernel is modelled at the products' own rate
    assert ev["fused_modelled_ms_per_step"] == pytest.approx(products_us / n_steps / 1e3, rel=1e-3)
    assert ev["estimate_ms"] == pytest.approx((span_us - products_us) / n_steps / 1e3, rel=1e-2)
    # replayed: the host time at the unprofiled steps' pace, which the profiler slowed 1.4x
    assert 0 < f.saving_alone_ms < ev["estimate_ms"]
    assert "softmax(QKᵀ)V written out" in f.message and "up to" in f.message
    assert "scaled_dot_product_attention" in f.fix.snippet


def test_sdpa_on_the_cpu_runs_its_fused_kernel_and_the_rule_stays_silent():
    assert RULE not in _all_findings(RUNS / "sdpa")


def test_sdpa_on_an_mi300x_silent_when_fused_and_priced_from_the_device_table_when_it_falls_back(tmp_path):
    # mi300x_sdpa_rocprofiler_sdk: 10 calls of SDPA on bf16 q, k, v [1, 32, 32768, 128], each
    # running _scaled_dot_product_flash_attention (Triton's attn_fwd kernel): fused, silent.
    rel = "corpus/mi300x_sdpa_rocprofiler_sdk.json.gz"
    assert RULE not in _all_findings(shared_trace(rel))
    # The same trace with that op renamed to the math fallback (its kernels unchanged), as if
    # SDPA had fallen back: one window, no ProfilerStep, so per step is per window.
    doc = load_events(trace_path(rel))
    assert rename_events(doc, by_name("aten::_scaled_dot_product_flash_attention"), "aten::_scaled_dot_product_attention_math") == 10
    kernel_us = sum(e["dur"] for e in doc["traceEvents"] if e.get("cat") == "kernel" and e["name"] == "attn_fwd.kd")
    f = _all_findings(write_trace(doc, tmp_path / "math.pt.trace.json"))[RULE]
    ev = f.evidence
    flops = 10 * 2 * 32 * 32768 * 32768 * (128 + 128)  # 2·B·H·L·S·(D + Dv), ten calls
    fused_ms = flops / (0.25 * 1307.4e12) * 1e3  # 25% of the MI300X datasheet's 1,307.4 dense bf16 TFLOP/s
    assert ev["paths"] == {"SDPA's math fallback": 10.0} and ev["fused_kernel"] == "flash attention"
    assert ev["unfused_ms_per_step"] == pytest.approx(kernel_us / 1e3, rel=1e-4)
    assert ev["fused_modelled_ms_per_step"] == pytest.approx(fused_ms, rel=1e-4)
    assert ev["estimate_ms"] == pytest.approx(kernel_us / 1e3 - fused_ms, rel=1e-3)
    assert "fell back to math" in f.message


def test_a_fused_kernel_is_claimed_only_for_the_devices_and_dtypes_that_have_one():
    (rule,) = [r for r in builtin_rules() if r.id == RULE]
    fused = rule.module.fused_kernel
    assert fused("nvidia", 9.0, "bf16") == "flash attention"
    assert fused("nvidia", 8.0, "fp32") == "memory-efficient attention"  # flash needs fp16/bf16
    assert fused("nvidia", 7.0, "fp16") == "memory-efficient attention"  # flash needs sm80
    assert fused("nvidia", 3.7, "fp16") is None
    assert fused("nvidia", 9.0, "fp64") is None
    assert fused(None, None, "bf16") and fused(None, None, "fp32")
    assert fused(None, None, "fp64") is None and fused(None, None, "fp16") is None
    assert fused("mtia", None, "bf16") is None


def test_the_page_has_every_section_and_every_option():
    (rule,) = [r for r in builtin_rules() if r.id == RULE]
    for section in ("## What it detects", "## Why it is slow", "## Evidence used", "## Example", "## How the saving is estimated"):
        assert section in rule.doc
    for option, default in rule.defaults.items():
        assert f"`{option}` ({type(default).__name__}, {default})" in rule.doc


def test_the_rule_is_listed_and_explained(cli):
    code, out, err = cli(["rules"])
    assert code == 0 and RULE in out, err
    code, out, err = cli(["explain", RULE])
    assert code == 0 and "softmax(QKᵀ)V" in out, err
