"""`advisor report --collectives` on real multi-rank traces, checked against hand computations
from the raw trace events (read here with json/gzip, independently of the loader).

The hand computation follows NCCL's definitions (nccl-tests doc/PERFORMANCE.md):
size = bytes of the collective's buffer (all-gather: the gathered output, n x one rank's
input); algbw = size / time; busbw = algbw x 2(n-1)/n for all-reduce, (n-1)/n for
all-gather, reduce-scatter and all-to-all, 1 for broadcast, reduce and send/recv. The size
comes from the kernel's own `In msg nelems` and `dtype` args where kineto writes them, else
from the `nccl:*` annotation around the kernel's launch call (its first `Input Dims` and
`Input type`), linked kernel -> launch call by `correlation`, launch call -> annotation by
thread and time.
"""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest

from conftest import shared_trace

JOBS = ["corpus/v100_dlrm_8rank", "corpus/rtx4090_nccl_2rank", "corpus/rtx4090_llama_tp2", "a100_two_ranks"]
ELEMENT = {"float": 4, "Float": 4, "long": 8, "long int": 8, "unsigned char": 1, "Long": 8, "signed char": 1, "int": 4, "c10::Half": 2, "c10::BFloat16": 2, "BFloat16": 2, "Half": 2, "double": 8}
KINDS = [("allreduce", "all_reduce"), ("allgather", "all_gather"), ("reducescatter", "reduce_scatter"), ("alltoall", "all_to_all"),
         ("broadcast", "broadcast"), ("sendrecv", "send_recv"), ("send", "send_recv"), ("recv", "send_recv"), ("reduce", "reduce")]
FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n, "reduce_scatter": lambda n: (n - 1) / n,
          "all_to_all": lambda n: (n - 1) / n, "broadcast": lambda n: 1, "reduce": lambda n: 1, "send_recv": lambda n: 1}
# Bucket lower edges as the report labels them.
BUCKETS = [(2**28, "≥ 256 MiB"), (2**24, "16–256 MiB"), (2**20, "1–16 MiB"), (2**16, "64 KiB–1 MiB"), (2**10, "1–64 KiB"), (0, "< 1 KiB")]


def _kind(name: str) -> str | None:
    s = name.lower().replace("_", "").replace("nccl:", "").replace("ncclkernel", "").replace("nccldevkernel", "")
    return next((k for needle, k in KINDS if s.startswith(needle)), None)


def _bucket(size: float) -> str:
    return next(label for edge, label in BUCKETS if size >= edge)


def _raw(path: Path) -> dict:
    return json.loads(gzip.open(path).read())


def _group_size(trace: dict) -> int:
    d = trace["distributedInfo"]
    pgs = d.get("pg_config") or []
    return pgs[0]["pg_size"] if len(pgs) == 1 else d["world_size"]


def hand_collectives(path: Path, with_start: bool = False) -> list[dict]:
    """Each collective of one rank's raw trace: kind, size (NCCL's), duration (µs); with_start:
    also its first kernel's start (µs)."""
    trace = _raw(path)
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    n = _group_size(trace)
    launches = {e["args"]["correlation"]: e for e in events if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    notes = [e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("nccl:")]
    by_owner: dict = {}
    for k in events:
        if k.get("cat") != "kernel" or "nccl" not in k["name"].lower():
            continue
        a = k.get("args", {})
        launch = launches.get(a.get("correlation"))
        owner = None
        if launch is not None:
            around = [x for x in notes if x["tid"] == launch["tid"] and x["ts"] <= launch["ts"] <= x["ts"] + x["dur"]]
            owner = around[-1] if around else None
        size = None
        if "In msg nelems" in a:
            size = a["In msg nelems"] * ELEMENT[a["dtype"]]
        elif owner is not None and owner["args"].get("Input Dims"):
            size = math.prod(owner["args"]["Input Dims"][0]) * ELEMENT[owner["args"]["Input type"][0]]
        kind = (_kind(owner["name"]) if owner else None) or _kind(k["name"].split("_", 1)[1])
        key = id(owner) if owner is not None else id(k)
        row = by_owner.setdefault(key, {"kind": kind, "size": size, "dur": 0.0, "start": k["ts"]})
        row["dur"] += k["dur"]
        row["start"] = min(row["start"], k["ts"])
    for row in by_owner.values():
        if row["size"] is not None and row["kind"] == "all_gather":
            row["size"] *= n
    rows = list(by_owner.values())
    if not with_start:
        for row in rows:
            del row["start"]
    return rows


def _report(cli, job: str) -> dict:
    from advisor.schemas import check

    code, out, err = cli(["report", str(shared_trace(job)), "--collectives", "-f", "json"])
    assert code == 0, err
    doc = json.loads(out)
    check("collectives", doc)  # every key of the published schema, and no other
    return doc


@pytest.mark.parametrize("job", JOBS)
def test_bus_bandwidth_matches_the_raw_events(cli, job):
    folder = shared_trace(job)
    files = sorted(p for p in folder.iterdir() if p.name.endswith(".json.gz"))
    n = _group_size(_raw(files[0]))
    rows = [r for f in files for r in hand_collectives(f)]
    assert rows, "no collective in the raw trace"
    doc = _report(cli, job)
    assert doc["group_size"] == n
    table = {(r["kind"], r["bucket"]): r for r in doc["collectives"]}
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["kind"], _bucket(r["size"]) if r["size"] is not None else "size unknown"), []).append(r)
    assert set(groups) == set(table)
    for key, g in groups.items():
        got = table[key]
        assert got["count"] == len(g), key
        assert got["time_ms"] == pytest.approx(sum(r["dur"] for r in g) / 1e3, rel=1e-3), key
        if key[1] == "size unknown":
            assert got["busbw_gbps"] is None, key
            continue
        algbw = sum(r["size"] for r in g) / (sum(r["dur"] for r in g) * 1e3)  # bytes / ns = GB/s
        busbw = algbw * FACTOR[key[0]](n)
        assert got["busbw_gbps"] == pytest.approx(busbw, rel=0.05), key


