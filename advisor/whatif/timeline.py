"""What one representative step looks like in time: the lanes of the HTML timeline.

The median step is the one shown (not the slowest: an outlier tells a different story than
the typical step). Host lanes: the DataLoader spans, the top-level CPU ops of each busy
thread and the synchronising runtime calls; device lanes: kernels, copies and memsets per
stream; and the gaps where the device does nothing at all. Everything is clipped to the
step and given in ns from the step's start. A replayed step (`replayed_timeline`) is drawn
the same way from the replay's times, so it can sit beside the measured one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from advisor.metrics.breakdown import (
    COMM_OP_NAME,
    DATALOADER_NAME,
    STEP_NAME,
    name_matches,
    communication_kernels,
    text_of,
)
from advisor.metrics.host_waits import waited_calls
from advisor.metrics.intervals import merge
from advisor.metrics.summary import Metrics
from advisor.whatif.replay import ReplayedStep

SPAN_COLUMNS = ["start", "end", "name", "cls", "count", "total"]  # total: ns the members cover
MAX_HOST_THREADS = 4
# Above this many spans in a lane, spans narrower than a pixel are merged with their
# neighbours (the file stays small; wide spans keep their own tooltip).
MAX_SPANS_PER_LANE = 2500
# Streams beyond the busiest few share one lane (a lane per stream would not fit the page).
MAX_DEVICE_LANES = 12
LANE_PIXELS = 1600
# Idle gaps are many (one between most kernels); sub-pixel ones are merged above this count.
MAX_IDLE_SPANS = 300
# A replayed step's lanes are drawn for their shape beside the measured one: sub-pixel spans
# merge above this count, so the two extra charts stay a fraction of the page.
MAX_REPLAYED_SPANS_PER_LANE = 400


@dataclass
class Lane:
    label: str
    group: str  # "host" or "device"
    spans: pd.DataFrame  # SPAN_COLUMNS; start/end in ns from the step start


@dataclass
class StepTimeline:
    step: int
    duration_ns: int
    reason: str
    lanes: list[Lane] = field(default_factory=list)
    idle: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=SPAN_COLUMNS))  # device idle gaps
    device_busy_ns: int = 0
    has_device: bool = False


def representative_step(steps: pd.DataFrame) -> int:
    """Row index of the median-duration step (the earlier one of a tie)."""
    d = steps["duration"].to_numpy(np.float64)
    return int(np.argmin(np.abs(d - np.median(d))))


def _clip(df: pd.DataFrame, lo: int, hi: int) -> pd.DataFrame:
    """Rows overlapping [lo, hi), clipped to it and shifted to start at 0."""
    ts = df["ts"].to_numpy(np.int64)
    end = df["end"].to_numpy(np.int64)
    keep = (end > lo) & (ts < hi)
    out = df.loc[keep].copy()
    out["start"] = np.clip(out["ts"].to_numpy(np.int64), lo, hi) - lo
    out["end"] = np.clip(out["end"].to_numpy(np.int64), lo, hi) - lo
    return out


def _names(values: pd.Series) -> np.ndarray:
    """The names as text ("nan" where missing, as `astype(str)` writes it)."""
    out = text_of(values)
    if values.hasnans:
        out[pd.isna(out)] = "nan"
    return out


def _spans(df: pd.DataFrame, cls: str | np.ndarray) -> pd.DataFrame:
    """The rows as a lane's spans, by start (the earlier row first where two start together);
    names and classes stay Python text (object columns): a lane's tooltips read them back."""
    start, end = df["start"].to_numpy(np.int64), df["end"].to_numpy(np.int64)
    order = np.argsort(start, kind="stable")
    classes = cls[order] if isinstance(cls, np.ndarray) else np.full(len(df), cls, dtype=object)
    return pd.DataFrame(
        {
            "start": start[order],
            "end": end[order],
            "name": pd.Series(_names(df["name"])[order], dtype=object),
            "cls": pd.Series(classes, dtype=object),
            "count": np.ones(len(df), dtype=np.int64),
            "total": end[order] - start[order],
        }
    )


def _top_level(df: pd.DataFrame) -> pd.DataFrame:
    """Ops not nested inside an earlier op of the same thread (the host frame is sorted by ts)."""
    if len(df) == 0:
        return df
    end = df["end"].to_numpy(np.int64)
    reach = np.maximum.accumulate(end)
    nested = np.zeros(len(df), dtype=bool)
    nested[1:] = df["ts"].to_numpy(np.int64)[1:] < reach[:-1]
    return df[~nested]


