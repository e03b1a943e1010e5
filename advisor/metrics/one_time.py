"""Work that happens once in the window: taken out of the steps, reported apart with its size.

The first call of its kind can do what no later one does: the first kernel launch loads the
kernels' library (hundreds of milliseconds for cuBLAS or a compiled graph's module), the
first call into cuDNN, cuBLAS or MIOpen creates its handle, the first convolution of a shape
autotunes. A window that holds such a call (a single cold pass, or a trace started with the
run) would charge it to a step and promise it back as a per-step saving. A runtime call is
taken as one-time work when it lasts at least ONE_TIME_MIN_MS and more than ONE_TIME_FACTOR
times the typical call of its name (the lower quartile of their durations) (at least MIN_CALLS of them), and is not a wait for
the device (a synchronize lasts as long as the work it waits for: advisor.metrics.host_waits)
nor a copy (it lasts as long as its bytes take); also a call that only
initialises a library (LIBRARY_INIT) lasting at least ONE_TIME_MIN_MS. Long calls that recur,
a name's in more than half the steps (`hipFree` stalling in every iteration), are the steps'
own work and stay in them, however large: one-time work is what happens once.

Its excess over the typical call is cut out of the timeline (everything after it moves
earlier by that much), where the device had nothing to do meanwhile: every figure after
that, step times, idle time and savings, is the steady run's. The note names each call and
its size. A step that held such a call is the run's first pass through everything in it
(the first dispatch of each op, the autograd engine's first backward, the first collective):
when every step of the window did (a window of one cold iteration), the rules that read the
host's pace or the device's idle time (HOST_PACE_RULES) have no warm step to stand on and do
not run, and a second note says so.
"""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pandas as pd

from advisor.load.trace import TraceFrames
from advisor.metrics.breakdown import name_matches, text_of
from advisor.metrics.device_records import COPY_CALL
from advisor.metrics.host_waits import waited_calls
from advisor.metrics.intervals import merge, overlap_with

ONE_TIME_FACTOR = 20.0
TYPICAL_QUANTILE = 0.25
ONE_TIME_MIN_MS = 5.0
MIN_CALLS = 3
# Long calls of one name in more than this share of the steps recur: the steps' own work.
RECURRING_SHARE = 0.5
LIBRARY_INIT = re.compile(
    r"^(cuInit|cuModuleLoad\w*|cuLibraryLoad\w*|hipModuleLoad\w*|cudnnCreate|cublasCreate\w*|cublasLtCreate|"
    r"miopenCreate\w*|rocblas_create_handle|hipblasCreate|hipblasLtCreate|cudaSetDevice|hipSetDevice)$"
)
ONE_TIME_NOTE = "one-time work taken out of the steps"
# Device activity during the excess above this share of it: the call did not hold the run
# up alone, and cutting it out would squeeze the device's work.
MAX_BUSY_SHARE = 0.05
COLD_WINDOW_NOTE = "every step of the window holds one-time work"
# Rules whose findings rest on the host's pace or the device's idle time in the steps: a step
# that loaded modules is a first call of everything in it (first dispatch of each op, the
# autograd engine's first backward, the first collective), so none of them has a basis there.
HOST_PACE_RULES = frozenset(
    {"gpu-idle", "launch-bound", "host-sync", "dataloader-stall", "step-time-variance", "straggler",
     "communication-exposed", "spare-gpu-memory"}
)


