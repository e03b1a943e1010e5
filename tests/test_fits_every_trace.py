"""Advice that fits every kind of trace (issue 22): steps found without ProfilerStep markers,
no noise ranked as a fix, facts before guesses, inference and CPU runs spoken to as such.

Each test reads a real trace from ../shared/traces, a recorded run of the sample, or a CPU
recording made for it (tests/data/, with the script that made it).
"""

from __future__ import annotations

import pytest
from conftest import REPO, SAMPLE_RUNS, shared_trace

from advisor.analysis import analyze

AUTOGRAD_CPU = REPO / "tests" / "data" / "autograd_profiler_cpu" / "resnet18_cpu_autograd.json.gz"


def rules_of(a) -> list[str]:
    return [f.rule for f in a.findings]


# --- item 1: iterations found without ProfilerStep ------------------------------------------
def test_alexnet_harness_steps_are_its_measured_iteration_and_warmup_is_apart():
    a = analyze(shared_trace("misc/a100_alexnet.json.gz"))
    m = a.primary
    # The harness's `[param|...|warmup|forward]` and `[param|...|measure|forward]` ranges: the
    # measured one is the step (79.7 ms host range), not the 43.4 s window.
    assert len(m.steps) == 1
    assert m.step_ms[0] == pytest.approx(79.7, abs=0.5)
    note = next(n for n in a.notes() if n.startswith("no ProfilerStep markers"))
    assert "2 iterations found from the repeated annotation" in note
    assert "the first (12,757.3 ms, named so) is the warm-up" in note and "cuDNN autotuning" in note
    # The autotuner's cudaEventSynchronize bursts and the context creation are warm-up: no
    # host-sync first, no finding larger than the step.
    assert a.findings and a.findings[0].rule != "host-sync"
    assert all(f.saving_ms is None or f.saving_ms <= m.step_ms.mean() for f in a.findings)
    assert "whole window counts as one step" not in " ".join(f.message for f in a.findings)


def test_autograd_profiler_recording_steps_come_from_the_dataloader():
    """The sample's CPU loop recorded with torch.autograd.profiler.profile (record.py beside it):
    six DataLoader `__next__` calls, the first iteration the warm-up."""
    a = analyze(AUTOGRAD_CPU)
    m = a.primary
    assert len(m.steps) == 5
    note = next(n for n in a.notes() if n.startswith("no ProfilerStep markers"))
    assert "6 iterations found from the DataLoader's __next__" in note and "is the warm-up" in note
    assert "CUDA" not in note  # a CPU run's warm-up is not a CUDA context
    # Each found step holds one forward, backward and optimizer step: one Optimizer.step span each.
    host = a.with_primary_frames().primary.frames.host
    opt = host[host["name"].astype(str).str.startswith("Optimizer.step#")]
    starts, ends = m.steps["start"].to_numpy(), m.steps["end"].to_numpy()
    per_step = [int(((opt["ts"] >= s) & (opt["end"] <= e)).sum()) for s, e in zip(starts, ends, strict=True)]
    assert per_step == [1] * 5
    # The input pipeline (batch 16 of HandAugment, no workers) leads.
    assert rules_of(a)[0] == "dataloader-stall"


# --- item 7: variance is a finding only with a cause ------------------------------------------
@pytest.mark.parametrize("run", ["cpu_baseline", "cpu_workers", "cpu_two_threads_full"])
def test_quick_start_cpu_runs_lead_with_input_pipeline_not_variance(run):
    a = analyze(SAMPLE_RUNS / "resnet18_cifar" / "runs" / run)
    assert "step-time-variance" not in rules_of(a)
    if run != "cpu_workers":
        assert rules_of(a)[0] == "dataloader-stall"
    if run == "cpu_two_threads_full":
        # the quick start as it runs (torch's two threads, its facts naming the CPU's bf16):
        # bf16 autocast in training is considered, not ranked above the DataLoader fix
        assert a.facts[0]["cpu_features"]["flags"] and "avx512_bf16" in a.facts[0]["cpu_features"]["flags"]
        assert "cpu-autocast" in {f.rule for f in a.considered}


