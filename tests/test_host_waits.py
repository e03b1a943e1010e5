"""One definition of "the host waits for the device" (advisor.metrics.host_waits), read by every
stage: the replay's wait calls (advisor.whatif.changes / graph), the drawn timeline's sync lane,
the host-sync metric and the one-time work taken out of a window.

The labels below were written from the raw events of each trace (the runtime calls' names and
categories as recorded, read with json), before the stages were run on them: which calls can make
the host wait (a synchronize, a copy, a free) and which cannot (a launch, an enqueued memset, an
event query or a device-side wait on an event); and which copies did wait (their call returned
only after their copy on the device ended).
"""

from __future__ import annotations

import copy
import re
from collections import Counter

import numpy as np
import pytest
from conftest import REPO, shared, shared_trace
from trace_edit import events, load_events, trace_file, write_trace

from advisor.analysis import analyze
from advisor.load.trace import load_trace
from advisor.metrics.events import rank_events
from advisor.metrics.host_device import sync_calls, timeline
from advisor.metrics.one_time import one_time_calls
from advisor.metrics.summary import compute_metrics
from advisor.whatif.changes import wait_calls_in
from advisor.whatif.timeline import step_timeline

# trace -> (names of runtime calls in which the host can wait, of them the synchronize calls,
# names recorded in the same trace that never make the host wait)
LABELS = {
    # MTIA's runtime (cat mtia_runtime) names its synchronize calls without a prefix; its copies
    # are enqueued commands ("enqueueCommand memcpyHtoDAsync"), as is its wait on an event.
    "misc/mtia_inference.json.gz": ({"synchronize", "synchronizeStream"}, {"synchronize", "synchronizeStream"},
                                    {"recordEvent", "enqueueCommand memcpyHtoDAsync", "enqueueCommand waitOnEvent"}),
    # ROCm: hipMemcpyWithStream is the blocking copy (a scalar read back), hipDeviceSynchronize.
    "misc/amd_mi250_minitoy.json.gz": ({"hipMemcpyWithStream", "hipDeviceSynchronize"}, {"hipDeviceSynchronize"},
                                       {"hipLaunchKernel", "hipExtModuleLaunchKernel"}),
    # CUDA with NCCL: event syncs and copies; cudaStreamWaitEvent makes the device wait, not the
    # host; cudaEventQuery polls and returns.
    "misc/a100_nccl.json.gz": ({"cudaEventSynchronize", "cudaDeviceSynchronize", "cudaMemcpyAsync"}, {"cudaEventSynchronize", "cudaDeviceSynchronize"},
                               {"cudaStreamWaitEvent", "cudaEventQuery", "cudaMemsetAsync", "cudaLaunchKernel", "cudaEventRecord"}),
}  # fmt: skip
# Copy calls of the median step that returned only after their copy on the device ended (raw events,
# by correlation id): a100_nccl's cudaMemcpyAsync are device-to-device copies of which 959 of 960
# return in ~9 µs, before their copy ends; ROCm's hipMemcpyWithStream returns after its copy
# (311.5 µs against 289.6 µs, 930.9 against 923.7).
BLOCKING_COPIES_DRAWN = {"misc/mtia_inference.json.gz": 0, "misc/amd_mi250_minitoy.json.gz": 2, "misc/a100_nccl.json.gz": 1}


def _metrics(rel: str):
    frames = load_trace(shared_trace(rel))
    return frames, compute_metrics(frames)


@pytest.mark.parametrize("rel", sorted(LABELS))
def test_every_stage_takes_the_same_calls_as_host_waits(rel):
    waits, syncs, never = LABELS[rel]
    frames, m = _metrics(rel)
    recorded = set(frames.runtime["name"].astype(str))
    assert waits <= recorded and never & recorded, (rel, sorted(recorded))  # the label is about calls this trace has
    # the replay's wait calls (what a fix that removes a sync "unwaits"), over the whole window
    events = rank_events(m)
    rows = wait_calls_in(events, [frames.window[0]], [frames.window[1]])
    assert set(events.runtime["name"].astype(str).to_numpy()[rows]) == waits
    # the drawn step's "Sync (host waits)" lane: the calls of the step in which the host did wait,
    # every synchronize and only the copies that returned after their own copy ended
    st = step_timeline(m)
    lo, hi = (int(v) for v in m.steps.iloc[[m.steps["duration"].sub(m.steps["duration"].median()).abs().argmin()]][["start", "end"]].iloc[0])
    in_step = frames.runtime[(frames.runtime["ts"] >= lo) & (frames.runtime["end"] <= hi)]
    drawn = Counter(n for ln in st.lanes if ln.label.startswith("Sync") for n in ln.spans["name"].astype(str))
    assert set(in_step["name"].astype(str)) & syncs <= set(drawn) <= waits, (drawn, rel)
    assert sum(drawn[n] for n in waits - syncs) == BLOCKING_COPIES_DRAWN[rel], drawn
    # the host-sync metric: synchronize calls (and copies to the host that blocked), never a call
    # that cannot wait
    named = {n for n in sync_calls(timeline(m, None))["name"] if not n.startswith("blocking copy")}
    assert named <= syncs and not named & never
    if rel.startswith("misc/mtia"):
        assert named == syncs  # MTIA's syncs are syncs for the rules too