def one_time_calls(frames: TraceFrames, steps: pd.DataFrame | None = None) -> pd.DataFrame:
    """The runtime calls that are one-time work (inside the steps' spans, when given): name,
    ts, end, excess (ns cut out), count (calls of the name)."""
    rt = frames.runtime
    empty = pd.DataFrame({"name": pd.Series([], dtype=object), "ts": [], "end": [], "excess": [], "count": []})
    if len(rt) == 0:
        return empty
    dur = (rt["end"] - rt["ts"]).to_numpy(np.int64)
    names = text_of(rt["name"])
    s = pd.Series(dur)
    # one group per name (by its category code, where the column is categorical)
    by_name = rt["name"].array.codes if isinstance(rt["name"].dtype, pd.CategoricalDtype) and not rt["name"].hasnans else names
    # the typical call of a name: its lower quartile (a short window's cold calls can be half
    # of them: seven launches of which three load a module)
    med = s.groupby(by_name).transform("quantile", TYPICAL_QUANTILE).to_numpy(np.float64)  # linear, as Series.quantile
    count = s.groupby(by_name).transform("size").to_numpy(np.int64)
    # a wait lasts as long as the work it waits for (the one definition of a wait:
    # advisor.metrics.host_waits), a copy as long as its bytes take: neither is one-time work
    waits = waited_calls(rt, frames.device) | name_matches(rt["name"], COPY_CALL)
    long = dur >= ONE_TIME_MIN_MS * 1e6
    outlier = long & (dur > ONE_TIME_FACTOR * med) & (count >= MIN_CALLS) & ~waits
    init = long & name_matches(rt["name"], LIBRARY_INIT)
    chosen = outlier | init
    if steps is not None and len(steps):
        ts_all = rt["ts"].to_numpy(np.int64)
        s0, s1 = steps["start"].to_numpy(np.int64), steps["end"].to_numpy(np.int64)
        i = np.searchsorted(s0, ts_all, side="right") - 1
        chosen &= (i >= 0) & (ts_all < s1[np.maximum(i, 0)])
        chosen &= ~_recurring(by_name, i, chosen & ~init, len(steps))
    pick = np.flatnonzero(chosen)
    if len(pick) == 0:
        return empty
    ts = rt["ts"].to_numpy(np.int64)[pick]
    end = rt["end"].to_numpy(np.int64)[pick]
    typical = np.where(init[pick], 0, med[pick]).astype(np.int64)
    out = pd.DataFrame({"name": names[pick], "ts": ts, "end": end, "excess": end - (ts + typical), "count": count[pick]})
    # keep those whose excess the device spent idle
    dev = frames.device
    if len(dev):
        ds, de = merge(dev["ts"].to_numpy(np.int64), dev["end"].to_numpy(np.int64))
        busy = overlap_with(ds, de, out["end"].to_numpy(np.int64) - out["excess"].to_numpy(np.int64), out["end"].to_numpy(np.int64))
        out = out[busy <= MAX_BUSY_SHARE * out["excess"].to_numpy(np.float64)]
    return out.sort_values("ts").reset_index(drop=True)


def _recurring(by_name: np.ndarray, step: np.ndarray, long: np.ndarray, steps: int) -> np.ndarray:
    """Per call, whether its name's long calls recur: they fall in more than RECURRING_SHARE of
    the steps (a `hipFree` that stalls 135 times in every iteration), so they are the steps'
    own work, never one-time, however large. A window of one step cannot tell: False there."""
    out = np.zeros(len(by_name), dtype=bool)
    if steps < 2 or not long.any():
        return out
    rows = np.flatnonzero(long)
    per_name = pd.Series(step[rows]).groupby(np.asarray(by_name)[rows]).nunique()
    recurring = per_name.index[per_name.to_numpy() > RECURRING_SHARE * steps]
    if len(recurring):
        out[rows] = np.isin(np.asarray(by_name)[rows], recurring)
    return out


def _shift(t: np.ndarray, cut_at: np.ndarray, cut_len: np.ndarray) -> np.ndarray:
    """Times with the cut intervals [cut_at, cut_at + cut_len) taken out of the timeline."""
    out = t.astype(np.int64, copy=True)
    for a, n in zip(cut_at, cut_len, strict=True):
        out -= np.clip(t - a, 0, n)
    return out


