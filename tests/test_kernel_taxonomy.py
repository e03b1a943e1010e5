"""The kernel taxonomy (advisor.metrics.kernel_taxonomy) against the truth written from the names
(tests/data/kernel_truth.tsv), and what the rules and `report --kernels` make of it.

The accuracy is scored as benchmarks/kernel_taxonomy.py scores it: by share of each trace's kernel
time, on the kernel table `advisor report` builds. The expected values of the expert-parallel
traces are derived from their raw events (names and durations read with json, not the advisor).
"""

from __future__ import annotations

import gzip
import importlib.util
import io
import json
import sys
from pathlib import Path

import pytest
from conftest import REPO, SAMPLE_RUNS, SHARED_TRACES, shared_trace
from corpus import analysis_of
from rich.console import Console

from advisor.load.trace import load_trace
from advisor.metrics.breakdown import communication_kernels
from advisor.metrics.kernel_taxonomy import FAMILIES, PRECISIONS, TAXONOMY, UNITS, read_kernel
from advisor.metrics.kernels import kernel_table
from advisor.metrics.precision import Tf32Switches, classify_kernel
from advisor.render.json_report import to_json
from advisor.render.text import render_text

_spec = importlib.util.spec_from_file_location("kernel_taxonomy_benchmark", REPO / "benchmarks" / "kernel_taxonomy.py")
bench = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = bench  # its dataclasses look their module up
_spec.loader.exec_module(bench)

TRUTH = bench.read_truth()
OWN_ROOTS = [SAMPLE_RUNS, REPO / "tests" / "data"]


def test_the_truth_file_uses_the_vocabulary_and_has_one_row_per_name():
    assert TRUTH.index.is_unique
    assert set(TRUTH["family"]) <= set(FAMILIES)
    assert set(TRUTH["precision"]) <= set(PRECISIONS)
    assert set(TRUTH["matrix_unit"]) <= set(UNITS)
    assert len(TRUTH) >= 1434  # every distinct kernel name of ../shared/traces and the repository's recordings


def test_every_row_cites_its_naming_convention():
    assert all(len(row) == 6 and row[5] for row in TAXONOMY)


def _raw_kernels(path: Path) -> list[tuple[str, float]]:
    """(name, dur) of every complete kernel event, read with json alone."""
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as f:
        doc = json.load(f)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    return [(e["name"], float(e.get("dur", 0))) for e in events if isinstance(e, dict) and e.get("cat") in ("kernel", "Kernel") and e.get("ph") == "X"]


def test_own_recordings_every_kernel_name_is_labelled_and_read_right():
    """Runs without ../shared: the repository's own recordings."""
    scores = [s for p in bench.trace_files([r for r in OWN_ROOTS if r.exists()]) if (s := _score(p)) is not None]
    assert scores, "the repository's recordings hold kernel traces"
    assert all(s.unlabelled == 0 for s in scores), [s.path for s in scores if s.unlabelled]
    summary = bench.summarise(scores)
    assert summary["mean"]["all"] >= 0.99


def _score(path: Path):
    try:
        return bench.score_trace(path, TRUTH)
    except Exception:  # not a trace the loader takes (facts files, labels): not scored
        return None


@pytest.mark.skipif(not SHARED_TRACES.exists(), reason=f"public traces not available: {SHARED_TRACES} is absent")
def test_accuracy_by_kernel_time_on_every_trace_mean_and_per_generation():
    scores = [s for p in bench.trace_files([SHARED_TRACES, *[r for r in OWN_ROOTS if r.exists()]]) if (s := _score(p)) is not None]
    summary = bench.summarise(scores)
    assert summary["mean"]["all"] >= 0.99, summary["mean"]
    generations = {k: v for k, v in summary.items() if k.startswith("generation:") and k not in ("generation:unknown",)}
    for gen in ("Volta", "Ampere", "Ada", "Hopper", "Blackwell", "AMD CDNA"):
        assert f"generation:{gen}" in generations
    low = {k: round(v["all"], 4) for k, v in generations.items() if v["all"] < 0.97}
    assert not low, low


def test_the_scoring_gives_no_credit_to_an_empty_reading():
    """The benchmark's scorer: a kernel table whose columns say nothing scores what the truth's
    own `other`/`unknown` rows are worth, not 100%."""
    import pandas as pd

    names = ["volta_sgemm_64x64_nn", "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"]
    k = pd.DataFrame({"kind": ["other", "other"], "name_precision": ["unknown", "unknown"], "matrix_unit": ["unknown", "unknown"]})
    got = bench.kernel_columns(k)
    truth = TRUTH.loc[names]
    assert not (got["family"].to_numpy() == truth["family"].to_numpy()).any()


