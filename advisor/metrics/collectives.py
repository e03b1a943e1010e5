"""Collectives per step, one rank at a time, and the waits they hide when the ranks are compared.

A collective kernel (NCCL all-reduce, all-gather, ...) starts on each rank when that rank's
stream reaches it and ends when every rank has contributed: its duration on one rank is the
transfer plus the time spent waiting for the last rank to arrive. The rank that arrives last
waits for no one, so for the same collective on every rank

    wait(rank) = duration(rank) - min over ranks of duration

and the rank with the shortest duration is the one the others waited for. Durations, not
timestamps, are compared: each trace counts time from its own first event and the hosts'
clocks are not aligned. The same holds for a step's collectives taken together, which is
what `job_waits` compares.

`rank_comm` measures one rank (it runs where the rank is loaded; a few kB come back);
`job_waits` compares the ranks (it runs on the reduce side, on those few kB).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from advisor.load.trace import TraceFrames
from advisor.metrics.breakdown import communication_kernels
from advisor.metrics.intervals import merge, overlap_with
from advisor.metrics.steps import step_of

COLLECTIVE_COLUMNS = ["step", "seq", "dur", "overlap"]
COMPUTE_COLUMNS = ["step", "kernels", "kernel_ns"]


@dataclass
class RankComm:
    """One rank's collectives and compute kernels, per step (times in ns).

    collectives: one row per collective kernel that starts inside a step: the step number,
    its position among the step's collectives on this rank (by start time), its duration and
    how much of it compute kernels ran alongside. compute: per step, the number and the
    summed duration of the other kernels.
    """

    collectives: pd.DataFrame
    compute: pd.DataFrame

    @property
    def has_collectives(self) -> bool:
        return len(self.collectives) > 0

    def per_step(self) -> pd.DataFrame:
        """step -> collective_ns, overlap_ns, collectives (count)."""
        c = self.collectives
        return c.groupby("step", sort=True).agg(collective_ns=("dur", "sum"), overlap_ns=("overlap", "sum"), collectives=("dur", "size"))

    def overlap_share(self) -> float | None:
        """Share of collective time during which compute kernels also ran (1 = fully hidden)."""
        total = int(self.collectives["dur"].sum())
        return float(self.collectives["overlap"].sum() / total) if total > 0 else None


def empty_comm() -> RankComm:
    return RankComm(
        pd.DataFrame({c: np.zeros(0, np.int64) for c in COLLECTIVE_COLUMNS}),
        pd.DataFrame({c: np.zeros(0, np.int64) for c in COMPUTE_COLUMNS}),
    )


def rank_comm(frames: TraceFrames, steps: pd.DataFrame) -> RankComm:
    """The collectives and compute kernels of each step of one rank."""
    dev = frames.device
    if len(dev) == 0 or len(steps) == 0:
        return empty_comm()
    is_kernel = (dev["kind"] == "kernel").to_numpy()
    comm = communication_kernels(frames)
    ts, te = dev["ts"].to_numpy(np.int64), dev["end"].to_numpy(np.int64)
    s_start, s_end = steps["start"].to_numpy(np.int64), steps["end"].to_numpy(np.int64)
    numbers = steps["step"].to_numpy(np.int64)

    compute = is_kernel & ~comm
    k_step = step_of(s_start, s_end, ts[compute])
    inside = k_step >= 0
    counts = np.bincount(k_step[inside], minlength=len(steps))
    busy = np.bincount(k_step[inside], weights=(te[compute] - ts[compute])[inside], minlength=len(steps))
    compute_table = pd.DataFrame({"step": numbers, "kernels": counts.astype(np.int64), "kernel_ns": busy.astype(np.int64)})

    cs, ce = ts[comm], te[comm]
    c_step = step_of(s_start, s_end, cs)
    keep = c_step >= 0
    cs, ce, c_step = cs[keep], ce[keep], c_step[keep]
    order = np.lexsort((cs, c_step))
    cs, ce, c_step = cs[order], ce[order], c_step[order]
    ks, ke = merge(ts[compute], te[compute])
    overlap = overlap_with(ks, ke, cs, ce) if len(cs) else np.zeros(0, np.int64)
    # Position of each collective among its step's collectives.
    first = np.searchsorted(c_step, c_step, side="left")
    seq = np.arange(len(c_step)) - first
    collectives = pd.DataFrame(
        {"step": numbers[c_step], "seq": seq.astype(np.int64), "dur": (ce - cs).astype(np.int64), "overlap": np.asarray(overlap, np.int64)}
    )
    return RankComm(collectives, compute_table)


@dataclass
class JobWaits:
    """The ranks compared step by step (ns; rows follow `ranks`, columns `steps`).

    collective: each rank's collective time in the step. wait: how much of it is waiting,
    the excess over the rank with the least (the one that arrived last). caused: time the
    job lost to each rank arriving last: how much sooner the step's collectives would have
    ended had the last rank arrived with the next-to-last (the second-least collective time
    less the least), charged to the last rank.
    """

    ranks: list[int]
    steps: np.ndarray
    collective: np.ndarray
    wait: np.ndarray
    caused: np.ndarray

    def mean_wait_ms(self) -> np.ndarray:
        return self.wait.mean(axis=1) / 1e6

    def mean_caused_ms(self) -> np.ndarray:
        return self.caused.mean(axis=1) / 1e6

    def row(self, rank: int) -> int:
        return self.ranks.index(rank)


def job_waits(comms: list[tuple[int, RankComm | None]]) -> JobWaits | None:
    """Waits and who caused them, over the steps every rank recorded. Step totals are compared,
    not single collectives: point-to-point traffic (pipeline send/recv) pairs ranks rather than
    syncing them all, and totals stay right for both. None with fewer than two ranks with
    collectives, or no step they share."""
    comms = [(r, c) for r, c in comms if c is not None and c.has_collectives]
    if len(comms) < 2:
        return None
    ranks = [r for r, _ in comms]
    totals = [c.collectives.groupby("step", sort=True)["dur"].sum() for _, c in comms]
    common = totals[0].index
    for t in totals[1:]:
        common = common.intersection(t.index)
    if len(common) == 0:
        return None
    common = common.sort_values()
    collective = np.vstack([t.loc[common].to_numpy(np.int64) for t in totals])
    shortest = collective.min(axis=0)
    wait = collective - shortest
    caused = np.zeros_like(collective)
    last = collective.argmin(axis=0)
    second = np.partition(collective, 1, axis=0)[1]
    caused[last, np.arange(len(common))] = second - shortest
    return JobWaits(ranks, common.to_numpy(np.int64), collective, wait, caused)