def without_one_time_work(frames: TraceFrames, steps: pd.DataFrame | None = None) -> tuple[TraceFrames, list[str]]:
    """The frames with each one-time call in the steps cut out of the timeline, and the note."""
    calls = one_time_calls(frames, steps)
    if len(calls) == 0:
        return frames, []
    # calls that overlap (two threads stalled at once, a record written twice) cut their union once
    cut_end = calls["end"].to_numpy(np.int64)
    cut_at, cut_end = merge(cut_end - calls["excess"].to_numpy(np.int64), cut_end)
    cut_len = cut_end - cut_at

    def moved(df: pd.DataFrame | None, cols: tuple[str, ...], keep_dur: bool = False) -> pd.DataFrame | None:
        if df is None or len(df) == 0:
            return df
        df = df.copy()
        if keep_dur:
            # device work is the device's own time: it moves with the cut, never shortens (a
            # kernel that ran during a host stall keeps its duration)
            df["ts"] = _shift(df["ts"].to_numpy(np.int64), cut_at, cut_len)
            df["end"] = df["ts"].to_numpy(np.int64) + df["dur"].to_numpy(np.int64)
            return df
        for c in cols:
            if c in df.columns:
                df[c] = _shift(df[c].to_numpy(np.int64), cut_at, cut_len)
        if "dur" in df.columns and "ts" in df.columns and "end" in df.columns:
            df["dur"] = df["end"] - df["ts"]
        return df

    metadata = dict(frames.metadata)
    session_end = metadata.get("profiler_session_end_ns")
    if isinstance(session_end, (int, float)) and not isinstance(session_end, bool):
        metadata["profiler_session_end_ns"] = int(_shift(np.array([int(session_end)]), cut_at, cut_len)[0])
    w0, w1 = _shift(np.array(frames.window, dtype=np.int64), cut_at, cut_len)
    out = replace(
        frames,
        host=moved(frames.host, ("ts", "end")),
        runtime=moved(frames.runtime, ("ts", "end")),
        device=moved(frames.device, ("ts", "end"), keep_dur=True),
        memory=moved(frames.memory, ("ts",)),
        steps=moved(frames.steps, ("start", "end")),
        syncs=moved(frames.syncs, ("ts", "end")),
        window=(int(w0), int(w1)),
        metadata=metadata,
    )
    total = float(cut_len.sum()) / 1e6
    parts = [
        f"{r.name} {r.excess / 1e6:,.1f} ms"
        + (f" (one of {r.count}, typically {(r.end - r.ts - r.excess) / 1e3:,.0f} µs)" if r.count >= MIN_CALLS and not LIBRARY_INIT.match(r.name) else "")
        for r in calls.head(5).itertuples()
    ]
    note = (
        f"{ONE_TIME_NOTE}, {total:,.1f} ms in all: {'; '.join(parts)}"
        + (f" and {len(calls) - 5} more" if len(calls) > 5 else "")
        + " (a library loaded or initialised, autotuning, first-call compilation): reported apart, never a per-step saving; "
        "the headline is the window as measured, with the steps without it beside it as a projection"
    )
    notes = [note]
    if steps is not None and len(steps) and _every_step_holds(steps, calls["ts"].to_numpy(np.int64)):
        n = len(steps)
        notes.append(
            f"{COLD_WINDOW_NOTE} ({'its only step is' if n == 1 else f'all {n} steps are'} the run's first calls): "
            "its host times are first-call times, not a warm step's, so no advice rests on the host's pace, the device's "
            "idle time or the batch size; record steps after the first ones (a profiler schedule with warmup) for that"
        )
    return out, notes


def _every_step_holds(steps: pd.DataFrame, ts: np.ndarray) -> bool:
    """Whether each step holds at least one of these times."""
    s0, s1 = steps["start"].to_numpy(np.int64), steps["end"].to_numpy(np.int64)
    i = np.searchsorted(s0, ts, side="right") - 1
    ok = (i >= 0) & (ts < s1[np.maximum(i, 0)])
    return len(np.unique(i[ok])) == len(steps)


def cold_window(metrics) -> bool:
    """Whether every step of this rank's window held one-time work (its note is among the notes):
    the rules in HOST_PACE_RULES have no warm step to stand on."""
    return any(n.startswith(COLD_WINDOW_NOTE) for n in metrics.notes)


def had_one_time_work(metrics) -> bool:
    """Whether one-time work was cut out of this rank's steps (its note is among the rank's notes)."""
    return any(n.startswith(ONE_TIME_NOTE) for n in metrics.notes)
