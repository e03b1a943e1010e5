"""Collectives per step, one rank at a time, and the waits they hide when the ranks are compared.

A collective kernel (NCCL all-reduce, all-gather, ...) starts on each rank when that rank's
stream reaches it and ends when every rank has contributed: its duration on one rank is the
transfer plus the time spent waiting for the last rank to arrive. The rank that arrives last
waits for no one, so for the same collective on every rank

    wait(rank) = duration(rank) - min over ranks of duration

and the rank with the shortest duration is the one the others waited for. Durations, not
timestamps, are compared: each trace counts time from its own first event and the hosts'
clocks are not aligned. The same holds for a step's collectives taken together, which is
what `job_waits` compares.

`rank_comm` measures one rank (it runs where the rank is loaded; a few kB come back);
`job_waits` compares the ranks (it runs on the reduce side, on those few kB).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from advisor.load.trace import TraceFrames
from advisor.metrics.breakdown import communication_kernels
from advisor.metrics.intervals import merge, overlap_with
from advisor.metrics.steps import step_of

COLLECTIVE_COLUMNS = ["step", "seq", "dur", "overlap", "offset"]
COMPUTE_COLUMNS = ["step", "kernels", "kernel_ns"]


@dataclass
class RankComm:
    """One rank's collectives and compute kernels, per step (times in ns).

    collectives: one row per collective kernel that starts inside a step: the step number,
    its position among the step's collectives on this rank (by start time), its duration, how
    much of it compute kernels ran alongside, and its start after the step's marker
    (ProfilerStep#N) starts (offset). compute: per step, the number and the
    summed duration of the other kernels.
    """

    collectives: pd.DataFrame
    compute: pd.DataFrame

    @property
    def has_collectives(self) -> bool:
        return len(self.collectives) > 0

    def per_step(self) -> pd.DataFrame:
        """step -> collective_ns, overlap_ns, collectives (count)."""
        c = self.collectives
        return c.groupby("step", sort=True).agg(collective_ns=("dur", "sum"), overlap_ns=("overlap", "sum"), collectives=("dur", "size"))

    def overlap_share(self) -> float | None:
        """Share of collective time during which compute kernels also ran (1 = fully hidden)."""
        total = int(self.collectives["dur"].sum())
        return float(self.collectives["overlap"].sum() / total) if total > 0 else None


def empty_comm() -> RankComm:
    return RankComm(
        pd.DataFrame({c: np.zeros(0, np.int64) for c in COLLECTIVE_COLUMNS}),
        pd.DataFrame({c: np.zeros(0, np.int64) for c in COMPUTE_COLUMNS}),
    )


def rank_comm(frames: TraceFrames, steps: pd.DataFrame) -> RankComm:
    """The collectives and compute kernels of each step of one rank."""
    dev = frames.device
    if len(dev) == 0 or len(steps) == 0:
        return empty_comm()
    is_kernel = (dev["kind"] == "kernel").to_numpy()
    comm = communication_kernels(frames)
    ts, te = dev["ts"].to_numpy(np.int64), dev["end"].to_numpy(np.int64)
    s_start, s_end = steps["start"].to_numpy(np.int64), steps["end"].to_numpy(np.int64)
    h_start = steps["host_start"].to_numpy(np.int64) if "host_start" in steps else s_start  # where the step's marker starts
    numbers = steps["step"].to_numpy(np.int64)

    compute = is_kernel & ~comm
    k_step = step_of(s_start, s_end, ts[compute])
    inside = k_step >= 0
    counts = np.bincount(k_step[inside], minlength=len(steps))
    busy = np.bincount(k_step[inside], weights=(te[compute] - ts[compute])[inside], minlength=len(steps))
    compute_table = pd.DataFrame({"step": numbers, "kernels": counts.astype(np.int64), "kernel_ns": busy.astype(np.int64)})

    cs, ce = ts[comm], te[comm]
    c_step = step_of(s_start, s_end, cs)
    keep = c_step >= 0
    cs, ce, c_step = cs[keep], ce[keep], c_step[keep]
    order = np.lexsort((cs, c_step))
    cs, ce, c_step = cs[order], ce[order], c_step[order]
    ks, ke = merge(ts[compute], te[compute])
    overlap = overlap_with(ks, ke, cs, ce) if len(cs) else np.zeros(0, np.int64)
    # Position of each collective among its step's collectives.
    first = np.searchsorted(c_step, c_step, side="left")
    seq = np.arange(len(c_step)) - first
    collectives = pd.DataFrame(
        {"step": numbers[c_step], "seq": seq.astype(np.int64), "dur": (ce - cs).astype(np.int64), "overlap": np.asarray(overlap, np.int64),
         "offset": (cs - h_start[c_step]).astype(np.int64)}
    )
    return RankComm(collectives, compute_table)


@dataclass
class JobWaits:
    """The ranks compared step by step (ns; rows follow `ranks`, columns `steps`).

    collective: each rank's collective time in the step. wait: how much of it is waiting,
    the excess over the rank with the least (the one that arrived last). caused: time the
    job lost to each rank arriving last: how much sooner the step's collectives would have
    ended had the last rank arrived with the next-to-last (the second-least collective time
    less the least), charged to the last rank.
    """

    ranks: list[int]
    steps: np.ndarray
    collective: np.ndarray
    wait: np.ndarray
    caused: np.ndarray

    def mean_wait_ms(self) -> np.ndarray:
        return self.wait.mean(axis=1) / 1e6

    def mean_caused_ms(self) -> np.ndarray:
        return self.caused.mean(axis=1) / 1e6

    def row(self, rank: int) -> int:
        return self.ranks.index(rank)


def job_waits(comms: list[tuple[int, RankComm | None]]) -> JobWaits | None:
    """Waits and who caused them, over the steps every rank recorded. Step totals are compared,
    not single collectives: point-to-point traffic (pipeline send/recv) pairs ranks rather than
    syncing them all, and totals stay right for both. None with fewer than two ranks with
    collectives, or no step they share."""
    comms = [(r, c) for r, c in comms if c is not None and c.has_collectives]
    if len(comms) < 2:
        return None
    ranks = [r for r, _ in comms]
    totals = [c.collectives.groupby("step", sort=True)["dur"].sum() for _, c in comms]
    common = totals[0].index
    for t in totals[1:]:
        common = common.intersection(t.index)
    if len(common) == 0:
        return None
    common = common.sort_values()
    collective = np.vstack([t.loc[common].to_numpy(np.int64) for t in totals])
    shortest = collective.min(axis=0)
    wait = collective - shortest
    caused = np.zeros_like(collective)
    last = collective.argmin(axis=0)
    second = np.partition(collective, 1, axis=0)[1]
    caused[last, np.arange(len(common))] = second - shortest
    return JobWaits(ranks, common.to_numpy(np.int64), collective, wait, caused)


# --- ranks x time in collectives (the HTML report's chart) ---

LANE_STEPS = 4  # steps the chart shows: the first ones every rank recorded


@dataclass
class CollectiveLanes:
    """Each rank's time in collectives over the first steps every rank recorded (ns). The
    ranks' clocks are not aligned, so each step starts at the same x on every rank: step j
    occupies [slot_start[j], slot_start[j] + slot[j]), slot[j] the longest rank's step j
    (from its ProfilerStep marker's start to the end of its work), and a collective sits at
    its offset from its own rank's marker. spans[i]: rank i's collectives as (start, end) rows
    on that axis; step_ns[i]: its steps' extents."""

    ranks: list[int]
    steps: np.ndarray
    slot_start: np.ndarray
    slot: np.ndarray
    spans: list[np.ndarray]
    step_ns: np.ndarray

    @property
    def duration_ns(self) -> int:
        return int(self.slot_start[-1] + self.slot[-1]) if len(self.slot) else 0


def collective_lanes(ranks: list[tuple[int, RankComm | None, pd.DataFrame]], max_steps: int = LANE_STEPS) -> CollectiveLanes | None:
    """CollectiveLanes of (rank, its RankComm, its steps table); None without two ranks with
    collectives in a step they all recorded (or an older cache entry without offsets)."""
    ranks = [(r, c, s) for r, c, s in ranks if c is not None and c.has_collectives and "offset" in c.collectives]
    if len(ranks) < 2:
        return None
    common = set(ranks[0][2]["step"].tolist())
    for _, _, s in ranks[1:]:
        common &= set(s["step"].tolist())
    shown = np.array(sorted(common)[:max_steps], dtype=np.int64)
    if len(shown) == 0:
        return None
    def extent(s: pd.DataFrame) -> np.ndarray:  # from the step's marker to the end of its work
        t = s.set_index("step").loc[shown]
        first = t["host_start"] if "host_start" in t else t["start"]
        return (t["end"] - first).to_numpy(np.int64)

    durations = np.vstack([extent(s) for _, _, s in ranks])
    slot = durations.max(axis=0)
    slot_start = np.concatenate([[0], np.cumsum(slot)[:-1]]).astype(np.int64)
    spans = []
    for _, c, _ in ranks:
        t = c.collectives
        t = t[t["step"].isin(shown)]
        j = np.searchsorted(shown, t["step"].to_numpy(np.int64))
        start = slot_start[j] + t["offset"].to_numpy(np.int64)
        spans.append(np.column_stack([start, start + t["dur"].to_numpy(np.int64)]) if len(t) else np.zeros((0, 2), np.int64))
    return CollectiveLanes([r for r, _, _ in ranks], shown, slot_start, slot, spans, durations)


# --- every collective of a rank: kind, message size, algorithm (`advisor report --collectives`) ---

# NCCL's bus bandwidth factors (nccl-tests, doc/PERFORMANCE.md): busbw = algbw x factor(n),
# n the ranks of the collective's own process group. The one definition: the collectives table
# (`advisor report --collectives`) and the rules that quote a bus bandwidth read it through
# `bus_factor` and `collective_bandwidth`.
BUS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "send_recv": lambda n: 1.0,
}
# A collective's name, as an annotation (nccl:_all_gather_base) or a kernel (ncclDevKernel_AllGather_RING_LL) writes it.
_KINDS = (
    ("allreduce", "all_reduce"), ("allgather", "all_gather"), ("reducescatter", "reduce_scatter"),
    ("alltoall", "all_to_all"), ("broadcast", "broadcast"), ("sendrecv", "send_recv"), ("send", "send_recv"),
    ("recv", "send_recv"), ("reduce", "reduce"),
)
_ALGORITHM = re.compile(r"_(RING|TREE|COLLNET_DIRECT|COLLNET_CHAIN|COLLNET|NVLS_TREE|NVLS|PAT)_?(LL128|LL|SIMPLE)?(?=[_(]|$)")
ELEMENT_BYTES = {
    "float": 4, "float32": 4, "int": 4, "int32": 4, "unsigned int": 4, "double": 8, "float64": 8, "long": 8, "long int": 8,
    "int64": 8, "half": 2, "c10::half": 2, "float16": 2, "c10::bfloat16": 2, "bfloat16": 2, "short": 2, "int16": 2,
    "signed char": 1, "unsigned char": 1, "char": 1, "int8": 1, "uint8": 1, "bool": 1, "byte": 1,
}
CALL_COLUMNS = ["start", "end", "dur", "kind", "algorithm", "bytes", "out_bytes", "group", "group_size"]


def bus_factor(kind: np.ndarray, n: np.ndarray) -> np.ndarray:
    """NCCL's busbw / algbw of each collective of `kind` over `n` ranks (BUS_FACTOR); NaN
    where the kind has none or n is unknown (NaN or < 1)."""
    kind = np.asarray(kind, dtype=object)
    n = np.asarray(n, dtype=np.float64)
    out = np.full(len(kind), np.nan)
    known = np.isfinite(n) & (n >= 1)
    for k, f in BUS_FACTOR.items():
        m = (kind == k) & known
        if m.any():
            out[m] = np.broadcast_to(np.asarray(f(n[m]), dtype=np.float64), (int(m.sum()),))
    return out


def nccl_size(kind: np.ndarray, in_bytes: np.ndarray, out_bytes: np.ndarray, n: np.ndarray) -> np.ndarray:
    """nccl-tests' size of each collective (the size its algbw divides): an all-gather's is the
    gathered output (the kernel's `Out msg nelems`, else one rank's input x n); a
    reduce-scatter's the full input (`In msg nelems`: n x each rank's output); every other
    kind's the input its record names."""
    kind = np.asarray(kind, dtype=object)
    in_bytes = np.asarray(in_bytes, dtype=np.float64)
    out_bytes = np.asarray(out_bytes, dtype=np.float64)
    gathered = np.where(np.isnan(out_bytes), in_bytes * np.asarray(n, dtype=np.float64), out_bytes)
    return np.where(kind == "all_gather", gathered, in_bytes)


def call_group_sizes(calls: pd.DataFrame, groups: dict[str, int], default: int | None) -> np.ndarray:
    """The ranks of each collective's own process group: the kernel's `Group size`, else the
    size `distributedInfo.pg_config` gives the group the kernel names, else `default` (the
    job's one group, or its world size); NaN where none is known."""
    own = calls["group_size"].to_numpy(np.float64)
    n = np.where(own >= 1, own, np.nan)
    if groups and np.isnan(n).any():
        named = pd.Series(calls["group"].to_numpy(dtype=object)).map(groups).to_numpy(np.float64)
        n = np.where(np.isnan(n), named, n)
    if default:
        n = np.where(np.isnan(n), float(default), n)
    return n


def collective_bandwidth(calls: pd.DataFrame, groups: dict[str, int], default: int | None) -> pd.DataFrame:
    """`calls` (collective_calls) with n (its group's ranks), size (nccl_size), factor
    (bus_factor) and bus_bytes (size x factor): busbw over any set of calls is the sum of
    their bus_bytes over the sum of their durations."""
    n = call_group_sizes(calls, groups, default)
    kind = calls["kind"].to_numpy(dtype=object)
    size = nccl_size(kind, calls["bytes"].to_numpy(np.float64), calls["out_bytes"].to_numpy(np.float64), n)
    factor = bus_factor(kind, n)
    return calls.assign(n=n, size=size, factor=factor, bus_bytes=size * factor)


def collective_kind(name: str) -> str | None:
    """all_reduce, all_gather, ... from an annotation's or a kernel's name; None if neither says."""
    squashed = name.lower().replace("_", "").replace("ncclkernel", "").replace("nccldevkernel", "").replace("nccl:", "")
    for needle, kind in _KINDS:
        if squashed.startswith(needle) or f":{needle}" in squashed:
            return kind
    return None


def collective_algorithm(kernel: str) -> str:
    """The algorithm and protocol a NCCL kernel's name states (RING LL, TREE SIMPLE), "" where none."""
    m = _ALGORITHM.search(kernel.split("(")[0])
    return " ".join(p for p in m.groups() if p) if m else ""


def _annotation_bytes(dims, types) -> float:
    """The first input's bytes of an `nccl:*` annotation (record_shapes): elements x element size."""
    if not isinstance(dims, list) or not dims or not isinstance(dims[0], list):
        return np.nan
    text = types if isinstance(types, str) else ""

    try:
        names = json.loads(text) if text else []
    except ValueError:
        return np.nan
    size = ELEMENT_BYTES.get(str(names[0]).lower()) if names else None
    if size is None or not all(isinstance(d, int) and d >= 0 for d in dims[0]):
        return np.nan
    return float(np.prod(dims[0], dtype=np.float64) * size)


def collective_calls(frames: TraceFrames) -> pd.DataFrame:
    """One row per collective on one rank, in start order: start, end, dur (ns of its kernels),
    kind, algorithm, bytes (the message as the call's record states it: the kernel's `In msg
    nelems` x dtype, else the first input of the `nccl:*` annotation around its launch; NaN
    where neither is recorded). Kernels launched under one annotation are one collective."""
    dev = frames.device
    comm = communication_kernels(frames) if len(dev) else np.zeros(0, dtype=bool)
    if not comm.any():
        return pd.DataFrame({"start": np.zeros(0, np.int64), "end": np.zeros(0, np.int64), "dur": np.zeros(0, np.int64),
                             "kind": np.zeros(0, object), "algorithm": np.zeros(0, object), "bytes": np.zeros(0), "out_bytes": np.zeros(0),
                             "group": np.zeros(0, object), "group_size": np.zeros(0, np.int64)})
    k = dev.loc[comm, ["name", "ts", "end", "correlation", "msg_bytes"]].reset_index(drop=True)
    sel = np.flatnonzero(comm)
    out_b = dev["msg_out_bytes"].to_numpy(np.float64)[sel] if "msg_out_bytes" in dev else np.full(len(k), np.nan)
    g_size = dev["group_size"].to_numpy(np.int64)[sel] if "group_size" in dev else np.full(len(k), -1, np.int64)
    g_name = dev["process_group"].to_numpy(dtype=object)[sel] if "process_group" in dev else np.full(len(k), None, object)
    names = k["name"].astype(str).to_numpy(dtype=object)
    # The launch call of each kernel, and the nccl:* annotation around it on the same thread.
    rt = frames.runtime
    launch = pd.Series(np.arange(len(rt)), index=rt["correlation"].to_numpy(np.int64))
    launch = launch[~launch.index.duplicated()]
    pos = launch.reindex(k["correlation"].to_numpy(np.int64)).to_numpy()
    host = frames.host
    is_ann = host["name"].astype(str).str.startswith("nccl:").to_numpy()
    ann = host.loc[is_ann, ["name", "tid", "ts", "end", "input_dims", "input_types"]].reset_index(drop=True)
    owner = np.full(len(k), -1, np.int64)
    if len(ann) and len(rt):
        linked = np.nonzero(~np.isnan(pos))[0]
        at = pos[linked].astype(np.int64)
        k_tid, k_t = rt["tid"].to_numpy()[at], rt["ts"].to_numpy(np.int64)[at]
        a_tid, a_ts_all, a_end_all = ann["tid"].to_numpy(), ann["ts"].to_numpy(np.int64), ann["end"].to_numpy(np.int64)
        for tid in pd.unique(a_tid):
            rows = np.nonzero(a_tid == tid)[0]
            rows = rows[np.argsort(a_ts_all[rows], kind="stable")]
            mine = k_tid == tid
            t = k_t[mine]
            j = np.searchsorted(a_ts_all[rows], t, side="right") - 1
            inside = (j >= 0) & (a_end_all[rows[np.clip(j, 0, None)]] >= t)
            owner[linked[mine][inside]] = rows[j[inside]]
    a_names = ann["name"].astype(str).to_numpy(dtype=object)
    a_bytes = np.array([_annotation_bytes(d, t) for d, t in zip(ann["input_dims"], ann["input_types"], strict=True)], dtype=np.float64)
    key = np.where(owner >= 0, owner, -1 - np.arange(len(k)))
    out = []
    for _, idx in pd.Series(np.arange(len(k))).groupby(key, sort=False):
        idx = idx.to_numpy()
        first = idx[0]
        a = owner[first]
        kind = (collective_kind(a_names[a]) if a >= 0 else None) or collective_kind(names[first]) or "other"
        size = float(k["msg_bytes"].iat[first])
        if np.isnan(size) and a >= 0:
            size = a_bytes[a]
        dur = int((k["end"].to_numpy(np.int64)[idx] - k["ts"].to_numpy(np.int64)[idx]).sum())
        group = g_name[first] if isinstance(g_name[first], str) else None
        out.append((int(k["ts"].iat[first]), int(k["end"].to_numpy(np.int64)[idx].max()), dur, kind, collective_algorithm(names[first]), size,
                    float(out_b[first]), group, int(g_size[first])))
    table = pd.DataFrame(out, columns=CALL_COLUMNS)
    return table.sort_values("start", kind="stable").reset_index(drop=True)


def comm_compute_overlap(frames: TraceFrames) -> dict[str, int]:
    """A rank's kernel time (ns) split as HTA's overlap table does: compute (non-collective
    kernels, merged), communication (collective kernels, merged), their overlap, and the
    communication no compute ran beside (exposed)."""
    dev = frames.device
    if len(dev) == 0:
        return {"compute_ns": 0, "communication_ns": 0, "overlapped_ns": 0, "exposed_ns": 0}
    is_kernel = (dev["kind"] == "kernel").to_numpy()
    comm = communication_kernels(frames)
    ts, te = dev["ts"].to_numpy(np.int64), dev["end"].to_numpy(np.int64)
    ks, ke = merge(ts[is_kernel & ~comm], te[is_kernel & ~comm])
    cs, ce = merge(ts[comm], te[comm])
    overlapped = int(overlap_with(ks, ke, cs, ce).sum()) if len(cs) else 0
    communication = int((ce - cs).sum())
    return {"compute_ns": int((ke - ks).sum()), "communication_ns": communication, "overlapped_ns": overlapped, "exposed_ns": communication - overlapped}


# --- the job's collectives: size buckets, bandwidth against the link, skew and wait across ranks ---

# Message size buckets (bytes): each bucket holds sizes from its edge up to the next.
SIZE_EDGES = (0, 2**10, 2**16, 2**20, 2**24, 2**28)
SIZE_LABELS = ("< 1 KiB", "1–64 KiB", "64 KiB–1 MiB", "1–16 MiB", "16–256 MiB", "≥ 256 MiB")


@dataclass
class RankCollectives:
    """What one rank sends back for the job's collectives table (small: one row per collective)."""

    rank: int
    calls: pd.DataFrame  # collective_calls
    overlap: dict[str, int]  # comm_compute_overlap
    device_name: str | None
    devices_in_trace: int
    group_size: int | None
    groups: dict[str, int] | None = None  # process group name -> its ranks, as distributedInfo.pg_config lists them


def group_size_of(distributed: dict) -> int | None:
    """The ranks a collective spans when its kernel does not say: the one process group's
    size, else the world size."""
    groups = distributed.get("pg_config")
    if isinstance(groups, list) and len(groups) == 1 and isinstance(groups[0], dict) and isinstance(groups[0].get("pg_size"), int):
        return int(groups[0]["pg_size"])
    world = distributed.get("world_size")
    return int(world) if isinstance(world, int) and world > 0 else None


def process_groups_of(distributed: dict) -> dict[str, int]:
    """Each process group's name -> its ranks, from `distributedInfo.pg_config`."""
    groups = distributed.get("pg_config")
    if not isinstance(groups, list):
        return {}
    return {str(g["pg_name"]): int(g["pg_size"]) for g in groups
            if isinstance(g, dict) and g.get("pg_name") is not None and isinstance(g.get("pg_size"), int) and g["pg_size"] > 0}


def rank_collectives(frames: TraceFrames, rank: int) -> RankCollectives:
    props = frames.device_properties
    name = str(props["name"].iloc[0]) if len(props) else None
    d = frames.distributed
    return RankCollectives(rank, collective_calls(frames), comm_compute_overlap(frames), name, len(props), group_size_of(d), process_groups_of(d))


def size_bucket(size: np.ndarray) -> np.ndarray:
    """The bucket label of each message size (bytes), "size unknown" for NaN."""
    idx = np.searchsorted(np.asarray(SIZE_EDGES, np.float64), np.nan_to_num(size, nan=-1.0), side="right") - 1
    labels = np.array(SIZE_LABELS, dtype=object)
    return np.where(np.isnan(size), "size unknown", labels[np.clip(idx, 0, len(labels) - 1)])


TABLE_COLUMNS = ["group", "group_size", "kind", "bucket", "algorithm", "count", "ranks", "time_ms", "bytes", "algbw_gbps", "busbw_gbps", "peak_share"]


def collective_calls_empty() -> pd.DataFrame:
    return pd.DataFrame({c: np.zeros(0, np.int64 if c in ("start", "end", "dur", "group_size") else np.float64 if c.endswith("bytes") else object)
                         for c in CALL_COLUMNS})


@dataclass
class JobCollectives:
    """The job's collectives (see to_dict for the fields)."""

    table: pd.DataFrame  # group, group_size, kind, bucket, algorithm, count, ranks, time_ms, bytes, algbw_gbps, busbw_gbps, peak_share
    ranks: pd.DataFrame  # rank, collectives, time_ms, matched, mean_lag_ms, max_lag_ms, wait_ms
    overlap: pd.DataFrame  # rank, compute_ms, communication_ms, overlapped_ms, exposed_ms, overlap_share
    link: Any
    group_size: int | None
    skew_p50_ms: float | None
    skew_max_ms: float | None
    notes: list[str]

    def to_dict(self) -> dict[str, Any]:
        def rows(df: pd.DataFrame) -> list[dict[str, Any]]:
            return [{k: (None if isinstance(v, float) and not np.isfinite(v) else v) for k, v in r.items()} for r in df.to_dict("records")]

        return {"group_size": self.group_size, "link": self.link.to_dict(), "collectives": rows(self.table), "ranks": rows(self.ranks),
                "skew_p50_ms": self.skew_p50_ms, "skew_max_ms": self.skew_max_ms, "overlap": rows(self.overlap), "notes": list(self.notes)}


def job_collectives(ranks: list[RankCollectives]) -> JobCollectives:
    """Every rank's collectives in one table per kind and size bucket (the first rank's sizes:
    every rank of a collective moves the same), bandwidth by NCCL's definitions against the
    inferred link, and per rank how late it arrived and how long it waited for the last.

    Skew and wait need the ranks' clocks on one time base: a collective ends on every rank at
    about the same moment (when the last rank's data arrived), so each rank's clock offset is
    the median over matched collectives of its end less the first rank's, and a collective's
    start on each rank is compared after that offset. Collectives are matched by process group,
    kind and order within those.

    Each collective's bandwidth uses its own process group's size (a TP all-reduce over 2
    ranks and a DP all-reduce over 8 in one job): one row per group, kind and size bucket."""
    from advisor.metrics.links import infer_link

    ranks = sorted(ranks, key=lambda r: r.rank)
    notes: list[str] = []
    n = next((r.group_size for r in ranks if r.group_size), None)
    named = next((r for r in ranks if r.device_name), None)
    frames = [collective_bandwidth(r.calls, r.groups or {}, r.group_size or n).assign(rank=r.rank) for r in ranks]
    calls = pd.concat(frames, ignore_index=True) if frames else collective_bandwidth(collective_calls_empty(), {}, n).assign(rank=0).iloc[:0]
    sizes = calls["n"].dropna()
    widest = int(sizes.max()) if len(sizes) else n
    link = infer_link(named.device_name if named else None, named.devices_in_trace if named else 0, widest)
    calls = calls.assign(bucket=size_bucket(calls["size"].to_numpy(np.float64)), group=calls["group"].fillna(""))
    links = {widest: link}
    rows = []
    for (group, kd, bucket), g in calls.groupby(["group", "kind", "bucket"], sort=True):
        dur = float(g["dur"].sum())
        sized = g["size"].notna().all()
        moved = float(g["size"].sum()) if sized else np.nan
        algbw = moved / dur if dur > 0 else np.nan  # bytes/ns = GB/s
        busbw = float(g["bus_bytes"].sum()) / dur if dur > 0 and sized and g["factor"].notna().all() else np.nan
        algs = sorted({a for a in g["algorithm"] if a})
        ns = g["n"].dropna().unique()
        size = int(ns[0]) if len(ns) == 1 else None
        # the link of this group: a tensor-parallel group of 2 may sit in one node where the job does not
        own = links.setdefault(size, infer_link(named.device_name if named else None, named.devices_in_trace if named else 0, size))
        rows.append({"group": group or None, "group_size": size, "kind": kd, "bucket": bucket,
                     "algorithm": ", ".join(algs) or "not named", "count": len(g), "ranks": int(g["rank"].nunique()),
                     "time_ms": dur / 1e6, "bytes": moved, "algbw_gbps": algbw, "busbw_gbps": busbw,
                     "peak_share": busbw / own.peak_gbps if own.peak_gbps and np.isfinite(busbw) else np.nan})
    table = pd.DataFrame(rows, columns=TABLE_COLUMNS)
    table = table.sort_values("time_ms", ascending=False, kind="stable").reset_index(drop=True)
    if calls["size"].isna().any():
        notes.append("Some collectives' message size is not in the trace (neither the kernel's `In msg nelems` nor an `nccl:*` op's input shapes): "
                     "their bandwidth is not computed. Record with record_shapes=True.")
    if n and len(ranks) < n:
        notes.append(f"The run holds {len(ranks)} of the group's {n} ranks: skew and wait compare these ranks only.")
    per_rank, skew = _lateness(ranks, notes)
    overlap = pd.DataFrame([{"rank": r.rank, "compute_ms": r.overlap["compute_ns"] / 1e6, "communication_ms": r.overlap["communication_ns"] / 1e6,
                             "overlapped_ms": r.overlap["overlapped_ns"] / 1e6, "exposed_ms": r.overlap["exposed_ns"] / 1e6,
                             "overlap_share": r.overlap["overlapped_ns"] / r.overlap["communication_ns"] if r.overlap["communication_ns"] else np.nan}
                            for r in ranks], columns=["rank", "compute_ms", "communication_ms", "overlapped_ms", "exposed_ms", "overlap_share"])
    return JobCollectives(table, per_rank, overlap, link, n, skew[0], skew[1], notes)


def _lateness(ranks: list[RankCollectives], notes: list[str]) -> tuple[pd.DataFrame, tuple[float | None, float | None]]:
    """Per rank: collectives, time in them, how late it started each (after the clock offset)
    behind the earliest rank, and the time it waited for the last (see job_collectives)."""
    base = pd.DataFrame({"rank": [r.rank for r in ranks], "collectives": [len(r.calls) for r in ranks],
                         "time_ms": [r.calls["dur"].sum() / 1e6 for r in ranks]})
    empty = base.assign(matched=0, mean_lag_ms=np.nan, max_lag_ms=np.nan, wait_ms=np.nan)
    if len(ranks) < 2 or any(len(r.calls) == 0 for r in ranks):
        return empty, (None, None)
    def keyed(c: pd.DataFrame) -> pd.Series:
        return c["group"].fillna("").astype(str) + "\x00" + c["kind"].astype(str)

    keys = sorted(set.intersection(*(set(keyed(r.calls)) for r in ranks)))
    starts, ends = [], []
    for key in keys:
        group, kd = key.split("\x00")
        per = [r.calls.loc[(keyed(r.calls) == key).to_numpy()] for r in ranks]
        m = min(len(p) for p in per)
        if any(len(p) != m for p in per):
            where = f" in process group {group}" if group else ""
            notes.append(f"The ranks recorded different numbers of {kd} collectives{where}: the first {m} of each are compared.")
        starts.append(np.vstack([p["start"].to_numpy(np.int64)[:m] for p in per]))
        ends.append(np.vstack([p["end"].to_numpy(np.int64)[:m] for p in per]))
    s, e = np.hstack(starts), np.hstack(ends)
    if s.shape[1] == 0:
        return empty, (None, None)
    offset = np.median(e - e[0], axis=1)
    aligned = s - offset[:, None]
    lag = aligned - aligned.min(axis=0)  # behind the earliest rank
    wait = aligned.max(axis=0) - aligned  # waiting for the last rank to arrive
    spread = aligned.max(axis=0) - aligned.min(axis=0)
    out = base.assign(matched=s.shape[1], mean_lag_ms=lag.mean(axis=1) / 1e6, max_lag_ms=lag.max(axis=1) / 1e6, wait_ms=wait.sum(axis=1) / 1e6)
    return out, (float(np.median(spread)) / 1e6, float(spread.max()) / 1e6)