def test_a_wait_is_never_one_time_work_but_a_call_on_an_idle_device_can_be():
    # ViT baseline, first profiled step: cudaStreamSynchronize waits 15.6 ms in loss.item() (the
    # device runs the step's kernels meanwhile) where the other 14 take ~0.01 ms: a wait, not
    # one-time work.
    run = shared("whatif/h100_vit/baseline")
    frames = load_trace(next(p for p in run.iterdir() if ".pt.trace." in p.name))
    rt = frames.runtime
    sync = rt[rt["name"].astype(str) == "cudaStreamSynchronize"]
    assert ((sync["end"] - sync["ts"]) > 10e6).sum() == 1
    assert "cudaStreamSynchronize" not in set(one_time_calls(frames, frames.steps)["name"])
    # A4000 ViT inference (no steps recorded): cudaFree for 3.0 s and 0.97 s while no kernel,
    # copy or memset ran (the device's last op ended 3.0 s and 4.0 s before they returned): the
    # context's setup, the host's own time, taken out as one-time work, not kept as a wait.
    frames = load_trace(shared_trace("corpus/a4000_gpu_only_vit_infer.json.gz"))
    cut = one_time_calls(frames)
    frees = cut[cut["name"].astype(str) == "cudaFree"]
    assert len(frees) == 2 and (frees["excess"] > 0.9e9).all()


# the one module that says which calls make the host wait (and device_records, which says which copy)
DEFINES = {"advisor/metrics/host_waits.py", "advisor/metrics/device_records.py"}
# a compiled pattern naming a synchronize call, or one held in a name that says sync or wait
OWN_DEFINITION = re.compile(r"re\.compile\(.*ynchroni[sz]e|\w*(SYNC|WAIT)\w*\s*=\s*re\.compile")


def test_no_stage_defines_its_own_host_wait():
    # An addition to the behavioural test above: a pattern of synchronize or wait calls compiled
    # anywhere else in the product is a second definition.
    found = []
    for root in ("advisor", "rules"):
        for path in sorted((REPO / root).rglob("*.py")):
            rel = str(path.relative_to(REPO))
            if rel in DEFINES:
                continue
            for i, line in enumerate(path.read_text().splitlines(), 1):
                if OWN_DEFINITION.search(line):
                    found.append(f"{rel}:{i}: {line.strip()}")
    assert not found, "\n".join(found)


def test_the_definition_names_what_the_raw_scan_found():
    # every runtime call name in the traces above that can wait matches, none that cannot
    from advisor.metrics.host_waits import HOST_WAIT_CALL, SYNC_CALL

    for waits, syncs, never in LABELS.values():
        assert all(HOST_WAIT_CALL.search(n) for n in waits) and all(SYNC_CALL.search(n) for n in syncs)
        assert not any(HOST_WAIT_CALL.search(n) for n in never)
    assert Counter(bool(HOST_WAIT_CALL.search(n)) for n in ("cudaFree", "hipFree", "cudaMemcpy", "cudaMemcpy2DAsync", "cudaCtxSynchronize")) == {True: 5}


def test_one_time_work_written_twice_is_cut_once(tmp_path):
    # The MI250 minitoy's one step holds one hipLaunchKernel of 6.54 ms where its other 11 take
    # ~5 µs: one-time work, cut out of the timeline. The same record written twice (a merged or
    # re-exported trace; the fuzz test found it) overlaps itself: cut once, the steps are what
    # they are with it once. Cut twice, the step ran 3.8 ms backwards.
    source = trace_file("misc/amd_mi250_minitoy.json.gz")
    frames = load_trace(source)
    (call,) = one_time_calls(frames, frames.steps).itertuples()
    doc = load_events(source)
    long_launch = [e for e in events(doc, lambda e: e.get("name") == "hipLaunchKernel") if e["dur"] > 6000]
    assert len(long_launch) == 1 and round(long_launch[0]["dur"]) == round((call.end - call.ts) / 1e3)
    doc["traceEvents"].append(copy.deepcopy(long_launch[0]))
    twice = analyze(write_trace(doc, tmp_path / "twice.json"))
    once = analyze(source)
    # (the copy adds a 13th call to the name's typical time: 78 ns)
    columns = ["start", "end", "duration"]
    for got, want in ((twice.ranks[0].steps[columns], once.ranks[0].steps[columns]), (twice.ranks[0].breakdown, once.ranks[0].breakdown)):
        assert abs(got.to_numpy(np.int64) - want.to_numpy(np.int64)).max() < 1000, (got, want)
    assert (twice.ranks[0].steps["duration"] > 0).all()
