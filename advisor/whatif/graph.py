"""One rank's steps as a dependency graph that a replay can re-time.

Nodes are the host's runtime calls (in issue order, all threads merged) with the step
boundaries as zero-length marks between them, and the device's kernels, copies and memsets
(in order per stream). Edges, all measured from the trace:

- host order: each host node starts a measured gap after the node it follows. The gap is the
  host's own work between calls (Python, operators, DataLoader); when two threads overlap, a
  node follows the start of the one it overlaps instead of its end.
- launch: a device op starts no earlier than its launch call plus the launch latency
  (correlation id); where the op was launched before its stream's previous op ended (it
  sat in the queue) the latency is the stream's typical one, otherwise the measured one.
- stream order: a device op starts after the previous op of its stream (plus the measured
  gap when it was queued).
- waits (host time blocked on the device is elastic; see `_waits`): a synchronize call, and
  a copy call that returned only after its copy finished (pageable or device-to-host), ends
  no earlier than the device work it waited for, plus its measured time after that work; a
  launch into a full queue ends no earlier than the op it waited for a queue slot from; every
  other enqueue call, no earlier than the op the run's queue depth before it. A waiting
  call's own cost is its base: what a call of its kind costs when it does not wait.
- device-side waits: an op held well past its launch and its stream, which started just as
  an op of another stream ended, follows that op.

Everything is NumPy arrays built with vectorised joins; only the replay walks the nodes in
order. Indices into the rank's frames (`runtime_row`, `device_row`) let a fix name the calls
and device ops it changes. The graph holds no frames and pickles small.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pandas as pd

from advisor.load.trace import TraceFrames
from advisor.metrics.breakdown import text_of
from advisor.metrics.host_waits import host_wait_calls

MARK_START, MARK_END, CALL = 1, 2, 0
# An op that started more than this after its stream went idle measures the launch latency.
QUEUED_NS = 3_000
# Launch latency used when a stream has no launch-bound op to measure it on.
DEFAULT_LATENCY_NS = 5_000
# A call that lasted longer than this and BLOCKED_FACTOR times the median of its kind, and
# returned within RELEASE_NS of a device op's end, waited for that op.
BLOCKED_NS = 20_000
BLOCKED_FACTOR = 10.0
RELEASE_NS = 20_000
# An op that started this long after its launch and its stream's previous op allowed waited
# for something else (another stream's op, when one ended just before it).
HELD_NS = 20_000
# A call that holds the launches of device work returned because that work was done when it
# returned this soon after the last of it ended (its own epilogue: results read back, freed).
CONTAINER_RELEASE_NS = 1_000_000
CONTAINER_RELEASE_SHARE = 0.05
# A launch blocked on a full queue waited for an op at least this many launches earlier (a
# slow call that returns as the op just before it ends is not back-pressure).
MIN_QUEUE_LAG = 32
# Launches the queue holds where no launch of the run blocked to measure it (CUDA's launch
# queue holds about a thousand: 1020-1026 on the recorded V100, A100 and H100 runs).
QUEUE_DEPTH_DEFAULT = 1024
# What a wait call costs the host besides the wait itself, where the trace has no call of the
# same kind that did not wait (the part a fix cannot remove).
WAIT_CALL_BASE_NS = 2_000


@dataclass
class StepGraph:
    """A rank's replayable graph (see the module docstring). Times are int64 ns."""

    # host nodes, in issue order
    h_ts: np.ndarray
    h_dur: np.ndarray
    h_kind: np.ndarray  # CALL, MARK_START, MARK_END
    h_step: np.ndarray  # step index for marks, -1 for calls
    h_anchor: np.ndarray  # node this one follows (-1: none)
    h_serial: np.ndarray  # follows the anchor's end (True) or its start (False: another thread)
    h_gap: np.ndarray  # measured time from the anchor's end (or start) to this node's start
    h_gap_start: np.ndarray  # measured time where the gap begins (for host-time removal)
    runtime_row: np.ndarray  # row in frames.runtime, -1 for marks
    # waits: CSR from host node to the device ops it waited for
    wait_ptr: np.ndarray
    wait_ops: np.ndarray
    wait_tail: np.ndarray  # per host node: time from the waited work's end to the call's end
    h_base: np.ndarray  # per host node: what the call costs when it does not wait (its duration if it never waits)
    h_waited: np.ndarray  # per host node: the trace shows it waiting for device work (else its waits did not bind)
    queue_depth: int  # launches the device queue holds (see `_waits`)
    queue_depth_measured: bool  # inferred from launches that blocked (else QUEUE_DEPTH_DEFAULT)
    # device ops, in replay order (by launch node, then start)
    d_launch: np.ndarray  # host node that launched (or precedes) the op
    d_stream: np.ndarray  # stream code (0..n_streams-1)
    d_dur: np.ndarray
    d_delay: np.ndarray  # from the launch node's start to the op's start, when not held by its stream
    d_gap: np.ndarray  # after the previous op of the stream ends
    d_latency: np.ndarray  # the stream's typical launch latency (what a queued op's delay is bounded by)
    d_step: np.ndarray  # step that launched it (-1: none)
    device_row: np.ndarray  # row in frames.device
    d_held_by: np.ndarray  # op of another stream this op waited for (-1: none)
    d_held_by_gap: np.ndarray  # from that op's end to this op's start
    d_before_first_step: np.ndarray  # ops from before the first step that it starts after (metrics.steps)
    # steps
    step_ids: np.ndarray
    step_start: np.ndarray  # measured spans (as metrics.steps)
    step_end: np.ndarray
    step_host_start: np.ndarray
    n_streams: int
    step_marks: bool = False  # the steps are the user's ProfilerStep marks (metrics.steps ends a host-paced last step by its mark)

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}  # no replay caches

    @property
    def measured_step_ns(self) -> np.ndarray:
        return self.step_end - self.step_start


