"""Nesting of host events: each event's parent and depth on its thread, and the innermost
op enclosing a runtime call.

Some traces link a kernel to its op by external id; others (several Kineto versions) put the
correlation id there instead, and only time tells which op launched it: the innermost op on
the launching thread whose span covers the runtime call.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def parents(host: pd.DataFrame) -> np.ndarray:
    """Row index of each host event's parent on the same thread (-1 for roots).

    `host` must be sorted by (ts, -dur) as the loader leaves it. One pass with a stack per
    thread: the only per-event loop in the metrics, and it runs only when a rule needs it.
    """
    out = np.full(len(host), -1, dtype=np.int64)
    ts = host["ts"].to_numpy(np.int64)
    end = host["end"].to_numpy(np.int64)
    for _, rows in host.groupby("tid", observed=True, sort=False).indices.items():
        stack: list[int] = []
        for i in rows.tolist():
            t = ts[i]
            while stack and end[stack[-1]] <= t:
                stack.pop()
            if stack and end[i] <= end[stack[-1]]:
                out[i] = stack[-1]
            stack.append(i)
    return out


def depth(parent: np.ndarray) -> np.ndarray:
    d = np.zeros(len(parent), dtype=np.int64)
    p = parent.copy()
    while (p >= 0).any():
        d += p >= 0
        p = np.where(p >= 0, parent[np.clip(p, 0, None)], -1)
    return d


def enclosing_rows(host: pd.DataFrame, parent: np.ndarray, tid: pd.Series, ts: np.ndarray, end: np.ndarray) -> np.ndarray:
    """For each (tid, ts, end), the row of the innermost host event covering it, or -1."""
    out = np.full(len(ts), -1, dtype=np.int64)
    h_tid = host["tid"].astype(str).to_numpy()
    h_ts = host["ts"].to_numpy(np.int64)
    h_end = host["end"].to_numpy(np.int64)
    q_tid = tid.astype(str).to_numpy()
    for t in np.unique(q_tid):
        rows = np.nonzero(h_tid == t)[0]
        if len(rows) == 0:
            continue
        q = np.nonzero(q_tid == t)[0]
        pos = np.searchsorted(h_ts[rows], ts[q], side="right") - 1
        idx = np.where(pos >= 0, rows[np.clip(pos, 0, None)], -1)
        # Walk up the parents until the event covers the query (depth-bounded, vectorised).
        for _ in range(256):
            bad = (idx >= 0) & (h_end[np.clip(idx, 0, None)] < end[q])
            if not bad.any():
                break
            idx[bad] = parent[idx[bad]]
        out[q] = idx
    return out