# --- the expert-parallel runs: communication and FP8 GEMMs --------------------------------------
SYNCLESS = "corpus/b200_ep_moe_syncless_fwd.json.gz"
REF = "corpus/b200_ep_moe_ref_fwd.json.gz"


def _shares(path: Path, prefixes: tuple[str, ...]) -> float:
    raw = _raw_kernels(path)
    total = sum(d for _, d in raw)
    return sum(d for n, d in raw if n.startswith(prefixes)) / total


def test_syncless_ep_moe_all_to_all_is_communication_and_mxfp8_gemms_run_on_tensor_cores():
    path = shared_trace(SYNCLESS)
    # Communication by hand: NCCL's all-gather and the two Triton all-to-all kernels (dispatch of
    # mxfp8 tokens, combine); 16.5% + 7.5% + 6.7% of kernel time.
    expected_comm = _shares(path, ("ncclDevKernel_AllGather", "_mxfp8_all_to_all_expert_major_kernel", "_combine_all_to_all_kernel"))
    assert 0.30 < expected_comm < 0.32
    frames = load_trace(path)
    k = kernel_table(frames)
    comm = communication_kernels(frames)
    dev = frames.device
    shown = dev.loc[comm, "dur"].sum() / dev.loc[dev["kind"] == "kernel", "dur"].sum()
    assert shown == pytest.approx(expected_comm, rel=1e-9)
    # The block-scaled grouped GEMMs (CuTe DSL and CUTLASS mslk) are FP8 Tensor Core work.
    gemms = k[k["name"].astype(str).str.match("kernel_cutlass_kernel_\\w*GroupedBlockScaledGemmKernel|_ZN12cutlass_mslk13device_kernel")]
    assert gemms["name"].nunique() == 2
    assert gemms["tensor_core"].all() and set(gemms["precision"]) == {"fp8"} and set(gemms["name_precision"]) == {"mxfp8"}
    assert set(k.loc[k["kind"] == "communication:all_to_all", "name"].astype(str)) == {"_mxfp8_all_to_all_expert_major_kernel", "_combine_all_to_all_kernel"}


def test_ref_ep_moe_grouped_mm_with_copy_in_its_template_is_tensor_core_work():
    path = shared_trace(REF)
    # aten::_grouped_mm's CUTLASS kernel (its template arguments spell Copy) is 20.9% of kernel time.
    grouped = _shares(path, ("_ZN7cutlass13device_kernelIN2at4cuda6detail25enable_3x_kernel_for_sm10",))
    assert 0.20 < grouped < 0.22
    k = kernel_table(load_trace(path))
    rows = k[k["name"].astype(str).str.startswith("_ZN7cutlass13device_kernelIN2at4cuda6detail25enable_3x_kernel_for_sm10")]
    assert "Copy" in str(rows["name"].iloc[0])
    assert rows["tensor_core"].all() and set(rows["precision"]) == {"bf16"} and set(rows["kind"]) == {"grouped_gemm"}
    on_tc = k.loc[k["tensor_core"], "dur"].sum() / k["dur"].sum()
    assert on_tc >= grouped  # the grouped GEMM and the nvjet GEMMs
    comm = communication_kernels(load_trace(path))
    assert comm.any()


def test_report_kernels_shows_them(cli, tmp_path):
    path = shared_trace(SYNCLESS)
    code, out, _ = cli(["report", "--kernels", "-f", "json", str(path)])
    assert code == 0
    doc = json.loads(out)
    from advisor.schemas import check

    check("kernels", doc)
    by_name = {r["name"]: r for r in doc["kernels"]}
    a2a = by_name["_mxfp8_all_to_all_expert_major_kernel"]
    assert a2a["family"] == "communication:all_to_all" and a2a["precision"] == "mxfp8" and a2a["matrix_units"] == "no"
    gemm = next(r for n, r in by_name.items() if "GroupedBlockScaledGemmKernel" in n)
    assert gemm["family"] == "grouped_gemm" and gemm["matrix_units"] == "yes" and gemm["tensor_core"]
    assert sum(r["share"] for r in doc["kernels"]) == pytest.approx(1.0)
    code, text, _ = cli(["report", "--kernels", str(path)])
    assert code == 0 and "communication:all_to_all" in text and "grouped_gemm" in text
    code, md, _ = cli(["report", "--kernels", "-f", "md", str(path)])
    assert code == 0 and md.startswith("# Kernels") and "| mxfp8 |" in md


