"""Building blocks for the changes rules declare: each names the frame rows a fix touches.

A rule detects something (copies, syncs, kernels, spans) and says what its fix does to them;
these functions turn that into a `Change` over the rank's frame rows, so rules never index
the graph themselves.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from advisor.metrics.events import RankEvents
from advisor.metrics.breakdown import name_matches, text_of
from advisor.metrics.host_device import COPY_CALL, LAUNCH_CALL
from advisor.metrics.intervals import merge, overlap_with, subtract
from advisor.metrics.host_waits import host_wait_calls
from advisor.whatif.replay import Change

# A launch call that a CUDA graph or a compiled region replaces costs about this much of its time.
GRAPHED_CALL_SHARE = 0.1


def row_values(rows, values) -> dict[int, float]:
    """{row: value} of a change's per-row table, from arrays (a value for all, or one per row):
    tables over thousands of kernels are made without a Python number per element."""
    keys = np.asarray(rows, dtype=np.int64).tolist()
    if np.ndim(values) == 0:
        return dict.fromkeys(keys, float(values))
    return dict(zip(keys, np.asarray(values, dtype=np.float64).tolist(), strict=True))


def row_set(rows) -> set[int]:
    """The rows of a change's per-row set, from an array."""
    return set(np.asarray(rows, dtype=np.int64).tolist())


def device_rows_of(events: RankEvents, correlations) -> np.ndarray:
    """Rows of events.device with these correlation ids."""
    corr = np.asarray(correlations, dtype=np.int64)
    return np.nonzero(events.device["correlation"].isin(corr[corr >= 0]).to_numpy())[0]


def runtime_rows_of(events: RankEvents, correlations) -> np.ndarray:
    """Rows of events.runtime (the launch calls) with these correlation ids."""
    corr = np.asarray(correlations, dtype=np.int64)
    return np.nonzero(events.runtime["correlation"].isin(corr[corr >= 0]).to_numpy())[0]


def wait_calls_in(events: RankEvents, starts, ends) -> np.ndarray:
    """Rows of events.runtime that are wait calls (syncs, blocking copies) starting inside [start, end]."""
    rt = events.runtime
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    if len(starts) == 0:
        return np.zeros(0, dtype=np.int64)
    waits = np.nonzero(host_wait_calls(rt["name"]))[0]
    ts = rt["ts"].to_numpy(np.int64)[waits]
    order = np.argsort(starts)
    s, e = starts[order], ends[order]
    i = np.searchsorted(s, ts, side="right") - 1
    ok = i >= 0
    inside = np.zeros(len(ts), dtype=bool)
    inside[ok] = ts[ok] <= e[i[ok]]
    return waits[inside]


def unwait(events: RankEvents, starts, ends) -> Change:
    """The host no longer waits for the device in these windows (a sync removed, a copy made async)."""
    return Change(unwait=row_set(wait_calls_in(events, starts, ends)))


# What enqueueing an asynchronous copy costs the host (ns) where the trace has no copy call
# that returned before its copy ran: a pinned copy's cudaMemcpyAsync returns in 6-11 µs on an
# A100 (../shared/traces/corpus/a100_memcpy_pinned_10steps, 20 calls).
ASYNC_COPY_CALL_NS = 10_000.0


def async_copy_call_ns(events: RankEvents) -> float:
    """What a copy call costs the host when it does not wait for its copy: the median of the
    trace's copy calls that returned before their copy began (ASYNC_COPY_CALL_NS without one)."""
    rt, dev = events.runtime, events.device
    calls = rt[name_matches(rt["name"], COPY_CALL) & (rt["correlation"] >= 0)]
    ops = dev[dev["kind"] == "memcpy"]
    if len(calls) == 0 or len(ops) == 0:
        return ASYNC_COPY_CALL_NS
    start = ops.groupby("correlation")["ts"].min()
    op_ts = start.reindex(calls["correlation"].to_numpy(np.int64)).to_numpy(np.float64)
    returned_first = np.isfinite(op_ts) & (calls["end"].to_numpy(np.float64) <= op_ts)
    if not returned_first.any():
        return ASYNC_COPY_CALL_NS
    return float(np.median((calls["end"] - calls["ts"]).to_numpy(np.float64)[returned_first]))


def made_async(events: RankEvents, correlations, call_ns: float | None = None) -> Change:
    """Copies whose call held the host while the copy ran (from pageable memory the driver
    stages the bytes chunk by chunk, and the call returns with the last chunk) issued
    asynchronously instead: each copy call costs what enqueueing a copy costs (`call_ns`,
    default `async_copy_call_ns`), so the host runs ahead while the copy engine works."""
    rows = runtime_rows_of(events, correlations)
    rows = rows[name_matches(events.runtime["name"].iloc[rows], COPY_CALL)] if len(rows) else rows
    if len(rows) == 0:
        return Change()
    ns = async_copy_call_ns(events) if call_ns is None else float(call_ns)
    dur = (events.runtime["end"] - events.runtime["ts"]).to_numpy(np.float64)[rows]
    factor = np.clip(ns / np.maximum(dur, 1.0), 0.0, 1.0)
    return Change(call_scale=row_values(rows, factor), unwait=row_set(rows))


