"""Precision and Tensor Cores judged from what the hardware did (metrics.precision).

Truth comes from outside the advisor: Nsight Compute's tensor-pipe counters for every kernel
of the H100 kernel corpus (`kernels/h100/tensor_core_truth.json`), the TensorBoard plugin's
Tensor Core figures on the V100 ResNet-50 traces (../shared/ANCHORS.md), and the step times a
ViT measured on an H100 with and without each fix (`whatif/h100_vit/*/advisor_facts.json`).
"""

from __future__ import annotations

import importlib.util
import json
import re
import statistics

import numpy as np
import orjson
import pytest
from conftest import REPO, shared, shared_trace, single_file
from trace_edit import edit_events, load_events, write_trace

from advisor.analysis import Analysis, analyze
from advisor.config import Config
from advisor.load.trace import load_trace
from advisor.metrics.compute import step_kernels
from advisor.metrics.kernels import kernel_table
from advisor.metrics.precision import (
    MEASURED_RATIOS,
    Tf32Switches,
    precision_speedup,
    read_kernel_name,
)
from advisor.render.json_report import to_json

MODES = ("fp32", "tf32", "bf16", "fp16", "defaults")
PRECISION_RULES = ["tf32-disabled", "tensor-cores-unused"]


# --- against Nsight Compute on the H100 corpus ------------------------------------------------
def base_name(name: str) -> str:
    """The name both spellings share: Nsight Compute shortens `at::native::` to `at::`, drops
    namespaces of anonymous scope and writes template parameters as `T1`, so compare the
    function's own name (and a cutlass wrapper's kernel, `Kernel2<cutlass_80_...>`)."""
    name = name.replace("(anonymous namespace)", "").replace("<unnamed>", "").replace("at::native::", "at::")
    name = re.sub(r"^void ", "", name)
    m = re.match(r"([^<(]*)(?:<([^,<>()]*))?", name)
    base = m.group(1).split("::")[-1].strip()
    first_template_argument = (m.group(2) or "").strip()
    return f"{base}<{first_template_argument}>" if first_template_argument.startswith("cutlass") else base


def misclassified_cycles(kernels_of_mode) -> tuple[float, float, list[str]]:
    """(share of cycles misclassified, share of cycles of kernels absent from the traces, their names)."""
    truth = json.loads(shared("kernels/h100/tensor_core_truth.json").read_text())["kernels"]
    total = wrong = absent = 0.0
    missing = set()
    for mode in MODES:
        k = kernels_of_mode(mode)
        by_base = k.assign(base=k["name"].astype(str).map(base_name), tc_ns=k["dur"] * k["tensor_core"])
        g = by_base.groupby("base")[["tc_ns", "dur"]].sum()
        tc_fraction = g["tc_ns"] / g["dur"]
        for name, modes in truth.items():
            if mode not in modes:
                continue
            cycles, on_tensor_cores = modes[mode]["elapsed_cycles"], modes[mode]["tensor_core"]
            total += cycles
            b = base_name(name)
            if b not in tc_fraction.index:
                absent += cycles
                missing.add(b)
                continue
            f = float(tc_fraction[b])
            wrong += cycles * ((1 - f) if on_tensor_cores else f)
    return wrong / (total - absent), absent / total, sorted(missing)


def corpus_switches(mode: str) -> Tf32Switches:
    labels = json.loads(shared("kernels/h100/labels.json").read_text())["modes"][mode]
    return Tf32Switches(matmul=labels["allow_tf32_matmul"], cudnn=labels["allow_tf32_cudnn"])


def test_at_most_one_percent_of_h100_kernel_cycles_misclassified():
    def kernels(mode):
        return kernel_table(load_trace(shared(f"kernels/h100/{mode}.pt.trace.json.gz")), 9.0, corpus_switches(mode))

    wrong, absent, missing = misclassified_cycles(kernels)
    assert wrong <= 0.01, f"{100 * wrong:.2f}% of cycles misclassified"
    # Only kernels that ran before the profiler started are not in the traces (the corpus's random init).
    assert missing == ["distribution_elementwise_grid_stride_kernel"] and absent < 0.02


def test_without_input_types_and_facts_the_names_alone_still_classify():
    # The same traces with `Input type` dropped from every op and no TF32 switches known.
    def kernels(mode):
        frames = load_trace(shared(f"kernels/h100/{mode}.pt.trace.json.gz"))
        frames.host["input_types"] = None
        k = kernel_table(frames, 9.0, Tf32Switches())
        assert (k.loc[k["precision"] != "", "precision_source"] != "op input types").all()
        return k

    wrong, _, _ = misclassified_cycles(kernels)
    assert wrong <= 0.05  # cuDNN's LSTM tile kernels name no dtype: the op's would have told