# --- names of the conventions the traces here do not hold (written from each library's convention) ---
@pytest.mark.parametrize(
    "name, family, precision, unit",
    [
        ("void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*, int*)", "communication:all_to_all", "unknown", "no"),
        ("void deep_ep::intranode::combine<__nv_bfloat16, 8, 768, 4096>(__nv_bfloat16*, float*)", "communication:all_to_all", "unknown", "no"),
        ("void deep_ep::intranode::notify_dispatch<8>(int const*, int*, int)", "communication:all_to_all", "unknown", "no"),
        ("void c10d::symmetric_memory::multimem_all_reduce_kernel<__nv_bfloat16, 16, 8>(__nv_bfloat16*, unsigned long)", "communication:all_reduce", "bf16", "no"),
        ("void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>(vllm::RankData*, vllm::RankSignals, vllm::Signal*, __nv_bfloat16*, int, int)", "communication:all_reduce", "bf16", "no"),
        ("void deep_gemm::fp8_gemm_kernel<128u, 4096u, 7168u, 128u, 128u, 1u, (deep_gemm::GemmType)1>(float*, int*, unsigned int)", "gemm", "fp8_e4m3", "yes"),
        ("bmm_MxE4m3_MxE2m1MxE4m3_Fp32_t128x8x512u2_s4_et64x8_m128x8x32_cga1x1x1_16dp256b_TN_transOut_schedS_bN_sm100a", "gemm", "mixed", "yes"),
        ("_matmul_ogs_NNT_bf16xbf16xmxfp4_128x256x128x1_swiglu", "grouped_gemm", "mixed", "yes"),
        ("void flash::FlashAttnBwdSm90<flash::CollectiveMainloopBwdSm90<2, cute::tuple<cute::C<1> >, cutlass::bfloat16_t, float> >(Params)", "attention", "bf16", "yes"),
        ("void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<cutlass::half_t> > >(Params)", "attention", "fp16", "yes"),
        ("void flash::compute_attn_ws<Flash_fwd_kernel_traits<128, 128, 176, 12, 2, false, 1, cutlass::bfloat16_t> >(Params)", "attention", "bf16", "yes"),
        ("Cijk_Alik_Bljk_HHS_BH_MT128x128x32_MI32x32x8x1_SN_1LDSB0", "gemm", "fp16", "yes"),
        ("Cijk_Ailk_Bljk_F8B8BS_BH_MT256x256x64_MI16x16x32x1_SN", "gemm", "mixed", "yes"),
        ("Cijk_Ailk_Bljk_SSS_BH_MT64x64x8_SN_1LDSB0_GRVW4", "gemm", "fp32", "no"),
        ("void cudnn::cnn::wgrad_alg0_engine_NHWC<float, 512, 6, 5, 3, 3, 3, false>(int, int, int, float const*, int, float*)", "conv", "fp32", "no"),
        ("volta_gcgemm_64x64_nt", "conv", "fp32", "no"),
        ("volta_cgemm_32x32_tn", "conv", "fp32", "no"),
        ("void fft1d_r2c_32<float, float, float2, true, false>(float2*, float const*, int, int)", "conv", "fp32", "no"),
        ("triton_tem_fused_mm_3", "gemm", "unknown", "unknown"),
        ("volta_h884gemm_64x64_ldg8_nn", "gemm", "fp16", "yes"),
    ],
)
def test_names_of_newer_libraries_read_as_their_conventions_say(name, family, precision, unit):
    r = read_kernel(name)
    assert (r.family, r.precision, r.matrix_unit) == (family, precision, unit)


def test_the_name_decides_before_the_op_and_the_switches():
    bf16_op = '["c10::BFloat16", "c10::BFloat16"]'
    # An fp32 FMA weight-gradient kernel stays fp32 with the TF32 switch on.
    fam, prec, tc, _ = classify_kernel("void wgrad_alg0_engine_NHWC<float, 512, 6, 5>(int, float const*)", "aten::convolution_backward", '["float", "float"]', 9.0, Tf32Switches(matmul=True, cudnn=True))
    assert (fam, prec, tc) == ("conv", "fp32-fma", False)
    # Pointwise and KV-cache kernels a bf16 op launches are not Tensor Core work.
    for name in ("SubTensorOpWithScalar1d", "void vllm::reshape_and_cache_flash_kernel<__hip_bfloat16, __hip_bfloat16, (vllm::Fp8KVCacheDataType)0>(__hip_bfloat16 const*)"):
        assert classify_kernel(name, "aten::linear", bf16_op, None, Tf32Switches())[1:3] == ("", False)
    # A Tensile kernel with no op (graph replay) reads its types and Matrix Core token.
    assert classify_kernel("Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT128x64x128_MI16x16x1_SN", None, None, None, Tf32Switches())[1:3] == ("bf16", True)
    # A Triton GEMM template: the op's dtype and the device decide, the name saying nothing.
    assert classify_kernel("triton_tem_fused_mm_2", "aten::mm", bf16_op, 9.0, Tf32Switches())[1:3] == ("bf16", True)


