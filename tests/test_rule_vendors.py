"""Each rule states which vendors' traces it has been tested on, and every claim is backed.

A rule file declares `TESTED_ON` (advisor/metrics/vendors.py). A vendor is claimed only where
a test runs the rule on a real trace of that vendor and asserts on it: an expert label of the
public corpus that names the rule (first fix, must or must-not: tests/test_corpus_labels.py),
or a test listed in ELSEWHERE, which names the test, the recording it runs the rule on, and
is checked here (the test exists, its file names the rule and the recording, and the
recording's vendor, read from the trace, is the one claimed).
"""

from __future__ import annotations

import ast
import functools
import json
from pathlib import Path

import pytest
from conftest import REPO, SHARED_TRACES

from advisor.engine import builtin_rules
from advisor.load.trace import load_trace
from advisor.metrics.vendors import VENDOR_NAMES, VENDORS, trace_vendor

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

LABELS = tomllib.loads((REPO / "tests" / "data" / "labels" / "corpus.toml").read_text())["trace"]

# (rule, vendor, test file, test function, recording it runs the rule on: repository-relative,
# or under ../shared/traces when it starts with "traces/")
ELSEWHERE = [
    ("cpu-autocast", "cpu", "tests/test_cpu_inference.py", "test_cpu_autocast_fires_on_fp32_linear_layers_and_is_silent_under_autocast", "tests/data/cpu_inference_grad/runs/batch256"),
    ("cpu-optimizer", "cpu", "tests/test_fits_every_trace.py", "test_cpu_optimizer_counts_the_models_parameters_and_stays_silent_below_its_floor", "sample_runs/cpu_transformer/runs/cpu_baseline"),
    ("cpu-threads", "cpu", "tests/test_fits_every_trace.py", "test_cpu_transformer_run_gets_top_ops_and_thread_advice", "sample_runs/cpu_transformer/runs/cpu_baseline"),
    ("d2d-copy-volume", "nvidia", "tests/test_rules_expert.py", "test_d2d_copies_named_by_their_cause_on_a_ddp_trace", "traces/misc/v100_ns_resolution.pt.trace.json.gz"),
    ("epoch-end", "nvidia", "tests/test_rules_expert.py", "test_epoch_ends_found_in_the_h100_walk_facts", "sample_runs/resnet18_cifar/runs/gpu_walk_final"),
    ("epoch-end", "cpu", "tests/test_advisorbench_cpu_rules.py", "test_a_dataloader_rebuilt_every_epoch_is_one_loader_whose_workers_restart", "tests/data/advisorbench_cpu/runs/loader_per_epoch"),
    ("unfused-elementwise", "cpu", "tests/test_advisorbench_cpu_rules.py", "test_the_cpu_elementwise_chains_of_the_gated_mlp_are_counted_and_priced_in_parts", "tests/data/advisorbench_cpu/runs/mlp_elementwise"),
    ("tensor-core-tile", "nvidia", "tests/test_roofline.py", "test_tile_finding_fires_on_misaligned_gemms_and_pads_them", "tests/data/shared/kernels/h100/bf16.pt.trace.json.gz"),
    ("small-gemm", "nvidia", "tests/test_roofline.py", "test_small_gemm_and_slow_memory_bound_findings_on_the_h100_recording", "tests/data/shared/kernels/h100/bf16.pt.trace.json.gz"),
    ("memory-bound-slow", "nvidia", "tests/test_roofline.py", "test_small_gemm_and_slow_memory_bound_findings_on_the_h100_recording", "tests/data/shared/kernels/h100/bf16.pt.trace.json.gz"),
    ("cpu-tensor-then-copy", "amd", "tests/test_rules_transfer.py", "test_cpu_tensor_then_copy_fires_on_randn_then_to", "traces/misc/amd_mi250_minitoy.json.gz"),
    ("unfused-attention", "cpu", "tests/test_unfused_attention.py", "test_eager_softmax_qkv_on_the_cpu_is_named_and_priced_from_its_own_ops", "tests/data/eager_attention_cpu/runs/eager"),
    ("fp8-gemm", "nvidia", "tests/test_fp8_gemm.py", "test_bf16_grouped_gemms_on_a_b200_get_an_fp8_option_priced_at_the_fp8_rate", "traces/corpus/b200_ep_moe_ref_fwd.json.gz"),
    ("unfused-attention", "amd", "tests/test_unfused_attention.py", "test_sdpa_on_an_mi300x_silent_when_fused_and_priced_from_the_device_table_when_it_falls_back", "traces/corpus/mi300x_sdpa_rocprofiler_sdk.json.gz"),
    ("empty-cache", "nvidia", "tests/test_rules_transfer.py", "test_empty_cache_and_churn_silent_without_step_markers", "traces/misc/a100_alexnet.json.gz"),
]


