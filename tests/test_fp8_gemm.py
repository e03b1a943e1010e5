"""fp8-gemm on real Hopper and Blackwell traces: bf16 GEMMs that dominate get an FP8 option, marked
as a change to the numerics and never listed above a free fix of a similar size; GEMMs already in
FP8, and an Ampere device, get none."""

from __future__ import annotations

import gzip
import json

import pytest
from conftest import shared_trace

from advisor.analysis import analyze
from advisor.engine import builtin_rules

RULE = "fp8-gemm"


def _analysis(rel: str):
    return analyze(shared_trace(rel))


def _every(a) -> dict:
    return {f.rule: f for f in [*a.findings, *a.considered]}


def _bf16_gemm_us_in_steps(rel: str) -> tuple[int, float]:
    """ProfilerSteps and the µs of bf16 GEMM kernels starting inside them, from the raw events:
    the CUTLASS 3.x sm100 grouped GEMM of `aten::_grouped_mm` (`GroupProblemShape`, `bfloat16_t`
    in its template arguments) and cuBLAS's `nvjet_sm100_t…` GEMMs (`t`: bf16 in nvjet's naming)."""
    doc = json.loads(gzip.decompress(shared_trace(rel).read_bytes()))
    ev = doc["traceEvents"]
    steps = sorted({(e["ts"], e["ts"] + e["dur"]) for e in ev if str(e.get("name", "")).startswith("ProfilerStep#") and e.get("ph") == "X"})
    lo, hi = min(a for a, _ in steps), max(b for _, b in steps)
    gemm = [
        e for e in ev
        if e.get("cat") == "kernel" and lo <= e["ts"] < hi
        and (("GroupProblemShape" in e["name"] and "bfloat16" in e["name"]) or e["name"].startswith("nvjet_sm100_t"))
    ]
    return len(steps), sum(e["dur"] for e in gemm)


def test_bf16_grouped_gemms_on_a_b200_get_an_fp8_option_priced_at_the_fp8_rate():
    rel = "corpus/b200_ep_moe_ref_fwd.json.gz"
    f = _every(_analysis(rel))[RULE]
    ev = f.evidence
    _, gemm_us = _bf16_gemm_us_in_steps(rel)
    # the analysis keeps one complete step of the two overlapping ProfilerSteps: all the GEMMs run in it
    assert ev["sixteen_bit_gemm_ms_per_step"] == pytest.approx(gemm_us / 1e3, rel=1e-3)
    # B200 datasheet: bf16 2,250, FP8 4,500 dense TFLOP/s -> half the GEMM time goes (on the timeline)
    assert ev["time_kept_at_fp8"] == {"bf16": 0.5}
    assert ev["estimate_ms"] == pytest.approx(0.5 * gemm_us / 1e3 * ev["kernel_time_on_timeline"], rel=1e-3)
    assert ev["compute_capability"] == 10.0 and ev["changes_numerics"] is True
    assert "change to the numerics" in f.message and "up to" in f.message
    assert "convert_to_float8_training" in f.fix.snippet


def test_it_is_never_listed_above_a_free_fix_of_a_similar_size():
    # b200_ep_moe_ref_fwd: FP8 saves ~2.5 ms/step on top of the fixes above it, memory-bound-slow
    # (no change to the numerics) ~1.3: more than half of it, so it is listed first
    ranked = _analysis("corpus/b200_ep_moe_ref_fwd.json.gz").findings
    order = [f.rule for f in ranked]
    fp8 = ranked[order.index(RULE)]
    free = ranked[order.index("memory-bound-slow")]
    assert fp8.saving_ms > free.saving_ms >= fp8.saving_ms / 2
    assert order.index("memory-bound-slow") < order.index(RULE)
    # a free fix that saves more than twice as much stays above it, and one under half below it
    assert all(order.index(g.rule) < order.index(RULE) for g in ranked if g.saving_ms >= 2 * fp8.saving_ms)


def test_a_b300_moe_microbenchmark_gets_the_fp8_option():
    f = _every(_analysis("corpus/b300_moe_microbench.json.gz"))[RULE]
    assert f.evidence["compute_capability"] == pytest.approx(10.3)
    assert f.evidence["sixteen_bit_gemm_share_of_kernel_time"] >= 0.25


def test_gemms_already_in_fp8_get_no_fp8_option():
    # the syncless run's grouped GEMMs are block-scaled MX-FP8 (2.75 ms), its bf16 GEMMs 0.27 ms
    assert RULE not in _every(_analysis("corpus/b200_ep_moe_syncless_fwd.json.gz"))


def test_an_ampere_device_gets_no_fp8_option():
    # PG509 is an A100 (cc 8.0): two thirds of its kernel time is bf16 GEMMs, and no FP8 Tensor Cores
    assert RULE not in _every(_analysis("corpus/pg509_vit_bf16_compile_cudagraph.json.gz"))


def test_the_page_has_every_section_and_every_option():
    (rule,) = [r for r in builtin_rules() if r.id == RULE]
    for section in ("## What it detects", "## Why it is slow", "## Evidence used", "## Example", "## How the saving is estimated"):
        assert section in rule.doc
    for option, default in rule.defaults.items():
        assert f"`{option}` ({type(default).__name__}, {default})" in rule.doc
    assert rule.module.RECIPE == "precision"
