"""Host↔device copies: how many, how big, how long, and from pageable or pinned memory."""

from __future__ import annotations

import msgspec
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


# --- bytes moved over time (HTA's memory bandwidth timeline) ---

BANDWIDTH_BUCKETS = 100
COPY_KINDS = {"HtoD": "H2D", "DtoH": "D2H", "DtoD": "D2D", "PtoP": "P2P", "HtoH": "H2H"}


class CopyBandwidth(msgspec.Struct, forbid_unknown_fields=True):
    """Bytes copied (memcpy) and set (memset) over a rank's steps, per time bucket and kind:
    the steps' window (first step's start to last step's end) cut into equal buckets, each
    copy's bytes spread evenly over its duration (a copy of no duration counts where it
    starts), and each bucket's bytes over its length (GB/s). kinds: H2D, D2H, D2D, P2P, H2H,
    memset (only those present)."""

    bucket_ms: float
    start_ms: list[float]  # each bucket's start, ms after the first step's start
    gbps: dict[str, list[float]]  # kind -> its average GB/s in each bucket
    bytes: dict[str, float]  # kind -> bytes in the window
    peak_gbps: dict[str, float]  # kind -> its highest bucket


def _spread(s: np.ndarray, e: np.ndarray, b: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Bytes per bucket, each interval's bytes spread evenly over it: the integral of the
    rate sum_i b_i / (e_i - s_i) over [s_i, e_i) between each pair of edges."""
    d = e - s
    out = np.zeros(len(edges) - 1)
    point = d <= 0
    if point.any():
        idx = np.clip(np.searchsorted(edges, s[point], side="right") - 1, 0, len(out) - 1)
        out += np.bincount(idx, weights=b[point], minlength=len(out))
    s, e, b, d = s[~point], e[~point], b[~point], d[~point]
    if len(s):
        r = b / d
        # F(t) = sum over intervals started before t of r (t - s) less those ended before t of r (t - e)
        os_, oe = np.argsort(s), np.argsort(e)
        cr_s, crs_s = np.concatenate([[0.0], np.cumsum(r[os_])]), np.concatenate([[0.0], np.cumsum((r * s)[os_])])
        cr_e, cre_e = np.concatenate([[0.0], np.cumsum(r[oe])]), np.concatenate([[0.0], np.cumsum((r * e)[oe])])
        i = np.searchsorted(s[os_], edges, side="right")
        j = np.searchsorted(e[oe], edges, side="right")
        f = (edges * cr_s[i] - crs_s[i]) - (edges * cr_e[j] - cre_e[j])
        out += np.diff(f)
    return np.maximum(out, 0.0)


def copy_bandwidth(frames: TraceFrames, steps: pd.DataFrame, buckets: int = BANDWIDTH_BUCKETS) -> CopyBandwidth | None:
    """CopyBandwidth of a rank over its steps; None without steps or copies and sets with a size."""
    dev = frames.device
    if len(steps) == 0 or len(dev) == 0:
        return None
    lo, hi = int(steps["start"].min()), int(steps["end"].max())
    if hi <= lo:
        return None
    kind = dev["kind"]
    is_set = (kind == "memset").to_numpy()
    b = dev["bytes"].to_numpy(np.float64)
    s, e = dev["ts"].to_numpy(np.int64), dev["end"].to_numpy(np.int64)
    moved = ((kind == "memcpy").to_numpy() | is_set) & ~np.isnan(b) & (e >= lo) & (s < hi)
    if not moved.any():
        return None
    # each row's kind from the categories' labels, not row by row
    ck = dev["copy_kind"]
    cats = np.array([COPY_KINDS.get(str(c), str(c)) for c in ck.cat.categories] + ["other copies"], dtype=object) if isinstance(ck.dtype, pd.CategoricalDtype) else None
    if cats is not None:
        named = cats[ck.cat.codes.to_numpy()[moved]]  # code -1 (missing) takes the last: "other copies"
    else:
        named = np.array([COPY_KINDS.get(str(c), str(c)) if isinstance(c, str) else "other copies" for c in ck.to_numpy(dtype=object)[moved]], dtype=object)
    label = np.where(is_set[moved], "memset", named)
    # the parts of copies outside the window are not in it: clip, keeping each copy's rate
    s, e, b = s[moved].astype(np.float64), e[moved].astype(np.float64), b[moved]
    d = e - s
    cs, ce = np.clip(s, lo, hi), np.clip(e, lo, hi)
    b = np.where(d > 0, b * (ce - cs) / np.where(d > 0, d, 1.0), b)
    edges = np.linspace(float(lo), float(hi), buckets + 1)
    width_ns = (hi - lo) / buckets
    gbps, total, peak = {}, {}, {}
    order = [k for k in ("H2D", "D2H", "D2D", "P2P", "H2H") if k in set(label)] + sorted(set(label) - {"H2D", "D2H", "D2D", "P2P", "H2H", "memset"})
    order += ["memset"] if "memset" in set(label) else []
    for k in order:
        m = label == k
        per = _spread(cs[m], ce[m], b[m], edges) / width_ns  # bytes/ns = GB/s
        per[np.abs(per) < 1e-9 * np.abs(per).max()] = 0.0  # the cumulative sums' rounding, not a copy
        gbps[k] = per.tolist()
        total[k] = float(b[m].sum())
        peak[k] = float(per.max())
    return CopyBandwidth(width_ns / 1e6, ((edges[:-1] - lo) / 1e6).tolist(), gbps, total, peak)
