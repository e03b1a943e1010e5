"""One definition of NCCL's bus bandwidth, used by the collectives table and by the
`communication-exposed` rule, and each collective counted with its own process group's size.

Every expected figure is computed here from the raw trace events (json/gzip, independently of
the loader), by NCCL's definitions (nccl-tests doc/PERFORMANCE.md): algbw = size / time, an
all-gather's size its gathered output; busbw = algbw x 2(n-1)/n (all-reduce), (n-1)/n
(all-gather, reduce-scatter, all-to-all), 1 (broadcast, reduce, send/recv), n the ranks of the
collective's process group (the kernel's `Group size` arg).
"""

from __future__ import annotations

import gzip
import importlib
import json

import pytest
from conftest import shared_trace
from test_collectives_report import FACTOR, _raw, hand_collectives

ELEMENT = {"Float": 4, "Long": 8}


def _bus_gbps(rows: list[dict], n: int) -> float:
    """sum(size x factor) / sum(time) over the sized rows of hand_collectives (bytes/ns = GB/s)."""
    sized = [r for r in rows if r["size"] is not None]
    return sum(r["size"] * FACTOR[r["kind"]](n) for r in sized) / (sum(r["dur"] for r in sized) * 1e3)


@pytest.mark.parametrize("job", ["corpus/v100_dlrm_8rank", "corpus/rtx4090_nccl_2rank", "corpus/rtx4090_llama_tp2"])
def test_the_rule_and_the_table_share_one_bus_bandwidth(job):
    """communication-exposed's bandwidth of each rank's collectives against the hand computation
    (within 5%); a rank whose trace records no message size (llama TP=2) gets none from either."""
    from advisor.load.trace import load_trace
    from advisor.metrics.collectives import collective_calls, group_size_of, process_groups_of

    rule = importlib.import_module("advisor.rules.communication_exposed")
    for f in sorted(p for p in shared_trace(job).iterdir() if p.name.endswith(".json.gz")):
        raw = _raw(f)
        d = raw["distributedInfo"]
        n = d["pg_config"][0]["pg_size"] if len(d.get("pg_config") or []) == 1 else d["world_size"]
        rows = hand_collectives(f)
        frames = load_trace(f)
        link = rule.link_bandwidth(collective_calls(frames), process_groups_of(frames.distributed), group_size_of(frames.distributed), None)
        if all(r["size"] is None for r in rows):
            assert link is None, f
            continue
        assert link["ranks"] == n
        assert link["bus_gbps"] == pytest.approx(_bus_gbps(rows, n), rel=0.05, abs=0.006), f  # the evidence rounds to 0.01 GB/s
        for k in link["by_kind"]:
            mine = [r for r in rows if r["kind"] == k["kind"]]
            assert k["count"] == len(mine)
            assert k["busbw_gbps"] == pytest.approx(_bus_gbps(mine, n), rel=0.05, abs=1e-3), (f, k)


def test_the_rule_on_dlrm_quotes_the_hand_computed_bandwidth():
    """The rule fires on the DLRM job (exposed all-to-all and all-reduce): its bus bandwidth is
    that of the rank's collectives that start inside the ProfilerStep spans, computed by hand."""
    from advisor.analysis import analyze

    folder = shared_trace("corpus/v100_dlrm_8rank")
    a = analyze(folder, select=["communication-exposed"])
    (f,) = a.findings
    link = f.evidence["link"]
    path = folder / f"rank{f.rank}.json.gz"
    raw = _raw(path)
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in raw["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#") and e.get("ph") == "X"]
    assert steps
    rows = [r for r in hand_collectives(path, with_start=True) if any(s <= r["start"] < e for s, e in steps)]
    assert link["collectives_sized"] == len(rows)
    assert link["bus_gbps"] == pytest.approx(_bus_gbps(rows, 8), rel=0.05, abs=0.006)
    assert "advisor report --collectives" in f.message


def test_an_all_gathers_size_is_its_output():
    """b200_ep_moe_syncless_fwd all-gathers 8 int64 per rank over 2 ranks: `Out msg nelems` 16.
    NCCL's size is the gathered output, 16 x 8 = 128 bytes per call, busbw = algbw x 1/2."""
    path = shared_trace("corpus/b200_ep_moe_syncless_fwd.json.gz")
    kernels = [e for e in _raw(path)["traceEvents"] if e.get("cat") == "kernel" and "AllGather" in e["name"]]
    assert kernels and all(k["args"]["Out msg nelems"] == 2 * k["args"]["In msg nelems"] == 16 for k in kernels)
    size = sum(k["args"]["Out msg nelems"] * ELEMENT[k["args"]["dtype"]] for k in kernels)
    dur_ns = sum(k["dur"] for k in kernels) * 1e3
    from advisor.load.trace import load_trace
    from advisor.metrics.collectives import RankCollectives, collective_calls, comm_compute_overlap, job_collectives

    frames = load_trace(path)
    job = job_collectives([RankCollectives(0, collective_calls(frames), comm_compute_overlap(frames), None, 0, 2, {"0": 2})])
    (row,) = [r for r in job.to_dict()["collectives"] if r["kind"] == "all_gather"]
    assert row["bytes"] == size == 10 * 128
    assert row["algbw_gbps"] == pytest.approx(size / dur_ns, rel=1e-6)
    assert row["busbw_gbps"] == pytest.approx(size / dur_ns * 0.5, rel=1e-6)


