"""The host↔device rules on real traces: copies, syncs, launches, optimizer, allocator, parallelism.

Every rule fires on a real trace and stays silent on another. Where no trace in
../shared/traces shows a signal at full strength, the test says so and either lowers the
rule's threshold through the config (the real numbers stay as recorded) or edits a real
trace in one named way (tests/trace_edit.py) and writes it to tmp_path. Expected numbers
are recomputed here from the raw JSON events, independently of the advisor's frames.
"""

from __future__ import annotations

import gzip
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import orjson
import pytest

from advisor.whatif.replay import Change
from advisor.whatif.savings import rank_replay
from conftest import shared
from trace_edit import (
    add_events,
    by_cat,
    by_name,
    clone,
    drop_events,
    edit_events,
    events,
    load_events,
    rename_events,
    trace_file,
    trace_path,
    traces_dir,
    write_trace,
)

from advisor.analysis import Analysis, analyze
from advisor.config import Config
from advisor.engine import Finding, all_rules, check_rank_rules, find_rule
from advisor.load.trace import load_trace
from advisor.metrics.summary import compute_metrics
from advisor.render.json_report import to_json

MY_RULES = [
    "h2d-pageable-copy",
    "h2d-copy-volume",
    "host-sync",
    "launch-bound",
    "zero-grad-memset",
    "single-tensor-optimizer",
    "cpu-tensor-then-copy",
    "data-parallel",
    "communication-exposed",
    "empty-cache",
    "allocator-churn",
]
PAGEABLE = "Memcpy HtoD (Pageable -> Device)"


# --- helpers ------------------------------------------------------------------------------
_CACHE: dict[tuple, Analysis] = {}


def run(path: Path, options: dict | None = None, select: list[str] | None = None, all_rules: bool = False) -> Analysis:
    """analyze() with an empty config (the repository's own config must not leak in).

    Only this file's rules (and dataloader-stall, which owns DataLoader time) run unless
    all_rules is set: keeps the file fast."""
    if select is None and not all_rules:
        select = MY_RULES + ["dataloader-stall"]
    key = (str(path), repr(options), tuple(select or ()))
    if key not in _CACHE:
        _CACHE[key] = analyze(path, config=Config(rule_options=options or {}), select=select)
    return _CACHE[key]


def finding(a: Analysis, rule: str) -> Finding | None:
    """The rule's finding, ranked or considered (its fix gains nothing on the run)."""
    return next((f for f in [*a.findings, *a.considered] if f.rule == rule), None)


def alone(f: Finding) -> float:
    """A finding's saving with its fix applied alone (the ranked figure is on top of the fixes above it)."""
    return f.saving_alone_ms if f.saving_alone_ms is not None else f.saving_ms


def raw_steps(doc: dict) -> list[dict]:
    """Host ProfilerStep spans straight from the JSON (not the GPU-side copies of them)."""
    out = [e for e in events(doc, lambda e: re.fullmatch(r"ProfilerStep#\d+", str(e.get("name"))) and e.get("ph") == "X")]
    out = [e for e in out if str(e.get("cat", "")).lower() in ("operator", "cpu_op", "user_annotation")]
    return sorted(out, key=lambda e: e["ts"])


def inside(e: dict, spans: list[dict]) -> bool:
    return any(s["ts"] <= e["ts"] < s["ts"] + s["dur"] for s in spans)


# --- acceptance ---------------------------------------------------------------------------
def test_nw0_acceptance_dataloader_first_and_pageable_copy_fires():
    a = run(trace_path("v100_resnet50_nw0"), all_rules=True)
    rules = [f.rule for f in a.findings]
    assert rules[0] == "dataloader-stall"
    # fires: on top of the fixes ranked above it, pinning saves under 0.5% of the step (considered)
    assert finding(a, "h2d-pageable-copy") is not None
    # autocast gains nothing alone on this loader-bound step, and is ranked with what it saves
    # once the loader's fix exposes the fp32 convolutions (68% of kernel time)
    tc = next(f for f in a.findings if f.rule == "tensor-cores-unused")
    assert tc.saving_ms > 0.05 * a.headline().measured_ms and "dataloader-stall" in tc.evidence["depends_on"]


def test_nw4_acceptance_no_dataloader_stall_pageable_copy_still_fires():
    a = run(trace_path("v100_resnet50_nw4"), all_rules=True)
    rules = [f.rule for f in a.findings]
    assert "dataloader-stall" not in rules
    assert "tensor-cores-unused" in rules and "h2d-pageable-copy" in rules


