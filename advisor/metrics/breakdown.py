"""Step-time breakdown: each instant of a step counted once, in priority order.

Categories and priority follow the TensorBoard profiler plugin's overview so the numbers can
be cross-checked: kernel > memcpy > memset > communication > runtime > dataloader >
cpu_exec, and whatever no category covers is `other`. Each category's ranges are merged over
all threads and streams first. Unlike the plugin, runtime calls and DataLoader spans are
counted on current-schema traces too.
"""

from __future__ import annotations

import re
from typing import Any, Callable

import numpy as np
import pandas as pd

from advisor.load.trace import TraceFrames
from advisor.metrics.intervals import covers_bounds, merge, sorted_unique
from advisor.metrics.kernel_taxonomy import is_communication

CATEGORIES = ["kernel", "memcpy", "memset", "communication", "runtime", "dataloader", "cpu_exec", "other"]

DATALOADER_NAME = re.compile(r"^(enumerate\(DataLoader\)#.*\.__next__|enumerate\(DataPipe\)#.*)$")
# Host-side collective ops (their spans count as communication) and collective kernels.
COMM_OP_NAME = re.compile(r"^(nccl|gloo|rccl|c10d)[:_]", re.IGNORECASE)
COMM_KERNEL_NAME = re.compile(r"nccl|rccl|gloo", re.IGNORECASE)
STEP_NAME = re.compile(r"^ProfilerStep#\d+$")


# Tables worked out once per category index (which names match a pattern, the names as text):
# the frames' columns and every slice of them share one category index, and the metrics and
# rules ask the same of it again. Each table has one slot more than the index, for code -1.
_PER_CATEGORIES: dict[tuple[int, object], tuple[pd.Index, np.ndarray]] = {}
_PER_CATEGORIES_KEPT = 64


def _per_categories(cats: pd.Index, what: object, make) -> np.ndarray:
    key = (id(cats), what)
    kept = _PER_CATEGORIES.get(key)
    if kept is not None and kept[0] is cats:
        return kept[1]
    table = make(cats)
    if len(_PER_CATEGORIES) >= _PER_CATEGORIES_KEPT:
        _PER_CATEGORIES.clear()
    _PER_CATEGORIES[key] = (cats, table)  # the index is kept with its table, so its id is not reused
    return table


def _category_text(cats: pd.Index) -> np.ndarray:
    table = np.empty(len(cats) + 1, dtype=object)
    table[:-1] = [str(c) for c in cats]
    table[-1] = np.nan
    return table


def per_name(names: pd.Series, what: object, value_of: Callable[[str], Any], dtype: Any = object, missing: Any = None) -> np.ndarray:
    """value_of(name as text) for each name of a column, worked out once per distinct name;
    for a categorical column once per category, kept per category index under `what` (which
    names what value_of computes); `missing` where a name is missing."""
    def table(texts: list[str]) -> np.ndarray:
        out = np.empty(len(texts) + 1, dtype=dtype)
        out[:-1] = [value_of(t) for t in texts]
        out[-1] = missing
        return out

    if isinstance(names.dtype, pd.CategoricalDtype):
        made = _per_categories(names.cat.categories, what, lambda cats: table(_per_categories(cats, "text", _category_text)[:-1].tolist()))
        return made[names.array.codes]  # a missing name (code -1) reads the table's last slot
    codes, distinct = pd.factorize(np.asarray(names, dtype=object))
    return table([str(v) for v in distinct])[codes]


def name_matches(names: pd.Series, pattern: re.Pattern) -> np.ndarray:
    """Regex test over a column (categorical or not), evaluated once per distinct name."""
    return per_name(names, pattern, lambda t: pattern.search(t) is not None, dtype=bool, missing=False)


def name_group(names: pd.Series, pattern: re.Pattern) -> np.ndarray:
    """The pattern's first group in each name (`str.extract`), None where it does not match:
    an object array, each distinct name searched once."""
    def group(text: str) -> str | None:
        m = pattern.search(text)
        return m.group(1) if m else None

    return per_name(names, ("group", pattern), group)


def text_of(values: pd.Series) -> np.ndarray:
    """`values.astype(str).to_numpy()` (an object array, NaN where missing), for a categorical
    column converted once per distinct value instead of once per row."""
    if isinstance(values.dtype, pd.CategoricalDtype):
        table = _per_categories(values.cat.categories, "text", _category_text)
        return table[values.array.codes]  # a missing value (code -1) reads the last slot
    if values.dtype == object and pd.api.types.infer_dtype(values.to_numpy(), skipna=False) == "string":
        return values.to_numpy(dtype=object, copy=True)  # text already, none missing: no string made
    return values.astype(str).to_numpy()


def text_or_empty(values: pd.Series) -> np.ndarray:
    """The column as text, "" where missing (an object array of Python strings), without a
    string made per row where its values are categories or text already."""
    out = text_of(values) if isinstance(values.dtype, pd.CategoricalDtype) else values.to_numpy(dtype=object, copy=True)
    out[pd.isna(out)] = ""
    if pd.api.types.infer_dtype(out, skipna=False) == "string":
        return out
    return values.astype(object).where(values.notna(), "").astype(str).to_numpy()


