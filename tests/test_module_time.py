"""Time per nn.Module in the JSON report (`ranks[].modules`), against a hand computation from
the raw events (json/gzip, independently of the loader): the `nn.Module: <name>` python
events that start inside the steps, each with its path (the module events open around it on
its thread, outermost first), its span (host time) and the device work (kernels, copies,
memsets) whose launch call, linked by `correlation`, starts inside that span on that thread.
The steps' window is the analysis' own step table (tested elsewhere), put on the raw clock by
the loader's `base_us`."""

from __future__ import annotations

import bisect
import gzip
import json
from collections import defaultdict

import pytest
from conftest import shared_trace

DEVICE = {"kernel", "gpu_memcpy", "gpu_memset"}
RUNTIME = {"cuda_runtime", "cuda_driver"}


def _hand(path, lo_us: float, hi_us: float) -> dict[str, dict]:
    ev = [e for e in json.loads(gzip.open(path).read())["traceEvents"] if e.get("ph") == "X"]
    mods = [e for e in ev if e.get("cat") == "python_function" and e["name"].startswith("nn.Module: ")]
    launches = {e["args"]["correlation"]: e for e in ev if e.get("cat") in RUNTIME and "correlation" in e.get("args", {})}
    per_tid: dict = defaultdict(list)
    for d in ev:
        if d.get("cat") in DEVICE and d.get("args", {}).get("correlation") in launches:
            l = launches[d["args"]["correlation"]]
            per_tid[l["tid"]].append((l["ts"], d["dur"]))
    for v in per_tid.values():
        v.sort()
    out: dict[str, dict] = {}
    stack: list = []
    for m in sorted(mods, key=lambda e: (str(e["tid"]), e["ts"], -e["dur"])):
        while stack and (stack[-1]["tid"] != m["tid"] or stack[-1]["ts"] + stack[-1]["dur"] <= m["ts"]):
            stack.pop()
        path = "/".join([s["path_name"] for s in stack] + [m["name"][len("nn.Module: "):]])
        m["path_name"] = m["name"][len("nn.Module: "):]
        stack.append(m)
        if not lo_us <= m["ts"] < hi_us:
            continue
        launched = per_tid.get(m["tid"], [])
        a = bisect.bisect_left(launched, (m["ts"], -1.0))
        b = bisect.bisect_right(launched, (m["ts"] + m["dur"], float("inf")))
        row = out.setdefault(path, {"calls": 0, "host_ms": 0.0, "device_ms": 0.0, "device_ops": 0})
        row["calls"] += 1
        row["host_ms"] += m["dur"] / 1e3
        row["device_ms"] += sum(d for _, d in launched[a:b]) / 1e3
        row["device_ops"] += b - a
    return out


@pytest.mark.parametrize("trace", ["corpus/mi300x_layernorm_fwd_bwd.json.gz", "corpus/mi300x_falconsai_vit_infer.json.gz"])
def test_module_time_matches_the_raw_events(cli, trace):
    from advisor.analysis import analyze
    from advisor.load.trace import load_trace
    from advisor.schemas import check

    path = shared_trace(trace)
    steps = analyze(path).primary.steps
    base = load_trace(path).base_us
    hand = _hand(path, base + steps["start"].min() / 1e3, base + steps["end"].max() / 1e3)
    assert hand
    code, out, err = cli(["report", str(path), "-f", "json"])
    assert code == 0, err
    doc = json.loads(out)
    check("report", doc)
    got = doc["ranks"][0]["modules"]
    assert got["steps"] == len(steps)
    assert got["left_out"] == max(0, len(hand) - 100)
    for r in got["rows"]:
        h = hand[r["path"]]
        assert r["module"] == r["path"].rsplit("/", 1)[-1] and r["depth"] == r["path"].count("/")
        assert r["calls"] == h["calls"] and r["device_ops"] == h["device_ops"], r["path"]
        assert r["host_ms"] == pytest.approx(h["host_ms"], rel=1e-5, abs=2e-6 * h["calls"]), r["path"]
        assert r["device_ms"] == pytest.approx(h["device_ms"], rel=1e-5, abs=2e-6 * max(h["device_ops"], 1)), r["path"]
    ranked = sorted(hand.values(), key=lambda h: (-h["device_ms"], -h["host_ms"]))
    assert got["rows"][0]["device_ms"] == pytest.approx(ranked[0]["device_ms"], rel=1e-5)


def test_no_module_calls_no_modules(cli):
    code, out, err = cli(["report", str(shared_trace("corpus/a100_memcpy_pinned_10steps.json.gz")), "-f", "json"])
    assert code == 0, err
    assert json.loads(out)["ranks"][0]["modules"] is None