def test_llama_tp2_records_no_message_size_and_says_so(cli):
    """The TP=2 run was recorded without shapes: no kernel carries `In msg nelems`, no nccl:*
    annotation `Input Dims`, so no bandwidth is given and the report says why."""
    folder = shared_trace("corpus/rtx4090_llama_tp2")
    for f in folder.iterdir():
        for e in _raw(f)["traceEvents"]:
            a = e.get("args", {})
            if e.get("cat") == "kernel" and "nccl" in e["name"].lower():
                assert "In msg nelems" not in a
            if e.get("name", "").startswith("nccl:"):
                assert not a.get("Input Dims")
    doc = _report(cli, "corpus/rtx4090_llama_tp2")
    assert all(r["busbw_gbps"] is None for r in doc["collectives"])
    assert any("record_shapes" in n for n in doc["notes"])


def test_link_inferred_only_where_the_trace_says_enough(cli):
    dlrm = _report(cli, "corpus/v100_dlrm_8rank")
    assert dlrm["link"]["name"] == "NVLink 2" and dlrm["link"]["peak_gbps"] == 150.0  # V100 SXM2: 6 links x 25 GB/s per direction
    share = {(r["kind"], r["bucket"]): r["peak_share"] for r in dlrm["collectives"]}
    for r in dlrm["collectives"]:
        assert share[(r["kind"], r["bucket"])] == pytest.approx(r["busbw_gbps"] / 150.0)
    pcie = _report(cli, "corpus/rtx4090_nccl_2rank")
    assert pcie["link"]["name"] == "PCIe gen4 x16"
    a100 = _report(cli, "a100_two_ranks")  # no deviceProperties, 128 ranks in the job
    assert a100["link"]["name"] is None and a100["link"]["why"].startswith("link unknown")
    assert all(r["peak_share"] is None for r in a100["collectives"])


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def _overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(e1, e2) - max(s1, s2)) for s1, e1 in a for s2, e2 in b)


@pytest.mark.parametrize("job", ["corpus/v100_dlrm_8rank", "a100_two_ranks"])
def test_overlap_table_matches_the_raw_kernels(cli, job):
    """Per rank: compute = union of non-NCCL kernels, communication = union of NCCL kernels,
    overlapped = their intersection, exposed = communication less overlapped."""
    folder = shared_trace(job)
    doc = _report(cli, job)
    by_rank = {r["rank"]: r for r in doc["overlap"]}
    for f in sorted(p for p in folder.iterdir() if p.name.endswith(".json.gz")):
        trace = _raw(f)
        kernels = [e for e in trace["traceEvents"] if e.get("cat") == "kernel" and e.get("ph") == "X"]
        comm = _union([(e["ts"], e["ts"] + e["dur"]) for e in kernels if "nccl" in e["name"].lower()])
        comp = _union([(e["ts"], e["ts"] + e["dur"]) for e in kernels if "nccl" not in e["name"].lower()])
        got = by_rank[trace["distributedInfo"]["rank"]]
        comm_ms = sum(e - s for s, e in comm) / 1e3
        both_ms = _overlap(comm, comp) / 1e3
        assert got["communication_ms"] == pytest.approx(comm_ms, rel=1e-3, abs=1e-3)
        assert got["compute_ms"] == pytest.approx(sum(e - s for s, e in comp) / 1e3, rel=1e-3, abs=1e-3)
        assert got["overlapped_ms"] == pytest.approx(both_ms, rel=1e-3, abs=1e-3)
        assert got["exposed_ms"] == pytest.approx(comm_ms - both_ms, rel=1e-3, abs=1e-3)