def test_fp32_gemms_named_xmma_run_on_the_fma_units_and_fp32_attention_on_tensor_cores():
    k = kernel_table(load_trace(shared("kernels/h100/fp32.pt.trace.json.gz")), 9.0, corpus_switches("fp32"))
    named = k.assign(name=k["name"].astype(str))
    xmma = named[named["name"].str.startswith("sm80_xmma_gemm_f32f32_f32f32")]
    assert len(xmma) and not xmma["tensor_core"].any() and set(xmma["precision"]) == {"fp32-fma"}
    simt = named[named["name"].str.contains("cutlass_80_simt_sgemm")]
    assert len(simt) and not simt["tensor_core"].any()
    # PyTorch's memory-efficient attention runs TF32 MMAs on sm80+ whatever the switch says.
    fmha = named[named["name"].str.startswith("fmha_cutlass")]
    assert len(fmha) and fmha["tensor_core"].all() and set(fmha["precision"]) == {"tf32"}


def test_bf16_autocast_kernels_take_the_ops_dtype_not_the_names():
    k = kernel_table(load_trace(shared("kernels/h100/bf16.pt.trace.json.gz")), 9.0, corpus_switches("bf16"))
    named = k.assign(name=k["name"].astype(str))
    # cuDNN names its bf16 attention kernels `..._wgmma_f16_...`; the op says c10::BFloat16.
    sdpa = named[named["name"].str.contains("sdpa_sm90_flash")]
    assert len(sdpa) and set(sdpa["precision"]) == {"bf16"} and sdpa["tensor_core"].all()
    assert set(sdpa["precision_source"]) == {"op input types"}
    nvjet = named[named["name"].str.startswith("nvjet_sm90_tst")]
    assert len(nvjet) and set(nvjet["precision"]) == {"bf16"}


# --- against the TensorBoard plugin on the V100 traces ----------------------------------------
@pytest.mark.parametrize("name", ["v100_resnet50_nw0", "v100_resnet50_nw4"])
def test_v100_resnet50_agrees_with_the_plugin_tensor_core_figures(name):
    a = analyze(shared_trace(name), select=[])
    m = a.primary
    assert m.tensor_core_kernel_share == 0.0  # the plugin: 0% of kernel time on Tensor Cores
    assert m.tensor_core_eligible_share == pytest.approx(0.676, abs=0.01)  # the plugin: 67.6% eligible
    assert set(m.kernel_time_by_precision_ms) == {"fp32-fma"}


# --- the ViT on an H100: baseline, --tf32, --bf16 ---------------------------------------------
_RUNS: dict[str, Analysis] = {}


def vit(run: str) -> Analysis:
    if run not in _RUNS:
        _RUNS[run] = analyze(shared(f"whatif/h100_vit/{run}")).with_primary_frames()  # tests read its kernels
    return _RUNS[run]


def unprofiled_median_ms(run: str) -> float:
    """Median step after the window, the three right after it left out (whatif/README.md)."""
    facts = json.loads((shared(f"whatif/h100_vit/{run}") / "advisor_facts.json").read_text())
    window = facts["window"]
    first = window["wait"] + window["warmup"] + window["active"] + 3
    return statistics.median(facts["step_times_ms"][first:])


def test_vit_baseline_leads_with_tf32_and_promises_what_tf32_measured():
    findings = vit("baseline").findings
    first = findings[0]
    assert first.rule == "tf32-disabled" and first.severity == "high" and first.confidence == "high"
    measured = unprofiled_median_ms("baseline") - unprofiled_median_ms("tf32")
    assert measured == pytest.approx(28.2, abs=0.05)  # 60.4 -> 32.2 ms
    assert 0.5 * measured <= first.saving_ms <= 1.5 * measured
    assert first.evidence["families"]["gemm"]["speedup"] == MEASURED_RATIOS[9.0][("gemm", "fp32-fma", "tf32")]
    assert first.evidence["families"]["gemm"]["tf32_switch"] is False
    assert 'set_float32_matmul_precision("high")' in first.fix.text
    assert "measured on an H100" in first.message


def test_vit_tf32_run_has_no_tf32_finding_and_bf16_run_no_high_precision_finding():
    assert "tf32-disabled" not in {f.rule for f in vit("tf32").findings}
    high = {f.rule for f in vit("bf16").findings if f.severity == "high"}
    assert not high & set(PRECISION_RULES)


def test_vit_json_report_has_time_per_precision():
    a = vit("baseline")
    report = orjson.loads(to_json(a))
    by_precision = report["summary"]["kernel_time_by_precision_ms"]
    # Independently, by name: cuBLAS's ffma GEMMs and cutlass's simt sgemms, per step, inside the steps.
    k = step_kernels(a.primary)
    names = k["name"].astype(str)
    fma_ns = k.loc[names.str.contains("_ffma_") | names.str.contains("simt_sgemm"), "dur"].sum()
    assert by_precision["fp32-fma"] == pytest.approx(fma_ns / len(a.primary.steps) / 1e6, rel=1e-3)
    assert by_precision["tf32"] > 0 and "bf16" not in by_precision
    bf16 = orjson.loads(to_json(vit("bf16")))["summary"]["kernel_time_by_precision_ms"]
    assert max(bf16, key=bf16.get) == "bf16"