def sorted_text_codes(values: pd.Series, missing: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Each row's position among the column's distinct texts in sorted order, and those texts:
    the groups of a `groupby` on the column as text, from one factorize of the column (its
    codes, for a categorical) and a string per distinct value, not per row. A missing value
    reads -1 (groupby leaves it out), or the text `missing` where one is given."""
    codes, uniques = pd.factorize(values)
    text = np.array([str(u) for u in uniques] + ([missing] if missing is not None else []), dtype=object)
    if missing is not None:
        codes = np.where(codes < 0, len(text) - 1, codes)
    if len(text) == 0:
        return codes, text
    distinct, inverse = np.unique(text, return_inverse=True)  # equal texts of distinct values (7 and "7") are one group
    return np.append(inverse.reshape(-1), -1)[codes], distinct


def row_groups(columns: list[np.ndarray]) -> np.ndarray:
    """One code per row for its tuple of values across `columns`, numbered in order of first
    appearance (as `pd.MultiIndex.from_arrays(columns).factorize()` numbers them, a missing
    value being one value of its own), without building a tuple per row: each column is
    factorized, and the codes are combined a column at a time."""
    n = len(columns[0]) if columns else 0
    key = np.zeros(n, dtype=np.int64)
    for c in columns:
        c = np.asarray(c)
        if c.dtype.kind in "iu" and n and int(c.max()) - int(c.min()) < 2**20:
            codes = c.astype(np.int64) - int(c.min())  # small integers (codes) are their own codes: one value, one number
        else:
            codes = pd.factorize(c, use_na_sentinel=True)[0].astype(np.int64) + 1  # a missing value: 0
        key = pd.factorize(key * (int(codes.max(initial=0)) + 1) + codes)[0].astype(np.int64)
    return key


def host_roles(frames: TraceFrames) -> np.ndarray:
    """Role of each host event (an object array, in the host frame's row order): dataloader,
    communication, cpu_exec, step, or none (python)."""
    host = frames.host
    role = np.full(len(host), "cpu_exec", dtype=object)
    role[name_matches(host["name"], COMM_OP_NAME)] = "communication"
    role[name_matches(host["name"], DATALOADER_NAME)] = "dataloader"
    role[name_matches(host["name"], STEP_NAME)] = "step"
    # Python frames (with_stack) span whole steps; like the plugin, they are not CPU exec.
    role[(host["kind"] == "python").to_numpy()] = "none"
    return role


def communication_kernels(frames: TraceFrames) -> np.ndarray:
    """Mask over device rows: kernels that are collectives or point-to-point transfers (by name:
    NCCL/RCCL/Gloo, or any communication the kernel taxonomy reads, DeepEP, NVSHMEM, symmetric
    memory, custom all-reduce, all-to-all kernels; or launched by a collective op)."""
    dev = frames.device
    is_kernel = (dev["kind"] == "kernel").to_numpy()
    by_name = name_matches(dev["name"], COMM_KERNEL_NAME) | per_name(dev["name"], "is_communication", is_communication, dtype=bool, missing=False)
    host = frames.host
    comm_ids = host.loc[name_matches(host["name"], COMM_OP_NAME), "external_id"]
    comm_ids = comm_ids[comm_ids >= 0].unique()
    by_op = dev["external_id"].isin(comm_ids).to_numpy() & (dev["external_id"] >= 0).to_numpy()
    return is_kernel & (by_name | by_op)


def category_ranges(frames: TraceFrames) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Merged (start, end) ranges of every category before priority is applied."""
    dev = frames.device
    comm = communication_kernels(frames)
    kind = dev["kind"].to_numpy()
    ts, end = dev["ts"].to_numpy(np.int64), dev["end"].to_numpy(np.int64)
    roles = host_roles(frames)
    hts, hend = frames.host["ts"].to_numpy(np.int64), frames.host["end"].to_numpy(np.int64)

    def pick(mask, s, e):
        return merge(s[mask], e[mask])

    comm_s = np.concatenate([ts[comm], hts[roles == "communication"]])
    comm_e = np.concatenate([end[comm], hend[roles == "communication"]])
    return {
        "kernel": pick((kind == "kernel") & ~comm, ts, end),
        "memcpy": pick(kind == "memcpy", ts, end),
        "memset": pick(kind == "memset", ts, end),
        "communication": merge(comm_s, comm_e),
        "runtime": merge(frames.runtime["ts"].to_numpy(np.int64), frames.runtime["end"].to_numpy(np.int64)),
        "dataloader": pick(roles == "dataloader", hts, hend),
        "cpu_exec": pick(roles == "cpu_exec", hts, hend),
    }


def step_breakdown(frames: TraceFrames, steps: pd.DataFrame) -> pd.DataFrame:
    """ns per category per step (rows: steps in order; columns: CATEGORIES; sum == duration)."""
    ranges = category_ranges(frames)
    s_start = steps["start"].to_numpy(np.int64)
    s_end = steps["end"].to_numpy(np.int64)
    bounds = [s_start, s_end] + [a for pair in ranges.values() for a in pair]
    b = sorted_unique(np.concatenate(bounds))
    lo, hi = b[:-1], b[1:]
    # Priority: the first category covering a segment takes it.
    cat = np.full(len(lo), len(CATEGORIES) - 1, dtype=np.int64)
    for i, name in reversed(list(enumerate(CATEGORIES[:-1]))):
        ms, me = ranges[name]
        cat[covers_bounds(b, ms, me)] = i
    idx = np.searchsorted(s_start, lo, side="right") - 1
    ok = idx >= 0
    ok[ok] &= lo[ok] < s_end[idx[ok]]
    n = len(steps)
    sums = np.bincount(idx[ok] * len(CATEGORIES) + cat[ok], weights=(hi - lo)[ok], minlength=n * len(CATEGORIES))
    out = pd.DataFrame(sums.reshape(n, len(CATEGORIES)).astype(np.int64), columns=CATEGORIES)
    out.index = pd.Index(steps["step"].to_numpy(), name="step")
    return out