def scale_device(rows, factor) -> Change:
    """These device ops take `factor` of their time (an array or one number); 0 removes them."""
    rows = np.asarray(rows, dtype=np.int64)
    f = np.broadcast_to(np.asarray(factor, dtype=np.float64), rows.shape)
    return Change(device_scale=row_values(rows, f))


def scale_op_rows(kernel_index, kernel_row, n_rows: int, rows, factors) -> Change | None:
    """The kernels of the chosen rows of an op table run at `factors` of their time (kernel k
    belongs to table row kernel_row[k], -1 for none); None when none of those rows ran a kernel."""
    rows = np.asarray(rows, dtype=np.int64)
    factor_of_row = np.ones(n_rows)
    factor_of_row[rows] = factors
    chosen = np.isin(kernel_row, rows)
    if not chosen.any():
        return None
    return scale_device(np.asarray(kernel_index)[chosen], factor_of_row[kernel_row[chosen]])


def remove_launches(events: RankEvents, correlations) -> Change:
    """The device ops and their launch calls go away (zero_grad memsets with set_to_none)."""
    return Change(
        device_scale=row_values(device_rows_of(events, correlations), 0.0),
        call_scale=row_values(runtime_rows_of(events, correlations), 0.0),
    )


def fused(events: RankEvents, kernels: pd.DataFrame, fused_away: np.ndarray, kept: np.ndarray, kept_share: np.ndarray) -> Change:
    """Elementwise chains fused by a compiler: the kernels in `fused_away` (a mask over the
    kernel rows) and their launch calls go; the kept kernels at positions `kept` run at
    `kept_share` of their time (a generated batch norm at the memory's speed)."""
    rows = kernels.index.to_numpy()
    faster = kept_share < 1.0
    return Change.merge([
        remove_launches(events, events.device["correlation"].to_numpy(np.int64)[rows[fused_away]]),
        Change(device_scale=row_values(rows[kept][faster], kept_share[faster])),
    ])


def graphed(events: RankEvents, device_rows, host_windows=None, host_share: float = 0.0) -> Change:
    """Device ops issued as one graph or compiled region: back to back on their streams, their
    launch calls reduced to a small share, and (optionally) `host_share` of the host time in
    `host_windows` (the eager per-op dispatch) gone."""
    rows = np.asarray(device_rows, dtype=np.int64)
    corr = events.device["correlation"].to_numpy(np.int64)[rows]
    calls = runtime_rows_of(events, corr)
    calls = calls[name_matches(events.runtime["name"].iloc[calls], LAUNCH_CALL)] if len(calls) else calls
    change = Change(tight_launch=row_set(rows), call_scale=row_values(calls, GRAPHED_CALL_SHARE))
    if host_windows is not None and host_share > 0:
        s, e = host_windows
        change.host_remove.append((np.asarray(s, dtype=np.int64), np.asarray(e, dtype=np.int64), float(host_share)))
    return change


# Host time per kernel that a compiled region's generated code launches, without the
# profiler (ns): Inductor's Python wrapper prepares each kernel's arguments and grid and calls
# its launcher. Measured on sample_runs/resnet18_cifar/runs/gpu_compiled (host-bound, its
# unprofiled steps no faster than the window, so its window figures are not inflated): 17.0 ms
# of compiled-region host time per step for 317 kernel launches, 53.6 µs each
# (`benchmarks/compiled_host_cost.py` measures it again, and on the ViT runs as a cross-check).
COMPILED_HOST_NS_PER_KERNEL = 53_600.0


def compiled(events: RankEvents, device_rows, launch_ts, step_index, kept, exclude: tuple[np.ndarray, np.ndarray] | None = None,
             per_kernel_ns: float = COMPILED_HOST_NS_PER_KERNEL) -> Change:
    """Device ops issued by a compiled region's generated code instead of eager PyTorch.

    In each step the eager host time from the first to the last launch of these ops
    (`launch_ts`, ns; NaN where unknown; less the `exclude` windows: spans the region does not
    cover, such as the optimizer) goes: the per-op dispatch, the Python between ops and the
    launch calls. In its place each kept op (`kept`, a mask over `device_rows`; the others are
    fused away) costs `per_kernel_ns` of host time at its launch, a figure measured without
    the profiler, so never scaled. The ops run back to back on their streams."""
    rows = np.asarray(device_rows, dtype=np.int64)
    launch_ts = np.asarray(launch_ts, dtype=np.float64)
    calls = runtime_rows_of(events, events.device["correlation"].to_numpy(np.int64)[rows])
    change = Change(tight_launch=row_set(rows), call_scale=row_values(calls, 0.0))
    known = ~np.isnan(launch_ts)
    if not known.any():
        return change
    ts = launch_ts[known].astype(np.int64)
    span = pd.DataFrame({"step": np.asarray(step_index, dtype=np.int64)[known], "ts": ts}).groupby("step")["ts"].agg(["min", "max"])
    ws, we = merge(span["min"].to_numpy(np.int64), span["max"].to_numpy(np.int64) + 1)
    if exclude is not None and len(exclude[0]):
        ws, we = subtract(ws, we, *merge(np.asarray(exclude[0], dtype=np.int64), np.asarray(exclude[1], dtype=np.int64)))
    change.host_remove.append((ws, we, 1.0))
    issued = ts[np.asarray(kept, dtype=bool)[known]]
    change.host_add_unprofiled.append((issued, np.full(len(issued), float(per_kernel_ns))))
    return change


