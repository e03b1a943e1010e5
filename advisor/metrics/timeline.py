"""One rank's idle timeline: device activity, step windows and DataLoader spans as int64 ns
arrays, built once per rank (Metrics.shared) and read by every measurement of the host and
the device waiting on each other (advisor.metrics.host_device)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from advisor.load.trace import TraceFrames
from advisor.metrics.breakdown import (
    DATALOADER_NAME,
    name_matches,
)
from advisor.metrics.intervals import merge, overlap_with, subtract
from advisor.metrics.summary import Metrics


@dataclass
class Timeline:
    """One rank's device activity, step windows and DataLoader spans, as int64 ns arrays.

    `idle_s/e` is the device's idle time; `starved_s/e` the part of it that ends with work
    the host launched only after the device had gone idle (the device waited for the host,
    not for a dependency on another stream or rank). Both leave out the DataLoader spans
    when the DataLoader's exposed time is a share of the step at or above `loader_min_share`
    (the input pipeline's time, reported by `dataloader-stall`).
    """

    frames: TraceFrames
    metrics: Metrics
    busy_s: np.ndarray
    busy_e: np.ndarray
    step_s: np.ndarray  # device-stretched step windows (what a step costs)
    step_e: np.ndarray
    host_s: np.ndarray  # the host's ProfilerStep spans (where the loop's own calls are)
    host_e: np.ndarray
    loader_s: np.ndarray
    loader_e: np.ndarray
    idle_s: np.ndarray
    idle_e: np.ndarray
    starved_s: np.ndarray
    starved_e: np.ndarray

    @property
    def n_steps(self) -> int:
        return len(self.step_s)

    def in_host_steps(self, ts: np.ndarray) -> np.ndarray:
        return _in_windows(ts, self.host_s, self.host_e)

    def in_steps(self, ts: np.ndarray) -> np.ndarray:
        return _in_windows(ts, self.step_s, self.step_e)

    def step_index(self, ts: np.ndarray) -> np.ndarray:
        """Index of the (device-stretched) step holding each time, -1 outside all steps."""
        ts = np.asarray(ts, dtype=np.int64)
        idx = np.searchsorted(self.step_s, ts, side="right") - 1
        ok = idx >= 0
        ok[ok] &= ts[ok] < self.step_e[idx[ok]]
        return np.where(ok, idx, -1)

    def step_numbers(self, ts: np.ndarray) -> list[int]:
        idx = self.step_index(np.asarray(ts, dtype=np.int64))
        steps = self.metrics.steps["step"].to_numpy()
        return sorted({int(steps[i]) for i in idx if i >= 0})

    def idle(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """Device idle ns inside each window [lo, hi)."""
        lo = np.asarray(lo, dtype=np.int64)
        return overlap_with(self.idle_s, self.idle_e, lo, np.maximum(np.asarray(hi, dtype=np.int64), lo))

    def busy(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        lo = np.asarray(lo, dtype=np.int64)
        return overlap_with(self.busy_s, self.busy_e, lo, np.maximum(np.asarray(hi, dtype=np.int64), lo))

    def starved(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """Starved device idle ns inside each window [lo, hi)."""
        lo = np.asarray(lo, dtype=np.int64)
        return overlap_with(self.starved_s, self.starved_e, lo, np.maximum(np.asarray(hi, dtype=np.int64), lo))

    def blocking_cost(self, start: np.ndarray, end: np.ndarray, count_idle_during: bool = True) -> pd.DataFrame:
        """Per blocking host call [start, end): idle_during, busy_during, idle_after, cost (ns).

        idle_after is the starved idle time in the `busy_during` ns after the call: without
        the call the host would have been that much further ahead, and would have launched
        that work in time. cost = idle_during + idle_after, at most the call's duration. With
        count_idle_during=False (waits for the device: if the device idles while the host
        waits, what both wait for is elsewhere) cost = idle_after. The windows after the
        calls are clipped at the next call, so the costs of one set of calls add up.
        Columns after_start/after_end give each call's window after it.
        """
        start = np.asarray(start, dtype=np.int64)
        end = np.maximum(np.asarray(end, dtype=np.int64), start)
        idle_in = self.idle(start, end)
        busy_in = self.busy(start, end)
        big = np.iinfo(np.int64).max
        next_start = np.full(len(start), big, dtype=np.int64)
        if len(start) > 1:
            order = np.argsort(start, kind="stable")
            next_start[order[:-1]] = start[order[1:]]
        horizon = np.maximum(np.minimum(end + busy_in, next_start), end)
        after = self.starved(end, horizon)
        cost = after + (idle_in if count_idle_during else 0)
        return pd.DataFrame(
            {"idle_during": idle_in, "busy_during": busy_in, "idle_after": after, "cost": cost, "after_start": end, "after_end": horizon}
        )


def _in_windows(ts: np.ndarray, s: np.ndarray, e: np.ndarray) -> np.ndarray:
    ts = np.asarray(ts, dtype=np.int64)
    if len(s) == 0:
        return np.zeros(len(ts), dtype=bool)
    idx = np.searchsorted(s, ts, side="right") - 1
    ok = idx >= 0
    ok[ok] &= ts[ok] < e[idx[ok]]
    return ok


def _loader_exposed(m: Metrics, loader_min_share: float | None) -> bool:
    """Whether the DataLoader's exposed time is at least `loader_min_share` of the step (None: never)."""
    step_ms = m.mean_step_ns / 1e6
    return loader_min_share is not None and step_ms > 0 and m.breakdown_mean_ms["dataloader"] / step_ms >= loader_min_share


def timeline(m: Metrics, loader_min_share: float | None) -> Timeline:
    """The rank's idle timeline (shared by every rule that reads it).

    `loader_min_share` is `dataloader-stall`'s `min_share` as the user configured it: at or
    above it the DataLoader's time is the input pipeline's, not idle time another cause explains.
    """
    return m.shared(f"host_device.timeline.{loader_min_share}", lambda: _build_timeline(m, loader_min_share))


def _build_timeline(m: Metrics, loader_min_share: float | None) -> Timeline:
    f = m.frames
    dev = f.device
    busy_s, busy_e = merge(dev["ts"].to_numpy(np.int64), dev["end"].to_numpy(np.int64))
    host = f.host
    dl = host[name_matches(host["name"], DATALOADER_NAME)]
    if not _loader_exposed(m, loader_min_share):
        dl = dl.iloc[:0]  # not the input pipeline's share: its idle time is anyone's
    loader_s, loader_e = merge(dl["ts"].to_numpy(np.int64), dl["end"].to_numpy(np.int64))
    st = m.steps
    host_s = st["host_start"].to_numpy(np.int64) if "host_start" in st else st["start"].to_numpy(np.int64)
    host_e = st["host_end"].to_numpy(np.int64) if "host_end" in st else st["end"].to_numpy(np.int64)
    # Idle time between device activity over the steps, and whether the work after each gap
    # was launched late (after the device had gone idle).
    lo = min([int(x.min()) for x in (st["start"].to_numpy(np.int64), busy_s) if len(x)], default=0)
    hi = max([int(x.max()) for x in (st["end"].to_numpy(np.int64), busy_e) if len(x)], default=0)
    gap_s = np.concatenate([[lo], busy_e]).astype(np.int64)
    gap_e = np.concatenate([busy_s, [hi]]).astype(np.int64)
    starved = np.zeros(len(gap_s), dtype=bool)
    if len(busy_s):
        lk = m.launches
        first_launch = lk[lk["launch_ts"].notna()].groupby("ts")["launch_ts"].min()
        nxt = pd.Series(busy_s).map(first_launch).to_numpy(np.float64)
        starved[:-1] = np.isfinite(nxt) & (nxt >= gap_s[:-1])
    gap = gap_e > gap_s
    idle_s, idle_e = subtract(*merge(gap_s[gap], gap_e[gap]), loader_s, loader_e)
    starved_s, starved_e = subtract(*merge(gap_s[gap & starved], gap_e[gap & starved]), loader_s, loader_e)
    return Timeline(
        frames=f,
        metrics=m,
        busy_s=busy_s,
        busy_e=busy_e,
        step_s=st["start"].to_numpy(np.int64),
        step_e=st["end"].to_numpy(np.int64),
        host_s=host_s,
        host_e=host_e,
        loader_s=loader_s,
        loader_e=loader_e,
        idle_s=idle_s,
        idle_e=idle_e,
        starved_s=starved_s,
        starved_e=starved_e,
    )