# --- h2d-pageable-copy --------------------------------------------------------------------
def test_pageable_copy_numbers_follow_the_raw_copies():
    doc = load_events(trace_path("v100_resnet50_nw0"))
    copies = events(doc, by_name(PAGEABLE))
    n_steps = len(raw_steps(doc))
    f = finding(run(trace_path("v100_resnet50_nw0")), "h2d-pageable-copy")
    assert f is not None and f.confidence == "high"
    total_bytes = sum(e["args"]["bytes"] for e in copies)
    total_us = sum(e["dur"] for e in copies)
    # The manifest: ~19 MB per copy at ~10 GB/s; two copies (images, labels) per step.
    assert f.evidence["mb_per_step"] == pytest.approx(total_bytes / n_steps / 1e6, rel=1e-3)
    assert f.evidence["measured_gbps"] == pytest.approx(total_bytes / total_us / 1e3, rel=1e-2)
    assert 9 < f.evidence["measured_gbps"] < 11
    # V100 (cc 7.0) has no pinned copies in the trace: PCIe 3 figure.
    assert f.evidence["pinned_gbps_assumed"] == 12
    # Lower bound: the big copies alone at 12 GB/s instead of ~10 GB/s.
    big = [e for e in copies if e["args"]["bytes"] >= 256 * 1024]
    faster_copy_ms = sum(e["dur"] / 1e3 - e["args"]["bytes"] / 12e9 * 1e3 for e in big) / n_steps
    # what it saves on top of the fixes ranked above it (considered where that is under 0.5% of the step)
    saving = f.saving_ms or f.evidence["saving_after_fixes_above_ms"]
    assert saving >= 0.9 * faster_copy_ms
    # Upper bound: everything the copies cost, device copy time plus the host's blocking calls.
    calls = {e["args"]["correlation"]: e for e in events(doc, by_name("cudaMemcpyAsync"))}
    host_ms = sum(calls[e["args"]["correlation"]]["dur"] for e in copies) / 1e3 / n_steps
    assert saving < host_ms + total_us / 1e3 / n_steps
    assert f.evidence["source"] == ["resnet50_profiler_api.py(44): <module>"]


def test_pageable_copy_silent_once_the_copies_are_pinned(tmp_path):
    # Edit: every "Pageable -> Device" copy of nw0 is relabelled "Pinned -> Device" (same
    # bytes, same times), as if the DataLoader pinned its batches.
    doc = load_events(trace_path("v100_resnet50_nw0"))
    assert rename_events(doc, by_name(PAGEABLE), "Memcpy HtoD (Pinned -> Device)") == 12
    a = run(write_trace(doc, tmp_path / "pinned.pt.trace.json"))
    assert finding(a, "h2d-pageable-copy") is None
    assert a.primary.h2d["pinned_count"] == 12


def test_pageable_copy_silent_without_host_to_device_copies():
    a = run(trace_path("misc/v100_ns_resolution.pt.trace.json.gz"))
    assert a.primary.h2d["count"] == 0
    assert finding(a, "h2d-pageable-copy") is None


def test_pageable_copy_reads_pin_memory_from_the_facts(tmp_path):
    # Facts file beside a real trace: the DataLoader says it pins, the copies say pageable,
    # so the advice changes to "the copied tensor is made after loading".
    src = trace_file("v100_resnet50_nw0")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / src.name).write_bytes(src.read_bytes())
    facts = {"schema": "advisor/facts/v1", "rank": 0, "world_size": 1, "dataloaders": [{"batch_size": 32, "num_workers": 0, "pin_memory": True}]}
    (run_dir / "advisor_facts.json").write_bytes(orjson.dumps(facts))
    f = finding(run(run_dir), "h2d-pageable-copy")
    assert f is not None
    assert f.evidence["dataloader_pin_memory"] == [True]
    assert "already pins" in f.fix.text and f.confidence == "medium"