def _two_groups(tmp_path):
    """a100_nccl (one rank of 2, every NCCL kernel in group "0" of 2 ranks) made into a job with
    a tensor-parallel and a data-parallel group: the all-reduces at odd positions move to group
    "dp" of 8 ranks; half of those lose their `Group size` arg, so their size comes from
    distributedInfo.pg_config, which lists "dp" with 8 ranks."""
    raw = _raw(shared_trace("misc/a100_nccl.json.gz"))
    raw["distributedInfo"]["pg_config"].append({"pg_name": "dp", "pg_desc": "dp", "backend_config": "cuda:nccl", "pg_size": 8, "ranks": list(range(8))})
    ar = [e for e in raw["traceEvents"] if e.get("cat") == "kernel" and "AllReduce" in e["name"]]
    for i, e in enumerate(ar):
        if i % 2:
            e["args"].update({"Process Group Name": "dp", "Group size": 8})
            if i % 4 == 1:
                del e["args"]["Group size"]
    path = tmp_path / "job" / "rank0.json.gz"
    path.parent.mkdir()
    path.write_bytes(gzip.compress(json.dumps(raw).encode()))
    return path, raw


def test_each_collective_counts_with_its_own_groups_size(cli, tmp_path):
    path, raw = _two_groups(tmp_path)
    from advisor.schemas import check

    code, out, err = cli(["report", str(path.parent), "--collectives", "-f", "json"])
    assert code == 0, err
    doc = json.loads(out)
    check("collectives", doc)
    got = {(r["group"], r["kind"]): r for r in doc["collectives"]}
    kernels = [e for e in raw["traceEvents"] if e.get("cat") == "kernel" and "nccl" in e["name"].lower()]
    for group, n in (("0", 2), ("dp", 8)):
        for kind, word in (("all_reduce", "AllReduce"), ("broadcast", "Broadcast")):
            mine = [e for e in kernels if word in e["name"] and e["args"]["Process Group Name"] == group]
            if not mine:
                assert (group, kind) not in got
                continue
            size = sum(e["args"]["In msg nelems"] * ELEMENT[e["args"]["dtype"]] for e in mine)
            dur_ns = sum(e["dur"] for e in mine) * 1e3
            rows = [r for (g, k), r in got.items() if (g, k) == (group, kind)]
            assert rows, (group, kind)
            # one row per size bucket: sum them back
            r_count = sum(r["count"] for r in [r for r in doc["collectives"] if r["group"] == group and r["kind"] == kind])
            assert r_count == len(mine)
            bus = sum(r["busbw_gbps"] * r["time_ms"] for r in doc["collectives"] if r["group"] == group and r["kind"] == kind) * 1e6
            assert bus / dur_ns == pytest.approx(size / dur_ns * FACTOR[kind](n), rel=1e-3), (group, kind)
            assert {r["group_size"] for r in doc["collectives"] if r["group"] == group} == {n}
    assert "process groups of 2, 8 ranks" in cli(["report", str(path.parent), "--collectives"])[1]


def test_the_rule_counts_each_group_with_its_own_size(tmp_path):
    """communication-exposed on the same trace: its per-kind bandwidth is the hand one per group."""
    path, raw = _two_groups(tmp_path)
    from advisor.load.trace import load_trace
    from advisor.metrics.collectives import collective_calls, group_size_of, process_groups_of

    rule = importlib.import_module("advisor.rules.communication_exposed")
    frames = load_trace(path)
    link = rule.link_bandwidth(collective_calls(frames), process_groups_of(frames.distributed), group_size_of(frames.distributed), None)
    kernels = [e for e in raw["traceEvents"] if e.get("cat") == "kernel" and "AllReduce" in e["name"]]
    by = {(k["group"], k["kind"]): k for k in link["by_kind"]}
    for group, n in (("0", 2), ("dp", 8)):
        mine = [e for e in kernels if e["args"]["Process Group Name"] == group]
        bus = sum(e["args"]["In msg nelems"] * 4 for e in mine) * 2 * (n - 1) / n / (sum(e["dur"] for e in mine) * 1e3)
        assert by[(group, "all_reduce")]["group_size"] == n
        assert by[(group, "all_reduce")]["busbw_gbps"] == pytest.approx(bus, rel=1e-3, abs=1e-3)
    assert link["ranks"] == 8


@pytest.mark.parametrize(
    ("device", "link"),
    [
        # deviceProperties names as the traces in ../shared write them
        ("Tesla V100-SXM2-32GB", "NVLink 2"),
        ("NVIDIA GeForce RTX 4090", "PCIe gen4 x16"),
        ("NVIDIA A100-PG509-200", None),  # an A100 module whose name says neither SXM nor PCIe: not an A10
        ("NVIDIA A10", "PCIe gen4 x16"),
        ("NVIDIA L40S", "PCIe gen4 x16"),
        ("Tesla T4", "PCIe gen3 x16"),
        ("NVIDIA H100 80GB HBM3", "NVLink 4"),
    ],
)
def test_a_device_name_names_its_link_by_whole_model_names(device, link):
    from advisor.metrics.links import device_link

    assert device_link(device) == link