# --- item 5: a synchronize that closes the step costs only the idle it causes -----------------
def test_closing_synchronize_is_not_charged_for_the_next_steps_host_work():
    from advisor.config import Config

    # The harness's measured iteration waits 0.9 ms in cudaDeviceSynchronize while the GPU runs
    # the forward pass; nothing of the step is launched after it.
    loose = Config(rule_options={"host-sync": {"min_share": 0.0}})
    a = analyze(shared_trace("misc/a100_alexnet.json.gz"), config=loose, select=["host-sync"])
    # The replay of removing it gains nothing measurable, so it may not be reported at all;
    # where it is, its evidence says why it costs nothing.
    for f in a.findings:
        assert f.evidence["closing_syncs_per_step"] == 1.0 and f.evidence["wait_ms_per_step"] > 0.5
        assert f.evidence["by_cause"][0]["cause"] == "explicit" and f.evidence["by_cause"][0]["saving_ms_per_step"] == 0.0
        assert f.saving_ms < 0.05
    # The Triton example's one synchronize, after its only kernel: no finding at all (it was
    # the run's first and only finding, at 0.01 ms).
    assert "host-sync" not in rules_of(analyze(shared_trace("misc/a100_triton.json.gz")))


# --- item 4: inference runs are told about throughput, latency and inference_mode -------------
def as_inference(tmp_path, run: str):
    """A recorded GPU run of the sample, its facts' `mode` set to inference (the one change)."""
    import shutil

    import orjson

    dest = tmp_path / run
    shutil.copytree(SAMPLE_RUNS / "resnet18_cifar" / "runs" / run, dest, ignore=shutil.ignore_patterns(".advisor-cache"))
    facts = dest / "advisor_facts.json"
    doc = orjson.loads(facts.read_bytes())
    doc["mode"] = "inference"
    facts.write_bytes(orjson.dumps(doc))
    return dest


def test_inference_runs_get_inference_advice(tmp_path):
    a = analyze(as_inference(tmp_path, "gpu_compiled"))
    by = {f.rule: f for f in a.findings}
    spare, launch = by["spare-gpu-memory"], by["launch-bound"]
    for f in (spare, launch):
        text = " ".join([f.message, f.fix.text, f.fix.snippet])
        assert "learning rate" not in text and "lr=" not in text and "cudagraph_mark_step_begin" not in text
        assert "inference_mode" in f.fix.text + f.fix.snippet and f.evidence["mode"] == "inference"
    assert "latency" in spare.message and "throughput" in spare.message
    assert "batch_size=128 → 512" in spare.fix.text and "[:512]" in spare.fix.snippet  # the run's own batch and factor
    assert "forward pass" in launch.message and "latency" in launch.message
    # The same run as recorded (training) keeps the training advice.
    train = {f.rule: f for f in analyze(SAMPLE_RUNS / "resnet18_cifar" / "runs" / "gpu_compiled").findings}
    assert "learning rate" in train["spare-gpu-memory"].message


# --- item 8: source lines and snippets from the run itself ------------------------------------
def test_frame_open_when_profiling_started_is_not_the_users_line():
    """gpu_baseline's Python stack stops at `train.py(202): main` (the line where the profiler
    started, open over every step): no finding may point there as if it were the op's line."""
    a = analyze(SAMPLE_RUNS / "resnet18_cifar" / "runs" / "gpu_baseline")
    sources = [s for f in a.findings for s in f.evidence.get("source", []) or []]
    said = [f for f in a.findings if "train.py(202)" in f.message or any("train.py(202)" in s for s in f.evidence.get("source", []) or [])]
    assert said, "the findings that used to point at train.py(202) still say where the stack stops"
    for f in said:
        for s in [f.message] + list(f.evidence.get("source", []) or []):
            if "train.py(202)" in s:
                assert "user line not in the trace" in s and "where profiling started" in s
    assert sources and not any(s.startswith("train.py(202)") for s in sources)


def test_frames_entered_inside_the_steps_are_still_named():
    """The 2021 ResNet-50 trace's call stacks name the script's lines: they stay."""
    a = analyze(shared_trace("v100_resnet50_nw0"))
    zero = next(f for f in [*a.findings, *a.considered] if f.rule == "zero-grad-memset")
    assert "resnet50_profiler_api.py(49): <module>" in zero.message


@pytest.mark.parametrize("run,batch,workers", [("gpu_baseline", 32, None), ("gpu_workers", 32, 15)])
def test_loader_snippets_show_the_runs_own_settings(run, batch, workers):
    a = analyze(SAMPLE_RUNS / "resnet18_cifar" / "runs" / run)
    pin = next(f for f in a.findings if f.rule == "h2d-pageable-copy")
    line = pin.fix.snippet.splitlines()[0]
    assert f"batch_size={batch}," in line and "pin_memory=True" in line and "batch_size=64" not in line
    assert (f"num_workers={workers}" in line) if workers else ("num_workers" not in line)


