"""Replay a rank's step graph, as measured or with fixes applied.

The replay walks the host nodes in issue order once. Each node starts its measured gap after
the node it follows (scaled, or shortened by the host time a fix removes); a launch starts
its device ops no earlier than the launch latency after it and no earlier than the end of
their stream's previous op; a wait call ends no earlier than the replayed end of the device
work it waited for. Steps are then re-spanned exactly as `metrics.steps` spans them.
With no change the replay reproduces the measured steps (tested on every recorded trace).

A fix is a `Change`: what it does to the graph, named by frame rows so rules can declare it
from what they detect. Changes compose (`Change.merge`), so all fixes replay together.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from advisor.metrics.intervals import merge, overlap_with
from advisor.metrics.steps import own_device_end
from advisor.whatif.graph import CALL, HELD_NS, MARK_END, MARK_START, StepGraph


# The fastest host the calibration tries (a share of its window figure), and how close to that
# host's replayed step a slower host may come while still counting as off the critical path.
HOST_SCALE_FLOOR = 0.05
HOST_OFF_PATH = 0.003
# Bisection steps of the calibration: the scale to 0.95 / 2**12 = 2.3e-4 (a step's host time
# to that share of it), each a replay of the whole window.
CALIBRATE_STEPS = 12


@dataclass
class Change:
    """What a fix changes in a rank's step. Rows are rows of that rank's frames.

    - `host_remove`: (start, end, fraction) ns windows of host time that the fix takes off
      the host's path (a DataLoader wait, a Python loop); gaps between calls shrink by that
      fraction of their overlap. A negative fraction adds host time (a larger batch to load).
    - `host_scale`: every host gap and call is this much shorter (profiler overhead, a faster
      host path); 1.0 leaves them.
    - `call_scale`: runtime row -> factor on that call's duration (0 removes the call).
    - `unwait`: runtime rows whose wait on the device the fix removes (asynchronous copy,
      sync gone); the call keeps `call_scale` of its own cost.
    - `device_scale`: device row -> factor on that op's duration (0 removes the op).
    - `tight_launch`: device rows that a fix issues back to back (CUDA graph, compiled
      region): their stream gaps close and their launch latency is the stream's.
    - `per_sample`: the step processes this many times the samples (a larger batch); the
      saving is reported per current step, so the replayed step is divided by it.
    - `host_add`: (ts, ns) arrays of host work the fix adds (autocast's casts): each `ns`, a
      window figure scaled like every other host time, lengthens the gap before the first
      host node at or after its `ts`.
    - `host_add_unprofiled`: (ts, ns) arrays of host work the fix adds whose cost is known
      without the profiler (the generated code of a compiled region, `changes.compiled`):
      placed as `host_add` places its work, never scaled.
    - `device_add`: device row -> ns of work the fix adds on that op's stream just before it
      (a cast kernel before the op that needs it), whatever the op's own scale.
    - `remainder_share`: the share of the rank's unexplained remainder (the unprofiled step
      time that neither the calibrated host nor the device places, `RankReplay`: a fixed
      remainder, or untimed host time in `untimed_host`) that the fix takes away: host time the
      trace does not show, so a fix that removes a share of the step's host work removes
      that share of it (see
      `changes.host_work_share`). 0 leaves it.
    """

    host_remove: list[tuple[np.ndarray, np.ndarray, float]] = field(default_factory=list)
    host_scale: float = 1.0
    call_scale: dict[int, float] = field(default_factory=dict)
    unwait: set[int] = field(default_factory=set)
    device_scale: dict[int, float] = field(default_factory=dict)
    tight_launch: set[int] = field(default_factory=set)
    per_sample: float = 1.0
    device_scale_all: float = 1.0  # a factor on every device op (a larger batch's device work)
    # (start, end, factor) windows of host time measured on their own (the DataLoader's wait
    # against the unprofiled steps'): scaled by their factor instead of host_scale.
    host_own: list[tuple[np.ndarray, np.ndarray, float]] = field(default_factory=list)
    host_add: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    host_add_unprofiled: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    device_add: dict[int, float] = field(default_factory=dict)
    remainder_share: float = 0.0
    # host node index -> ns of host time added before it: time the trace does not show as
    # events (the loop's own Python, unprofiled), placed by the calibration (see savings.py).
    # A fix's `remainder_share` takes that share of it away too.
    untimed_host: dict[int, float] = field(default_factory=dict)

    @classmethod
    def merge(cls, changes: Sequence["Change"], onto: "Change | None" = None) -> "Change":
        """The changes together. Per-row tables are combined a table at a time (dict.update,
        then the rows two changes share), and a table only one change has is shared, not
        copied: a replay never modifies a change.

        The merge is a fold over the changes in order; `onto`, a merge made before, continues
        it: `merge(b, onto=merge(a))` is `merge([*a, *b])`, value for value."""
        out = cls()
        remainder = 0.0
        if onto is not None:
            changes = [onto, *changes]
        for i, c in enumerate(changes):
            if i == 0 and onto is not None:
                remainder = onto.remainder_share  # the fold's state, not one more change on it
            else:
                remainder = 1.0 - (1.0 - remainder) * (1.0 - c.remainder_share)
            out.host_remove += c.host_remove
            out.host_scale *= c.host_scale
            out.per_sample *= c.per_sample
            out.device_scale_all *= c.device_scale_all
            out.host_own += c.host_own
            out.host_add += c.host_add
            out.host_add_unprofiled += c.host_add_unprofiled
        out.remainder_share = remainder
        out.call_scale = _merged_table([c.call_scale for c in changes], _combine, _combine_arrays)
        out.device_scale = _merged_table([c.device_scale for c in changes], _combine, _combine_arrays)
        out.device_add = _merged_table([c.device_add for c in changes], max, _max_arrays)  # the same casts do not stack
        out.untimed_host = _merged_table([c.untimed_host for c in changes], lambda a, b: a + b, np.add)
        out.unwait = _merged_set([c.unwait for c in changes])
        out.tight_launch = _merged_set([c.tight_launch for c in changes])
        return out

    def with_host_scale(self, scale: float) -> "Change":
        out = Change.merge([self])
        out.host_scale = self.host_scale * scale
        return out


def _merged_table(tables: list[dict], combine, combine_arrays=None) -> dict:
    """Per-row tables combined: a row in one table keeps its value, rows in several are
    combined in order (`combine_arrays`: `combine` over float64 arrays, for the many rows two
    fixes of the same kernels share)."""
    tables = [t for t in tables if t]
    if not tables:
        return {}
    if len(tables) == 1:
        return tables[0]
    out = dict(tables[0])
    for t in tables[1:]:
        common = list(out.keys() & t.keys())
        a, b = list(map(out.__getitem__, common)), list(map(t.__getitem__, common))
        out.update(t)
        if combine_arrays is not None and len(common) >= 64 and set(map(type, a)) | set(map(type, b)) == {float}:
            out.update(zip(common, combine_arrays(np.array(a), np.array(b)).tolist(), strict=True))  # float64 holds them exactly
        else:
            out.update(zip(common, map(combine, a, b), strict=True))
    return out


def _merged_set(sets: list[set]) -> set:
    sets = [s for s in sets if s]
    if len(sets) == 1:
        return sets[0]
    return set().union(*sets)


def _combine_arrays(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """_combine row by row (its min as Python's: `a` unless `b` is smaller)."""
    return np.where((a > 1) | (b > 1), a * b, np.where(b < a, b, a))


def _max_arrays(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """max row by row, as Python's: `a` unless `b` is larger."""
    return np.where(b > a, b, a)


def _combine(a: float, b: float) -> float:
    """Two fixes on the same node: speed-ups do not stack (the better one wins), growth does
    (a larger batch of a faster kernel is both)."""
    if a > 1 or b > 1:
        return a * b
    return min(a, b)


@dataclass(frozen=True)
class ReplayResult:
    """Replayed step times (ns per current step), small and picklable."""

    step_ns: np.ndarray

    @property
    def median_ms(self) -> float:
        return float(np.median(self.step_ns)) / 1e6 if len(self.step_ns) else 0.0

    @property
    def mean_ms(self) -> float:
        return float(np.mean(self.step_ns)) / 1e6 if len(self.step_ns) else 0.0


class EffectiveArrays(NamedTuple):
    """A change as per-node arrays (ns, float), what the replay's walk reads."""

    host_gap: np.ndarray  # per host node: its gap after its anchor
    call_own: np.ndarray  # per host node: its own cost (a call that waited: its base)
    unwaited: np.ndarray  # per host node: its waits removed
    wait_tail: np.ndarray  # per host node: from the waited work's end to its end (own cost where it never waited)
    op_dur: np.ndarray  # per device op: its duration
    op_delay: np.ndarray  # per device op: from its launch node's start to its start
    op_gap: np.ndarray  # per device op: after the previous op of its stream


def _floats(g: StepGraph) -> dict[str, np.ndarray]:
    """The graph's times as float64, made once per graph (every replay starts from them)."""
    kept = g.__dict__.get("_floats")
    if kept is None:
        names = ("h_gap", "h_dur", "h_base", "wait_tail", "d_dur", "d_delay", "d_gap")
        kept = g.__dict__["_floats"] = {n: getattr(g, n).astype(np.float64) for n in names}
    return kept


def _table_arrays(g: StepGraph, table: dict | set) -> tuple[np.ndarray, np.ndarray | None]:
    """A change's per-row table as (rows, values) arrays (a set: rows alone), kept per graph
    for the table object: a fix's table is shared, not copied, by the merges it is in."""
    def make() -> tuple[np.ndarray, np.ndarray | None]:
        rows = np.fromiter(table.keys() if isinstance(table, dict) else table, dtype=np.int64, count=len(table))
        values = np.fromiter(table.values(), dtype=np.float64, count=len(table)) if isinstance(table, dict) else None
        return rows, values

    return _kept_for(g, "_tables", (table,), make)


def _kept_for(g: StepGraph, cache: str, objects: tuple, make):
    """make()'s value, kept per graph for the objects it is made from (keyed by their ids; the
    objects are kept with it, so their ids are not reused), at most 256 per cache."""
    kept = g.__dict__.setdefault(cache, {})
    key = tuple(map(id, objects))
    got = kept.get(key)
    if got is not None and all(a is b for a, b in zip(got[0], objects, strict=True)):
        return got[1]
    value = make()
    if len(kept) >= 256:
        kept.clear()
    kept[key] = (objects, value)
    return value


def _row_positions(g: StepGraph) -> dict[str, np.ndarray]:
    """Runtime row -> host node and device row -> op position (-1: not in the graph), made once
    per graph: a change's tables name rows, the replay's arrays are per node."""
    kept = g.__dict__.get("_row_positions")
    if kept is None:
        rows = g.runtime_row
        node_of = np.full(int(rows.max()) + 1 if len(rows) else 0, -1, dtype=np.int64)
        node_of[rows[rows >= 0]] = np.nonzero(rows >= 0)[0]
        pos_of = np.full(int(g.device_row.max()) + 1 if len(g.device_row) else 0, -1, dtype=np.int64)
        pos_of[g.device_row] = np.arange(len(g.device_row))
        kept = g.__dict__["_row_positions"] = {"node_of": node_of, "pos_of": pos_of}
    return kept


def _gap_overlap(g: StepGraph, ms: np.ndarray, me: np.ndarray) -> np.ndarray:
    """Each host gap's overlap with the merged windows (ns, float)."""
    return overlap_with(ms, me, g.h_gap_start, g.h_ts).astype(np.float64)


def _window_overlaps(g: StepGraph, parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[tuple[np.ndarray, np.ndarray], np.ndarray]:
    """The windows (start, end arrays of several fixes) merged, and their overlap with each host
    gap, kept per graph for the arrays: the greedy ranking replays one fix's windows with each
    of the others'."""
    def make() -> tuple[tuple[np.ndarray, np.ndarray], np.ndarray]:
        ms, me = merge(np.concatenate([np.asarray(a, dtype=np.int64) for a, _ in parts]), np.concatenate([np.asarray(b, dtype=np.int64) for _, b in parts]))
        return (ms, me), _gap_overlap(g, ms, me)

    return _kept_for(g, "_window_overlaps", tuple(x for pair in parts for x in pair), make)


def _own_windows(host_own: list[tuple[np.ndarray, np.ndarray, float]]) -> list[tuple[np.ndarray, np.ndarray, float]]:
    """The host windows measured on their own, merged per factor and made disjoint: each keeps
    its own factor, and where windows of two factors overlap the smaller factor (the faster
    host) holds, as the largest removal does for `host_remove`."""
    from advisor.metrics.intervals import subtract

    out: list[tuple[np.ndarray, np.ndarray, float]] = []
    taken_s, taken_e = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    for factor in sorted({float(f) for _, _, f in host_own}):
        s, e = merge(
            np.concatenate([np.asarray(a, dtype=np.int64) for a, _, f in host_own if float(f) == factor]),
            np.concatenate([np.asarray(b, dtype=np.int64) for _, b, f in host_own if float(f) == factor]),
        )
        s, e = subtract(s, e, taken_s, taken_e) if len(taken_s) else (s, e)
        if len(s):
            out.append((s, e, factor))
        taken_s, taken_e = merge(np.concatenate([taken_s, s]), np.concatenate([taken_e, e]))
    return out


def _host_time_in(g: StepGraph, ms: np.ndarray, me: np.ndarray, ov: np.ndarray, own: list[tuple[np.ndarray, np.ndarray, float]], scale: float) -> np.ndarray:
    """Replayed host time of each gap inside the windows (ms, me), whose overlap with each gap
    is `ov`: at `scale`, and the parts in a window measured on its own at that window's factor."""
    out = ov * scale
    if not own or len(ms) == 0:
        return out
    from advisor.metrics.intervals import intersect

    for own_s, own_e, own_f in own:
        i_s, i_e = intersect(ms, me, own_s, own_e)
        out = out + overlap_with(i_s, i_e, g.h_gap_start, g.h_ts).astype(np.float64) * (own_f - scale)
    return out


def _effective(g: StepGraph, change: Change) -> EffectiveArrays:
    """The change as per-node arrays: host gaps, call durations, waits, device durations."""
    scale = change.host_scale
    floats = _floats(g)
    gap = floats["h_gap"] * scale
    own = _own_windows(change.host_own)
    for own_s, own_e, own_f in own:
        gap += overlap_with(own_s, own_e, g.h_gap_start, g.h_ts) * (own_f - scale)

    def host_time(ms: np.ndarray, me: np.ndarray, ov: np.ndarray) -> np.ndarray:
        """Replayed host time of each gap inside the windows (own windows at their own factor);
        `ov`: the windows' overlap with each gap."""
        return _host_time_in(g, ms, me, ov, own, scale)

    if change.host_remove:
        # Fractions: windows of the same fraction merge; the largest fraction wins where they overlap.
        from advisor.metrics.intervals import intersect

        windows, overlaps = {}, {}
        for frac in sorted({f for _, _, f in change.host_remove}):
            windows[frac], overlaps[frac] = _window_overlaps(g, [(a, b) for a, b, f in change.host_remove if f == frac])
        removed = np.zeros(len(gap))
        added = np.zeros(len(gap))
        for frac, (ms, me) in windows.items():
            if frac >= 0:
                removed = np.maximum(removed, host_time(ms, me, overlaps[frac]) * frac)  # the largest removal wins where fixes overlap
                continue
            # A negative fraction adds host time (more samples per step, a compute thread
            # fewer), except where a removal takes the same time away: time a fix removes is not
            # added back. Counted on the windows' overlap, not per gap: one gap can hold both
            # (a CPU step is one gap, its loading and its compute).
            grown = host_time(ms, me, overlaps[frac]) * -frac
            back = np.zeros(len(gap))
            for pf, (ps, pe) in windows.items():
                if pf > 0:
                    both = intersect(ms, me, ps, pe)
                    back = np.maximum(back, host_time(*both, _gap_overlap(g, *both)) * -frac * min(pf, 1.0))
            added += grown - back
        gap = np.maximum(gap - removed + added, 0.0)
    kept = 1.0 - min(max(change.remainder_share, 0.0), 1.0)
    for node, ns in change.untimed_host.items():
        if 0 <= node < len(gap):
            gap[node] += ns * kept
    for added, factor in ((change.host_add, scale), (change.host_add_unprofiled, 1.0)):
        if added:
            at = np.concatenate([np.asarray(t, dtype=np.int64) for t, _ in added])
            ns = np.concatenate([np.asarray(n, dtype=np.float64) for _, n in added])
            node = np.searchsorted(g.h_ts, at, side="left")
            ok = node < len(gap)
            np.add.at(gap, node[ok], ns[ok] * factor)
    dur = floats["h_dur"] * scale
    unwait = np.zeros(len(g.h_ts), dtype=bool)
    if change.call_scale or change.unwait:
        node_of = _row_positions(g)["node_of"]
        if change.call_scale:
            r, f = _table_arrays(g, change.call_scale)
            ok = (r >= 0) & (r < len(node_of))
            i = node_of[r[ok]]
            dur[i[i >= 0]] *= f[ok][i >= 0]
        if change.unwait:
            r, _ = _table_arrays(g, change.unwait)
            i = node_of[r[(r >= 0) & (r < len(node_of))]]
            unwait[i[i >= 0]] = True
    # A call that waited costs its base when it does not wait (unwaited, or the work it waited
    # for done early); a call that never waited costs its duration, and where it waits for a
    # queue slot it returns that long after the slot frees.
    own = np.where(g.h_waited, np.minimum(dur, floats["h_base"] * scale), dur)
    tail = np.where(g.h_waited, floats["wait_tail"], own)
    d_dur = floats["d_dur"] * change.device_scale_all
    delay = floats["d_delay"].copy()
    d_gap = floats["d_gap"].copy()
    if change.device_scale_all != 1.0:
        # A long bubble between queued ops that no op of this rank ends before, and an op's wait
        # past a launch latency (microseconds) onto an idle stream, wait on device work outside
        # the trace (the peer ranks' before a collective): every rank runs the same script, so
        # that work scales with this rank's.
        d_gap = np.where(d_gap >= HELD_NS, d_gap * change.device_scale_all, d_gap)
        lat = np.minimum(g.d_latency, HELD_NS)
        past = delay - lat
        delay = np.where(past >= HELD_NS, lat + past * change.device_scale_all, delay)
    if change.device_scale or change.tight_launch or change.device_add:
        pos_of = _row_positions(g)["pos_of"]
        if change.device_scale:
            r, f = _table_arrays(g, change.device_scale)
            okr = (r >= 0) & (r < len(pos_of))
            p = pos_of[r[okr]]
            d_dur[p[p >= 0]] *= f[okr][p >= 0]  # a row not in the graph (-1) is no op's
        if change.device_add:
            r, ns = _table_arrays(g, change.device_add)
            okr = (r >= 0) & (r < len(pos_of))
            p = pos_of[r[okr]]
            np.add.at(d_dur, p[p >= 0], ns[okr][p >= 0])
        if change.tight_launch:
            r, _ = _table_arrays(g, change.tight_launch)
            p = pos_of[r[(r >= 0) & (r < len(pos_of))]]
            p = p[p >= 0]
            d_gap[p] = np.minimum(d_gap[p], 0)
            delay[p] = np.minimum(delay[p], g.d_latency[p])
    return EffectiveArrays(gap, own, unwait, tail, d_dur, delay, d_gap)


def replay_graph(g: StepGraph, change: Change | None = None) -> ReplayResult:
    """Replayed step times of the graph with `change` applied (measured when None)."""
    change = change or Change()
    start, _, d_start, d_end = _simulate(g, _effective(g, change))
    return ReplayResult(_respan(g, np.asarray(start), np.asarray(d_start), np.asarray(d_end)) / change.per_sample)


def replay_nodes(g: StepGraph, change: Change) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Replayed start and end of every host node and every device op (ns), with `change`."""
    return tuple(np.asarray(x) for x in _simulate(g, _effective(g, change)))  # type: ignore[return-value]


def _static_lists(g: StepGraph) -> tuple:
    """The graph's fixed arrays as plain lists for the node walk, built once per graph."""
    cached = g.__dict__.get("_lists")
    if cached is None:
        n_h = len(g.h_ts)
        counts = np.diff(g.wait_ptr)
        first_w = g.wait_ops[np.minimum(g.wait_ptr[:-1], max(len(g.wait_ops) - 1, 0))] if len(g.wait_ops) else np.full(n_h, -1)
        first_op = np.searchsorted(g.d_launch, np.arange(n_h + 1), side="left")
        cached = (
            first_op.tolist(),
            g.h_anchor.tolist(),
            g.h_serial.tolist(),
            g.d_stream.tolist(),
            g.d_held_by.tolist(),
            g.d_held_by_gap.tolist(),
            g.wait_ptr.tolist(),
            g.wait_ops.tolist(),
            first_w,
            np.where(counts == 1, first_w, -1).tolist(),
            (counts > 1).tolist(),
            first_op,
        )
        g.__dict__["_lists"] = cached
    return cached


def _simulate(g: StepGraph, effective: EffectiveArrays) -> tuple[Sequence[float], Sequence[float], Sequence[float], Sequence[float]]:
    """Start and end of every host node and device op (ns, on the trace's clock): the chain's
    closed form where the graph is one (`_simulate_chain`), else the node walk."""
    if _one_chain(g):
        counts = np.diff(g.wait_ptr)
        if effective.unwaited.any():  # an unwaited node keeps no waits
            counts = counts * ~effective.unwaited
        if not (counts > 1).any():
            gap, own, _, tail, d_dur, delay, d_gap = effective
            if effective.unwaited.any():
                runs = _chain_runs(_static_lists(g)[11], np.where(counts == 1, _static_lists(g)[8], -1), len(g.h_ts), len(g.d_dur))
            else:  # the graph's own waits: its runs are the same for every such change
                runs = g.__dict__.get("_chain_runs")
                if runs is None:
                    runs = g.__dict__["_chain_runs"] = _chain_runs(_static_lists(g)[11], np.where(counts == 1, _static_lists(g)[8], -1), len(g.h_ts), len(g.d_dur))
            return _simulate_chain(len(g.h_ts), len(g.d_dur), float(g.h_ts[0]), runs, gap, own, tail, d_dur, delay, d_gap)
    return _walk(g, effective)


def _walk(g: StepGraph, effective: EffectiveArrays) -> tuple[list[float], list[float], list[float], list[float]]:
    """The node walk: every host node in issue order, its device ops after it."""
    gap, own, unwait, tail, d_dur, delay, d_gap = effective
    n_h, n_d = len(g.h_ts), len(g.d_dur)
    static = _static_lists(g)
    first_op, anchor, serial, d_stream, dep, dep_gap, wp, wops = static[:8]
    counts = np.diff(g.wait_ptr)
    if unwait.any():  # an unwaited node keeps no waits
        counts = counts * ~unwait
        wone = np.where(counts == 1, static[8], -1).tolist()
        many = (counts > 1).tolist()
    else:
        wone, many = static[9], static[10]
    gap_l, own_l, tail_l = gap.tolist(), own.tolist(), tail.tolist()
    d_dur_l, delay_l, d_gap_l = d_dur.tolist(), delay.tolist(), d_gap.tolist()
    start = [0.0] * n_h
    end = [0.0] * n_h
    d_start = [0.0] * n_d
    d_end = [0.0] * n_d
    last = [float("-inf")] * max(g.n_streams, 1)
    t0 = float(g.h_ts[0]) if n_h else 0.0
    nxt = first_op[1:]
    for i, (a, ser, gp, ow, tl, w, mw, k0, k1) in enumerate(zip(anchor, serial, gap_l, own_l, tail_l, wone, many, first_op, nxt, strict=False)):
        if a < 0:
            s = t0
        elif ser:
            s = end[a] + gp
        else:
            s = start[a] + gp
        start[i] = s
        if k1 > k0:
            for k in range(k0, k1):
                st = d_stream[k]
                b = s + delay_l[k]
                q = last[st] + d_gap_l[k]
                if q > b:
                    b = q
                dp = dep[k]
                if dp >= 0:
                    q = d_end[dp] + dep_gap[k]
                    if q > b:
                        b = q
                d_start[k] = b
                last[st] = d_end[k] = b + d_dur_l[k]
        e = s + ow
        if w >= 0:
            w = d_end[w] + tl
            if w > e:
                e = w
        elif mw:
            w = max(d_end[wops[p]] for p in range(wp[i], wp[i + 1])) + tl
            if w > e:
                e = w
        end[i] = e
    k = first_op[n_h]
    while k < n_d:  # ops after the last host node (none in practice)
        st = d_stream[k]
        b = max(last[st] + d_gap_l[k], d_start[k - 1] if k else t0)
        d_start[k] = b
        last[st] = d_end[k] = b + d_dur_l[k]
        k += 1
    return start, end, d_start, d_end


def _one_chain(g: StepGraph) -> bool:
    """Whether the graph is one host thread's chain of calls (each node after the one before
    it ends) feeding one stream, with no op held by another stream: `_simulate_chain` walks it."""
    chain = g.__dict__.get("_one_chain")
    if chain is None:
        n_h = len(g.h_ts)
        chain = (
            n_h > 0
            and g.n_streams <= 1
            and bool((g.h_anchor == np.arange(n_h) - 1).all())
            and bool(g.h_serial[1:].all())
            and not bool((g.d_held_by >= 0).any())
        )
        g.__dict__["_one_chain"] = chain
    return chain


class ChainRuns(NamedTuple):
    """A chain's runs (`_simulate_chain`): for each, its first and last node and the ops they
    launch; and per node, the op it waits for (`wait_at`, n_d: none) and whether it does."""

    runs: list[tuple[int, int, int, int]]  # (first node, last node, first op, op after the last)
    launcher: np.ndarray  # per op launched by a node: that node
    waits: np.ndarray
    wait_at: np.ndarray
    n_launched: int


def _chain_runs(first_op: np.ndarray, wone: np.ndarray, n_h: int, n_d: int) -> ChainRuns:
    """Cut a chain's calls into runs none of whose calls waits for an op launched within the
    run, but its last one."""
    first_op = np.asarray(first_op, dtype=np.int64)
    wone = np.asarray(wone, dtype=np.int64)
    n_launched = int(first_op[n_h])
    launcher = np.repeat(np.arange(n_h, dtype=np.int64), np.diff(first_op))
    waits = wone >= 0
    w_at = np.where(waits, wone, n_d)
    # The node whose launch the wait is on (n_h: an op after the last node, not yet timed).
    w_node = np.where(waits, np.append(launcher, n_h)[np.minimum(w_at, n_launched)], -1)
    runs = []
    i0 = 0
    window = 2048
    while i0 < n_h:
        hits = np.flatnonzero(w_node[i0 : i0 + window] >= i0)
        while not len(hits) and i0 + window < n_h:
            window *= 2
            hits = np.flatnonzero(w_node[i0 : i0 + window] >= i0)
        i1 = i0 + int(hits[0]) if len(hits) else n_h - 1  # the run's last node
        runs.append((i0, i1, int(first_op[i0]), int(first_op[i1 + 1])))
        i0 = i1 + 1
    return ChainRuns(runs, launcher, waits, w_at, n_launched)


def _simulate_chain(n_h, n_d, t0, chain: ChainRuns, gap, own, tail, d_dur, delay, d_gap):
    """`_simulate` for a graph of one chain (`_one_chain`) whose calls each wait for one op at
    most, in NumPy: the walk cut into runs of calls none of which waits for an op launched
    within its own run (`_chain_runs`: a queue's waits reach about a thousand launches back,
    a synchronize's its own launches), each run solved in closed form.

    Within a run a call ends at max(previous end + gap + own, its wait's end + tail) and an op
    at max(previous op's end + gap + duration, its launch's start + delay + duration): both
    recurrences x_j = max(x_{j-1} + a_j, c_j), whose solution is
    x_j = A_j + max(x_0, max_{k <= j}(c_k - A_k)) with A the running sum of a. The call that
    waits inside its run closes it, once its run's ops are timed. The same arithmetic as the
    node walk, summed in another order (equal to a few ulps)."""
    launcher, waits, w_at = chain.launcher, chain.waits, chain.wait_at
    start = np.empty(n_h)
    end = np.empty(n_h)
    d_start = np.zeros(n_d)
    d_end = np.zeros(n_d + 1)  # the last slot: where a call without a wait points
    gap = np.array(gap, dtype=np.float64)
    gap[0] = 0.0  # the first node starts at t0
    step_cost = gap + own
    op_cost = d_gap + d_dur
    op_ready = delay + d_dur
    e_prev, last = float(t0), -np.inf
    for i0, i1, k0, k1 in chain.runs:
        if i1 > i0:  # nodes i0..i1-1: their waits are on ops timed before the run
            acc = np.cumsum(step_cost[i0:i1])
            held = np.where(waits[i0:i1], d_end[w_at[i0:i1]] + tail[i0:i1], -np.inf)
            x = acc + np.maximum(e_prev, np.maximum.accumulate(held - acc))
            end[i0:i1] = x
            start[i0 + 1 : i1 + 1] = x + gap[i0 + 1 : i1 + 1]
        start[i0] = e_prev + gap[i0]
        if k1 > k0:
            s_of = start[launcher[k0:k1]]
            acc = np.cumsum(op_cost[k0:k1])
            y = acc + np.maximum(last, np.maximum.accumulate(s_of + op_ready[k0:k1] - acc))
            before = np.empty(k1 - k0)
            before[0] = last
            before[1:] = y[:-1]
            b = np.maximum(s_of + delay[k0:k1], before + d_gap[k0:k1])
            d_start[k0:k1] = b
            d_end[k0:k1] = b + d_dur[k0:k1]
            last = float(d_end[k1 - 1])
        e = float(start[i1] + own[i1])
        if waits[i1]:
            e = max(e, float(d_end[w_at[i1]] + tail[i1]))
        end[i1] = e_prev = e
    for k in range(chain.n_launched, n_d):  # ops after the last host node (none in practice)
        b = max(last + d_gap[k], d_start[k - 1] if k else t0)
        d_start[k] = b
        last = d_end[k] = b + d_dur[k]
    return start, end, d_start, d_end[:n_d]


def _respan(g: StepGraph, start: np.ndarray, d_start: np.ndarray, d_end: np.ndarray) -> np.ndarray:
    """Step durations from replayed host marks and device ops, as metrics.steps spans them."""
    s, e = _step_bounds(g, start, d_start, d_end)
    return (e - s).astype(np.float64)


def _step_bounds(g: StepGraph, start: np.ndarray, d_start: np.ndarray, d_end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Replayed start and end of each step (ns), spanned as metrics.steps spans them."""
    n = len(g.step_ids)
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    hs = np.zeros(n, dtype=np.int64)
    he = np.zeros(n, dtype=np.int64)
    kind = g.h_kind
    sm, em = kind == MARK_START, kind == MARK_END
    hs[g.h_step[sm]] = np.round(start[sm]).astype(np.int64)
    he[g.h_step[em]] = np.round(start[em]).astype(np.int64)
    dev_min = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    dev_max = np.full(n, np.iinfo(np.int64).min, dtype=np.int64)
    count = np.zeros(n, dtype=np.int64)
    own = g.d_step >= 0
    if own.any():
        np.minimum.at(dev_min, g.d_step[own], np.round(d_start[own]).astype(np.int64))
        np.maximum.at(dev_max, g.d_step[own], np.round(d_end[own]).astype(np.int64))
        np.add.at(count, g.d_step[own], 1)
    own_end = own_device_end(hs, he, dev_min, dev_max, count)
    starts = np.zeros(n, dtype=np.int64)
    ends = np.zeros(n, dtype=np.int64)
    prev = hs[0]
    if g.d_before_first_step.any():
        prev = max(prev, int(np.round(d_end[g.d_before_first_step].max())))
    for i in range(n):
        s = max(prev, hs[i]) if i else prev
        e = max(he[i], s) if count[i] == 0 else max(he[i], own_end[i], s)
        starts[i], ends[i] = s, e
        prev = e
    return starts, ends


@dataclass(frozen=True)
class ReplayedStep:
    """One replayed step node by node, for a timeline: times in ns from the step's start.

    Host calls are rows of the rank's `frames.runtime`, device ops rows of `frames.device`;
    each is listed when it overlaps the step. `waits` marks the calls that waited for device
    work in the replay. A step of a fix that grows the batch (`per_sample` > 1) processes
    that many current steps' samples.
    """

    index: int  # row of the rank's steps
    duration_ns: int
    per_sample: float
    call_row: np.ndarray
    call_start: np.ndarray
    call_end: np.ndarray
    waits: np.ndarray
    device_row: np.ndarray
    device_start: np.ndarray
    device_end: np.ndarray


def replay_step(g: StepGraph, change: Change | None = None, index: int | None = None) -> ReplayedStep | None:
    """The replayed median step (or step `index`) with `change` applied, node by node.

    The same simulation as `replay_graph`, kept per node for the one step a timeline draws; the
    median is the step whose replayed duration is closest to the replayed median (the
    earlier of a tie), as the measured timeline picks its step."""
    change = change or Change()
    if len(g.step_ids) == 0:
        return None
    eff = _effective(g, change)
    start, end, d_start, d_end = (np.asarray(x) for x in _simulate(g, eff))
    s, e = _step_bounds(g, start, d_start, d_end)
    d = (e - s).astype(np.float64)
    i = int(np.argmin(np.abs(d - np.median(d)))) if index is None else int(index)
    lo, hi = float(s[i]), float(e[i])
    calls = (g.h_kind == CALL) & (end > lo) & (start < hi)
    waited = (end - start) > eff.call_own + 1_000  # held past its own cost by the device work it waited for
    ops = (d_end > lo) & (d_start < hi)
    return ReplayedStep(
        index=i,
        duration_ns=int(hi - lo),
        per_sample=float(change.per_sample),
        call_row=g.runtime_row[calls],
        call_start=np.round(start[calls] - lo).astype(np.int64),
        call_end=np.round(end[calls] - lo).astype(np.int64),
        waits=waited[calls],
        device_row=g.device_row[ops],
        device_start=np.round(d_start[ops] - lo).astype(np.int64),
        device_end=np.round(d_end[ops] - lo).astype(np.int64),
    )


def calibrate(g: StepGraph, target_median_ms: float, build=None, fastest: bool = True) -> float:
    """Host scale for a run whose steps after the window ran faster than the window (bisection).

    The profiler slows the host (Python stacks, per-call bookkeeping), not the device, but a
    median step alone cannot tell a slow host from a stall the graph does not show: many
    scales reproduce it. The one chosen is the largest whose replayed step is within 0.3% of
    the replay with the fastest host (5% of its window figure): the host keeps as much of its
    time as it can without lengthening the step, and whatever still separates the replay from
    the unprofiled step is not the host's (`RankReplay` keeps it as a fixed remainder). On the
    recorded H100 runs this reading predicts the TF32 run's step, where a host slow enough to
    fill the step predicted almost no gain. `build(scale)` gives the change to replay at a scale
    (default: the scale alone), so parts of the host measured on their own (the DataLoader's
    wait) keep their own figure. With `fastest=False`, the scale at which the replay meets the
    target instead (the host explains all of it). Returns 1.0 when the window was not slower.
    """
    build = build or (lambda scale: Change(host_scale=scale))
    if replay_graph(g, build(1.0)).median_ms <= target_median_ms:
        return 1.0
    lo, hi = HOST_SCALE_FLOOR, 1.0
    floor = replay_graph(g, build(lo)).median_ms
    if floor >= target_median_ms:
        target_median_ms = floor * 1.005  # the device bounds the step before the host reaches the target
    elif fastest:
        target_median_ms = floor * (1 + HOST_OFF_PATH)
    for _ in range(CALIBRATE_STEPS):
        mid = (lo + hi) / 2
        if replay_graph(g, build(mid)).median_ms > target_median_ms:
            hi = mid
        else:
            lo = mid
    return lo
