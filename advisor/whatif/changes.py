"""Building blocks for the changes rules declare: each names the frame rows a fix touches.

A rule detects something (copies, syncs, kernels, spans) and says what its fix does to them;
these functions turn that into a `Change` over the rank's frame rows, so rules never index
the graph themselves.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from advisor.load.trace import TraceFrames
from advisor.whatif.graph import WAIT_CALL
from advisor.whatif.replay import Change

LAUNCH_CALL = re.compile(r"^(cudaLaunch|cuLaunch|hipLaunch|hipExtLaunch|hipModuleLaunch|hipExtModuleLaunch|cudaGraphLaunch|hipGraphLaunch)")
# A launch call that a CUDA graph or a compiled region replaces costs about this much of its time.
GRAPHED_CALL_SHARE = 0.1


def _name_mask(names: pd.Series, pattern: re.Pattern) -> np.ndarray:
    if isinstance(names.dtype, pd.CategoricalDtype):
        cats = names.cat.categories
        hit = np.fromiter((bool(pattern.search(str(c))) for c in cats), dtype=bool, count=len(cats))
        codes = names.cat.codes.to_numpy()
        return np.where(codes >= 0, hit[np.clip(codes, 0, None)] if len(cats) else False, False)
    return names.astype(str).str.contains(pattern).to_numpy()


def device_rows_of(frames: TraceFrames, correlations) -> np.ndarray:
    """Rows of frames.device with these correlation ids."""
    corr = np.asarray(correlations, dtype=np.int64)
    return np.nonzero(frames.device["correlation"].isin(corr[corr >= 0]).to_numpy())[0]


def runtime_rows_of(frames: TraceFrames, correlations) -> np.ndarray:
    """Rows of frames.runtime (the launch calls) with these correlation ids."""
    corr = np.asarray(correlations, dtype=np.int64)
    return np.nonzero(frames.runtime["correlation"].isin(corr[corr >= 0]).to_numpy())[0]


def wait_calls_in(frames: TraceFrames, starts, ends) -> np.ndarray:
    """Rows of frames.runtime that are wait calls (syncs, blocking copies) starting inside [start, end]."""
    rt = frames.runtime
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    if len(starts) == 0:
        return np.zeros(0, dtype=np.int64)
    waits = np.nonzero(_name_mask(rt["name"], WAIT_CALL))[0]
    ts = rt["ts"].to_numpy(np.int64)[waits]
    order = np.argsort(starts)
    s, e = starts[order], ends[order]
    i = np.searchsorted(s, ts, side="right") - 1
    ok = i >= 0
    inside = np.zeros(len(ts), dtype=bool)
    inside[ok] = ts[ok] <= e[i[ok]]
    return waits[inside]


def unwait(frames: TraceFrames, starts, ends) -> Change:
    """The host no longer waits for the device in these windows (a sync removed, a copy made async)."""
    return Change(unwait={int(r) for r in wait_calls_in(frames, starts, ends)})


def scale_device(rows, factor) -> Change:
    """These device ops take `factor` of their time (an array or one number); 0 removes them."""
    rows = np.asarray(rows, dtype=np.int64)
    f = np.broadcast_to(np.asarray(factor, dtype=np.float64), rows.shape)
    return Change(device_scale={int(r): float(x) for r, x in zip(rows, f)})


def remove_launches(frames: TraceFrames, correlations) -> Change:
    """The device ops and their launch calls go away (zero_grad memsets with set_to_none)."""
    return Change(
        device_scale={int(r): 0.0 for r in device_rows_of(frames, correlations)},
        call_scale={int(r): 0.0 for r in runtime_rows_of(frames, correlations)},
    )


def graphed(frames: TraceFrames, device_rows, host_windows=None, host_share: float = 0.0) -> Change:
    """Device ops issued as one graph or compiled region: back to back on their streams, their
    launch calls reduced to a small share, and (optionally) `host_share` of the host time in
    `host_windows` (the eager per-op dispatch) gone."""
    rows = np.asarray(device_rows, dtype=np.int64)
    corr = frames.device["correlation"].to_numpy(np.int64)[rows]
    calls = runtime_rows_of(frames, corr)
    calls = calls[_name_mask(frames.runtime["name"].iloc[calls], LAUNCH_CALL)] if len(calls) else calls
    change = Change(tight_launch={int(r) for r in rows}, call_scale={int(r): GRAPHED_CALL_SHARE for r in calls})
    if host_windows is not None and host_share > 0:
        s, e = host_windows
        change.host_remove.append((np.asarray(s, dtype=np.int64), np.asarray(e, dtype=np.int64), float(host_share)))
    return change


def added_work(frames: TraceFrames, ts, host_ns, device_ns=None) -> Change:
    """Work a fix adds (autocast's casts): `host_ns` of host time (window figures) at each host
    time `ts`, and `device_ns` on the stream of the first device op launched at or after it."""
    ts = np.asarray(ts, dtype=np.int64)
    change = Change(host_add=[(ts, np.asarray(host_ns, dtype=np.float64))])
    if device_ns is None or len(ts) == 0:
        return change
    dev = frames.device
    rt = frames.runtime
    corr_dev = dev["correlation"].to_numpy(np.int64)
    first_row = pd.Series(np.arange(len(dev)), index=corr_dev)
    first_row = first_row[(first_row.index >= 0) & ~first_row.index.duplicated(keep="first")]
    row = first_row.reindex(rt["correlation"].to_numpy(np.int64)).to_numpy()
    launched = ~np.isnan(row)
    if not launched.any():
        return change
    launch_ts = rt["ts"].to_numpy(np.int64)[launched]
    order = np.argsort(launch_ts, kind="stable")
    launch_ts, rows = launch_ts[order], row[launched][order].astype(np.int64)
    j = np.searchsorted(launch_ts, ts, side="left")
    ok = j < len(launch_ts)
    added = pd.Series(np.asarray(device_ns, dtype=np.float64)[ok]).groupby(rows[j[ok]]).sum()
    change.device_add = {int(r): float(v) for r, v in added.items() if v > 0}
    return change