# --- item 2: a sampled trace keeps its steps' figures ------------------------------------------
def test_sampled_trace_keeps_the_step_and_its_copies(tmp_path):
    """The first 33 events of the A100 80GB trace (ProfilerStep#550, 209.7 ms, and the
    profiler's own span), plus the step's host-to-device copies: the step is the marker's
    209.7 ms, not the 4.0 ms its few kept events cover, and every kept copy counts."""
    import gzip

    import orjson

    doc = orjson.loads(gzip.decompress(shared_trace("misc/a100_80gb_train.json.gz").read_bytes()))
    spans = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    step = next(e for e in spans if e.get("name") == "ProfilerStep#550")
    session = [e for e in spans if e.get("cat") == "Trace"]
    copies = [
        e
        for e in spans
        if str(e.get("name", "")).startswith("Memcpy HtoD") and step["ts"] <= e["ts"] <= step["ts"] + step["dur"]
    ]
    assert len(copies) >= 2
    kept = spans[:33] + [e for e in [step] + session + copies if e not in spans[:33]]
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("ph") != "X"] + kept
    path = tmp_path / "sample.json"
    path.write_bytes(orjson.dumps(doc))
    a = analyze(path)
    m = a.primary
    assert len(m.steps) == 1 and m.step_ms[0] == pytest.approx(step["dur"] / 1000, abs=0.01)
    assert not any("clipped" in n for n in a.notes())
    assert m.h2d["count"] == len(copies)
    assert m.h2d["bytes"] == sum(e["args"]["bytes"] for e in copies)
    # A marker left open past the profiler's span is still clipped (the Triton example).
    t = analyze(shared_trace("misc/a100_triton.json.gz"))
    assert t.primary.step_ms[0] < 2 and any("clipped to the last recorded event" in n for n in t.notes())


# --- item 6: the collectives' bandwidth against the link ---------------------------------------
def test_communication_exposed_compares_achieved_bandwidth_with_the_link():
    import gzip

    import orjson

    path = shared_trace("misc/a100_nccl.json.gz")
    a = analyze(path, select=["communication-exposed"])
    f = a.findings[0]
    link = f.evidence["link"]
    # Independently, from the raw events: the collective kernels inside the ProfilerStep spans
    # (all-reduces and broadcasts), their message bytes times NCCL's factor (2(n-1)/n for an
    # all-reduce, 1 for a broadcast) over their kernel time.
    doc = orjson.loads(gzip.decompress(path.read_bytes()))
    ev = doc["traceEvents"]
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in ev if str(e.get("name", "")).startswith("ProfilerStep#") and e.get("cat") == "user_annotation"]
    ar = [
        e
        for e in ev
        if e.get("cat") == "kernel" and ("AllReduce" in e["name"] or "Broadcast" in e["name"]) and any(s <= e["ts"] < t for s, t in steps)
    ]
    n = doc["distributedInfo"]["world_size"]
    element = {"Float": 4, "Long": 8}
    factor = {True: 2 * (n - 1) / n, False: 1.0}
    expect = sum(e["args"]["In msg nelems"] * element[e["args"]["dtype"]] * factor["AllReduce" in e["name"]] for e in ar) / sum(e["dur"] for e in ar) / 1e3
    assert link["collectives_sized"] == len(ar)
    assert link["bus_gbps"] == pytest.approx(expect, rel=0.02) and link["bus_gbps"] < 10
    assert link["link"] == "NVLink 3" and link["link_gbps"] == 230
    assert "GB/s of bus bandwidth" in f.message and "NVLink 3" in f.message and "PCIe 4" in f.message and "InfiniBand" in f.message
    assert "cannot overlap" in f.message  # why the saving is less than the exposed time


# --- item 9: CPU runs get what a CPU user expects ---------------------------------------------
CPU_TRANSFORMER = SAMPLE_RUNS / "cpu_transformer" / "runs" / "cpu_baseline"


def test_cpu_transformer_run_gets_top_ops_and_thread_advice(cli):
    """sample_runs/cpu_transformer recorded with `advisor profile --device cpu ... -- --threads 1`
    on a 2-core machine: one intra-op thread, so the matmuls could use two."""
    import orjson

    facts = orjson.loads((CPU_TRANSFORMER / "advisor_facts.json").read_bytes())
    assert facts["torch_threads"]["intra_op"] == 1 and facts["cpu_count"] == 2 and facts["device"]["type"] == "cpu"
    a = analyze(CPU_TRANSFORMER)
    assert "step-time-variance" not in rules_of(a)
    f = next(f for f in a.findings if f.rule == "cpu-threads")
    assert f.evidence["target_threads"] == 2 and "torch.set_num_threads(2)" in f.fix.snippet
    assert 0 < f.saving_ms <= f.evidence["pooled_ops_ms_per_step"] / 2 + 1  # at most half the pooled ops' time
    assert "aten::mm" in f.evidence["top_pooled_ops"]
    # The text report has a top-ops table for a CPU-only run.
    code, out, _ = cli(["report", str(CPU_TRANSFORMER)])
    assert code == 0 and "Top CPU ops (self time per step)" in out and "aten::mm" in out