def test_wait_for_the_slowest_on_one_all_reduce(cli):
    """Two ranks, one all-reduce: it ends on both at the same moment, so the rank whose kernel
    ran longer started that much earlier and waited that long for the other."""
    folder = shared_trace("corpus/rtx4090_nccl_2rank")
    durs = {}
    for f in folder.iterdir():
        trace = _raw(f)
        (k,) = [e for e in trace["traceEvents"] if e.get("cat") == "kernel" and "nccl" in e["name"].lower()]
        durs[trace["distributedInfo"]["rank"]] = k["dur"]
    doc = _report(cli, "corpus/rtx4090_nccl_2rank")
    waited = {r["rank"]: r["wait_ms"] for r in doc["ranks"]}
    slow = max(durs, key=durs.get)
    assert waited[slow] == pytest.approx(abs(durs[1] - durs[0]) / 1e3, rel=1e-3)
    assert waited[1 - slow] == pytest.approx(0.0, abs=1e-6)
    assert doc["skew_max_ms"] == pytest.approx(abs(durs[1] - durs[0]) / 1e3, rel=1e-3)


def test_text_and_markdown_and_bad_formats(cli):
    job = str(shared_trace("corpus/v100_dlrm_8rank"))
    code, out, _ = cli(["report", job, "--collectives"])
    assert code == 0 and "busbw GB/s" in out and "NVLink 2" in out and "exposed ms" in out
    code, out, _ = cli(["report", job, "--collectives", "-f", "md"])
    assert code == 0 and out.startswith("# Collectives") and "| group | n | kind | size |" in out
    code, out, err = cli(["report", job, "--collectives", "-f", "html"])
    assert code == 2 and "--collectives writes text, json or markdown" in err and "Traceback" not in err


def test_the_plain_report_computes_none_of_these_views(nw0, tmp_path):
    """The report without --collectives or --ops -f csv imports neither view's code (the
    views are computed only when asked, so the plain report costs what it did)."""
    import os
    import subprocess
    import sys

    probe = (
        "import sys\n"
        "from advisor.cli import main\n"
        f"sys.argv = ['advisor', 'report', {str(nw0)!r}, '-f', 'json']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "views = ['advisor.metrics.links', 'advisor.metrics.op_table', 'advisor.render.collectives', 'advisor.metrics.launches', 'advisor.render.launches']\n"
        "sys.stderr.write('LOADED ' + ' '.join(m for m in views if m in sys.modules) + '\\n')\n"
    )
    env = {**os.environ, "ADVISOR_CACHE": "off", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    line = [x for x in done.stderr.splitlines() if x.startswith("LOADED")]
    assert line == ["LOADED "], done.stderr[-2000:]


def test_skew_survives_clock_offsets_and_finds_a_late_rank(cli, tmp_path):
    """16 ranks made from the 8 of the DLRM job: rank r is rank r % 8 recorded on a host whose
    clock is r x 1234.5 µs ahead (every event shifted), and rank 13 arrives late at every
    collective: its NCCL kernels start D µs later and end as recorded (the last rank's data
    arrives when it did). The lags of every rank but 13 are their originals' (the clocks are
    put on one base); rank 13's mean lag is rank 5's plus D."""
    folder = shared_trace("corpus/v100_dlrm_8rank")
    originals = {}
    for f in sorted(folder.iterdir()):
        t = _raw(f)
        originals[t["distributedInfo"]["rank"]] = t
    late = 13
    d_us = 0.5 * min(e["dur"] for e in originals[late % 8]["traceEvents"] if e.get("cat") == "kernel" and "nccl" in e["name"].lower())
    job = tmp_path / "job16"
    job.mkdir()
    for r in range(16):
        t = json.loads(json.dumps(originals[r % 8]))
        t["distributedInfo"].update(rank=r, world_size=16)
        for e in t["traceEvents"]:
            if "ts" in e:
                e["ts"] = e["ts"] + r * 1234.5
            if r == late and e.get("cat") == "kernel" and "nccl" in e["name"].lower():
                e["ts"] += d_us
                e["dur"] -= d_us
        (job / f"rank{r}.json.gz").write_bytes(gzip.compress(json.dumps(t).encode()))
    code, out, err = cli(["report", str(folder), "--collectives", "-f", "json"])
    assert code == 0, err
    base = {r["rank"]: r["mean_lag_ms"] for r in json.loads(out)["ranks"]}
    code, out, err = cli(["report", str(job), "--collectives", "-f", "json"])
    assert code == 0, err
    doc = json.loads(out)
    lag = {r["rank"]: r["mean_lag_ms"] for r in doc["ranks"]}
    assert sorted(lag) == list(range(16))
    for r in range(16):
        expected = base[r % 8] + (d_us / 1e3 if r == late else 0.0)
        assert lag[r] == pytest.approx(expected, abs=2e-3), r  # µs timestamps, ns arithmetic
    assert doc["link"]["name"] is None  # 16 ranks, 8 GPUs in each trace: the network is not recorded