def added_work(events: RankEvents, ts, host_ns, device_ns=None) -> Change:
    """Work a fix adds (autocast's casts): `host_ns` of host time (window figures) at each host
    time `ts`, and `device_ns` on the stream of the first device op launched at or after it."""
    ts = np.asarray(ts, dtype=np.int64)
    change = Change(host_add=[(ts, np.asarray(host_ns, dtype=np.float64))])
    if device_ns is None or len(ts) == 0:
        return change
    dev = events.device
    rt = events.runtime
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


def host_work_share(events: RankEvents, steps: pd.DataFrame, starts, ends, fraction: float = 1.0) -> float:
    """Share of the steps' own host work (the host spans of the steps less the DataLoader's
    wait, which is measured on its own) that removing `fraction` of these windows takes away.
    A fix declares it as its `remainder_share`: window figures on both sides, so the
    profiler's inflation cancels."""
    from advisor.whatif.savings import dataloader_spans

    if len(steps) == 0:
        return 0.0
    hs = steps["host_start"].to_numpy(np.int64)
    he = np.maximum(steps["host_end"].to_numpy(np.int64), hs)
    ss, se = merge(hs, he)
    dl_s, dl_e = dataloader_spans(events)
    own_s, own_e = subtract(ss, se, dl_s, dl_e) if len(dl_s) else (ss, se)
    own = float((own_e - own_s).sum())
    if own <= 0:
        return 0.0
    ws, we = merge(np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64))
    removed = float(overlap_with(own_s, own_e, ws, we).sum()) * float(fraction)
    return min(max(removed / own, 0.0), 1.0)


# Warps one SM holds at once, by compute capability (CUDA C Programming Guide, "Technical
# Specifications per Compute Capability"): 64 on 7.0/8.0/9.0/10.0, 48 on 8.6/8.7/8.9/12.0,
# 32 on 7.5. Unknown devices take 64.
MAX_WARPS_PER_SM = {7.5: 32, 8.6: 48, 8.7: 48, 8.9: 48, 12.0: 48}


def _dims(values: pd.Series) -> np.ndarray:
    """Product of the kernel launch dimensions ("[288, 1, 64]" or a list); NaN where absent.
    Parsed once per distinct value: a run has a few hundred distinct grids."""
    codes, uniques = pd.factorize(values.map(lambda v: str(list(v)) if isinstance(v, (list, tuple, np.ndarray)) else v))
    prod = np.full(len(uniques) + 1, np.nan)
    for i, v in enumerate(uniques):
        parts = str(v).strip("[]() ").replace(",", " ").split()
        try:
            prod[i] = float(np.prod([float(p) for p in parts])) if parts else np.nan
        except ValueError:
            pass
    return prod[np.where(codes >= 0, codes, len(uniques))]


def batch_growth(events: RankEvents, rows, factor: float, capability: float | None) -> np.ndarray:
    """How much longer each of these kernels runs on `factor` times the rows (a larger batch).

    A kernel runs its blocks in waves: the SMs each hold a few blocks at once (the trace's
    occupancy says how many), and the last wave is often partly empty. With `factor` times
    the blocks the kernel needs ceil(factor × blocks / slots) waves instead of
    factor × ceil(blocks / slots): the partly empty tail is paid once, not `factor` times.
    Only kernels whose grid fills at least one wave are counted so (their grid follows the
    rows; a smaller grid may not, e.g. a reduction over the batch): the others, copies and
    kernels without launch dimensions grow `factor` times.
    """
    rows = np.asarray(rows, dtype=np.int64)
    dev = events.device
    out = np.full(len(rows), float(factor))
    need = {"grid", "block", "blocks_per_sm", "occupancy"}
    if len(rows) == 0 or not need <= set(dev.columns):
        return out
    sub = dev.iloc[rows]
    blocks = _dims(sub["grid"])
    warps = np.ceil(_dims(sub["block"]) / 32.0)
    per_sm = sub["blocks_per_sm"].to_numpy(np.float64)
    occupancy = sub["occupancy"].to_numpy(np.float64) / 100.0
    max_warps = MAX_WARPS_PER_SM.get(round(capability, 1), 64) if capability else 64
    with np.errstate(invalid="ignore", divide="ignore"):
        sms = np.round(blocks / per_sm)
        resident = np.floor(occupancy * max_warps / warps + 1e-6)
        slots = sms * resident
        ok = (text_of(sub["kind"]) == "kernel") & np.isfinite(slots) & (slots >= 1) & (blocks >= slots)
        waves = np.ceil(blocks / np.where(ok, slots, 1))
        grown = np.ceil(factor * blocks / np.where(ok, slots, 1))
    out[ok] = np.clip(grown[ok] / waves[ok], 1.0, factor)
    return out
