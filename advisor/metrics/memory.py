"""Device memory over the window, from `[memory]` events (profile_memory=True).

Device type 1 is CUDA (and other accelerators); type 0 is the CPU, whose figures must never
be compared with a GPU's memory (the TensorBoard plugin's memory rule does exactly that).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from advisor.load.trace import TraceFrames

CPU_DEVICE_TYPE = 0


def device_memory_curve(frames: TraceFrames) -> pd.DataFrame:
    """Allocated/reserved bytes over time for accelerator devices (ts, device_id, allocated, reserved)."""
    m = frames.memory
    m = m[(m["device_type"] != CPU_DEVICE_TYPE) & (m["device_type"] >= 0)]
    curve = m[["ts", "device_id", "total_allocated", "total_reserved"]].rename(
        columns={"total_allocated": "allocated", "total_reserved": "reserved"}
    )
    if len(m) and curve["allocated"].isna().all():
        # Older traces carry only each allocation's size: rebuild the curve from the running
        # sum. Memory allocated before the window is unknown, so this is a lower bound
        # (lifted so it never goes below zero).
        running = m.groupby("device_id")["bytes"].cumsum()
        floor = running.groupby(m["device_id"]).transform("min").clip(upper=0)
        curve["allocated"] = (running - floor).to_numpy()
    return curve


def peak_memory(frames: TraceFrames) -> dict[int, dict[str, float | None]]:
    """Per device id: peak allocated and reserved bytes seen in the window."""
    curve = device_memory_curve(frames)
    out: dict[int, dict[str, float | None]] = {}
    for dev, g in curve.groupby("device_id"):
        a, r = g["allocated"].to_numpy(), g["reserved"].to_numpy()
        out[int(dev)] = {
            "allocated": float(np.nanmax(a)) if np.isfinite(a).any() else None,
            "reserved": float(np.nanmax(r)) if np.isfinite(r).any() else None,
        }
    return out


def allocated_per_step(frames: TraceFrames, steps: pd.DataFrame) -> pd.Series:
    """Allocated bytes at the end of each step (last memory event inside it), NaN if none."""
    curve = device_memory_curve(frames)
    if len(curve) == 0 or len(steps) == 0:
        return pd.Series(np.nan, index=steps["step"].to_numpy() if len(steps) else [], dtype=float)
    ts = curve["ts"].to_numpy(np.int64)
    alloc = curve.groupby("ts")["allocated"].sum() if curve["device_id"].nunique() > 1 else curve.set_index("ts")["allocated"]
    ts = alloc.index.to_numpy(np.int64)
    vals = alloc.to_numpy(np.float64)
    idx = np.searchsorted(ts, steps["end"].to_numpy(np.int64), side="right") - 1
    first = np.searchsorted(ts, steps["start"].to_numpy(np.int64), side="left")
    out = np.where((idx >= 0) & (idx >= first), vals[np.clip(idx, 0, None)], np.nan)
    return pd.Series(out, index=steps["step"].to_numpy())