# --- h2d-copy-volume ----------------------------------------------------------------------
def test_copy_volume_flags_float32_images_when_the_share_is_lowered():
    # Real nw4: the batch copy is ~1% of the step once pinned, under the 3% default; with
    # the threshold at 0.5% the rule reports it with the trace's own numbers.
    doc = load_events(trace_path("v100_resnet50_nw4"))
    big = [e for e in events(doc, by_name(PAGEABLE)) if e["args"]["bytes"] > 1e6]
    assert {e["args"]["bytes"] for e in big} == {32 * 3 * 224 * 224 * 4}  # float32 [32, 3, 224, 224]
    default = run(trace_path("v100_resnet50_nw4"))
    assert finding(default, "h2d-copy-volume") is None
    a = run(trace_path("v100_resnet50_nw4"), options={"h2d-copy-volume": {"min_share": 0.005}})
    f = finding(a, "h2d-copy-volume")
    assert f is not None
    top = f.evidence["largest_copy"]
    assert top["shape"] == [32, 3, 224, 224] and top["bytes_per_element"] == 4
    assert "uint8" in top["send_instead"]
    # uint8 is a quarter of the bytes: three quarters of the (pinned) copy time go.
    assert f.evidence["estimate_ms"] == pytest.approx(0.75 * f.evidence["copy_ms_per_step_after_pinning"], rel=0.02)
    # Replayed, the smaller copy gains at most what it loses.
    assert 0 <= alone(f) <= f.evidence["copy_ms_per_step_after_pinning"] + 0.01
    # The pinned time is bytes / 12 GB/s (no pinned copies in the trace to measure).
    n_steps = len(raw_steps(doc))
    assert f.evidence["copy_ms_per_step_after_pinning"] <= sum(e["args"]["bytes"] for e in big) / 12e9 * 1e3 / n_steps + 1e-3


