"""The HTML report's ranks x time chart of collectives, against the raw events: each rank's
NCCL kernels launched inside the steps every rank recorded (the launch call, linked by
`correlation`, inside the ProfilerStep span), placed at their offset from their own rank's
ProfilerStep start (the ranks' clocks are not aligned). Raw events are read here with
json/gzip, independently of the loader."""

from __future__ import annotations

import re

import pytest
from conftest import shared_trace
from test_collectives_report import _raw


def _hand_lanes(folder, steps_shown: int = 4) -> tuple[list[int], dict[int, list[tuple[float, float]]]]:
    """(the steps shown, rank -> [(start µs, end µs)] of its NCCL kernels on the chart's axis)."""
    per_rank = {}
    for f in sorted(p for p in folder.iterdir() if p.name.endswith(".json.gz")):
        t = _raw(f)
        ev = [e for e in t["traceEvents"] if e.get("ph") == "X"]
        steps = {int(e["name"].split("#")[1]): (e["ts"], e["dur"]) for e in ev if str(e.get("name", "")).startswith("ProfilerStep#")}
        launch = {e["args"]["correlation"]: e["ts"] for e in ev if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
        nccl = [dict(e, launched=launch[e["args"]["correlation"]]) for e in ev if e.get("cat") == "kernel" and "nccl" in e["name"].lower()]
        per_rank[t["distributedInfo"]["rank"]] = (steps, nccl)
    common = sorted(set.intersection(*(set(s) for s, _ in per_rank.values())))[:steps_shown]
    # a step's slot: the longest rank's, from its marker's start to the end of its last NCCL kernel (DLRM
    # shares one step, so only the offsets are checked)
    slot = [max(max([s[n][1]] + [k["ts"] + k["dur"] - s[n][0] for k in ks if s[n][0] <= k["launched"] < s[n][0] + s[n][1]]) for s, ks in per_rank.values())
            for n in common]
    start = [sum(slot[:j]) for j in range(len(common))]
    lanes = {}
    for rank, (steps, nccl) in per_rank.items():
        out = []
        for j, n in enumerate(common):
            s0, d = steps[n]
            out += [(start[j] + k["ts"] - s0, start[j] + k["ts"] - s0 + k["dur"]) for k in nccl if s0 <= k["launched"] < s0 + d]
        lanes[rank] = sorted(out)
    return common, lanes


def test_lanes_match_the_raw_kernels():
    from advisor.analysis import analyze

    folder = shared_trace("corpus/v100_dlrm_8rank")
    steps, hand = _hand_lanes(folder)
    a = analyze(folder)
    lanes = a.collective_lanes
    assert list(lanes.steps) == steps
    assert sorted(lanes.ranks) == sorted(hand)
    for rank, spans in zip(lanes.ranks, lanes.spans, strict=True):
        got = sorted((float(s) / 1e3, float(e) / 1e3) for s, e in spans)
        assert len(got) == len(hand[rank]), rank
        for (s, e), (hs, he) in zip(got, hand[rank], strict=True):
            assert s == pytest.approx(hs, abs=0.002) and e == pytest.approx(he, abs=0.002), rank  # µs timestamps, ns arithmetic


def test_the_html_report_draws_one_lane_per_rank(cli, tmp_path):
    folder = shared_trace("corpus/v100_dlrm_8rank")
    _, hand = _hand_lanes(folder)
    out = tmp_path / "r.html"
    code, _, err = cli(["report", str(folder), "-f", "html", "-o", str(out)])
    assert code == 0, err
    html = out.read_text()
    i = html.index("<h3>Ranks × time in collectives</h3>")
    section = html[i: html.index("</figure>", i)]
    labels = re.findall(r'class="lane-label lane-rank"[^>]*><title>rank (\d+): ([\d.]+) ms</title>', section)
    assert sorted(int(r) for r, _ in labels) == sorted(hand)
    for r, total in labels:
        assert float(total) == pytest.approx(sum(e - s for s, e in hand[int(r)]) / 1e3, abs=0.006)
    assert "<script" not in section and "http" not in section  # inline SVG, nothing fetched


def test_one_rank_has_no_chart(cli, tmp_path):
    out = tmp_path / "r.html"
    code, _, err = cli(["report", str(shared_trace("misc/a100_nccl.json.gz")), "-f", "html", "-o", str(out)])
    assert code == 0, err
    assert "Ranks × time in collectives" not in out.read_text()
