"""Step spans: where each training step begins and ends, host and device together.

A `ProfilerStep#N` range covers the host side of a step, but the GPU may still be running
the step's kernels after the host has moved on. As in the TensorBoard profiler plugin, a
step's end is stretched to the end of the last device activity launched from inside it, and
its start is pushed past the previous step's end, so steps never overlap and the device
time of a step is charged to that step.

When the host runs ahead of the device (the next step's device work starts before this
step's has ended), the end of a step's last kernel is not that step's own time: the kernel
waited in a queue of work launched earlier. Such a step ends where the next step's device
work begins, and the last step of the window ends as far behind its host end as it started
behind its host start, not when the queue drains (the profiler's closing synchronisation).
Where the host paces the steps (the last step's work is launched onto an idle device), the
last step ends no further past its ProfilerStep mark than the other steps' device work ran
past theirs (or its own work started after its mark's start), whatever the device does after
that (the end of the recording draining the queue); where the device paces them (the last
step's work queued behind earlier work), the steps lie on the device's timeline, behind the
marks, and only a last step spanning far longer than the others is cut.
A `ProfilerStep` range that runs past the end of the profiler's own span (`PyTorch
Profiler (0)`, a marker left open: a 13 s step in a 355 ms recording) is clipped to the last
recorded event, with a note; one that ends inside it is the step, however few of its events a
sampled or filtered trace kept (a 33-event sample of a 209.7 ms step was read as a 4.0 ms
step). Without that span, a marker past the end of the trace by more than the part the trace
covers is taken as left open.

Traces without `ProfilerStep` markers (the autograd profiler's API, benchmark harnesses,
`record_function` loops, inference engines) still repeat one iteration: `find_iterations`
looks, in this order, for the DataLoader's `__next__`, `Optimizer.zero_grad` and
`Optimizer.step` spans, repeated user annotations (`record_function` ranges; a harness's
`warmup` and `measure` ranges of one name count as one), the root module's repeated call
(`nn.Module: ...` not inside another module's call), and a repeated sequence of top-level
operators (a model called in a loop with nothing named). An iteration is the outermost
repeated unit that holds a whole forward pass: a range or module call that runs inside one
forward pass (a transformer block, `TransformerLayer_3` or `Qwen3DecoderLayer_35`: the number
is the block, not the iteration), or whose instances one larger span holds as its parts, is
never the iteration; a span its instances fill is the loop around them. The first iteration is
the warm-up when its name says so or it lasts more than 1.5x the median of the others: it is
reported apart (a note) and left out of the steps, so its one-time costs (CUDA context
creation, cuDNN autotuning) are never charged per step. Only when none of these repeats is
the whole window one step; the note then says whether the root module's forward runs once in
it (a single pass). The notes say what the iteration was found from.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from advisor.load.trace import TraceFrames
from advisor.metrics.breakdown import name_matches, text_of


def launches(frames: TraceFrames) -> pd.DataFrame:
    """Device activity joined to the runtime call that launched it (by correlation id); made
    once per frames (the steps, the device records' check and the rules all ask). Callers
    read it, never modify it."""
    kept = frames.__dict__.get("_launches")
    if kept is not None and kept[0] is frames.runtime and kept[1] is frames.device:
        return kept[2]
    out = _launches(frames)
    frames.__dict__["_launches"] = (frames.runtime, frames.device, out)
    return out


def _launches(frames: TraceFrames) -> pd.DataFrame:
    rt = frames.runtime[["correlation", "ts", "end", "tid", "external_id"]]
    rt = rt[rt["correlation"] >= 0].drop_duplicates("correlation", keep="first")
    dev = frames.device[["correlation", "ts", "end", "kind"]].reset_index(names="device_row")
    return dev.merge(
        rt.rename(columns={"ts": "launch_ts", "end": "launch_end", "tid": "launch_tid", "external_id": "launch_external_id"}),
        on="correlation",
        how="left",
    )


# What starts (or ends) one iteration of a loop without ProfilerStep markers, best first.
ITERATION_ANCHORS: tuple[tuple[str, re.Pattern[str], str], ...] = (
    ("the DataLoader's __next__", re.compile(r"^enumerate\(DataLoader\)#.*__next__"), "start"),
    ("Optimizer.zero_grad", re.compile(r"^Optimizer\.zero_grad#"), "start"),
    ("Optimizer.step", re.compile(r"^Optimizer\.step#"), "end"),
)
# Words a harness puts in its warm-up and measured ranges: one range name, two phases.
PHASE_WORDS = re.compile(r"warm[-_ ]?up|measured?|timed|benchmark")
WARMUP_WORD = re.compile(r"warm[-_ ]?up", re.IGNORECASE)
WARMUP_RATIO = 1.5  # a first iteration this much longer than the median of the rest is the warm-up
MODULE_CALL = re.compile(r"^nn\.Module: ")
STEP_MARKER = re.compile(r"^ProfilerStep#")


@dataclass(frozen=True)
class Iterations:
    """Iterations found without step markers: host spans, how they were found, the warm-up."""

    steps: pd.DataFrame  # step, name, start, end (ns), warm-up left out
    how: str  # what repeats, as the report says it
    warmup_ms: float | None  # the first iteration's length, when it was left out as the warm-up
    warmup_named: bool
    # Other threads that run the same span while this thread's iterations run (a server
    # handling requests concurrently): 0 for a loop on one thread.
    concurrent_threads: int = 0


def _outermost(ts: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Which spans (sorted by start) are not nested in or overlapping an earlier kept one."""
    keep = np.zeros(len(ts), dtype=bool)
    if len(ts) == 0:
        return keep
    running = np.maximum.accumulate(end)
    keep[0] = True
    keep[1:] = ts[1:] >= running[:-1]
    if keep.all():
        return keep
    last = end[0]  # a left-out span's end must not shadow the spans after it: walk the conflicts
    for i in range(1, len(ts)):
        keep[i] = ts[i] >= last
        if keep[i]:
            last = end[i]
    return keep


def _per_name(names: pd.Series, fn) -> np.ndarray:
    """fn(name) for each row, evaluated once per distinct name (object array)."""
    if isinstance(names.dtype, pd.CategoricalDtype):
        per_cat = np.array([fn(str(c)) for c in names.cat.categories] + [fn("")], dtype=object)
        return per_cat[names.cat.codes.to_numpy()]
    return np.array([fn(str(n)) for n in names], dtype=object)


def _main_tid(host: pd.DataFrame, rows: np.ndarray) -> object:
    tids = host["tid"].iloc[rows].astype(str)
    return tids.value_counts().index[0]


def _candidates(host: pd.DataFrame, window: tuple[int, int]) -> list[tuple[str, np.ndarray, str, np.ndarray]]:
    """(how, host rows, mode, every row of the pattern on any thread) for each pattern that
    repeats at least twice, best first."""
    out: list[tuple[str, np.ndarray, str, np.ndarray]] = []
    for how, pattern, mode in ITERATION_ANCHORS:
        rows = np.flatnonzero(name_matches(host["name"], pattern))
        if len(rows) >= 2:
            out.append((how, rows, mode, rows))
    span = max(window[1] - window[0], 1)
    dur = (host["end"] - host["ts"]).to_numpy(np.int64)
    kinds = text_of(host["kind"])
    module = name_matches(host["name"], MODULE_CALL)
    step_marker = name_matches(host["name"], STEP_MARKER)
    keys_all = _per_name(host["name"], lambda n: PHASE_WORDS.sub("", re.sub(r"\d+", "#", n.lower())))
    names = host["name"]
    for kind, label in (("annotation", "annotation"), ("python", "module call")):
        if kind == "python":
            # the root module's calls: a module called inside another is a part of its forward
            # (a transformer block of the model), and the number in its name is the instance,
            # not an iteration count (Qwen3DecoderLayer_35 is the 36th block)
            sel = np.flatnonzero((kinds == kind) & module)
            sel = sel[_outermost_per_thread(host, sel)]
            keys_of = pd.Series(names.astype(str).to_numpy()[sel]) if len(sel) else pd.Series([], dtype=object)
        else:  # a range over (nearly) the whole window wraps the loop: not one iteration
            sel = np.flatnonzero((kinds == kind) & (dur < 0.9 * span) & ~step_marker)
            keys_of = pd.Series(keys_all[sel])
        if len(sel) == 0:
            continue
        keys = keys_of
        groups = []
        for _, idx in keys.groupby(keys, sort=False).groups.items():
            every = sel[np.asarray(idx)]
            rows = every[_outermost_per_thread(host, every)]  # threads running it at once each count
            if len(rows) >= 2:
                groups.append((int(dur[rows].sum()), rows, every))
        for _, rows, every in sorted(groups, key=lambda g: -g[0])[:1]:
            out.append((f"the repeated {label} {names.iloc[rows[-1]]}", rows, "start", every))
    return out


def _outermost_per_thread(host: pd.DataFrame, sel: np.ndarray) -> np.ndarray:
    """Which of the rows `sel` lie in no other row of `sel` on their thread."""
    keep = np.zeros(len(sel), dtype=bool)
    if len(sel) == 0:
        return keep
    tids = text_of(host["tid"])[sel]
    ts = host["ts"].to_numpy(np.int64)[sel]
    end = host["end"].to_numpy(np.int64)[sel]
    for tid in np.unique(tids):
        idx = np.flatnonzero(tids == tid)
        order = idx[np.lexsort((-end[idx], ts[idx]))]
        keep[order] = _outermost(ts[order], end[order])
    return keep


LOOP_COVER = 0.8  # a span its instances fill this much of is the loop around them, not one iteration


def parts_of_larger_unit(on_tid: pd.DataFrame, ts: np.ndarray, end: np.ndarray, span: int) -> bool:
    """Whether some span on the thread holds two instances of a repeated unit (sorted, not
    nested) as parts of something larger: the blocks of one forward pass. A span the
    instances nearly fill (LOOP_COVER) is the loop around them (a benchmark's range), and so
    is one over nearly the whole window; a module call or a forward range never is."""
    if len(ts) < 2 or len(on_tid) == 0:
        return False
    o_ts = on_tid["ts"].to_numpy(np.int64)
    o_end = on_tid["end"].to_numpy(np.int64)
    forward = name_matches(on_tid["name"], MODULE_CALL) | name_matches(on_tid["name"], FORWARD_NAME)
    ok = ~name_matches(on_tid["name"], STEP_MARKER)
    o_ts, o_end, forward = o_ts[ok], o_end[ok], forward[ok]
    lo = np.searchsorted(ts, o_ts, side="left")  # first instance starting in the span
    hi = np.searchsorted(end, o_end, side="right") - 1  # last instance ending in it
    holds = (hi - lo) >= 1
    if not holds.any():
        return False
    cum = np.concatenate([[0], np.cumsum(end - ts)])
    covered = (cum[np.minimum(hi, len(ts) - 1) + 1] - cum[np.minimum(lo, len(ts))]).astype(np.float64)
    length = np.maximum(o_end - o_ts, 1).astype(np.float64)
    loop = ~forward & ((covered >= LOOP_COVER * length) | (length >= 0.9 * span))
    return bool((holds & ~loop).any())


def inside_forward(on_tid: pd.DataFrame, ts: np.ndarray, end: np.ndarray) -> bool:
    """Whether most instances of a repeated range lie inside a module call or a forward range
    (other than themselves): then the range is a part of a forward pass, not an iteration."""
    names = on_tid["name"]
    fwd = name_matches(names, MODULE_CALL) | name_matches(names, FORWARD_NAME)
    if not fwd.any() or len(ts) == 0:
        return False
    f_ts = on_tid["ts"].to_numpy(np.int64)[fwd]
    f_end = on_tid["end"].to_numpy(np.int64)[fwd]
    order = np.argsort(f_ts, kind="stable")
    f_ts, reach = f_ts[order], np.maximum.accumulate(f_end[order])
    k = np.searchsorted(f_ts, ts, side="right") - 1
    has = k >= 0
    held = np.zeros(len(ts), dtype=bool)
    held[has] = reach[k[has]] >= end[has]
    # an instance that is itself a forward range is held by itself: only strictly larger spans count
    same = np.zeros(len(ts), dtype=bool)
    same[has] = (f_ts[k[has]] == ts[has]) & (reach[k[has]] == end[has])
    return bool((held & ~same).mean() > 0.5)


def root_forward(frames: TraceFrames) -> tuple[str, int] | None:
    """The root module's forward as the trace records it (its outermost `nn.Module` call,
    else its outermost annotation named forward) and how many times it runs, on the thread
    that runs it most; None where the trace records neither."""
    host = frames.host
    if len(host) == 0:
        return None
    kinds = text_of(host["kind"])
    for sel in (
        np.flatnonzero((kinds == "python") & name_matches(host["name"], MODULE_CALL)),
        np.flatnonzero((kinds == "annotation") & name_matches(host["name"], FORWARD_NAME)),
    ):
        sel = sel[_outermost_per_thread(host, sel)]
        if len(sel) == 0:
            continue
        pairs = pd.DataFrame({"tid": text_of(host["tid"])[sel], "name": text_of(host["name"])[sel]})
        counts = pairs.value_counts()
        (_, name), n = counts.index[0], int(counts.iloc[0])
        return name, n
    return None


FORWARD_NAME = re.compile(r"(?i)(^|[^a-z])forward([^a-z]|$)")


MIN_PERIOD = 8  # a repeated op sequence shorter than this is a loop inside a model, not a pass of it
MAX_PERIOD_TRIES = 4000


def periodic_ops(frames: TraceFrames) -> tuple[np.ndarray, np.ndarray, int] | None:
    """Where a trace that names no iteration repeats its top-level ops: the same sequence of
    operators, one forward pass after another (a model called in a loop, profiled without
    markers, modules or annotations). Returns the starts and ends of the repeats (ns) and
    the sequence's length, or None when the top-level ops do not repeat from the first."""
    host = frames.host
    kinds = text_of(host["kind"])
    sel = np.flatnonzero((kinds == "op") | (kinds == "annotation"))
    if len(sel) < 2 * MIN_PERIOD:
        return None
    tids = text_of(host["tid"])[sel]
    main = pd.Series(tids).value_counts().index[0]
    sel = sel[tids == main]
    ts = host["ts"].to_numpy(np.int64)[sel]
    end = host["end"].to_numpy(np.int64)[sel]
    order = np.lexsort((-end, ts))
    sel, ts, end = sel[order], ts[order], end[order]
    top = _outermost(ts, end)
    sel, ts, end = sel[top], ts[top], end[top]
    codes = pd.factorize(text_of(host["name"])[sel])[0]
    n = len(codes)
    if n < 2 * MIN_PERIOD:
        return None
    cands = np.flatnonzero(codes[MIN_PERIOD : n // 2 + 1] == codes[0]) + MIN_PERIOD
    for p in cands[:MAX_PERIOD_TRIES]:
        k = min(n - p, 64)
        if not (codes[p : p + k] == codes[:k]).all():
            continue
        if (codes[p:] == codes[: n - p]).all():
            p = _shortest_period(codes, int(p))
            reps = n // p
            starts = ts[np.arange(reps) * p]
            ends = np.append(ts[np.arange(1, reps) * p], end[reps * p - 1 :].max() if reps * p < n else end[-1])
            return starts, ends, int(p)
    return None


def _shortest_period(codes: np.ndarray, period: int) -> int:
    """The shortest period that repeats the whole sequence, among the divisors of PERIOD: a
    3-op loop body (`rand`, `square`, `.to()`) repeats every 9 ops too, and 3 of its
    iterations are not one. A sequence periodic in PERIOD and in a divisor of it holds nothing
    longer than the divisor's ops that could be one pass (MIN_PERIOD only keeps a short run
    inside a longer pass from being taken for the pass)."""
    n = len(codes)
    for q in range(1, period):
        if period % q == 0 and (codes[q:] == codes[: n - q]).all():
            return q
    return period


def find_iterations(frames: TraceFrames) -> Iterations | None:
    """The loop's iterations in a trace without ProfilerStep markers, or None when nothing repeats."""
    host = frames.host
    if len(host) == 0:
        return None
    found = _named_iterations(frames)
    if found is not None:
        return found
    rep = periodic_ops(frames)
    if rep is None:
        return None
    starts, ends, period = rep
    return _as_iterations(starts, ends, [f"iteration {i}" for i in range(len(starts))], f"the repeated sequence of {period} top-level operators (one pass of the model each)", 0)


def _as_iterations(starts: np.ndarray, ends: np.ndarray, names: list[str], how: str, others: int) -> Iterations | None:
    """Iterations from their spans: the first left out as the warm-up when named so or much longer than the rest."""
    dur = (ends - starts).astype(np.float64)
    named = bool(WARMUP_WORD.search(names[0])) if names else False
    rest = dur[1:]
    warm = len(dur) >= 2 and (named or (len(rest) > 0 and dur[0] > WARMUP_RATIO * float(np.median(rest))))
    first = 1 if warm else 0
    steps = pd.DataFrame(
        {
            "step": np.arange(first, len(starts), dtype=np.int64),
            "name": [f"iteration {i}" for i in range(first, len(starts))],
            "start": starts[first:].astype(np.int64),
            "end": ends[first:].astype(np.int64),
        }
    )
    if len(steps) == 0:
        return None
    return Iterations(steps, how, float(dur[0]) / 1e6 if warm else None, named, others)


def _named_iterations(frames: TraceFrames) -> Iterations | None:
    """Iterations from a span the trace names (the DataLoader, the optimizer, an annotation, a module call)."""
    host = frames.host
    span = max(frames.window[1] - frames.window[0], 1)
    for how, rows, mode, every in _candidates(host, frames.window):
        tid = _main_tid(host, rows)
        others = _concurrent_threads(host, every, text_of(host["tid"].iloc[every]), tid)
        rows = rows[text_of(host["tid"].iloc[rows]) == tid]
        ts = host["ts"].to_numpy(np.int64)[rows]
        end = host["end"].to_numpy(np.int64)[rows]
        order = np.argsort(ts, kind="stable")
        rows, ts, end = rows[order], ts[order], end[order]
        keep = _outermost(ts, end)
        rows, ts, end = rows[keep], ts[keep], end[keep]
        if len(rows) < 2:
            continue
        on_tid = host[text_of(host["tid"]) == tid]
        if mode == "start" and not how.startswith("the DataLoader"):
            if parts_of_larger_unit(on_tid, ts, end, span):
                continue  # the blocks of one forward pass, called in turn: not iterations
            if how.startswith("the repeated annotation") and inside_forward(on_tid, ts, end):
                continue  # a range inside the model's forward (a layer's): a part of each iteration
        t_ts, t_end = on_tid["ts"].to_numpy(np.int64), on_tid["end"].to_numpy(np.int64)
        if mode == "start":
            starts = ts
            ends = np.append(ts[1:], 0)
            after = t_end[(t_ts >= ts[-1])]
            ends[-1] = max(int(after.max()), int(end[-1])) if len(after) else int(end[-1])
            if len(ts) > 2 and ends[-1] <= end[-1]:
                starts, ends, rows = starts[:-1], ends[:-1], rows[:-1]  # nothing ran after it: the call that ended the loop
        else:
            first = t_ts[(t_ts < end[0]) & (t_end <= end[0])]
            starts = np.concatenate([[int(first.min()) if len(first) else int(ts[0])], end[:-1]])
            ends = end
        names = text_of(host["name"])[rows]
        found = _as_iterations(starts, ends, list(names), how, others)
        if found is None:
            continue
        return found
    return None


def _concurrent_threads(host: pd.DataFrame, rows: np.ndarray, row_tids: np.ndarray, tid: object) -> int:
    """Threads other than `tid` whose spans of the repeated pattern overlap `tid`'s in time."""
    from advisor.metrics.intervals import merge, overlap_with

    ts, end = host["ts"].to_numpy(np.int64)[rows], host["end"].to_numpy(np.int64)[rows]
    mine = row_tids == tid
    if mine.all():
        return 0
    ms, me = merge(ts[mine], end[mine])
    return sum(
        int(overlap_with(ms, me, *merge(ts[row_tids == other], end[row_tids == other])).sum() > 0)
        for other in np.unique(row_tids[~mine])
    )


def step_of(starts: np.ndarray, ends: np.ndarray, ts: np.ndarray, te: np.ndarray | None = None) -> np.ndarray:
    """Index of the step whose [start, end) holds [ts, te] (te defaults to ts), else -1."""
    if len(starts) == 0:
        return np.full(len(ts), -1, dtype=np.int64)
    idx = np.searchsorted(starts, ts, side="right") - 1
    te = ts if te is None else te
    ok = idx >= 0
    inside = np.zeros(len(ts), dtype=bool)
    inside[ok] = te[ok] <= ends[idx[ok]]
    return np.where(inside, idx, -1)


def trace_end(frames: TraceFrames) -> int | None:
    """The end of the last recorded event other than the step markers themselves."""
    host = frames.host
    ends = [int(t["end"].max()) for t in (frames.runtime, frames.device) if len(t)]
    if len(host):
        not_step = ~name_matches(host["name"], STEP_MARKER)
        if not_step.any():
            ends.append(int(host["end"].to_numpy(np.int64)[not_step].max()))
    return max(ends) if ends else None


def clip_to_trace(frames: TraceFrames, host_steps: pd.DataFrame, notes: list[str]) -> np.ndarray:
    """Host step ends, each at most the trace's last event: a marker left open (a step that
    never closed, or closed long after the profiler stopped) would count time nothing recorded."""
    h_end = host_steps["end"].to_numpy(np.int64)
    last = trace_end(frames)
    if last is None:
        return h_end
    h_start = host_steps["start"].to_numpy(np.int64)
    session_end = frames.metadata.get("profiler_session_end_ns")
    if isinstance(session_end, (int, float)) and not isinstance(session_end, bool):
        # The profiler's own span says where recording stopped: a marker that ends inside it
        # is a real step, however few of its events a sampled or filtered trace kept; one
        # that ends past it was left open.
        over = (h_end > int(session_end)) & (h_end > np.maximum(last, h_start))
    else:
        # Past the end by more than the part the trace covers: a marker left open, not a step
        # whose last few events a sampled or filtered trace dropped.
        over = (h_end > np.maximum(last, h_start)) & (h_end - last > np.maximum(last - h_start, 0))
    if not over.any():
        return h_end
    clipped = np.where(over, np.maximum(last, h_start), h_end)
    for i in np.nonzero(over)[0][:3]:
        notes.append(
            f"{host_steps['name'].iloc[i]} lasts {(h_end[i] - h_start[i]) / 1e6:,.1f} ms but the trace records events for only "
            f"{(last - h_start[i]) / 1e6:,.1f} ms of it: clipped to the last recorded event (the rest of the marker is time nothing recorded)"
        )
    return clipped


TRAILING_SPAN = 1.5
# A runtime call that issues device work (a launch or a copy; metrics.device_records names each)
ISSUES_WORK = re.compile(r"Launch|Memcpy")
TRAILING_NOTE_NS = 100_000  # a last step's device work this far past its mark is said in a note


def host_paced_last(
    launch_ts: np.ndarray, dev_ts: np.ndarray, dev_end: np.ndarray, owner: np.ndarray, dev_count: np.ndarray
) -> bool:
    """Whether the last step with device work launched it onto an idle device: no device
    activity launched before the step's first launch (by another step, or before the steps)
    was still running, or queued to run, when that launch was issued. Then the host paced the
    step, and what its device work runs past the mark beyond what the other steps' work ran
    past theirs is the end of the recording draining the queue (the closing synchronisation),
    not the step. Where earlier work was still running, the device paces the steps and they
    lie on its timeline, behind the marks."""
    has = np.nonzero(dev_count > 0)[0]
    if len(has) == 0:
        return False
    last = int(has[-1])
    own = owner == last
    if not own.any():
        return False
    first = int(launch_ts[own].min())
    # work launched (or started) before that first launch and still running then or later:
    # the step's work queued behind it
    with np.errstate(invalid="ignore"):
        earlier = ~own & ((launch_ts < first) | (dev_ts < first))
    busy = earlier & (dev_end > first)
    return not bool(busy.any())


def own_device_end(
    h_start: np.ndarray,
    h_end: np.ndarray,
    dev_min: np.ndarray,
    dev_max: np.ndarray,
    dev_count: np.ndarray,
    notes: list[str] | None = None,
    paced_by_host: bool = False,
) -> np.ndarray:
    """Per step, where its own device work ends: the end of its last device activity, unless
    the device runs behind the host, where that end is a queue of earlier work draining.

    The device runs behind when some step's device work starts before the previous step's
    has ended. Then a step ends where the next step's device work starts, and the last step
    ends as far behind its host end as its device work started behind its host start.
    Where the host paced the last step (`paced_by_host`: its work was launched onto an idle
    device, see `host_paced_last`) after other steps with device work, the last step ends no
    further past its mark than the other steps' device work ran past theirs (or its own work
    started after its mark's start): no trailing synchronisation stretches it, whatever its
    span. A window of one step has no other to measure it by: its device work is its own.
    """
    out = _device_end(h_start, h_end, dev_min, dev_max, dev_count, None if paced_by_host else notes)
    idx = np.nonzero(dev_count > 0)[0]
    if paced_by_host and len(idx) >= 2:
        # no further past its mark than the other steps' device work ran past theirs, or than
        # its own work started after its mark's start: the rest is a queue the end of the
        # recording drains (the closing synchronisation), never the step's
        last = idx[-1]
        others = idx[:-1]
        overhang = max(int(np.maximum(dev_max[others] - h_end[others], 0).max()) if len(others) else 0, int(dev_min[last]) - int(h_start[last]), 0)
        bound = max(int(h_end[last]) + overhang, int(dev_min[last]))
        out[last] = min(int(out[last]), bound)
        if int(dev_max[last]) > out[last]:
            if notes is not None and int(dev_max[last]) - int(out[last]) >= TRAILING_NOTE_NS:
                notes.append(
                    f"the last step's device work ran {(int(dev_max[last]) - int(h_end[last])) / 1e6:,.2f} ms past its ProfilerStep mark, "
                    f"launched onto an idle device (the host paced the step), where no other step's ran more than "
                    f"{overhang / 1e6:,.2f} ms past its own: that step is measured as the others are, to that far past its mark "
                    "(a step's time is never read from a queue the end of the recording drains)"
                )
    return out


def _device_end(
    h_start: np.ndarray, h_end: np.ndarray, dev_min: np.ndarray, dev_max: np.ndarray, dev_count: np.ndarray, notes: list[str] | None
) -> np.ndarray:
    """own_device_end before a host-paced last step is ended at its mark."""
    has = dev_count > 0
    out = np.where(has, dev_max, h_end)
    idx = np.nonzero(has)[0]
    if len(idx) < 2:
        return out
    nxt_min = dev_min[idx[1:]]
    behind = dev_max[idx[:-1]] > nxt_min
    if not behind.any():
        # A last step whose device work spans far longer than any other step's (TRAILING_SPAN
        # times) ends as far past its host end as the others' did (or its own start's lag):
        # the rest is the profiler's closing synchronisation draining work queued behind a
        # stall, not a step longer than its ProfilerStep mark.
        last = idx[-1]
        others_span = int((dev_max[idx[:-1]] - dev_min[idx[:-1]]).max())
        if int(dev_max[last]) - int(dev_min[last]) <= TRAILING_SPAN * others_span:
            return out
        overhang = max(int((np.maximum(dev_max[idx[:-1]] - h_end[idx[:-1]], 0)).max()), int(dev_min[last]) - int(h_start[last]), 0)
        out[last] = min(int(dev_max[last]), max(int(h_end[last]) + overhang, int(dev_min[last])))
        if notes is not None and out[last] < dev_max[last]:
            notes.append(
                f"the last step's device work ran {(int(dev_max[last]) - int(h_end[last])) / 1e6:,.2f} ms past its ProfilerStep mark, "
                f"where no other step's ran more than {overhang / 1e6:,.2f} ms past its own: that step is measured as the others are, "
                "to that far past its mark (a step's time is never read from a queue the end of the recording drains)"
            )
        return out
    out[idx[:-1]] = np.minimum(dev_max[idx[:-1]], nxt_min)
    last = idx[-1]
    lag = max(int(dev_min[last]) - int(h_start[last]), 0)
    out[last] = min(int(dev_max[last]), max(int(h_end[last]) + lag, int(dev_min[last])))
    return out


def step_spans(frames: TraceFrames) -> tuple[pd.DataFrame, list[str]]:
    """One row per step: step, name, host_start, host_end, start, end, duration (ns), device_ops.

    Returns the frame and notes for the report (no markers, trailing steps dropped).
    """
    notes: list[str] = []
    host_steps = frames.steps
    if len(host_steps) == 0:
        host = frames.host
        found = find_iterations(frames)
        if found is not None:
            host_steps = found.steps
            n_found = len(found.steps) + (found.warmup_ms is not None)
            note = f"no ProfilerStep markers: {n_found} iterations found from {found.how}"
            if found.concurrent_threads:
                note += (
                    f", on one thread while {found.concurrent_threads} other thread{'s' if found.concurrent_threads > 1 else ''} "
                    "ran the same span at the same time (a server handling requests concurrently): a step is the time between "
                    "that thread's requests, which their arrival sets as much as the work, and the savings shorten each "
                    "request's work, not the time between requests"
                )
            if found.warmup_ms is not None:
                why = "named so" if found.warmup_named else "longer than 1.5x the others"
                costs = "CUDA context creation, cuDNN autotuning, first allocations" if frames.has_device else "lazy initialisation, first allocations"
                note += (
                    f"; the first ({found.warmup_ms:,.1f} ms, {why}) is the warm-up, reported apart and left out of the steps "
                    f"(its one-time costs, such as {costs}, are not per-step costs)"
                )
            notes.append(note)
        else:
            if len(host):
                start, end = int(host["ts"].min()), int(host["end"].max())
            else:
                start, end = frames.window
            note = "no ProfilerStep markers: the whole trace window is treated as one step"
            root = root_forward(frames)
            if root is not None and root[1] == 1:
                note += (
                    f" (the root module's forward, {root[0]}, runs once in it: a single pass, whose one-time costs "
                    "are not those of the steps that would follow)"
                )
            elif root is not None:
                note += f" (nothing repeats as an iteration; {root[0]} is the outermost forward)"
            notes.append(note)
            host_steps = pd.DataFrame({"step": [0], "name": ["(whole trace)"], "start": [start], "end": [end]})
    h_start = host_steps["start"].to_numpy(np.int64)
    h_end = clip_to_trace(frames, host_steps, notes)
    n = len(host_steps)

    dev_min = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    dev_max = np.full(n, np.iinfo(np.int64).min, dtype=np.int64)
    dev_count = np.zeros(n, dtype=np.int64)
    use_device = False
    if frames.has_device and len(frames.runtime):
        lk = launches(frames)
        has_rt = lk["launch_ts"].notna().to_numpy()
        owner = np.full(len(lk), -1, dtype=np.int64)
        lts = lk["launch_ts"].to_numpy(np.float64)
        lte = lk["launch_end"].to_numpy(np.float64)
        owner[has_rt] = step_of(h_start, h_end, lts[has_rt].astype(np.int64), lte[has_rt].astype(np.int64))
        matched = owner >= 0
        if matched.any():
            use_device = True
            o = owner[matched]
            np.minimum.at(dev_min, o, lk["ts"].to_numpy(np.int64)[matched])
            np.maximum.at(dev_max, o, lk["end"].to_numpy(np.int64)[matched])
            np.add.at(dev_count, o, 1)
            prev_end = int(h_start[0])
            if dev_min[0] != np.iinfo(np.int64).max:
                ends = lk["end"].to_numpy(np.int64)[~matched]
                before = ends[ends < dev_min[0]]
                if len(before):
                    prev_end = max(prev_end, int(before.max()))

    start = h_start.copy()
    end = h_end.copy()
    if use_device:
        paced = False
        if len(frames.steps):
            # ProfilerStep marks: a step launched onto an idle device ends by its mark
            paced = host_paced_last(lts, lk["ts"].to_numpy(np.int64), lk["end"].to_numpy(np.int64), owner, dev_count)
        own_end = own_device_end(h_start, h_end, dev_min, dev_max, dev_count, notes, paced_by_host=paced)
        for i in range(n):  # a step's start depends on the previous step's stretched end
            s = max(prev_end, int(h_start[i]))
            e = int(h_end[i])
            e = max(e, s) if dev_count[i] == 0 else max(e, int(own_end[i]))
            if e < s:
                e = s
            start[i], end[i] = s, e
            prev_end = e
        if n > 1:
            last = int(np.nonzero(dev_count > 0)[0].max())
            keep = last + 1
            if last > 0 and dev_count[last - 1] * 0.8 > dev_count[last]:
                keep = last
            # on a device that ran no kernel (a CPU run that copied a batch once), steps after
            # the last with device work miss it only where their host launched work whose
            # records are absent: a step that launched nothing misses nothing and stays
            if keep == last + 1 and last + 1 < n and not (frames.device["kind"].astype(str) == "kernel").any():
                rt = frames.runtime
                issues = name_matches(rt["name"], ISSUES_WORK)
                lost = rt[issues & ~rt["correlation"].isin(lk["correlation"]).to_numpy()]
                lost_step = step_of(h_start, h_end, lost["ts"].to_numpy(np.int64)) if len(lost) else np.zeros(0, dtype=np.int64)
                if not (lost_step > last).any():
                    keep = n
            if keep < n:
                notes.append(
                    f"dropped the last {n - keep} step(s): the profiler did not capture all of their device work"
                )
            start, end, dev_count = start[:keep], end[:keep], dev_count[:keep]
            host_steps = host_steps.iloc[:keep]
            h_start, h_end = h_start[:keep], h_end[:keep]

    out = pd.DataFrame(
        {
            "step": host_steps["step"].to_numpy(np.int64),
            "name": text_of(host_steps["name"]),
            "host_start": h_start,
            "host_end": h_end,
            "start": start,
            "end": end,
            "device_ops": dev_count,
        }
    )
    out["duration"] = out["end"] - out["start"]
    return out, notes


UNEVEN_SPREAD = 0.25  # the slowest step this far above the median makes the window uneven


def uneven_steps_note(step_ms: np.ndarray) -> str | None:
    """A note on the measurement when step times differ (slowest > 25% above the median):
    averages over such a window are less precise. Whether the slow steps have a cause the
    trace shows is the step-time-variance rule's question; without one this is all there is."""
    if len(step_ms) < 3:
        return None
    median = float(np.median(step_ms))
    if median <= 0 or float(step_ms.max()) <= (1 + UNEVEN_SPREAD) * median:
        return None
    return (
        f"step times vary {float(step_ms.min()):.1f}–{float(step_ms.max()):.1f} ms around a median of {median:.1f} ms: "
        "a note on the measurement (warm-up, another process on a busy machine), not a fix; "
        "record more steps for steadier figures"
    )

