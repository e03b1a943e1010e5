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
A `ProfilerStep` range that runs past the end of the trace by more than the part the trace
covers (a marker left open: a 13 s step in a 355 ms trace) is clipped to the last recorded
event, with a note.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from advisor.load.trace import TraceFrames
from advisor.metrics.breakdown import text_of


def launches(frames: TraceFrames) -> pd.DataFrame:
    """Device activity joined to the runtime call that launched it (by correlation id)."""
    rt = frames.runtime[["correlation", "ts", "end", "tid", "external_id"]]
    rt = rt[rt["correlation"] >= 0].drop_duplicates("correlation", keep="first")
    dev = frames.device[["correlation", "ts", "end", "kind"]].reset_index(names="device_row")
    return dev.merge(
        rt.rename(columns={"ts": "launch_ts", "end": "launch_end", "tid": "launch_tid", "external_id": "launch_external_id"}),
        on="correlation",
        how="left",
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
        not_step = ~host["name"].astype(str).str.startswith("ProfilerStep#").to_numpy()
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


def own_device_end(h_start: np.ndarray, h_end: np.ndarray, dev_min: np.ndarray, dev_max: np.ndarray, dev_count: np.ndarray) -> np.ndarray:
    """Per step, where its own device work ends: the end of its last device activity, unless
    the device runs behind the host, where that end is a queue of earlier work draining.

    The device runs behind when some step's device work starts before the previous step's
    has ended. Then a step ends where the next step's device work starts, and the last step
    ends as far behind its host end as its device work started behind its host start.
    """
    has = dev_count > 0
    out = np.where(has, dev_max, h_end)
    idx = np.nonzero(has)[0]
    if len(idx) < 2:
        return out
    nxt_min = dev_min[idx[1:]]
    behind = dev_max[idx[:-1]] > nxt_min
    if not behind.any():
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
        if len(host):
            start, end = int(host["ts"].min()), int(host["end"].max())
        else:
            start, end = frames.window
        notes.append("no ProfilerStep markers: the whole trace window is treated as one step")
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
        own_end = own_device_end(h_start, h_end, dev_min, dev_max, dev_count)
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