def test_the_report_summary_counts_the_grouped_and_fp8_gemms_on_tensor_cores(cli):
    ref, syncless = shared_trace(REF), shared_trace(SYNCLESS)
    # From the raw events: the grouped GEMM alone is 20.9% of ref's kernel time; the two
    # block-scaled MX-FP8 GEMMs are 11.5% of syncless's (7.6% + 3.9%).
    grouped = _shares(ref, ("_ZN7cutlass13device_kernelIN2at4cuda6detail25enable_3x_kernel_for_sm10",))
    mxfp8 = _shares(syncless, ("kernel_cutlass_kernel_torchaoprototypemoe", "_ZN12cutlass_mslk13device_kernel"))
    assert 0.11 < mxfp8 < 0.12
    code, out, _ = cli(["report", "-f", "json", str(ref)])
    assert code == 0 and json.loads(out)["summary"]["tensor_core_kernel_share"] >= grouped
    code, out, _ = cli(["report", "-f", "json", str(syncless)])
    summary = json.loads(out)["summary"]
    assert code == 0 and summary["tensor_core_kernel_share"] >= mxfp8 and summary["kernel_time_by_precision_ms"]["fp8"] > 0


# --- AMD's Matrix Cores in the summary -------------------------------------------------------
AMD_TRACES = [
    "corpus/mi300x_falconsai_vit_infer.json.gz",
    "corpus/mi300x_layernorm_fwd_bwd.json.gz",
    "corpus/mi300x_qwen15_05b_chat_infer.json.gz",
    "corpus/mi300x_xdit_flux_infer.json.gz",
    "corpus/mi300x_sglang_qwen3_decode.json.gz",
]


def _raw_matrix_share(path: Path) -> tuple[float, float] | None:
    """The share of the kernel time launched inside the ProfilerStep marks (all of it without
    marks) that the truth file says ran on matrix units, read with json alone; None where a name
    is unlabelled. A range: the names alone leave some kernels' unit unknown (`attn_fwd`), so
    (share labelled yes, share labelled yes or unknown)."""
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as f:
        doc = json.load(f)
    events = [e for e in (doc["traceEvents"] if isinstance(doc, dict) else doc) if isinstance(e, dict) and e.get("ph") == "X"]
    marks = [(e["ts"], e["ts"] + e.get("dur", 0)) for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]
    lo, hi = (min(m[0] for m in marks), max(m[1] for m in marks)) if marks else (-float("inf"), float("inf"))
    # a kernel belongs to the step that launched it: its launch's time, found by correlation id
    launched = {e["args"]["correlation"]: e["ts"] for e in events if e.get("cat") not in ("kernel", "Kernel") and isinstance(e.get("args"), dict) and "correlation" in e["args"]}
    kernels = [
        (e["name"], float(e.get("dur", 0)))
        for e in events
        if e.get("cat") in ("kernel", "Kernel") and lo <= launched.get((e.get("args") or {}).get("correlation"), e["ts"]) <= hi
    ]
    if not kernels or any(name not in TRUTH.index for name, _ in kernels):
        return None
    total = sum(d for _, d in kernels)
    if not total:
        return None
    yes = sum(d for name, d in kernels if TRUTH.at[name, "matrix_unit"] == "yes") / total
    return yes, yes + sum(d for name, d in kernels if TRUTH.at[name, "matrix_unit"] == "unknown") / total


@pytest.mark.parametrize("name", AMD_TRACES)
def test_an_amd_run_states_its_matrix_core_share_as_its_kernels_show(name):
    """An MI300X run's summary names AMD's Matrix Cores (not NVIDIA's Tensor Cores) and gives
    the share of kernel time the truth file's labels put on them: between the share labelled
    yes and that with the unknown ones added, a percentage point either side."""
    path = shared_trace(name)
    expected = _raw_matrix_share(path)
    if expected is None:
        pytest.skip(f"{name}: a kernel name the truth file does not label, or no kernel in the steps")
    a = analysis_of(name)  # the one analysis of the trace the suite makes (tests/corpus.py)
    share = json.loads(to_json(a))["summary"]["tensor_core_kernel_share"]
    assert expected[0] - 0.01 <= share <= expected[1] + 0.01, (share, expected)
    buf = io.StringIO()
    render_text(a, Console(file=buf, width=400, color_system=None, force_terminal=False))
    text = buf.getvalue()
    assert "Tensor Cores" not in text.split("Step-time breakdown")[0]
    assert "of kernel time on Matrix Cores" in text, text[:2000]