def test_cpu_threads_silent_when_the_loaders_workers_take_the_other_core():
    # cpu_workers: one intra-op thread and num_workers=1 on 2 cores: nothing to spare.
    a = analyze(SAMPLE_RUNS / "resnet18_cifar" / "runs" / "cpu_workers")
    assert "cpu-threads" not in rules_of(a)
    # cpu_baseline: one thread (OMP_NUM_THREADS=1), no workers: the input pipeline still leads.
    # The one idle core can take a loader worker or a second compute thread, not both: with the
    # loader's fix ranked first, cpu-threads is considered, with nothing left for it.
    b = analyze(SAMPLE_RUNS / "resnet18_cifar" / "runs" / "cpu_baseline")
    assert rules_of(b)[0] == "dataloader-stall"
    threads = next(f for f in [*b.findings, *b.considered] if f.rule == "cpu-threads")
    assert "OMP_NUM_THREADS=1" in threads.message
    assert threads in b.considered and "dataloader-stall" in (threads.no_gain or "")


def test_cpu_optimizer_counts_the_models_parameters_and_stays_silent_below_its_floor():
    from advisor.config import Config

    loose = Config(rule_options={"cpu-optimizer": {"min_share": 0.0}})
    a = analyze(CPU_TRANSFORMER, config=loose, select=["cpu-optimizer"])
    f = [*a.findings, *a.considered][0]  # under 0.5% of the step: considered, with its evidence
    # TinyLM: an embedding, 2 encoder layers of 12 tensors each, a linear head of 2: 27 tensors.
    assert f.evidence["parameters"] == 27 and f.evidence["optimizer"] == "AdamW"
    assert "fused=True" in f.fix.snippet


@pytest.mark.xfail(strict=True, reason="the whole per-parameter update is priced now (its Python loop, each op's dispatch, "
                   "the extra passes over memory), not only the ops' fixed cost: 3.2 ms/step replayed, 1.1% of the step, "
                   "just over the 1% floor; no fused twin of this sample has been measured")
def test_cpu_optimizer_silent_at_its_default_floor_on_the_cpu_transformer_sample():
    # Its per-op fixed cost is a small share of this step: no finding at the default floor.
    assert "cpu-optimizer" not in rules_of(analyze(CPU_TRANSFORMER))


def test_cpu_inference_run_is_told_as_inference(cli):
    """sample_runs/cpu_transformer with --inference (torch.inference_mode(), one thread),
    recorded with advisor profile: an inference run, no training advice, thread advice stays."""
    import orjson

    run = SAMPLE_RUNS / "cpu_transformer" / "runs" / "cpu_inference"
    assert orjson.loads((run / "advisor_facts.json").read_bytes())["mode"] == "inference"
    a = analyze(run)
    rules = rules_of(a)
    assert "cpu-optimizer" not in rules and "step-time-variance" not in rules
    assert not any("learning rate" in f.message + f.fix.text for f in a.findings)
    assert rules[0] == "cpu-threads" and "aten::addmm" in a.findings[0].evidence["top_pooled_ops"]
    code, out, _ = cli(["report", str(run)])
    assert code == 0 and "Top CPU ops (self time per step)" in out


# --- item 8: snippets are built from the finding's own values -----------------------------------
def test_loader_snippets_show_the_runs_own_values_or_name_them():
    import re

    baseline = analyze(SAMPLE_RUNS / "resnet18_cifar" / "runs" / "gpu_baseline")
    found = {f.rule: f for f in [*baseline.findings, *baseline.considered]}
    stall, bigger = found["dataloader-stall"], found["spare-gpu-memory"]
    # the message's worker count is the snippet's; the run's batch of 32 (its facts file) too
    (told,) = set(re.findall(r"set num_workers=(\d+)", stall.message))
    assert f"num_workers={told}," in stall.fix.snippet and "batch_size=32," in stall.fix.snippet
    # 4x the batch of 32, and no DataLoader workers the run did not have (it had none)
    assert "batch_size=128" in bigger.fix.snippet and "num_workers" not in bigger.fix.snippet
    # A trace without a facts file knows neither: the snippet names them instead of inventing numbers.
    nw0 = analyze(shared_trace("v100_resnet50_nw0"))
    stall = next(f for f in [*nw0.findings, *nw0.considered] if f.rule == "dataloader-stall")
    assert "batch_size=batch_size" in stall.fix.snippet and "num_workers=8" not in stall.fix.snippet
