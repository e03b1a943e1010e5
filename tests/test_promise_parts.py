"""torch.compile's and autocast's promises in their parts, on the run that showed the problem.

A second recording of the V100 ResNet-50 `num_workers=0` run put `unfused-elementwise` first
at 46.99 ms, its own estimate 19.80, above the DataLoader whose fix measured 29.2 ms (the
issue's figures): a bundle of fusion, launches, layout and batch-norm models, of which only
fusion and launches were ever checked by a measured pair (the H100 ViT compile pair: a ViT has
no batch norm). Each part is now shown with its figure and bound, the unchecked ones as
"up to", and such a promise ranks behind a measured fix of like size.
"""

from __future__ import annotations

import gzip
import json

import pytest
from conftest import shared_trace, single_file

from advisor.analysis import analyze
from advisor.engine.ranking import UNCHECKED_MARGIN, _pick
from advisor.render.fmt import order_note


def nw0_trace_dir():
    return shared_trace("v100_resnet50_nw0")


@pytest.fixture(scope="module")
def nw0_analysis():
    return analyze(nw0_trace_dir())


def _finding(a, rule):
    found = [f for f in a.findings if f.rule == rule]
    assert found, f"{rule} did not fire: {[f.rule for f in a.findings]}"
    return found[0]


def test_dataloader_fix_ranks_above_compile(nw0_analysis):
    # the issue: the DataLoader's fix measured 29.2 ms on this run, compile's own estimate 19.80
    ranked = [f.rule for f in nw0_analysis.findings]
    assert ranked.index("dataloader-stall") < ranked.index("unfused-elementwise")


def test_compile_parts_add_up_to_its_promise(nw0_analysis):
    f = _finding(nw0_analysis, "unfused-elementwise")
    parts = {p["part"]: p for p in f.evidence["promise_parts"]}
    assert set(parts) == {"fusion", "launches removed", "layout", "norms"}
    # the parts add up to the promise alone (their definition), to the rounding of each part
    assert sum(p["ms"] for p in parts.values()) == pytest.approx(f.saving_alone_ms, abs=0.01)
    for p in parts.values():
        if p["ms"] > 0 and p["bound_ms"] is not None:
            assert p["ms"] <= p["bound_ms"] + 0.001, p
    # a ViT has no batch norm and (but for its patch embedding) no convolution: the measured
    # compile pair checked fusion and launches, never layout nor norms
    assert not parts["fusion"]["up_to"] and not parts["launches removed"]["up_to"]
    assert parts["layout"]["up_to"] and parts["norms"]["up_to"]
    # ResNet-50 has a batch norm after every convolution: its norms part is there, and at most
    # the cuDNN batch-norm kernels' time, from the raw trace: 636 `cudnn::bn_*` kernels,
    # 96.18 ms over the 6 ProfilerSteps
    events = json.load(gzip.open(single_file(nw0_trace_dir())))["traceEvents"]
    bn_ms = sum(e["dur"] for e in events if e.get("cat") == "Kernel" and "cudnn::bn_" in e["name"]) / 1e3
    steps = sum(1 for e in events if str(e.get("name", "")).startswith("ProfilerStep#"))
    assert 0 < parts["norms"]["ms"] <= parts["norms"]["bound_ms"] <= bn_ms / steps + 0.01


def test_up_to_parts_labelled_in_the_text(nw0_analysis, cli):
    code, out, _ = cli(["report", str(nw0_trace_dir())])
    assert code == 0
    text = " ".join(out.split())
    f = _finding(nw0_analysis, "unfused-elementwise")
    for p in f.evidence["promise_parts"]:
        if p["ms"] >= 0.005:
            said = f"{p['part']} up to {p['ms']:.2f} ms" if p["up_to"] else f"{p['part']} {p['ms']:.2f} ms"
            assert said in text, said
    assert "no measured pair has checked layout, norms" in text


def test_autocast_parts_add_up_and_speedups_are_up_to(nw0_analysis):
    f = _finding(nw0_analysis, "tensor-cores-unused")
    parts = {p["part"]: p for p in f.evidence["promise_parts"]}
    assert set(parts) == {"per-op speed-ups", "casts", "host cost"}
    assert sum(p["ms"] for p in parts.values()) == pytest.approx(f.saving_alone_ms, abs=0.01)
    # the casts cost (never gain), and the H100 ViT bf16 pair measured 16.18 ms against 27.27
    # promised: no pair confirms the per-op speed-ups
    assert parts["casts"]["ms"] <= 0 and parts["host cost"]["ms"] <= 0
    assert parts["per-op speed-ups"]["up_to"]
    assert "per-op speed-ups up to" in " ".join(f.message.split())


def test_up_to_promise_goes_behind_a_measured_fix_of_like_size(nw0_analysis):
    # the second V100 recording's figures (the issue): compile promised 46.99 ms, the DataLoader
    # fix 29.2 (within UNCHECKED_MARGIN); the measured fix goes first, and compile's line says why
    compile_, loader = _finding(nw0_analysis, "unfused-elementwise"), _finding(nw0_analysis, "dataloader-stall")
    assert 46.99 < 29.2 * UNCHECKED_MARGIN
    compile_.evidence.pop("ranked_after_measured", None)
    gain, picked = _pick([(46.99, compile_), (29.2, loader)], [compile_, loader])
    assert picked is loader and gain == 29.2
    assert compile_.evidence["ranked_after_measured"] == ["dataloader-stall"]
    # more than twice as much, and the "up to" promise goes first
    assert _pick([(70.0, compile_), (29.2, loader)], [compile_, loader])[1] is compile_
    # its line below a smaller figure names the measured fix and the reason
    loader_row = type("Row", (), {"rule": "dataloader-stall", "saving_ms": 29.2, "evidence": {}})()
    compile_row = type("Row", (), {"rule": "unfused-elementwise", "saving_ms": 34.6, "evidence": compile_.evidence})()
    note = order_note([loader_row, compile_row], 1)
    assert "listed below dataloader-stall" in note and "measured pairs confirm" in note and "up to" in note
    compile_.evidence.pop("ranked_after_measured", None)


def test_cpu_autocast_parts_on_a_measured_pair():
    # a CPU inference run and the same run under bf16 autocast (tests/data/cpu_inference_grad):
    # the measured saving is the drop of the median step after the window (the first one after
    # it left out, as the trace is written then), read from the facts files: 4.403 -> 3.237 ms,
    # below the speed-ups' "up to" figure, which no pair confirms
    import numpy as np
    import orjson
    from conftest import REPO

    runs = REPO / "tests" / "data" / "cpu_inference_grad" / "runs"
    median = {}
    for r in ("batch256", "batch256_bf16"):
        facts = orjson.loads((runs / r / "advisor_facts.json").read_bytes())
        median[r] = float(np.median(facts["step_times_ms"][max(facts["profiled_steps"]) + 2:]))
    assert median == pytest.approx({"batch256": 4.403, "batch256_bf16": 3.237}, abs=0.001)
    measured = median["batch256"] - median["batch256_bf16"]
    f = _finding(analyze(runs / "batch256"), "cpu-autocast")
    parts = {p["part"]: p for p in f.evidence["promise_parts"]}
    assert sum(p["ms"] for p in parts.values()) == pytest.approx(f.saving_alone_ms, abs=0.01)
    assert parts["per-op speed-ups"]["up_to"] and "per-op speed-ups up to" in f.message
    assert 0 < measured <= parts["per-op speed-ups"]["ms"]