def _host_nodes(frames: TraceFrames, steps: pd.DataFrame) -> pd.DataFrame:
    rt = frames.runtime
    calls = pd.DataFrame(
        {
            "ts": rt["ts"].to_numpy(np.int64),
            "dur": np.maximum(rt["end"].to_numpy(np.int64) - rt["ts"].to_numpy(np.int64), 0),
            "kind": CALL,
            "step": -1,
            "runtime_row": np.arange(len(rt), dtype=np.int64),
        }
    )
    n = len(steps)
    hs = steps["host_start"].to_numpy(np.int64)
    he = np.maximum(steps["host_end"].to_numpy(np.int64), hs)
    marks = pd.DataFrame(
        {
            "ts": np.concatenate([hs, he]),
            "dur": 0,
            "kind": np.concatenate([np.full(n, MARK_START), np.full(n, MARK_END)]),
            "step": np.concatenate([np.arange(n), np.arange(n)]),
            "runtime_row": -1,
        }
    )
    nodes = pd.concat([calls, marks], ignore_index=True)
    # Marks of a step's end come before calls at the same instant, a step's start after them.
    order_key = np.where(nodes["kind"].to_numpy() == MARK_END, 0, np.where(nodes["kind"].to_numpy() == CALL, 1, 2))
    order = np.lexsort((order_key, nodes["ts"].to_numpy()))
    return nodes.iloc[order].reset_index(drop=True)


