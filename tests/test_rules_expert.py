"""Rules an expert would name that the first catalog lacked: unbucketed all-reduce,
device-to-device copies, epoch ends. Each fires on a real recording and stays silent on
another; expected numbers come from the raw JSON events or from the recording's own script,
not from the advisor's frames.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import REPO, shared_trace
from trace_edit import events, load_events

from advisor.analysis import Analysis, analyze
from advisor.config import Config
from advisor.engine import Finding

GLOO = REPO / "tests" / "data" / "allreduce_gloo" / "runs"
_CACHE: dict[tuple, Analysis] = {}


def run(path: Path, select: list[str] | None = None) -> Analysis:
    key = (str(path), tuple(select or ()))
    if key not in _CACHE:
        _CACHE[key] = analyze(path, config=Config(), select=select)
    return _CACHE[key]


def finding(a: Analysis, rule: str) -> Finding | None:
    return next((f for f in a.findings if f.rule == rule), None)


def host_steps(doc: dict) -> list[dict]:
    out = [e for e in events(doc, lambda e: re.fullmatch(r"ProfilerStep#\d+", str(e.get("name"))) and e.get("ph") == "X")]
    return sorted([e for e in out if str(e.get("cat", "")).lower() in ("operator", "cpu_op", "user_annotation")], key=lambda e: e["ts"])


# --- unbucketed-allreduce -----------------------------------------------------------------
def test_per_parameter_allreduce_loop_is_found_on_both_ranks():
    """tests/data/allreduce_gloo: two gloo ranks, one all_reduce per parameter (--manual)."""
    a = run(GLOO / "manual", select=["unbucketed-allreduce"])
    f = finding(a, "unbucketed-allreduce")
    assert f is not None and f.evidence["ranks"] == [0, 1]
    # The script's model: 25 Linear layers, a weight and a bias each: 50 gradients per step.
    for path in sorted((GLOO / "manual").glob("rank*.pt.trace.json.gz")):
        doc = load_events(path)
        steps = host_steps(doc)
        calls = [e for e in events(doc, lambda e: e.get("name") == "c10d::allreduce_") if any(s["ts"] <= e["ts"] < s["ts"] + s["dur"] for s in steps)]
        assert len(calls) / len(steps) == 50
    assert f.evidence["allreduce_calls_per_step"] == 50 and not f.evidence["ddp"]
    assert "DistributedDataParallel" in f.fix.text and "DDP(model, bucket_cap_mb=25)" in f.fix.snippet
    assert "device_ids" not in f.fix.snippet  # CPU ranks: no device to name


def test_allreduce_saving_is_what_ddp_measured_on_the_same_script():
    """The same script with DDP (bucketed, recorded beside it) is the measured 'after'."""
    before = run(GLOO / "manual", select=["unbucketed-allreduce"])
    after = run(GLOO / "ddp", select=["unbucketed-allreduce"])
    gained = before.step_times_ms().mean() - after.step_times_ms().mean()
    f = finding(before, "unbucketed-allreduce")
    assert gained > 30
    assert 0.6 * gained <= f.saving_ms <= 1.2 * gained


@pytest.mark.parametrize("path", ["ddp", "a100_nccl"])
def test_allreduce_silent_on_bucketed_ddp_runs(path):
    """The gloo DDP recording (2 buckets per step) and a real NCCL DDP job (5 per step)."""
    p = GLOO / "ddp" if path == "ddp" else shared_trace("misc/a100_nccl.json.gz")
    assert finding(run(p, select=["unbucketed-allreduce"]), "unbucketed-allreduce") is None


# --- d2d-copy-volume ----------------------------------------------------------------------
def test_d2d_copies_named_by_their_cause_on_a_ddp_trace():
    path = shared_trace("misc/v100_ns_resolution.pt.trace.json.gz")
    doc = load_events(path)
    steps = host_steps(doc)
    n = len(steps)
    copies = events(doc, lambda e: e.get("cat") == "gpu_memcpy" and "DtoD" in str(e.get("name")))
    to_grad = events(doc, lambda e: e.get("name") == "torch.distributed.ddp.reducer::copy_bucket_to_grad")
    f = finding(run(path, select=["d2d-copy-volume"]), "d2d-copy-volume")
    assert f is not None
    causes = {c["cause"]: c for c in f.evidence["causes"]}
    grad = causes["DDP copies each gradient bucket back into .grad"]
    assert grad["copies_per_step"] == round(len(to_grad) / n, 1) == 161  # ResNet-50 has 161 parameters
    # Every DtoD memcpy of the trace is accounted for, in bytes and in time.
    assert f.evidence["mb_per_step"] == pytest.approx(sum(e["args"]["bytes"] for e in copies) / n / 1e6, rel=1e-3)
    assert sum(c["ms_per_step"] for c in f.evidence["causes"]) == pytest.approx(f.evidence["copy_ms_per_step"], abs=0.01)
    assert "gradient_as_bucket_view=True" in f.fix.snippet and "broadcast_buffers=False" in f.fix.snippet
    # The buffer broadcast: 53 BatchNorm layers x 3 buffers, copied inside DDP's forward.
    assert causes["DDP broadcasts the module buffers (BatchNorm statistics) every forward"]["copies_per_step"] == 159


@pytest.mark.parametrize("name", ["v100_resnet50_nw0", "misc/a100_nccl.json.gz"])
def test_d2d_copies_silent_without_device_copies(name):
    assert finding(run(shared_trace(name), select=["d2d-copy-volume"]), "d2d-copy-volume") is None


# --- epoch-end ----------------------------------------------------------------------------
SAMPLE_RUNS = REPO / "sample_runs" / "resnet18_cifar" / "runs"


def test_epoch_ends_found_in_the_h100_walk_facts():
    """gpu_walk_final: batch 512 of 10,000 samples (20 batches, the last of 272), 15 workers
    that are not persistent, 48 steps: epochs begin at steps 20 and 40."""
    import orjson

    facts = orjson.loads((SAMPLE_RUNS / "gpu_walk_final" / "advisor_facts.json").read_bytes())
    wait = facts["loader_wait_ms"]
    f = finding(run(SAMPLE_RUNS / "gpu_walk_final"), "epoch-end")
    assert f is not None and f.evidence["epoch_starts"] == [20, 40]
    # The first step of each new epoch waits for freshly started workers: most of a second.
    for start, extra in zip([20, 40], f.evidence["worker_restart_ms"], strict=True):
        assert wait[start] - 1 <= extra <= wait[start] + wait[start + 1]
        assert extra > 500
    assert f.evidence["short_last_batch"] == 10000 % 512
    assert "persistent_workers=True" in f.fix.snippet and "drop_last=True" in f.fix.snippet
    # What the workers cost per step of the run is more than half an average step.
    assert 0.5 < f.saving_pct < 0.7


@pytest.mark.parametrize("name", ["gpu_workers", "gpu_cudagraphs", "cpu_workers"])
def test_epoch_end_silent_when_the_run_crossed_no_epoch_end(name):
    """Batch 32 and 128 of 10,000 samples in 48 steps (8 on the CPU): no epoch ended."""
    assert finding(run(SAMPLE_RUNS / name), "epoch-end") is None


def test_epoch_end_silent_without_facts():
    assert finding(run(shared_trace("v100_resnet50_nw4")), "epoch-end") is None


# --- training-only rules on inference runs ------------------------------------------------
def test_training_only_rules_stay_silent_when_the_facts_say_inference(tmp_path):
    """The per-parameter all-reduce recording, its facts' `mode` changed in one named way."""
    import shutil

    import orjson

    for mode, fires in (("training", True), ("inference", False)):
        run_dir = tmp_path / mode
        shutil.copytree(GLOO / "manual", run_dir, ignore=shutil.ignore_patterns(".advisor-cache"))
        for p in run_dir.glob("advisor_facts.rank*.json"):
            doc = orjson.loads(p.read_bytes())
            doc["mode"] = mode
            p.write_bytes(orjson.dumps(doc))
        a = analyze(run_dir, config=Config(), select=["unbucketed-allreduce", "communication-exposed", "step-time-variance"])
        assert (finding(a, "unbucketed-allreduce") is not None) is fires
        # Uneven steps without a cause the trace shows are a note for any run, never a finding.
        assert finding(a, "step-time-variance") is None and any("step times vary" in n for n in a.notes())


@pytest.mark.parametrize(
    "name,training",
    [
        ("misc/mtia_inference.json.gz", False),
        ("misc/old_schema_inference.json.gz", False),
        ("v100_resnet50_nw0", True),
        ("misc/a100_nccl.json.gz", True),
        ("misc/amd_mi250_minitoy.json.gz", True),
    ],
)
def test_inference_is_told_from_the_trace_without_facts(name, training):
    from advisor.engine import is_training
    from advisor.facts import FactsFile

    a = run(shared_trace(name), select=["step-time-variance"])
    assert is_training(a.with_primary_frames().primary, FactsFile()) is training
