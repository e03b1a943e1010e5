"""Every measured pair keeps its promise: a run before a fix, the run with the fix applied, and
the saving the "before" run's report promised for that fix against the gain the pair measured.

The pairs are benchmarks/promise_accuracy.py's: the ViT on an H100 (whatif/h100_vit: the
baseline and each fix alone; its facts files hold each run's unprofiled step times after the
profiled window) and the rounds of the sample's GPU walk whose "before" run is in
sample_runs/resnet18_cifar/runs (the gain each round measured is in its results file,
benchmarks/results/follow_the_advice_gpu*.json, `measured_after_ms`).

The measured gain is the drop of the median unprofiled step, per sample of the run before (a 4x
batch's step counts a quarter). The pairs are steady (each ViT median is over 30 unprofiled
steps, whose interquartile range is 3-28% of the median: the median itself moves by a few
percent), so a promise is held to ±25% of its gain; a gain under 1 ms is within the run-to-run
noise, and the promise must then stay under 2 ms (benchmarks/promise_accuracy.py's rule). Both readings
of a promise are held: the finding's `saving_alone_ms` (what the report prints) and the fixes
replayed together on the before run (`Analysis.replayed_saving`, what the benchmark replays).
"""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest
from conftest import REPO, SAMPLE_RUNS, shared

from advisor.analysis import Analysis, analyze
from advisor.config import Config
from advisor.facts import typed_facts
from advisor.metrics.unprofiled import unprofiled_steps

RESULTS = REPO / "benchmarks" / "results"
WALK_RUNS = SAMPLE_RUNS / "resnet18_cifar" / "runs"

# ViT fix run -> the rules whose fix it applied (benchmarks/promise_accuracy.py, VIT_FIXES).
VIT_FIXES = {
    "workers": ["dataloader-stall"],
    "pin_memory": ["h2d-pageable-copy"],
    "tf32": ["tf32-disabled"],
    "bf16": ["tensor-cores-unused"],
    "no_sync": ["host-sync"],
    "foreach": ["single-tensor-optimizer"],
    "compile": ["unfused-elementwise"],
    "batch256": ["spare-gpu-memory"],
}
SAMPLES_PER_STEP = {"batch256": 4.0}  # 256 samples a step against the baseline's 64
# Walk rounds: (results file, change number, before run, rules whose fixes the round applied).
# The cudagraphs round's `--compile reduce-overhead` also set zero_grad(set_to_none=True).
WALK = [
    ("follow_the_advice_gpu.json", 1, "gpu_baseline", ["dataloader-stall"]),
    ("follow_the_advice_gpu.json", 3, "gpu_workers", ["spare-gpu-memory"]),
    ("follow_the_advice_gpu_cudagraphs.json", 1, "gpu_compiled", ["launch-bound", "zero-grad-memset"]),
    ("follow_the_advice_gpu_final_code_2.json", 4, "gpu_input_bound", ["dataloader-stall"]),
]
# Pairs whose promise misses its measured gain by more than the band: strict, with the reason.
MISSED = {
    # benchmarks/results/promise_accuracy.txt: the one pair of 12 outside the band
    "vit/bf16": "autocast with TF32 off: promised 27.3 ms against 16.2 ms measured (x1.69)",
    # the benchmark counts this pair right on the replayed promise (dataloader-stall has no
    # graph change on this run: 0 ms); the report states a saving of 8.1 ms for it
    "walk/follow_the_advice_gpu_final_code_2#4": (
        "the report ranks dataloader-stall at 8.1 ms on gpu_input_bound; the round that applied its fix "
        "(--uint8-to-device) measured 0.83 ms"
    ),
}


@functools.cache
def _analysis(run: str) -> Analysis:
    path = shared("whatif/h100_vit/baseline") if run == "vit/baseline" else WALK_RUNS / run
    return analyze(path, config=Config())


def _unprofiled_median_ms(run_folder) -> float:
    facts = json.loads((run_folder / "advisor_facts.json").read_text())
    return float(np.median(unprofiled_steps(typed_facts(facts)).step_ms))


def _pairs() -> list:
    out = []
    for fix, rules in VIT_FIXES.items():
        out.append(pytest.param(("vit", fix, rules), id=f"vit/{fix}"))
    for results, number, before, rules in WALK:
        out.append(pytest.param(("walk", (results, number, before), rules), id=f"walk/{results.split('.')[0]}#{number}"))
    return [pytest.param(*p.values, id=p.id, marks=[pytest.mark.xfail(strict=True, reason=MISSED[p.id])] if p.id in MISSED else []) for p in out]


def _measured_and_before(kind: str, which) -> tuple[float, Analysis]:
    if kind == "vit":
        gain = _unprofiled_median_ms(shared("whatif/h100_vit/baseline")) - _unprofiled_median_ms(shared(f"whatif/h100_vit/{which}")) / SAMPLES_PER_STEP.get(which, 1.0)
        return gain, _analysis("vit/baseline")
    results, number, before = which
    change = next(c for c in json.loads((RESULTS / results).read_text())["changes"] if c["number"] == number)
    return float(change["measured_after_ms"]), _analysis(before)


def _report_promise(a: Analysis, rules: list[str], kind: str, which) -> float:
    """What the report states: the finding's saving alone (0 where the rule did not fire or gains
    nothing); autocast turned on with TF32 left off (the ViT's bf16 run) promises autocast alone,
    which tensor-cores-unused states in its evidence when tf32-disabled fired too."""
    by = {f.rule: f for f in [*a.findings, *a.considered]}
    if kind == "vit" and which == "bf16" and "autocast_without_tf32_replayed_ms" in by["tensor-cores-unused"].evidence:
        return float(by["tensor-cores-unused"].evidence["autocast_without_tf32_replayed_ms"])
    (rule,) = rules
    f = by.get(rule)
    return 0.0 if f is None else float(f.saving_alone_ms if f.saving_alone_ms is not None else f.saving_ms or 0.0)


def _kept(promised: float, measured: float) -> bool:
    if measured < 1.0:
        return promised < 2.0
    return abs(promised - measured) <= 0.25 * measured


@pytest.mark.parametrize("pair", _pairs())
def test_a_measured_fix_gains_what_the_run_before_it_promised(pair):
    kind, which, rules = pair
    measured, a = _measured_and_before(kind, which)
    replayed = a.replayed_saving(rules) or 0.0
    if kind == "vit" and which == "bf16":
        replayed = _report_promise(a, rules, kind, which)  # the replay of autocast alone, as the evidence states it
    assert _kept(replayed, measured), f"{rules}: replayed {replayed:.2f} ms against {measured:.2f} ms measured"
    if len(rules) == 1:
        stated = _report_promise(a, rules, kind, which)
        assert _kept(stated, measured), f"{rules}: the report promises {stated:.2f} ms against {measured:.2f} ms measured"
