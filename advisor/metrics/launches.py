"""How long work waits between its launch call and its start on the device, and how deep each
stream's queue runs (`advisor report --launches`).

For each device op (kernel, copy, set) whose launch call the trace links (`correlation`):
its launch delay is the time from the launch call's start on the host to the op's start on
the device (the launch call itself, then the wait behind the stream's earlier work), and the
stream's queue length at that launch is the number of the stream's ops launched by then (this
one included) that have not finished. A queue that stays near 1 with short delays is a device
that waits on the host; a deep queue with long delays is a host well ahead of the device.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

LAUNCH_COLUMNS = ["stream", "ops", "delay_p50_us", "delay_p90_us", "delay_max_us", "queue_mean", "queue_max"]


def launch_table(frames) -> pd.DataFrame:
    """One row per stream (and one for all streams, stream -1): linked ops, launch delay p50,
    p90 and max (µs), queue length mean and max over the stream's launches."""
    dev, rt = frames.device, frames.runtime
    if len(dev) == 0 or len(rt) == 0:
        return pd.DataFrame({c: pd.Series(dtype=np.float64) for c in LAUNCH_COLUMNS})
    calls = rt[rt["correlation"] >= 0].drop_duplicates("correlation")
    launch = pd.Series(calls["ts"].to_numpy(np.int64), index=calls["correlation"].to_numpy(np.int64))
    ops = dev[dev["correlation"] >= 0]
    at = launch.reindex(ops["correlation"].to_numpy(np.int64)).to_numpy()
    linked = ~np.isnan(at)
    t = pd.DataFrame({"stream": ops["stream"].to_numpy(np.int64)[linked], "launch": at[linked].astype(np.int64),
                      "start": ops["ts"].to_numpy(np.int64)[linked], "end": ops["end"].to_numpy(np.int64)[linked]})
    t["delay_us"] = (t["start"] - t["launch"]) / 1e3
    queue = np.zeros(len(t), np.int64)
    for _, idx in t.groupby("stream", sort=False).indices.items():
        launches = t["launch"].to_numpy()[idx]
        ends = np.sort(t["end"].to_numpy()[idx])
        launched = np.searchsorted(np.sort(launches), launches, side="right")  # this one and every earlier launch
        queue[idx] = launched - np.searchsorted(ends, launches, side="right")  # less those finished by then
    t["queue"] = queue
    rows = []
    for stream, g in [*t.groupby("stream", sort=True), (-1, t)]:
        d = g["delay_us"].to_numpy()
        rows.append({"stream": int(stream), "ops": len(g), "delay_p50_us": float(np.percentile(d, 50)), "delay_p90_us": float(np.percentile(d, 90)),
                     "delay_max_us": float(d.max()), "queue_mean": float(g["queue"].mean()), "queue_max": int(g["queue"].max())})
    return pd.DataFrame(rows, columns=LAUNCH_COLUMNS)


# A gap between two ops of a stream no longer than this is the device starting the next op
# (HTA's `consecutive_kernel_delay`, 30 ns), not idling.
BACK_TO_BACK_NS = 30
IDLE_COLUMNS = ["stream", "gaps", "idle_ms", "host_wait_ms", "kernel_wait_ms", "other_ms"]


def idle_table(frames) -> pd.DataFrame:
    """One row per stream (and stream -1: all): the stream's idle time between consecutive
    ops (ms, within the span of its ops), split by cause as HTA splits it: host wait (the next
    op's launch call started after the previous op ended: the device waited for the host),
    kernel wait (a gap of BACK_TO_BACK_NS or less), other (the op was launched in time and
    still started later: a sync, an event wait, another stream)."""
    dev, rt = frames.device, frames.runtime
    if len(dev) == 0:
        return pd.DataFrame({c: pd.Series(dtype=np.float64) for c in IDLE_COLUMNS})
    calls = rt[rt["correlation"] >= 0].drop_duplicates("correlation")
    launch = pd.Series(calls["ts"].to_numpy(np.int64), index=calls["correlation"].to_numpy(np.int64))
    at = launch.reindex(dev["correlation"].to_numpy(np.int64)).to_numpy()
    t = pd.DataFrame({"stream": dev["stream"].to_numpy(np.int64), "start": dev["ts"].to_numpy(np.int64), "end": dev["end"].to_numpy(np.int64), "launch": at})
    rows = []
    for stream, g in t.groupby("stream", sort=True):
        g = g.sort_values(["start", "end"], kind="stable")
        start, end, lau = g["start"].to_numpy(), g["end"].to_numpy(), g["launch"].to_numpy()
        reach = np.maximum.accumulate(end)[:-1]  # the stream is busy until every earlier op has ended
        gap = start[1:] - reach
        idle = gap > 0
        host = idle & ~np.isnan(lau[1:]) & (lau[1:] > reach)
        kernel = idle & ~host & (gap <= BACK_TO_BACK_NS)
        other = idle & ~host & ~kernel
        rows.append({"stream": int(stream), "gaps": int(idle.sum()), "idle_ms": gap[idle].sum() / 1e6, "host_wait_ms": gap[host].sum() / 1e6,
                     "kernel_wait_ms": gap[kernel].sum() / 1e6, "other_ms": gap[other].sum() / 1e6})
    table = pd.DataFrame(rows, columns=IDLE_COLUMNS)
    total = table.drop(columns="stream").sum().to_dict() | {"stream": -1}
    return pd.concat([table, pd.DataFrame([total], columns=IDLE_COLUMNS)], ignore_index=True).astype({"stream": np.int64, "gaps": np.int64})
