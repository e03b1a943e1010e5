"""Memory bandwidth over time (HTA's memory bandwidth timeline): bytes copied and set per time
bucket and kind over a rank's steps, in the JSON report and the HTML report, against a hand
computation from the raw events (json/gzip, independently of the loader): each `gpu_memcpy` /
`gpu_memset` event's `bytes` spread evenly over [ts, ts + dur), summed per bucket of the
steps' window cut in 100, over the bucket's length. The window's ends are the report's step
table (the step boundaries are the analysis' own, tested elsewhere); the raw clock is put on
the step table's by the first ProfilerStep, whose start both hold."""

from __future__ import annotations

import gzip
import json

import pytest
from conftest import shared_trace

KIND = {"HtoD": "H2D", "DtoH": "D2H", "DtoD": "D2D", "PtoP": "P2P", "HtoH": "H2H"}


def _hand(path, steps) -> dict[str, list[float]]:
    raw = json.loads(gzip.open(path).read())
    ev = [e for e in raw["traceEvents"] if e.get("ph") == "X"]
    first = min(e["ts"] for e in ev if str(e.get("name", "")).startswith("ProfilerStep#"))
    # µs after the first ProfilerStep's start (raw timestamps near 1.7e15 µs lose 0.25 µs in a float)
    origin = -steps["host_start"].iloc[0] / 1e3
    lo, hi = origin + steps["start"].min() / 1e3, origin + steps["end"].max() / 1e3
    edges = [lo + (hi - lo) * i / 100 for i in range(101)]
    width_ns = (hi - lo) / 100 * 1e3
    out: dict[str, list[float]] = {}
    for e in ev:
        if e.get("cat") not in ("gpu_memcpy", "gpu_memset") or "bytes" not in e.get("args", {}):
            continue
        kind = "memset" if e["cat"] == "gpu_memset" else KIND.get(e["name"].split()[1], e["name"].split()[1])
        s, t, b = e["ts"] - first, e["ts"] - first + e["dur"], e["args"]["bytes"]
        row = out.setdefault(kind, [0.0] * 100)
        for i in range(100):
            a, z = max(s, edges[i]), min(t, edges[i + 1])
            if e["dur"] > 0 and z > a:
                row[i] += b * (z - a) / e["dur"]
            elif e["dur"] == 0 and edges[i] <= s < edges[i + 1]:
                row[i] += b
    return {k: [v / width_ns for v in row] for k, row in out.items()}


@pytest.mark.parametrize("trace", ["corpus/a100_memcpy_pinned_10steps.json.gz", "misc/a100_80gb_train.json.gz"])
def test_json_report_matches_the_raw_copies(cli, trace):
    from advisor.analysis import analyze
    from advisor.schemas import check

    path = shared_trace(trace)
    code, out, err = cli(["report", str(path), "-f", "json"])
    assert code == 0, err
    doc = json.loads(out)
    check("report", doc)
    (rank,) = doc["ranks"]
    got = rank["memory_bandwidth"]
    hand = _hand(path, analyze(path).primary.steps)
    assert set(got["gbps"]) == set(hand)
    for k, series in hand.items():
        assert len(got["gbps"][k]) == 100
        peak = max(series)
        for g, h in zip(got["gbps"][k], series, strict=True):
            assert g == pytest.approx(h, rel=1e-4, abs=1e-6 * peak), k  # the JSON keeps 7 significant digits
        assert got["peak_gbps"][k] == pytest.approx(peak, rel=1e-4)
    assert "Memory bandwidth over time" not in out


def test_the_pinned_copies_run_at_their_recorded_bandwidth(cli):
    """While a copy runs alone its bucket shows its own bandwidth: the trace's `memory bandwidth
    (GB/s)` arg of the H2D copies (about 5.0 GB/s) and the D2H copies (about 8.7 GB/s)."""
    path = shared_trace("corpus/a100_memcpy_pinned_10steps.json.gz")
    raw = json.loads(gzip.open(path).read())
    recorded = {}
    for e in raw["traceEvents"]:
        if e.get("cat") == "gpu_memcpy":
            recorded.setdefault(KIND[e["name"].split()[1]], []).append(e["args"]["memory bandwidth (GB/s)"])
    code, out, err = cli(["report", str(path), "-f", "json"])
    got = json.loads(out)["ranks"][0]["memory_bandwidth"]["peak_gbps"]
    for k, v in recorded.items():
        assert got[k] == pytest.approx(max(v), rel=0.01), k


def test_html_draws_it_and_a_run_without_copies_has_none(cli, tmp_path):
    path = shared_trace("corpus/a100_memcpy_pinned_10steps.json.gz")
    out = tmp_path / "r.html"
    code, _, err = cli(["report", str(path), "-f", "html", "-o", str(out)])
    assert code == 0, err
    html = out.read_text()
    i = html.index("<h3>Memory bandwidth over time</h3>")
    section = html[i: html.index("</ul>", i)]
    assert section.count('<polyline class="line c-bw-h2d"') == 1 and section.count('<polyline class="line c-bw-d2h"') == 1
    assert "<script" not in section
    code, out_json, err = cli(["report", str(shared_trace("corpus/cpu_resnet18_infer_macos.json.gz")), "-f", "json"])  # CPU only
    assert code == 0, err
    assert all(r["memory_bandwidth"] is None for r in json.loads(out_json)["ranks"])