def coalesce(spans: pd.DataFrame, duration_ns: int, limit: int = MAX_SPANS_PER_LANE) -> pd.DataFrame:
    """Merge runs of sub-pixel spans that nearly touch, when a lane holds more than `limit`.

    A merged span keeps the name of its longest member, counts its members and sums the
    time they cover (`total`, less than its extent when they leave gaps); wide spans are left
    alone so their tooltips still name one kernel.
    """
    if len(spans) <= limit or duration_ns <= 0:
        return spans
    px = duration_ns / LANE_PIXELS
    s = spans["start"].to_numpy(np.int64)
    e = spans["end"].to_numpy(np.int64)
    narrow = (e - s) < px
    new = np.ones(len(spans), dtype=bool)
    new[1:] = ~(narrow[1:] & narrow[:-1] & (s[1:] - np.maximum.accumulate(e)[:-1] < px))
    first = np.flatnonzero(new)  # each run's first span: the runs are contiguous
    group = np.cumsum(new) - 1
    dur = e - s
    # each run's longest span, the first of equals
    is_longest = dur == np.maximum.reduceat(dur, first)[group]
    at = np.flatnonzero(is_longest)
    longest = at[np.unique(group[at], return_index=True)[1]]
    out = pd.DataFrame(
        {
            "start": np.minimum.reduceat(s, first),
            "end": np.maximum.reduceat(e, first),
            "name": spans["name"].to_numpy()[longest],
            "cls": spans["cls"].to_numpy()[longest],
            "count": np.add.reduceat(spans["count"].to_numpy(np.int64), first),
            "total": np.add.reduceat(spans["total"].to_numpy(np.int64), first),
        }
    )
    return out


def step_timeline(m: Metrics, row: int | None = None) -> StepTimeline | None:
    """The lanes of one step (the median step unless `row` names a row of `m.steps`)."""
    steps = m.steps
    if len(steps) == 0:
        return None
    median = row is None
    row = representative_step(steps) if row is None else row
    st = steps.iloc[row]
    lo, hi = int(st["start"]), int(st["end"])
    dur = hi - lo
    reason = "the median step" if median and len(steps) > 1 else ("the only step" if len(steps) == 1 else "chosen step")
    frames = m.frames
    lanes: list[Lane] = []

    host = _clip(frames.host, lo, hi)
    if len(host):
        dl = host[name_matches(host["name"], DATALOADER_NAME)]
        if len(dl):
            lanes.append(Lane("DataLoader", "host", _spans(dl, "dataloader")))
        special = name_matches(host["name"], STEP_NAME) | name_matches(host["name"], DATALOADER_NAME)
        comm = name_matches(host["name"], COMM_OP_NAME) & ~special
        if comm.any():
            lanes.append(Lane("Collectives (host)", "host", coalesce(_spans(host[comm], "communication"), dur)))
        plain = ~special & ~comm
        notes = host[(host["kind"] == "annotation").to_numpy() & plain]
        if len(notes):
            lanes.append(Lane("Annotations", "host", coalesce(_spans(_top_level(notes), "annotation"), dur)))
        ops = host[(host["kind"] == "op").to_numpy() & plain]
        busy = ops.groupby("tid", observed=True)["dur"].sum().sort_values(ascending=False)
        threads = [t for t in busy.index[:MAX_HOST_THREADS] if busy[t] > 0]
        for tid in sorted(threads, key=str):
            top = _top_level(ops[ops["tid"] == tid])
            label = "CPU ops" if len(threads) == 1 else f"CPU ops · thread {tid}"
            lanes.append(Lane(label, "host", coalesce(_spans(top, "cpu_exec"), dur)))

    rt = frames.runtime
    sync_parts = []
    if len(rt):
        sync = _clip(rt[waited_calls(rt, frames.device)], lo, hi)  # the one definition (advisor.metrics.host_waits)
        if len(sync):
            sync_parts.append(sync)
    if frames.syncs is not None and len(frames.syncs) and {"ts", "end", "name"} <= set(frames.syncs.columns):
        sync = _clip(frames.syncs, lo, hi)
        if len(sync):
            sync_parts.append(sync)
    if sync_parts:
        sync = pd.concat([p[["start", "end", "name"]] for p in sync_parts], ignore_index=True)
        lanes.append(Lane("Sync (host waits)", "host", coalesce(_spans(sync, "sync"), dur)))

    dev = frames.device
    timeline = StepTimeline(step=int(st["step"]), duration_ns=dur, reason=reason, has_device=len(dev) > 0)
    if len(dev):
        _device_lanes(timeline, lanes, _clip(_with_class(frames, dev, np.arange(len(dev))), lo, hi))
    timeline.lanes = lanes
    return timeline