def _anchors(ts: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """For each node, the earlier node that ended last: follow its end, or its start if it overlaps."""
    n = len(ts)
    idx = np.arange(n)
    cummax = np.maximum.accumulate(end) if n else end
    at_max = np.where(end == cummax, idx, -1)
    holder = np.maximum.accumulate(at_max) if n else at_max
    anchor = np.full(n, -1, dtype=np.int64)
    anchor[1:] = holder[:-1]
    serial = np.ones(n, dtype=bool)
    gap = np.zeros(n, dtype=np.int64)
    lo = ts.copy()
    has = anchor >= 0
    a = anchor[has]
    a_end, a_ts = end[a], ts[a]
    ser = a_end <= ts[has]
    serial[has] = ser
    gap[has] = np.where(ser, ts[has] - a_end, ts[has] - a_ts)
    lo[has] = np.where(ser, a_end, ts[has])  # an overlapping node removes no host time of its own
    return anchor, serial, gap, lo


def build_graph(frames: TraceFrames, steps: pd.DataFrame, step_marks: bool | None = None) -> StepGraph:
    """The replayable graph of a rank, for the steps of `metrics.steps` (see module docstring)."""
    nodes = _host_nodes(frames, steps)
    h_ts = nodes["ts"].to_numpy(np.int64)
    h_dur = nodes["dur"].to_numpy(np.int64)
    h_end = h_ts + h_dur
    anchor, serial, gap, gap_start = _anchors(h_ts, h_end)
    runtime_row = nodes["runtime_row"].to_numpy(np.int64)
    node_of_row = np.full(len(frames.runtime), -1, dtype=np.int64)
    is_call = runtime_row >= 0
    node_of_row[runtime_row[is_call]] = np.nonzero(is_call)[0]

    # --- device ops and their launch nodes ---------------------------------------------------
    dev = frames.device
    d_ts = dev["ts"].to_numpy(np.int64)
    d_end = np.maximum(dev["end"].to_numpy(np.int64), d_ts)
    rt = frames.runtime
    corr_rt = rt["correlation"].to_numpy(np.int64)
    ok = corr_rt >= 0
    first = pd.Series(np.arange(len(rt))[ok], index=corr_rt[ok])
    first = first[~first.index.duplicated(keep="first")]
    corr_dev = dev["correlation"].to_numpy(np.int64)
    rt_row = first.reindex(corr_dev).to_numpy()
    launched = ~np.isnan(rt_row) & (corr_dev >= 0)
    launch = np.full(len(dev), -1, dtype=np.int64)
    launch[launched] = node_of_row[rt_row[launched].astype(np.int64)]
    # Ops with no launch call in the trace follow the last host node before them.
    orphan = launch < 0
    if orphan.any():
        launch[orphan] = np.maximum(np.searchsorted(h_ts, d_ts[orphan], side="right") - 1, 0) if len(h_ts) else 0
    stream_codes, _ = pd.factorize(dev["stream"].to_numpy(np.int64))
    stream_codes = stream_codes.astype(np.int64)
    if orphan.any() and (~orphan).any():
        # An orphan (work in flight when the window opened) must replay before the launched
        # ops its stream ran after it: no later than the launch of the next launched op.
        by = np.lexsort((d_ts, stream_codes))
        big = np.iinfo(np.int64).max
        nxt = np.where(orphan[by], big, launch[by])
        # reverse running minimum within each stream
        s_by = stream_codes[by]
        rev = nxt[::-1].copy()
        s_rev = s_by[::-1]
        for s in np.unique(s_rev):
            sel = s_rev == s
            rev[sel] = np.minimum.accumulate(rev[sel])
        bound = rev[::-1]
        cap = np.full(len(dev), big, dtype=np.int64)
        cap[by] = bound
        launch[orphan] = np.minimum(launch[orphan], cap[orphan])
        # Work in flight when the window opened (before the first launched op of its stream)
        # was queued before the first host node: it replays from there, back to back.
        first_launched = np.full(int(stream_codes.max()) + 1, big, dtype=np.int64)
        np.minimum.at(first_launched, stream_codes[~orphan], d_ts[~orphan])
        in_flight = orphan & (d_ts < first_launched[stream_codes])
        launch[in_flight] = 0
    n_streams = int(stream_codes.max()) + 1 if len(dev) else 0
    order = np.lexsort((d_ts, launch)) if len(dev) else np.zeros(0, dtype=np.int64)
    launch, stream, ts, end = launch[order], stream_codes[order], d_ts[order], d_end[order]
    dur = end - ts
    launch_ts = h_ts[launch] if len(h_ts) else np.zeros(len(ts), dtype=np.int64)

    # previous op of the same stream in replay order
    prev_end = np.full(len(ts), np.iinfo(np.int64).min, dtype=np.int64)
    if len(ts):
        by_stream = np.lexsort((np.arange(len(ts)), stream))
        s_sorted = stream[by_stream]
        same = np.zeros(len(ts), dtype=bool)
        same[1:] = s_sorted[1:] == s_sorted[:-1]
        pe = np.full(len(ts), np.iinfo(np.int64).min, dtype=np.int64)
        pe[1:] = end[by_stream][:-1]
        pe[~same] = np.iinfo(np.int64).min
        prev_end[by_stream] = pe
    has_prev = prev_end > np.iinfo(np.int64).min
    since_prev = np.where(has_prev, ts - np.where(has_prev, prev_end, 0), np.iinfo(np.int64).max)
    raw_delay = ts - launch_ts  # negative only for ops from before the first host node
    # Queued: launched before the stream's previous op ended, so the stream, not the launch,
    # set its start (plus the measured bubble after its predecessor).
    queued = has_prev & ((launch_ts < np.where(has_prev, prev_end, 0)) | (orphan[order] & (launch == 0)))
    # The stream's launch latency, measured on ops launched onto an idle stream (a bubble
    # between queued ops says nothing of it).
    idle_found = (since_prev > QUEUED_NS) & ~queued & ~orphan[order] & (raw_delay >= 0)
    latency = np.full(max(n_streams, 1), DEFAULT_LATENCY_NS, dtype=np.int64)
    for s in range(n_streams):
        sel = idle_found & (stream == s)
        if sel.any():
            latency[s] = int(np.median(raw_delay[sel]))
    lat = latency[stream] if len(ts) else np.zeros(0, dtype=np.int64)
    d_delay = np.where(queued, np.minimum(lat, raw_delay), raw_delay)
    d_gap = np.where(queued, np.maximum(since_prev, 0), np.minimum(np.where(has_prev, since_prev, 0), 0))
    # Held by another stream: an op that started HELD_NS or more after both its launch (plus
    # the latency) and its stream's previous op, just as an op of another stream ended (an
    # event its stream waited on, a collective's input), follows that op, not the clock.
    d_held_by = np.full(len(ts), -1, dtype=np.int64)
    d_held_by_gap = np.zeros(len(ts), dtype=np.int64)
    if n_streams > 1 and len(ts):
        ready = launch_ts + lat
        ready = np.where(has_prev, np.maximum(ready, np.where(has_prev, prev_end, 0) + QUEUED_NS), ready)
        held = np.nonzero(ts - ready > HELD_NS)[0]
        by_end = np.argsort(end, kind="stable")
        ends_sorted = end[by_end]
        j = np.searchsorted(ends_sorted, ts[held], side="right") - 1
        okj = j >= 0
        dep = by_end[np.clip(j, 0, None)]
        okj &= (stream[dep] != stream[held]) & (end[dep] >= ts[held] - RELEASE_NS) & (dep < held)
        held, dep = held[okj], dep[okj]
        d_held_by[held] = dep
        d_held_by_gap[held] = ts[held] - end[dep]
        d_delay[held] = np.minimum(d_delay[held], lat[held])
        d_gap[held] = np.minimum(d_gap[held], 0)

    # --- steps -------------------------------------------------------------------------------
    hs = steps["host_start"].to_numpy(np.int64)
    he = steps["host_end"].to_numpy(np.int64)
    call_end = h_end[launch] if len(h_ts) else launch_ts
    d_step = np.full(len(ts), -1, dtype=np.int64)
    if len(hs) and len(ts):
        idx = np.searchsorted(hs, launch_ts, side="right") - 1
        okk = (idx >= 0) & ~orphan[order]
        inside = np.zeros(len(ts), dtype=bool)
        inside[okk] = call_end[okk] <= he[idx[okk]]
        d_step = np.where(inside, idx, -1)

    # The first step starts after the device work from before it that ended before its own
    # began (metrics.steps): that work, replayed, sets its start.
    d_before_first_step = np.zeros(len(ts), dtype=bool)
    first_own = d_step == 0
    if first_own.any():
        d_before_first_step = (d_step < 0) & (end < ts[first_own].min())

    # --- waits -------------------------------------------------------------------------------
    waits = _waits(frames, h_ts, h_dur, runtime_row, node_of_row, launch, stream, ts, end, orphan[order], n_streams)

    return StepGraph(
        h_ts=h_ts,
        h_dur=h_dur,
        h_kind=nodes["kind"].to_numpy(np.int64),
        h_step=nodes["step"].to_numpy(np.int64),
        h_anchor=anchor,
        h_serial=serial,
        h_gap=gap,
        h_gap_start=gap_start,
        runtime_row=runtime_row,
        wait_ptr=waits.wait_ptr,
        wait_ops=waits.wait_ops,
        wait_tail=waits.wait_tail,
        h_base=waits.h_base,
        h_waited=waits.h_waited,
        queue_depth=waits.queue_depth,
        queue_depth_measured=waits.queue_depth_measured,
        d_launch=launch,
        d_stream=stream,
        d_dur=dur,
        d_delay=d_delay,
        d_gap=d_gap,
        d_latency=lat,
        d_step=d_step,
        device_row=order.astype(np.int64),
        d_before_first_step=d_before_first_step,
        d_held_by=d_held_by,
        d_held_by_gap=d_held_by_gap,
        step_ids=steps["step"].to_numpy(np.int64),
        step_start=steps["start"].to_numpy(np.int64),
        step_end=steps["end"].to_numpy(np.int64),
        step_host_start=hs,
        n_streams=n_streams,
        step_marks=bool(len(frames.steps)) if step_marks is None else step_marks,
    )


def _container_waits(h_ts, h_end, h_tid, is_call, first_q, waited, launch, op_end):
    """Calls (not launches, not waits already) longer than BLOCKED_NS that hold, on their own
    thread, the launch calls of device ops and return within CONTAINER_RELEASE of the last of
    those ops ending (and not before it): each such node and the op it waited for."""
    no = np.zeros(0, dtype=np.int64)
    cand_all = np.nonzero(is_call & (first_q == np.iinfo(np.int64).max) & ~waited & (h_end - h_ts > BLOCKED_NS))[0]
    if len(cand_all) == 0 or len(launch) == 0:
        return no, no
    out_node, out_op = [], []
    op_tid = h_tid[launch]
    for tid in np.unique(h_tid[cand_all]):
        nodes = np.nonzero(h_tid == tid)[0]  # this thread's nodes, ascending
        ops = np.nonzero(op_tid == tid)[0]
        if len(ops) == 0:
            continue
        ops = ops[np.argsort(launch[ops], kind="stable")]
        op_launch, ends = launch[ops], op_end[ops]
        cand = cand_all[h_tid[cand_all] == tid]
        # ops launched by this thread's nodes after the call and starting before it returns: [lo, hi)
        lo = np.searchsorted(op_launch, cand, side="right")
        inside = np.searchsorted(h_ts[nodes], h_end[cand], side="left") - 1
        hi = np.searchsorted(op_launch, nodes[np.maximum(inside, 0)], side="right")
        has = (hi > lo) & (inside >= 0)
        cand, lo, hi = cand[has], lo[has], hi[has]
        if len(cand) == 0:
            continue
        best = _range_argmax(ends, lo, hi)
        after = h_end[cand] - ends[best]
        ok = (after >= 0) & (after <= np.maximum(CONTAINER_RELEASE_NS, CONTAINER_RELEASE_SHARE * (h_end[cand] - h_ts[cand])))
        out_node.append(cand[ok])
        out_op.append(ops[best[ok]])
    if not out_node:
        return no, no
    return np.concatenate(out_node), np.concatenate(out_op)


def _range_argmax(values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Index of the largest value in each [lo, hi) (non-empty), by a sparse table."""
    n = len(values)
    table = [np.arange(n)]
    k = 1
    while (1 << k) <= n:
        prev = table[-1]
        half = 1 << (k - 1)
        a, b = prev[: n - (1 << k) + 1], prev[half : half + n - (1 << k) + 1]
        table.append(np.where(values[a] >= values[b], a, b))
        k += 1
    level = np.floor(np.log2(hi - lo)).astype(np.int64)
    best = np.empty(len(lo), dtype=np.int64)
    for lv in np.unique(level):
        sel = level == lv
        a, b = table[lv][lo[sel]], table[lv][hi[sel] - (1 << lv)]
        best[sel] = np.where(values[a] >= values[b], a, b)
    return best


class Waits(NamedTuple):
    """What `_waits` finds: the StepGraph fields of the same names."""

    wait_ptr: np.ndarray
    wait_ops: np.ndarray
    wait_tail: np.ndarray
    h_base: np.ndarray
    h_waited: np.ndarray
    queue_depth: int
    queue_depth_measured: bool


def _waits(frames, h_ts, h_dur, runtime_row, node_of_row, launch, stream, ts, end, orphan, n_streams) -> Waits:
    """Which device ops each host node waits for, the time from their end to the node's end,
    each node's unblocked cost, and the run's launch-queue depth (see the module docstring).

    Four kinds of wait, all from the trace:
    - a wait call (synchronize, blocking copy, free) waits for the last op of each stream
      launched before it that finished while it ran;
    - an enqueue call (launch, memset, async copy) that lasted far longer than its kind's
      median and returned just as an op MIN_QUEUE_LAG or more queue entries earlier finished
      was blocked on a full queue: it waited for that op. The run's depth is the median lag
      of those calls;
    - a call that launches nothing itself but holds, on its thread, the launches of device
      work and returns within CONTAINER_RELEASE of the last of it ending ran that work to
      completion (`_container_waits`);
    - every other enqueue call waits for the op `depth` entries earlier in the queue (it
      cannot be queued before that op leaves), unless the trace shows it did not (the queue
      was deeper there: several streams, a driver that batches).
    A node's base is what it costs when it does not wait: the median of its kind among the
    calls that did not wait, never more than its own duration nor less than its time after
    the waited work; where no call of its kind went unblocked, its time after the waited
    work plus WAIT_CALL_BASE_NS.
    """
    rt = frames.runtime
    n_h, n_d = len(h_ts), len(ts)
    h_end = h_ts + h_dur
    is_call = runtime_row >= 0
    names = np.full(n_h, -1, dtype=np.int64)
    if len(rt):
        codes, _ = pd.factorize(text_of(rt["name"]))
        names[is_call] = codes[runtime_row[is_call]]
    pairs_node: list[np.ndarray] = []
    pairs_op: list[np.ndarray] = []
    # 1. wait calls
    is_wait_row = host_wait_calls(rt["name"])  # the one definition (advisor.metrics.host_waits)
    wait_nodes = node_of_row[np.nonzero(is_wait_row)[0]]
    wait_nodes = np.sort(wait_nodes[wait_nodes >= 0])
    for s in range(n_streams):
        pos = np.nonzero(stream == s)[0]  # replay order, so launch nodes ascend
        if len(pos) == 0 or len(wait_nodes) == 0:
            continue
        last = np.searchsorted(launch[pos], wait_nodes, side="right") - 1
        okw = last >= 0
        op = pos[np.clip(last, 0, None)]
        w_s, w_e = h_ts[wait_nodes], h_end[wait_nodes]
        waited = okw & (end[op] > w_s) & (end[op] <= w_e + 1_000)
        pairs_node.append(wait_nodes[waited])
        pairs_op.append(op[waited])
    measured_wait = np.zeros(n_h, dtype=bool)
    for pn in pairs_node:
        measured_wait[pn] = True

    # 2. the launch queue: orphans (in flight when the window opened) first, then launches in issue order
    q_order = np.lexsort((ts, np.where(orphan, 0, launch), ~orphan)) if n_d else np.zeros(0, dtype=np.int64)
    qpos = np.empty(n_d, dtype=np.int64)
    qpos[q_order] = np.arange(n_d)
    first_q = np.full(n_h, np.iinfo(np.int64).max, dtype=np.int64)
    if n_d:
        np.minimum.at(first_q, launch[~orphan], qpos[~orphan])
    enq = np.nonzero(first_q < np.iinfo(np.int64).max)[0]
    depth, depth_measured = QUEUE_DEPTH_DEFAULT, False
    typical = np.zeros(n_h, dtype=np.float64)
    if len(enq):
        med = pd.Series(h_dur[enq]).groupby(names[enq]).median()
        typical[enq] = med.reindex(names[enq]).to_numpy()
        long = enq[(h_dur[enq] > BLOCKED_NS) & (h_dur[enq] > BLOCKED_FACTOR * typical[enq]) & ~measured_wait[enq]]
        blocked = np.zeros(0, dtype=np.int64)
        if len(long):
            by_end = np.argsort(end, kind="stable")
            ends_sorted = end[by_end]
            j = np.searchsorted(ends_sorted, h_end[long] + 1_000, side="right") - 1
            okj = j >= 0
            op = by_end[np.clip(j, 0, None)]
            lag = first_q[long] - qpos[op]
            rel = okj & (end[op] >= np.maximum(h_ts[long], h_end[long] - RELEASE_NS)) & (lag >= MIN_QUEUE_LAG)
            blocked, blocked_op, lags = long[rel], op[rel], lag[rel]
            if len(blocked) >= 3:
                depth, depth_measured = int(np.median(lags)), True
            pairs_node.append(blocked)
            pairs_op.append(blocked_op)
            measured_wait[blocked] = True
        # 3. calls that run the device work they launch to completion (MTIA's `predictor_executor::run`)
        h_tid = np.full(n_h, -1, dtype=np.int64)
        if len(rt):
            tid_codes, _ = pd.factorize(text_of(rt["tid"]))
            h_tid[is_call] = tid_codes[runtime_row[is_call]]
        cont, cont_op = _container_waits(h_ts, h_end, h_tid, is_call, first_q, measured_wait, launch, end)
        if len(cont):
            pairs_node.append(cont)
            pairs_op.append(cont_op)
            measured_wait[cont] = True
        rest = enq[~measured_wait[enq]]
        q = first_q[rest] - depth
        okq = q >= 0
        rest, q = rest[okq], q[okq]
        op = q_order[q]
        # only where the trace agrees: the op `depth` launches earlier ended before the call could return
        agree = end[op] + h_dur[rest] <= h_end[rest]
        pairs_node.append(rest[agree])
        pairs_op.append(op[agree])

    wait_ptr = np.zeros(n_h + 1, dtype=np.int64)
    wait_tail = np.zeros(n_h, dtype=np.int64)
    h_base = h_dur.copy()
    pn = np.concatenate(pairs_node) if pairs_node else np.zeros(0, dtype=np.int64)
    po = np.concatenate(pairs_op) if pairs_op else np.zeros(0, dtype=np.int64)
    if len(pn):
        o = np.lexsort((po, pn))
        pn, po = pn[o], po[o]
        np.add.at(wait_ptr, pn + 1, 1)
        wait_ptr = np.cumsum(wait_ptr)
        last_end = np.full(n_h, np.iinfo(np.int64).min, dtype=np.int64)
        np.maximum.at(last_end, pn, end[po])
        has_w = last_end > np.iinfo(np.int64).min
        tail = np.maximum(h_end - np.where(has_w, last_end, 0), 0)
        # base: the median of the node's kind among calls that did not wait
        free = is_call & ~measured_wait
        idle_med = pd.Series(h_dur[free]).groupby(names[free]).median()
        kind_base = idle_med.reindex(names).to_numpy()
        w = measured_wait
        base_w = np.where(np.isnan(kind_base[w]), tail[w] + WAIT_CALL_BASE_NS, np.maximum(kind_base[w], tail[w]))
        h_base[w] = np.minimum(h_dur[w], base_w.astype(np.int64))
        wait_tail[w] = tail[w]  # a call that did not wait (a queue slot it found free) has none: its own cost follows the op
    return Waits(wait_ptr, po, wait_tail, h_base, measured_wait, depth, depth_measured)
