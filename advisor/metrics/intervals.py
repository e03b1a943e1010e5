"""Vectorised interval arithmetic on (start, end) int64 arrays.

The step-time breakdown is a question about unions of intervals (when was *any* kernel
running?). Doing it with numpy keeps a million-event trace in milliseconds.
"""

from __future__ import annotations

import numpy as np


def merge(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Union of intervals as sorted, disjoint (start, end) arrays."""
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    keep = ends > starts
    starts, ends = starts[keep], ends[keep]
    if len(starts) == 0:
        return starts, ends
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    run_end = np.maximum.accumulate(ends)
    # A new merged interval begins where an interval starts after everything before it ended.
    new = np.empty(len(starts), dtype=bool)
    new[0] = True
    new[1:] = starts[1:] > run_end[:-1]
    first = np.flatnonzero(new)
    out_start = starts[first]
    # the running end never falls: each merged interval ends where its last member's runs to
    last = np.empty(len(first), dtype=np.int64)
    last[:-1] = first[1:] - 1
    last[-1] = len(starts) - 1
    return out_start, run_end[last]


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """np.unique of integer times or positions: sort, then drop repeats. NumPy 2's np.unique
    hashes first and is ~10x slower on the 10^5 bounds a breakdown sorts."""
    values = np.sort(np.asarray(values).ravel())
    if len(values) < 2:
        return values
    keep = np.empty(len(values), dtype=bool)
    keep[0] = True
    np.not_equal(values[1:], values[:-1], out=keep[1:])
    return values[keep]


def covers(m_starts: np.ndarray, m_ends: np.ndarray, points: np.ndarray) -> np.ndarray:
    """For merged intervals, whether each point lies inside one (start <= p < end)."""
    if len(m_starts) == 0:
        return np.zeros(len(points), dtype=bool)
    idx = np.searchsorted(m_starts, points, side="right") - 1
    ok = idx >= 0
    out = np.zeros(len(points), dtype=bool)
    out[ok] = points[ok] < m_ends[idx[ok]]
    return out


def covers_bounds(bounds: np.ndarray, m_starts: np.ndarray, m_ends: np.ndarray) -> np.ndarray:
    """covers(m_starts, m_ends, bounds[:-1]) for sorted unique `bounds` that hold every start
    and end: each interval covers the segments from its start's bound to its end's, so only
    the intervals' ends are looked up, not every segment. Intervals that are not disjoint and
    in order (or have no length) are read as covers() reads them."""
    m_starts = np.asarray(m_starts, dtype=np.int64)
    m_ends = np.asarray(m_ends, dtype=np.int64)
    if len(bounds) == 0:
        return np.zeros(0, dtype=bool)
    if not ((m_starts < m_ends).all() and (m_starts[1:] >= m_ends[:-1]).all()):
        return covers(m_starts, m_ends, bounds[:-1])
    edge = np.zeros(len(bounds), dtype=np.int64)
    edge[np.searchsorted(bounds, m_starts)] += 1  # starts and ends each rise strictly: no slot twice
    edge[np.searchsorted(bounds, m_ends)] -= 1
    return np.cumsum(edge[:-1]) > 0


def total(starts: np.ndarray, ends: np.ndarray) -> int:
    s, e = merge(starts, ends)
    return int((e - s).sum())


def overlap_with(m_starts: np.ndarray, m_ends: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Length of the merged intervals' overlap with each window [lo, hi)."""
    if len(m_starts) == 0:
        return np.zeros(len(lo), dtype=np.int64)
    # Prefix sums of lengths, clipped at the window edges.
    lengths = np.concatenate([[0], np.cumsum(m_ends - m_starts)])

    def covered_before(t: np.ndarray) -> np.ndarray:
        i = np.searchsorted(m_starts, t, side="right")  # intervals starting at or before t
        full = lengths[i]
        last = np.clip(i - 1, 0, None)
        excess = np.where(i > 0, np.clip(m_ends[last] - t, 0, None), 0)
        return full - excess

    return covered_before(np.asarray(hi)) - covered_before(np.asarray(lo))


def subtract(a_s: np.ndarray, a_e: np.ndarray, b_s: np.ndarray, b_e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merged intervals A minus merged intervals B, as merged intervals."""
    if len(a_s) == 0 or len(b_s) == 0:
        return a_s, a_e
    bounds = sorted_unique(np.concatenate([a_s, a_e, b_s, b_e]))
    lo, hi = bounds[:-1], bounds[1:]
    keep = covers_bounds(bounds, a_s, a_e) & ~covers_bounds(bounds, b_s, b_e)
    return merge(lo[keep], hi[keep])


def intersect(a_s: np.ndarray, a_e: np.ndarray, b_s: np.ndarray, b_e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merged intervals A ∩ B, as merged intervals."""
    if len(a_s) == 0 or len(b_s) == 0:
        return a_s[:0], a_e[:0]
    bounds = sorted_unique(np.concatenate([a_s, a_e, b_s, b_e]))
    lo, hi = bounds[:-1], bounds[1:]
    keep = covers_bounds(bounds, a_s, a_e) & covers_bounds(bounds, b_s, b_e)
    return merge(lo[keep], hi[keep])