def test_copy_volume_silent_when_the_batch_is_already_uint8(tmp_path):
    # Edit: the big nw4 copies carry a quarter of the bytes in a quarter of the time, as if
    # the images were sent as uint8 (1 byte per element of [32, 3, 224, 224]).
    doc = load_events(trace_path("v100_resnet50_nw4"))

    def to_uint8(e):
        if e["args"]["bytes"] > 1e6:
            e["args"]["bytes"] //= 4
            e["dur"] = max(1, e["dur"] // 4)

    edit_events(doc, by_name(PAGEABLE), to_uint8)
    a = run(write_trace(doc, tmp_path / "uint8.pt.trace.json"), options={"h2d-copy-volume": {"min_share": 0.0}})
    assert finding(a, "h2d-copy-volume") is None


# --- host-sync ----------------------------------------------------------------------------
def test_host_sync_reports_item_calls_on_a_real_trace():
    # Real A100 rank: `aten::item` reads a value back (a blocking device→host copy). The wait
    # costs little here (the GPU had nothing queued), so the default 0.5% keeps the rule quiet;
    # at 0 it reports the syncs with their real numbers.
    path = trace_path("a100_two_ranks")
    assert finding(run(path), "host-sync") is None
    a = run(path, options={"host-sync": {"min_share": 0.0}})
    f = finding(a, "host-sync")
    assert f is not None
    causes = {c["cause"] for c in f.evidence["by_cause"]}
    assert "item" in causes
    doc = load_events(trace_file("a100_two_ranks/rank-1.json.gz"))
    dtoh = [e for e in events(doc, lambda e: str(e.get("name", "")).startswith("Memcpy DtoH"))]
    assert dtoh, "the trace has device→host copies"
    assert 0 < alone(f) < 1.0


def test_host_sync_does_not_charge_waits_on_other_ranks():
    # Real A100 run: the host blocks ~140 ms per step in a device→host copy, but the GPU
    # sits idle during most of that wait too (it waits for the all-to-all of other ranks):
    # removing the sync would not make that work arrive sooner, so it is not counted.
    from advisor.metrics.hierarchy import op_tree
    from advisor.metrics.host_device import sync_calls, timeline

    path = trace_path("a100_80gb_train")
    m = compute_metrics(load_trace(path))
    calls = sync_calls(timeline(m, None), op_tree(m.frames))
    waits = (calls["end"] - calls["ts"]).to_numpy()
    assert waits.max() > 100e6  # > 100 ms
    default = finding(run(path), "host-sync")
    f = finding(run(path, options={"host-sync": {"min_share": 0.0}}), "host-sync")
    assert f is not None and f.evidence["wait_ms_per_step"] > 100
    # Replayed without the wait, the host only gets its own next work done sooner: under 1%
    # of the 216 ms step, against over 100 ms of waiting.
    step_ms = run(path).headline().baseline_ms
    assert f.saving_ms < 0.01 * step_ms
    assert default is None or default.saving_ms < 0.01 * step_ms


def test_the_users_dataloader_threshold_decides_whose_idle_time_the_loader_is():
    # H100 ViT baseline: after each loss.item() the host waits for its next batch. At
    # dataloader-stall's default threshold that exposed DataLoader time is the input
    # pipeline's, so the idle gap after the sync is mostly not counted as the sync's. With the
    # threshold raised past the run's loader share in the user's configuration, the loader
    # time is idle time like any other, and host-sync's own estimate takes it in. The promise
    # is the replay's either way.
    path = shared("whatif/h100_vit/baseline")
    default = run(path)
    raised = run(path, options={"dataloader-stall": {"min_share": 1.0}})
    assert finding(default, "dataloader-stall") is not None and finding(raised, "dataloader-stall") is None
    before, after = finding(default, "host-sync"), finding(raised, "host-sync")
    gain = after.evidence["device_idle_after_ms_per_step"] - before.evidence["device_idle_after_ms_per_step"]
    assert 0.5 < gain <= default.primary.breakdown_mean_ms["dataloader"]
    assert alone(after) == pytest.approx(alone(before))


def test_host_sync_leaves_the_pageable_copy_syncs_and_the_profiler_sync_alone():
    # nw0 has 12 stream syncs (each made by a pageable copy) and the profiler's own
    # cudaDeviceSynchronize after the last step: none is the loop's own wait.
    from advisor.metrics.hierarchy import op_tree
    from advisor.metrics.host_device import sync_calls, timeline

    doc = load_events(trace_path("v100_resnet50_nw0"))
    assert len(events(doc, lambda e: "Synchronize" in str(e.get("name")))) == 13
    m = compute_metrics(load_trace(trace_file("v100_resnet50_nw0")))
    assert len(sync_calls(timeline(m, None), op_tree(m.frames))) == 0
    assert finding(run(trace_path("v100_resnet50_nw0")), "host-sync") is None


RECORD_ITEM_LOOP = r"""
import sys, torch
from torch.profiler import profile, ProfilerActivity, schedule
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
total = 0.0
def save(p):
    p.export_chrome_trace(sys.argv[1])
with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=4), record_shapes=True, on_trace_ready=save) as prof:
    for step in range(5):
        x = torch.randn(32, 64)
        loss = model(x).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
        total += loss.item()
        prof.step()
"""


def test_host_sync_silent_on_a_cpu_run_calling_item(tmp_path):
    # A real CPU run recorded here: `.item()` every step, but there is no device to wait for.
    pytest.importorskip("torch")
    out = tmp_path / "cpu_item.pt.trace.json"
    subprocess.run([sys.executable, "-c", RECORD_ITEM_LOOP, str(out)], check=True, timeout=120)
    doc = load_events(out)
    assert len(events(doc, by_name("aten::item"))) >= 4
    a = run(out)
    assert not a.primary.has_device
    assert not [f for f in a.findings if f.rule in MY_RULES]


# --- launch-bound -------------------------------------------------------------------------
def test_launch_bound_fires_on_a_host_bound_ddp_forward():
    path = trace_path("a100_nccl")
    a = run(path)
    f = finding(a, "launch-bound")
    assert f is not None and f.confidence == "medium"
    ev = f.evidence
    assert ev["kernels_per_step"] >= 100 and ev["median_kernel_us"] < 50
    # The gaps are idle time: never more than the device's idle time per step.
    idle_ms = (1 - a.primary.gpu_utilization) * a.primary.mean_step_ns / 1e6
    assert f.saving_ms <= idle_ms
    assert ev["gap_ms_per_step"] > 0.2 * idle_ms


def test_launch_bound_silent_on_a_gpu_bound_run():
    a = run(trace_path("misc/v100_ns_resolution.pt.trace.json.gz"))
    assert a.primary.gpu_utilization > 0.95
    assert finding(a, "launch-bound") is None


def test_idle_time_is_not_counted_twice_on_nw0():
    # launch-bound, zero-grad-memset, single-tensor-optimizer and h2d-pageable-copy all
    # measure device idle time; together they stay within the idle time the breakdown shows
    # outside DataLoader spans (plus the kernel time the optimizer and zero_grad rules count).
    a = run(trace_path("v100_resnet50_nw0"))
    bd = a.primary.breakdown_mean_ms
    idle_outside_loader = a.primary.mean_step_ns / 1e6 * (1 - a.primary.gpu_utilization) - bd["dataloader"]
    mine = {f.rule: f for f in [*a.findings, *a.considered] if f.rule in ("launch-bound", "zero-grad-memset", "single-tensor-optimizer", "h2d-pageable-copy")}
    assert set(mine) == {"launch-bound", "zero-grad-memset", "single-tensor-optimizer", "h2d-pageable-copy"}
    # Replayed together, the four fixes save no more than their savings alone add up to (they
    # overlap) and no less than the best of them.
    full = a.with_primary_frames().primary  # findings travel without their changes: state them again
    changes = [f.change for f in check_rank_rules(all_rules(), full, None) if f.rule in mine and f.change is not None]
    assert len(changes) == 4
    replay = rank_replay(full, None)
    together = replay.saving_ms(Change.merge(changes))
    assert together <= sum(alone(f) for f in mine.values()) + 0.01
    assert together >= max(alone(f) for f in mine.values()) - 0.01
    assert idle_outside_loader > 0


def test_launch_bound_leaves_out_the_gaps_after_a_sync():
    # The compiled H100 ViT reads loss.item() every step: the device drains its queue while
    # the host waits, and that idle time is the sync's (host-sync's fix), not launch overhead
    # that graphing the model removes. Counted, it would take launch-bound past 3% of the
    # step (its threshold); launch-bound must not report it.
    path = shared("whatif/h100_vit/compile")
    a = run(path)
    assert finding(a, "host-sync") is not None
    assert finding(a, "launch-bound") is None
    counted = finding(run(path, options={"launch-bound": {"min_share": 0.0}}), "launch-bound")
    assert counted is None or counted.evidence["gap_ms_per_step"] < 0.03 * a.primary.mean_step_ns / 1e6


# --- zero-grad-memset ---------------------------------------------------------------------
def test_zero_grad_memset_fires_on_nw0_within_the_zero_grad_time():
    doc = load_events(trace_path("v100_resnet50_nw0"))
    spans = events(doc, by_name("Optimizer.zero_grad#SGD.zero_grad"))
    steps = raw_steps(doc)
    zero_ops = [e for e in events(doc, by_name("aten::zero_")) if inside(e, spans)]
    f = finding(run(trace_path("v100_resnet50_nw0")), "zero-grad-memset")
    assert f is not None
    assert f.evidence["zeroing_ops_per_step"] == pytest.approx(len(zero_ops) / len(steps))
    assert f.evidence["zeroing_ops_per_step"] == 161  # ResNet-50's parameter tensors
    span_ms = sum(e["dur"] for e in spans) / 1e3 / len(steps)
    # Replayed: zero_grad's host time and its kernels go; the step shrinks by at most both.
    assert 0.5 * span_ms < alone(f) <= span_ms + f.evidence["kernel_ms_per_step"] + 0.01


def test_zero_grad_memset_silent_when_grads_are_set_to_none():
    # Real DDP run whose zero_grad spans launch nothing (set_to_none).
    doc = load_events(trace_path("v100_ns_resolution"))
    spans = events(doc, by_name("Optimizer.zero_grad#SGD.zero_grad"))
    assert spans and not [e for e in events(doc, by_name("aten::zero_")) if inside(e, spans)]
    assert finding(run(trace_path("v100_ns_resolution")), "zero-grad-memset") is None


# --- single-tensor-optimizer --------------------------------------------------------------
def test_single_tensor_optimizer_counts_the_per_parameter_launches():
    doc = load_events(trace_path("v100_resnet50_nw0"))
    spans = events(doc, by_name("Optimizer.step#SGD.step"))
    launches = [e for e in events(doc, by_name("cudaLaunchKernel")) if inside(e, spans)]
    f = finding(run(trace_path("v100_resnet50_nw0")), "single-tensor-optimizer")
    assert f is not None and f.evidence["optimizer"] == "SGD"
    assert f.evidence["kernels_per_step"] == pytest.approx(len(launches) / len(spans)) == 483  # 161 params × 3
    # Replayed: the optimizer step's host time and kernel time bound what packing them can save.
    assert 0 < alone(f) <= f.evidence["optimizer_step_ms_per_step"] + f.evidence["kernel_ms_per_step"]


@pytest.mark.parametrize("name", ["v100_ns_resolution", "a100_80gb_train"])
def test_single_tensor_optimizer_silent_for_foreach_and_fused(name):
    # v100_ns_resolution: SGD with _foreach_ ops; a100_80gb_train: FusedAdam.
    assert finding(run(trace_path(name)), "single-tensor-optimizer") is None


# --- cpu-tensor-then-copy -----------------------------------------------------------------
def test_cpu_tensor_then_copy_fires_on_randn_then_to():
    # Real AMD MI250 run: each step does torch.randn(...) on the CPU, then .to("cuda").
    path = trace_path("amd_mi250_minitoy")
    f = finding(run(path), "cpu-tensor-then-copy")
    assert f is not None
    assert f.evidence["factories"] == {"aten::randn": 2}
    assert "torch.randn" in f.fix.text


def test_cpu_tensor_then_copy_silent_for_dataloader_batches():
    assert finding(run(trace_path("v100_resnet50_nw0")), "cpu-tensor-then-copy") is None


def test_cpu_made_batches_move_from_pageable_copy_to_cpu_tensor_rule(tmp_path):
    # Edit: nw0's DataLoader spans are renamed `aten::randn` — a synthetic-data benchmark
    # that makes each batch with torch.randn on the CPU and copies it (the copies, times and
    # everything else stay as recorded). The same copies must now be claimed by
    # cpu-tensor-then-copy, and h2d-pageable-copy must not count them again.
    doc = load_events(trace_path("v100_resnet50_nw0"))
    n = rename_events(doc, lambda e: str(e.get("name", "")).startswith("enumerate(DataLoader)"), "aten::randn")
    assert n == len(raw_steps(doc))
    a = run(write_trace(doc, tmp_path / "randn.pt.trace.json"))
    f = finding(a, "cpu-tensor-then-copy")
    assert f is not None and f.evidence["factories"] == {"aten::randn": n}
    assert finding(a, "h2d-pageable-copy") is None
    assert finding(a, "dataloader-stall") is None


# --- data-parallel ------------------------------------------------------------------------
def test_data_parallel_silent_on_distributed_data_parallel():
    doc = load_events(trace_path("v100_ns_resolution"))
    assert events(doc, by_name("DistributedDataParallel.forward"))
    assert finding(run(trace_path("v100_ns_resolution")), "data-parallel") is None


def test_data_parallel_fires_on_dataparallel_forward_spans(tmp_path):
    # Edit: the real DDP run's `DistributedDataParallel.forward` ranges are renamed
    # `DataParallel.forward` (the range nn.DataParallel records). The run has one GPU, where
    # DataParallel only costs its head and tail; the threshold is lowered to see it.
    doc = load_events(trace_path("v100_ns_resolution"))
    rename_events(doc, by_name("DistributedDataParallel.forward"), "DataParallel.forward")
    path = write_trace(doc, tmp_path / "dp.pt.trace.json")
    assert finding(run(path), "data-parallel") is None  # one device, under 1% of the step
    a = run(path, options={"data-parallel": {"min_share": 0.0}})
    f = finding(a, "data-parallel")
    assert f is not None
    assert f.evidence["data_parallel_spans_per_step"] == 1.0
    assert f.evidence["devices_in_trace"] == [0]
    assert f.saving_ms < f.evidence["forward_ms_per_step"]


# --- communication-exposed ----------------------------------------------------------------
def test_communication_exposed_on_a_ddp_allreduce_run():
    doc = load_events(trace_path("a100_nccl"))
    steps = raw_steps(doc)
    nccl = [e for e in events(doc, lambda e: str(e.get("name", "")).startswith("ncclKernel")) if inside(e, steps) and e.get("ph") == "X"]
    nccl_ms = sum(e["dur"] for e in nccl) / 1e3 / len(steps)
    a = run(trace_path("a100_nccl"))
    f = finding(a, "communication-exposed")
    assert f is not None and f.confidence == "medium"
    assert set(f.evidence["collectives"]) <= {"AllReduce", "Broadcast"}
    assert f.evidence["exposed_ms_per_step"] <= nccl_ms + 0.01
    # not replayed: the rule's figure, as the same share of the replayed step (the profiler's estimated cost out)
    scale = a.headline().baseline_ms / (a.primary.mean_step_ns / 1e6)
    assert f.saving_ms == pytest.approx((f.evidence["exposed_ms_per_step"] - f.evidence["unavoidable_tail_ms_per_step"]) * scale, abs=0.01)


def test_communication_exposed_point_to_point_is_low_confidence():
    f = finding(run(trace_path("a100_80gb_train")), "communication-exposed")
    assert f is not None
    assert f.evidence["point_to_point_share"] == 1.0 and f.confidence == "low"
    assert "bucket" in f.fix.text and f.fix.snippet == ""


@pytest.mark.parametrize("name", ["v100_ns_resolution", "v100_resnet50_nw0"])
def test_communication_exposed_silent_without_collective_kernels(name):
    assert finding(run(trace_path(name)), "communication-exposed") is None


# --- empty-cache and allocator-churn ------------------------------------------------------
def alexnet_with_steps(tmp_path: Path, drop_clear_cache_free: bool = False) -> Path:
    """Edit: the A100 AlexNet benchmark has no ProfilerStep markers; its warm-up and measured
    iterations (the outer `[param|...|warmup|forward]` and `[param|...|measure|forward]`
    ranges) become ProfilerStep#1 and #2. Optionally the one cudaFree its measured
    `[param|clear_cache]` makes outside any op is dropped."""
    doc = load_events(trace_path("a100_alexnet"))
    outer = [e for e in events(doc, lambda e: str(e.get("name", "")).endswith("|forward]"))]
    outer = [e for e in outer if not any(o is not e and o["ts"] <= e["ts"] and e["ts"] + e["dur"] <= o["ts"] + o["dur"] and o["name"] == e["name"] for o in outer)]
    assert [e["name"].split("|")[-2] for e in outer] == ["warmup", "measure"]
    add_events(doc, [clone(e, name=f"ProfilerStep#{i + 1}", args={}) for i, e in enumerate(outer)])
    if drop_clear_cache_free:
        clear = [e for e in events(doc, by_name("[param|clear_cache]")) if e["ts"] >= outer[1]["ts"]][0]
        dropped = drop_events(doc, lambda e: e.get("name") == "cudaFree" and clear["ts"] <= e["ts"] < clear["ts"] + clear["dur"])
        assert dropped == 1
    return write_trace(doc, tmp_path / ("alexnet_nofree.json" if drop_clear_cache_free else "alexnet_steps.json"))


def test_empty_cache_fires_when_the_loop_frees_the_cache(tmp_path):
    path = alexnet_with_steps(tmp_path)
    a = run(path)
    f = finding(a, "empty-cache")
    assert f is not None and f.evidence["steps"] == [2]
    assert f.evidence["frees_outside_ops_per_step"] == 0.5  # one free, two steps
    # The cudaMalloc calls of the measured step follow it: they belong to empty-cache.
    assert f.evidence["mallocs_after_it_per_step"] > 0
    assert finding(a, "allocator-churn") is None


def test_empty_cache_is_priced_by_replaying_the_run_without_its_allocator_calls(tmp_path):
    # The measured AlexNet iteration empties the cache once (a cudaFree outside any op) and
    # gets the memory back with cudaMalloc calls. The fix is replayed: those calls and the
    # host's wait in the cudaFree go. Counted here from the raw events of the edited trace.
    path = alexnet_with_steps(tmp_path)
    a = run(path)
    f = finding(a, "empty-cache")
    _, stated = a.stated_fixes()
    change = stated["empty-cache"].change
    assert f is not None and change is not None and f.saving_alone_ms is not None
    doc = load_events(path)
    step = next(e for e in events(doc, by_name("ProfilerStep#2")))
    s0, s1 = step["ts"], step["ts"] + step["dur"]
    ops = [e for e in events(doc, by_cat("cpu_op")) if e["ts"] < s1 and e["ts"] + e["dur"] > s0]
    alloc = sorted((e for e in events(doc, by_name("cudaFree", "cudaMalloc")) if s0 <= e["ts"] < s1), key=lambda e: e["ts"])
    free = [e for e in alloc if e["name"] == "cudaFree" and not any(o["ts"] <= e["ts"] and e["ts"] + e["dur"] <= o["ts"] + o["dur"] for o in ops)]
    assert len(free) == 1
    owned = [e for e in alloc if e is free[0] or (e["name"] == "cudaMalloc" and e["ts"] > free[0]["ts"])]
    rt = a.with_primary_frames().primary.frames.runtime
    t0 = min(float(e["ts"]) for e in doc["traceEvents"] if e.get("ph") == "X" and "ts" in e)
    named = rt.iloc[sorted(change.call_scale)]
    assert sorted(named["name"]) == sorted(e["name"] for e in owned)
    assert np.allclose(np.sort(named["ts"].to_numpy() / 1e3 + t0), sorted(e["ts"] for e in owned), atol=1.0)
    assert set(change.call_scale.values()) == {0.0} and change.unwait == set(change.call_scale)
    # The device is busy 2% of the step: removing the calls gives back their host time, less
    # what the device ran meanwhile (it stays on the step's path), over the window's two steps.
    kernels = [e for e in events(doc, by_cat("kernel", "gpu_memcpy", "gpu_memset"))]
    busy = sum(max(0.0, min(k["ts"] + k["dur"], c["ts"] + c["dur"]) - max(k["ts"], c["ts"])) for c in owned for k in kernels)
    calls_ms = sum(e["dur"] for e in owned) / 1e3
    assert (calls_ms - busy / 1e3) / 2 * 0.95 <= f.saving_alone_ms <= calls_ms / 2 * 1.02


def test_empty_cache_and_churn_silent_without_step_markers():
    a = run(trace_path("a100_alexnet"))
    assert len(a.with_primary_frames().primary.frames.steps) == 0
    assert finding(a, "empty-cache") is None and finding(a, "allocator-churn") is None


def test_allocator_churn_counts_the_mallocs_after_warm_up(tmp_path):
    path = alexnet_with_steps(tmp_path, drop_clear_cache_free=True)
    doc = load_events(path)
    step2 = [e for e in raw_steps(doc) if e["name"] == "ProfilerStep#2"][0]
    mallocs = [e for e in events(doc, by_name("cudaMalloc")) if inside(e, [step2])]
    a = run(path)
    f = finding(a, "allocator-churn")
    assert f is not None
    assert f.evidence["mallocs_after_warmup"] == len(mallocs) == 5
    assert f.evidence["call_ms_after_warmup"] == pytest.approx(sum(e["dur"] for e in mallocs) / 1e3, rel=1e-3)
    assert finding(a, "empty-cache") is None


def test_allocator_churn_silent_on_a_steady_loop():
    doc = load_events(trace_path("v100_resnet50_nw0"))
    assert not events(doc, by_name("cudaMalloc", "cudaFree"))
    assert finding(run(trace_path("v100_resnet50_nw0")), "allocator-churn") is None


# --- every rule, every trace --------------------------------------------------------------
def all_trace_paths() -> list[Path]:
    root = traces_dir()
    out = [p for p in sorted(root.iterdir()) if p.is_dir() and p.name not in ("misc", "corpus")]  # corpus: tests/test_every_trace.py
    out += sorted((root / "misc").glob("*.json*"))
    return out


def test_every_trace_runs_and_findings_are_sane():
    for path in all_trace_paths():
        a = run(path)
        step_ms = max(m.mean_step_ns for m in a.ranks) / 1e6
        for f in [f for f in a.findings if f.rule in MY_RULES]:
            assert f.saving_ms is not None and 0 < f.saving_ms <= step_ms + 1e-6, (path, f.rule)
            assert f.confidence in ("high", "medium", "low")
            assert f.message and f.fix.text, (path, f.rule)
        orjson.loads(to_json(a))  # the JSON report takes every evidence value


@pytest.mark.parametrize("rule_id", MY_RULES)
def test_rule_file_documents_itself(rule_id):
    r = find_rule(rule_id)
    for section in ("## What it detects", "## Why it is slow", "## Evidence used", "## Example", "## How the saving is estimated"):
        assert section in r.doc, (rule_id, section)
    assert "Before:" in r.doc and "After:" in r.doc
    assert r.docs_url.startswith("https://") and f"Reference: {r.docs_url}" in r.doc
    assert r.module.FIX and r.module.AFTER.strip()
    assert all(isinstance(v, (int, float)) for v in r.defaults.values())


def test_trace_edit_round_trip(tmp_path):
    # The helper writes what it read: gzip or not, the loader sees the same events.
    doc = load_events(trace_path("misc/cpu_only.pt.trace.json.gz"))
    n = len(doc["traceEvents"])
    for name in ("copy.json", "copy.json.gz"):
        p = write_trace(doc, tmp_path / name)
        again = load_events(p)
        assert len(again["traceEvents"]) == n
    raw = gzip.decompress((tmp_path / "copy.json.gz").read_bytes())
    assert orjson.loads(raw)["traceEvents"] == doc["traceEvents"]
    assert np.isfinite(load_trace(tmp_path / "copy.json").window[1])
