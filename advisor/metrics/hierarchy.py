"""Nesting of host events: which op was open when something happened on its thread.

Some traces link a kernel to its op by external id; others (several Kineto versions) put the
correlation id there instead, and only time tells which op launched it. The op tree answers
that for the metrics (launching ops) and for the rules (the op around a copy, a sync, a
zero_grad), built without a per-event Python loop.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from advisor.load.trace import TraceFrames
from advisor.metrics.breakdown import STEP_NAME, name_matches
from advisor.metrics.intervals import sorted_unique


@dataclass
class OpTree:
    """Host ops and annotations (not Python frames, not ProfilerStep) with their nesting.

    `parent` and `prev_sibling` are positions in `ops` (-1 for none). Nesting is per thread,
    from the times alone: an op's parent is the innermost op that was open when it started.
    """

    ops: pd.DataFrame  # name (str), tid, ts, end, kind, external_id, call_stack, input_dims, input_types
    parent: np.ndarray
    prev_sibling: np.ndarray
    depth: np.ndarray
    thread: np.ndarray  # ops["tid"] as a NumPy str array: innermost() compares it per thread, often

    def mask(self, pattern: re.Pattern) -> np.ndarray:
        """Ops whose name matches (evaluated once per distinct name)."""
        return name_matches(self.ops["name"], pattern)

    def innermost(self, ts: np.ndarray, tid: np.ndarray) -> np.ndarray:
        """Position of the innermost op on thread `tid` (compared as text) open at time `ts` (-1 if none)."""
        ts = np.asarray(ts, dtype=np.int64)
        out = np.full(len(ts), -1, dtype=np.int64)
        op_ts = self.ops["ts"].to_numpy(np.int64)
        op_end = self.ops["end"].to_numpy(np.int64)
        rows_of = self.rows_by_thread()
        for t, pts in _positions_by_text(np.asarray(tid)).items():  # threads are independent
            rows = rows_of.get(t)
            if rows is None:
                continue
            j = np.searchsorted(op_ts[rows], ts[pts], side="right") - 1
            cur = np.where(j >= 0, rows[np.clip(j, 0, None)], -1)
            # Walk up while the candidate closed before the point.
            for _ in range(int(self.depth.max(initial=0)) + 2):
                bad = (cur >= 0) & (op_end[np.clip(cur, 0, None)] <= ts[pts])
                if not bad.any():
                    break
                cur = np.where(bad, self.parent[np.clip(cur, 0, None)], cur)
            out[pts] = cur
        return out

    def rows_by_thread(self) -> dict[str, np.ndarray]:
        """Each thread's op positions (ascending), by the thread's text, made once per tree."""
        kept = self.__dict__.get("_rows_by_thread_kept")
        if kept is None:
            kept = self.__dict__["_rows_by_thread_kept"] = _positions_by_text(self.thread)
        return kept

    def nearest_ancestor(self, pos: np.ndarray, hit: np.ndarray, outermost: bool = False) -> np.ndarray:
        """For each position, the nearest (or outermost) ancestor-or-self where `hit` is True, else -1."""
        cur = np.asarray(pos, dtype=np.int64).copy()
        found = np.full(len(cur), -1, dtype=np.int64)
        at = np.arange(len(cur))  # the positions still walking up, and where each one is
        for _ in range(int(self.depth.max(initial=0)) + 2):
            live = cur >= 0
            at, cur = at[live], cur[live]
            if len(cur) == 0:
                break
            here = hit[cur]
            found[at[here]] = cur[here]
            if not outermost:  # the nearest is found: that position stops
                at, cur = at[~here], cur[~here]
            cur = self.parent[cur]
        return found


def _positions_by_text(values: np.ndarray) -> dict[str, np.ndarray]:
    """{str(value): its positions, ascending} (as `values.astype(str) == key` would find them),
    with each distinct value converted once."""
    if len(values) == 0:
        return {}
    if values.dtype.kind == "U" and (values == values[0]).all():  # one thread's points
        return {str(values[0]): np.arange(len(values))}
    codes, uniques = pd.factorize(values, use_na_sentinel=False)
    return _positions_by_code(codes, [str(u) for u in uniques.tolist()])


def _positions_by_code(codes: np.ndarray, names: list[str]) -> dict[str, np.ndarray]:
    """{names[code]: positions of the code, ascending}; codes whose names are equal are one key
    (7 and "7": one thread)."""
    order = np.argsort(codes, kind="stable")
    edges = np.searchsorted(codes[order], np.arange(len(names) + 1))
    out: dict[str, np.ndarray] = {}
    for i, key in enumerate(names):
        rows = order[edges[i]:edges[i + 1]]
        if len(rows) == 0:
            continue
        out[key] = np.sort(np.concatenate([out[key], rows])) if key in out else rows
    return out


def _used_names(names: pd.Series) -> pd.Series:
    """The names as a categorical of the names used, sorted (`astype(str).astype("category")`),
    without a string per row where the column is a sorted categorical of text already."""
    if isinstance(names.dtype, pd.CategoricalDtype) and names.cat.categories.dtype == "str" and names.cat.categories.is_monotonic_increasing and not names.hasnans:
        return names.cat.remove_unused_categories()
    return names.astype(str).astype("category")


def op_tree(frames: TraceFrames) -> OpTree:
    host = frames.host
    keep = (host["kind"] != "python").to_numpy() & ~name_matches(host["name"], STEP_NAME)
    cols = ["name", "tid", "ts", "end", "dur", "kind", "external_id", "call_stack", "input_dims", "input_types"]
    ops = host.loc[keep, cols + (["concrete_inputs"] if "concrete_inputs" in host else [])].reset_index(drop=True)
    ops["name"] = _used_names(ops["name"])
    tid_column = ops["tid"]
    n = len(ops)
    depth = np.zeros(n, dtype=np.int64)
    parent = np.full(n, -1, dtype=np.int64)
    prev = np.full(n, -1, dtype=np.int64)
    if isinstance(tid_column.dtype, pd.CategoricalDtype):  # each thread's name made once, its ops grouped by code
        codes = np.asarray(tid_column.array.codes, dtype=np.int64)
        names = [str(c) for c in tid_column.cat.categories.tolist()]
        codes = np.where(codes < 0, len(names), codes)
        ops["tid"] = pd.Series(np.array([*names, np.nan], dtype=object)[codes], dtype=object)  # the text, NaN where missing
        tids = np.array([*names, "nan"], dtype=str)[codes]
        by_thread = _positions_by_code(codes, [*names, "nan"])
    else:
        ops["tid"] = tid_column.astype(str)
        tids = ops["tid"].to_numpy().astype(str)
        by_thread = _positions_by_text(tids)
    for rows in by_thread.values():  # threads are independent; rows already in (ts asc, dur desc) order
        ts = ops["ts"].to_numpy(np.int64)[rows]
        end = ops["end"].to_numpy(np.int64)[rows]
        pos = np.arange(len(rows))
        # Ops open when op i starts: those before it in order that end after its start.
        d = pos - np.searchsorted(np.sort(end), ts, side="right") + (end == ts)
        d = np.maximum(d, 0)
        depth[rows] = d
        # Parent: the last op before i with depth d-1; previous sibling: the last op before i
        # with the same depth and the same parent.
        for level in sorted_unique(d):
            at = pos[d == level]
            if level > 0:
                above = pos[d == level - 1]
                k = np.searchsorted(above, at, side="left") - 1
                parent[rows[at]] = np.where(k >= 0, rows[above[np.clip(k, 0, None)]], -1)
        for level in sorted_unique(d):
            at = pos[d == level]
            if len(at) > 1:
                same = parent[rows[at[1:]]] == parent[rows[at[:-1]]]
                prev[rows[at[1:]]] = np.where(same, rows[at[:-1]], -1)
    tree = OpTree(ops=ops, parent=parent, prev_sibling=prev, depth=depth, thread=tids)
    tree.__dict__["_rows_by_thread_kept"] = by_thread
    return tree