def _with_class(frames, dev: pd.DataFrame, pos: np.ndarray) -> pd.DataFrame:
    """Device rows (at positions `pos` of frames.device) with their span class (`_cls`):
    collectives apart from other kernels."""
    comm = communication_kernels(frames)[pos]
    return dev.assign(_cls=np.where(comm, "communication", text_of(dev["kind"])))


def _device_lanes(timeline: StepTimeline, lanes: list[Lane], dev: pd.DataFrame, limit: int = MAX_SPANS_PER_LANE) -> None:
    """Lanes of the busiest streams (the rest share one), busy time and idle gaps, from device
    rows already clipped to the step (`start`/`end` from its start, `_cls`)."""
    dur = timeline.duration_ns
    multi_device = dev["device"].nunique() > 1
    busy_by_stream = (dev["end"] - dev["start"]).groupby([dev["device"], dev["stream"]]).sum()
    shown = set(busy_by_stream.sort_values(ascending=False).index[:MAX_DEVICE_LANES])
    for (device, stream), g in dev.groupby(["device", "stream"], sort=True):
        if (device, stream) not in shown:
            continue
        where = f"GPU{device} · stream {stream}" if multi_device else f"stream {stream}"
        spans = _spans(g, g["_cls"].to_numpy(dtype=object))
        lanes.append(Lane(where, "device", coalesce(spans, dur, limit)))
    if len(busy_by_stream) > len(shown):
        rest = dev[~pd.MultiIndex.from_arrays([dev["device"], dev["stream"]]).isin(list(shown))]
        label = f"{len(busy_by_stream) - len(shown)} more streams"
        lanes.append(Lane(label, "device", coalesce(_spans(rest, rest["_cls"].to_numpy(dtype=object)), dur, limit)))
    ms_, me_ = merge(dev["start"].to_numpy(np.int64), dev["end"].to_numpy(np.int64))
    timeline.device_busy_ns = int((me_ - ms_).sum())
    gap_s = np.concatenate([[0], me_])
    gap_e = np.concatenate([ms_, [dur]])
    keep = gap_e > gap_s
    gaps = pd.DataFrame({"start": gap_s[keep], "end": gap_e[keep], "name": "device idle"})
    timeline.idle = coalesce(_spans(gaps, "idle"), dur, limit=MAX_IDLE_SPANS)


def replayed_timeline(m: Metrics, step: ReplayedStep, reason: str) -> StepTimeline:
    """The lanes of a replayed step (`advisor.whatif.replay_step`): the host's runtime calls
    (the replay's host nodes; the host's own work between them is not drawn) and the device
    streams, at the replay's times. Names are the trace's."""
    frames = m.frames
    dur = step.duration_ns
    row = int(m.steps["step"].iloc[step.index]) if step.index < len(m.steps) else step.index
    timeline = StepTimeline(step=row, duration_ns=dur, reason=reason, has_device=len(step.device_row) > 0)
    lanes: list[Lane] = []
    rt = frames.runtime
    calls = pd.DataFrame(
        {
            "ts": step.call_start,
            "end": np.maximum(step.call_end, step.call_start),
            "name": _names(rt["name"].iloc[step.call_row]) if len(step.call_row) else np.zeros(0, dtype=object),
        }
    )
    calls = _clip(calls, 0, dur)
    waits = step.waits[(calls.index.to_numpy())] if len(calls) else np.zeros(0, dtype=bool)
    if (~waits).any():
        lanes.append(Lane("Runtime calls", "host", coalesce(_spans(calls[~waits], "runtime"), dur, MAX_REPLAYED_SPANS_PER_LANE)))
    if waits.any():
        lanes.append(Lane("Sync (host waits)", "host", coalesce(_spans(calls[waits], "sync"), dur, MAX_REPLAYED_SPANS_PER_LANE)))
    if len(step.device_row):
        dev = frames.device.iloc[step.device_row]
        dev = _with_class(frames, dev, step.device_row).assign(ts=step.device_start, end=step.device_end)
        _device_lanes(timeline, lanes, _clip(dev.reset_index(drop=True), 0, dur), MAX_REPLAYED_SPANS_PER_LANE)
    timeline.lanes = lanes
    return timeline
