"""Host↔device copies: how many, how big, how long, and from pageable or pinned memory."""

from __future__ import annotations

import numpy as np
import pandas as pd

from advisor.load.trace import TraceFrames


def copies(frames: TraceFrames, kind: str | None = None) -> pd.DataFrame:
    """Memcpy rows, optionally of one direction (HtoD, DtoH, DtoD, ...)."""
    dev = frames.device
    mask = dev["kind"] == "memcpy"
    if kind is not None:
        mask &= dev["copy_kind"] == kind
    return dev.loc[mask, ["name", "ts", "end", "dur", "stream", "correlation", "bytes", "copy_kind", "copy_src", "copy_dst", "bandwidth_gbps"]]


def h2d_copies(frames: TraceFrames) -> pd.DataFrame:
    return copies(frames, "HtoD")


def copy_summary(c: pd.DataFrame, n_steps: int) -> dict:
    """Totals over the window and per step; bytes are None when the trace has no sizes."""
    n_steps = max(n_steps, 1)
    time_ns = int(c["dur"].sum())
    has_bytes = bool(c["bytes"].notna().any())
    total_bytes = int(np.nansum(c["bytes"].to_numpy())) if has_bytes else None
    pageable = int((c["copy_src"] == "Pageable").sum() + (c["copy_dst"] == "Pageable").sum())
    pinned = int((c["copy_src"] == "Pinned").sum() + (c["copy_dst"] == "Pinned").sum())
    bw = (total_bytes / time_ns) if (has_bytes and time_ns > 0) else None
    return {
        "count": int(len(c)),
        "bytes": total_bytes,
        "time_ms": time_ns / 1e6,
        "pageable_count": pageable,
        "pinned_count": pinned,
        "bandwidth_gbps": bw,
        "per_step_time_ms": time_ns / 1e6 / n_steps,
        "per_step_bytes": (total_bytes / n_steps) if total_bytes is not None else None,
    }