def test_precision_speedup_scales_only_matrix_kernels_forward():
    k = step_kernels(vit("baseline").primary)
    to_tf32 = precision_speedup(k, "tf32")
    to_bf16 = precision_speedup(k, "bf16")
    fp32_gemm = ((k["precision"] == "fp32-fma") & (k["family"] == "gemm")).to_numpy()
    assert fp32_gemm.any()
    assert np.allclose(to_tf32[fp32_gemm], 1 / 4.63) and np.allclose(to_bf16[fp32_gemm], 1 / 5.90)
    attention = (k["precision"] == "tf32").to_numpy() & (k["family"] == "attention").to_numpy()
    assert attention.any() and (to_tf32[attention] == 1).all() and np.allclose(to_bf16[attention], 1 / 6.06)
    other = (k["precision"] == "").to_numpy()
    assert other.any() and (to_tf32[other] == 1).all() and (to_bf16[other] == 1).all()
    # Nothing goes back: bf16 kernels asked to move to TF32 stay as they are.
    kb = step_kernels(vit("bf16").primary)
    assert (precision_speedup(kb, "tf32")[(kb["precision"] == "bf16").to_numpy()] == 1).all()
    # Without a measurement (an A100), the conservative table: 2x fp32 -> TF32.
    assert np.allclose(precision_speedup(k, "tf32", capability=8.0)[fp32_gemm], 1 / 2.0)
    with pytest.raises(ValueError, match="target"):
        precision_speedup(k, "fp64")


def test_the_measured_table_is_what_the_corpus_measures():
    spec = importlib.util.spec_from_file_location("precision_ratios", REPO / "benchmarks" / "precision_ratios.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    _, measured = bench.measure(shared("kernels/h100"))
    table = MEASURED_RATIOS[9.0]
    for key, value in table.items():
        assert value == pytest.approx(measured[key], abs=0.006), key


def test_names_alone_say_so_in_the_finding(tmp_path):
    # Edit: the ViT baseline trace without `Input type` on any op, and no facts file beside it.
    [trace] = shared("whatif/h100_vit/baseline").glob("*.pt.trace.json.gz")
    doc = load_events(trace)

    def drop_types(e):
        del e["args"]["Input type"]

    assert edit_events(doc, lambda e: "Input type" in e.get("args", {}), drop_types) > 1000
    run = write_trace(doc, tmp_path / "no_shapes" / "worker0.pt.trace.json")
    a = analyze(run, config=Config(), select=PRECISION_RULES)
    f = next(f for f in a.findings if f.rule == "tf32-disabled")
    assert "kernel names alone" in f.message and f.confidence == "low"
    assert f.evidence["precision_from_op_input_types"] == 0.0


# --- Volta has no TF32 ------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["v100_resnet50_nw0", "v100_resnet50_nw4", "misc/v100_ns_resolution.pt.trace.json.gz"])
def test_tf32_disabled_never_fires_on_volta(name, tmp_path):
    assert "tf32-disabled" not in {f.rule for f in analyze(shared_trace(name), select=PRECISION_RULES).findings}
    # Not even with a facts file that says the switches are off.
    src = shared_trace(name)
    trace = single_file(src) if src.is_dir() else src
    run = tmp_path / "run"
    run.mkdir()
    (run / trace.name).write_bytes(trace.read_bytes())
    facts = {"schema": "advisor/facts/v1", "rank": 0, "tf32": {"matmul": False, "cudnn": False, "float32_matmul_precision": "highest"}}
    (run / "advisor_facts.json").write_bytes(orjson.dumps(facts))
    a = analyze(run, select=PRECISION_RULES)
    found = {f.rule for f in [*a.findings, *a.considered]}  # ranked, or considered with no gain on this run
    assert "tf32-disabled" not in found and "tensor-cores-unused" in found


def test_volta_tensor_core_names_are_fp16():
    assert read_kernel_name("volta_h884gemm_64x64_ldg8_nn").precision == "fp16"
    assert read_kernel_name("volta_sgemm_128x64_nn").unit == "fma"


# --- the page -----------------------------------------------------------------------------------
@pytest.mark.parametrize("rule", PRECISION_RULES)
def test_explain_shows_how_the_precision_is_decided(cli, rule):
    code, out, _ = cli(["explain", rule])
    assert code == 0
    assert "How the precision is decided" in out and "Input type" in out and "ffma" in out
    assert "4.63×" in out and "6.06×" in out  # the measured GEMM fp32 → TF32 and attention TF32 → bf16 rows