def _first_trace(path: Path) -> Path:
    if path.is_file():
        return path
    return sorted(p for p in path.rglob("*") if p.name.endswith((".json", ".json.gz")) and p.name != "advisor_facts.json")[0]


@functools.cache
def vendor_of(path: Path) -> str:
    """The vendor of a recording (its first trace file), read from the trace."""
    return trace_vendor(load_trace(_first_trace(path)))


def _recording(rel: str) -> Path:
    path = SHARED_TRACES / rel.removeprefix("traces/") if rel.startswith("traces/") else REPO / rel
    if not path.exists():
        pytest.skip(f"real recording not available: {path}")
    return path


def label_evidence() -> dict[str, set[str]]:
    """rule -> vendors of the labelled public traces whose label names it, in a check that
    holds (a check listed in KNOWN_MISSES is no evidence)."""
    from test_corpus_labels import KNOWN_MISSES

    out: dict[str, set[str]] = {}
    for label in LABELS:
        vendor = vendor_of(_recording(f"traces/{label['path']}"))
        misses = KNOWN_MISSES.get(label["path"], {})
        for check in ("first_fix", "must", "must_not"):
            if check in misses:
                continue
            for rule in label[check]:
                out.setdefault(rule, set()).add(vendor)
    return out


def test_every_rule_declares_the_vendors_it_was_tested_on():
    for rule in builtin_rules():
        claimed = getattr(rule.module, "TESTED_ON", None)
        assert isinstance(claimed, tuple) and claimed, f"{rule.id}: no TESTED_ON"
        assert set(claimed) <= set(VENDORS) and len(set(claimed)) == len(claimed), (rule.id, claimed)
        assert "Tested on" not in rule.doc, f"{rule.id}: the claim lives in TESTED_ON, shown on its page"


@pytest.mark.parametrize("entry", ELSEWHERE, ids=[f"{e[0]}-{e[1]}" for e in ELSEWHERE])
def test_each_test_named_as_evidence_runs_the_rule_on_a_trace_of_that_vendor(entry):
    rule, vendor, test_file, test_name, recording = entry
    source = (REPO / test_file).read_text()
    tree = ast.parse(source)
    assert test_name in {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}, f"{test_file} has no {test_name}"
    assert f'"{rule}"' in source, f"{test_file} never names {rule}"
    assert Path(recording.removesuffix(".pt.trace.json.gz").removesuffix(".json.gz")).name in source, f"{test_file} never names {recording}"
    assert vendor_of(_recording(recording)) == vendor


def test_each_rules_vendor_claim_is_backed_by_a_test_on_a_trace_of_that_vendor():
    evidence = label_evidence()
    for rule, vendor, *_ in ELSEWHERE:
        evidence.setdefault(rule, set()).add(vendor)
    unbacked = {r.id: sorted(set(r.module.TESTED_ON) - evidence.get(r.id, set())) for r in builtin_rules()}
    unbacked = {k: v for k, v in unbacked.items() if v}
    assert not unbacked, f"claims of traces no test runs the rule on: {unbacked}"


def test_vendors_are_read_from_the_trace():
    # one recording per vendor, each told by what its own trace holds
    seen = {
        "traces/corpus/a100_memcpy_pinned_10steps.json.gz": "nvidia",  # CUDA runtime calls, an A100
        "traces/misc/amd_mi250_minitoy.json.gz": "amd",  # hipLaunchKernel
        "traces/corpus/mi300x_vllm_decode_full_graph.json.gz": "amd",  # HIP calls, no device name recorded
        "traces/misc/mtia_inference.json.gz": "mtia",
        "traces/corpus/cpu_resnet18_infer_macos.json.gz": "cpu",
        "traces/corpus/a100_host_cpu_activity_only.json.gz": "cpu",  # an A100 listed, nothing ran on it
    }
    for rel, vendor in seen.items():
        assert vendor_of(_recording(rel)) == vendor, rel


def test_the_claims_are_shown_in_the_rule_listing_and_on_each_page(cli):
    code, out, err = cli(["rules", "-f", "json"])
    assert code == 0, err
    listed = {r["id"]: r["tested_on"] for r in json.loads(out)}
    for rule in builtin_rules():
        assert listed[rule.id] == list(rule.module.TESTED_ON)
    code, out, err = cli(["explain", "cpu-tensor-then-copy"])
    assert code == 0, err
    assert "Tested on: " + ", ".join(VENDOR_NAMES[v] for v in ("nvidia", "amd", "cpu")) + " traces." in out
    code, out, err = cli(["rules"])
    assert code == 0 and "tested on" in out
