"""`advisor report --launches` against a hand computation from the raw events (json/gzip):
each device op linked to its launch call by `correlation`; delay = op start - launch call
start; queue length at a launch = the stream's ops launched at or before it that have not
ended by then (counted one by one here)."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from conftest import shared_trace

DEVICE = {"kernel", "gpu_memcpy", "gpu_memset"}


def hand(path) -> dict:
    events = [e for e in json.loads(gzip.open(path).read())["traceEvents"] if e.get("ph") == "X"]
    calls = {}
    for e in events:
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {}):
            calls.setdefault(e["args"]["correlation"], e)
    ops = []
    for e in events:
        if e.get("cat") in DEVICE and e["args"].get("correlation") in calls:
            ops.append((e["args"]["stream"], calls[e["args"]["correlation"]]["ts"], e["ts"], e["ts"] + e["dur"]))
    out = {}
    for stream in sorted({o[0] for o in ops}) + [-1]:
        mine = [o for o in ops if stream in (-1, o[0])]
        delays = np.array([o[2] - o[1] for o in mine])
        queues = []
        for s, launch, _, _ in mine:
            same = [o for o in ops if o[0] == s]
            queues.append(sum(1 for o in same if o[1] <= launch and o[3] > launch))
        out[stream] = {"ops": len(mine), "p50": np.percentile(delays, 50), "p90": np.percentile(delays, 90), "max": delays.max(),
                       "queue_mean": np.mean(queues), "queue_max": max(queues)}
    return out


@pytest.mark.parametrize("job", ["corpus/rtx4090_llama_tp2", "corpus/v100_dlrm_8rank"])
def test_launch_delays_and_queues_match_the_raw_events(cli, job):
    from advisor.schemas import check

    code, out, err = cli(["report", str(shared_trace(job)), "--launches", "-f", "json"])
    assert code == 0, err
    doc = json.loads(out)
    check("launches", doc)
    folder = shared_trace(job)
    path = next(p for p in sorted(folder.iterdir()) if json.loads(gzip.open(p).read())["distributedInfo"]["rank"] == doc["rank"])
    expected = hand(path)
    got = {r["stream"]: r for r in doc["streams"]}
    assert set(got) == set(expected)
    for stream, e in expected.items():
        g = got[stream]
        assert g["ops"] == e["ops"]
        for key, mine in (("delay_p50_us", "p50"), ("delay_p90_us", "p90"), ("delay_max_us", "max")):
            assert g[key] == pytest.approx(e[mine], abs=2e-3), (stream, key)  # µs; the loader keeps whole ns
        assert g["queue_max"] == e["queue_max"], stream
        assert g["queue_mean"] == pytest.approx(e["queue_mean"], rel=1e-9), stream


def hand_idle(path) -> dict:
    """Per stream: walk its ops by start; a gap after the latest end so far is idle; host wait
    when the next op's launch call started after that end, kernel wait when the gap is 30 ns
    or less, other otherwise (µs in the trace, so ×1000 to ns, from the first event: epoch µs
    in ns would lose the ns to float rounding)."""
    events = [e for e in json.loads(gzip.open(path).read())["traceEvents"] if e.get("ph") == "X"]
    t0 = min(e["ts"] for e in events)
    calls = {}
    for e in events:
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {}):
            calls.setdefault(e["args"]["correlation"], e)
    by_stream: dict = {}
    for e in events:
        if e.get("cat") in DEVICE:
            call = calls.get(e["args"].get("correlation"))
            ts = e["ts"] - t0
            by_stream.setdefault(e["args"]["stream"], []).append((ts * 1e3, (ts + e["dur"]) * 1e3, (call["ts"] - t0) * 1e3 if call else None))
    out = {}
    for stream, ops in by_stream.items():
        ops.sort(key=lambda o: (o[0], o[1]))
        busy_until = ops[0][1]
        sums = {"gaps": 0, "host": 0.0, "kernel": 0.0, "other": 0.0}
        for start, end, launch in ops[1:]:
            gap = start - busy_until
            if gap > 0:
                sums["gaps"] += 1
                if launch is not None and launch > busy_until:
                    sums["host"] += gap
                elif gap <= 30:
                    sums["kernel"] += gap
                else:
                    sums["other"] += gap
            busy_until = max(busy_until, end)
        out[stream] = sums
    return out


@pytest.mark.parametrize("job", ["corpus/rtx4090_llama_tp2", "corpus/v100_dlrm_8rank"])
def test_idle_by_cause_matches_the_raw_events(cli, job):
    code, out, err = cli(["report", str(shared_trace(job)), "--launches", "-f", "json"])
    assert code == 0, err
    doc = json.loads(out)
    folder = shared_trace(job)
    path = next(p for p in sorted(folder.iterdir()) if json.loads(gzip.open(p).read())["distributedInfo"]["rank"] == doc["rank"])
    expected = hand_idle(path)
    got = {r["stream"]: r for r in doc["idle"]}
    assert set(got) == set(expected) | {-1}
    for stream, e in expected.items():
        g = got[stream]
        assert g["gaps"] == e["gaps"], stream
        for key, mine in (("host_wait_ms", "host"), ("kernel_wait_ms", "kernel"), ("other_ms", "other")):
            assert g[key] == pytest.approx(e[mine] / 1e6, abs=1e-5), (stream, key)
    assert got[-1]["idle_ms"] == pytest.approx(sum(g["host_wait_ms"] + g["kernel_wait_ms"] + g["other_ms"] for s, g in got.items() if s != -1))
