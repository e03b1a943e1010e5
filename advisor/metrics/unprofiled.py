"""The steps after the profiled window, from the facts file's step clock.

`advisor profile` times every step of the run, its wait for the DataLoader and its optimizer's
step, profiled or not. When the run goes on after the window (`--full`), the steps after it are the same work
without the profiler: comparing them with the window says how much the profiler itself
slowed the recorded steps (Python stack recording can cost more than a compiled step, and
then every host-side figure of the trace is inflated) and whether the window showed what
bounds the rest of the run (prefetched batches can hide a slow input pipeline).
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
import numpy as np

from advisor.facts import FactsFile, steps_as_run

MIN_UNPROFILED_STEPS = 3
NOTABLE_SLOWDOWN = 1.25


class ProfilerOverhead(msgspec.Struct, forbid_unknown_fields=True):
    """Median step times (ms) of the window and of the unprofiled steps after it, to 3 decimals."""

    window_median_ms: float
    unprofiled_median_ms: float
    unprofiled_steps: int
    slowdown: float


@dataclass(frozen=True)
class MeasuredOverhead:
    """The window against the unprofiled steps after it, unrounded."""

    window_median_ms: float
    unprofiled_median_ms: float
    unprofiled_steps: int

    @property
    def slowdown(self) -> float:
        return self.window_median_ms / self.unprofiled_median_ms

    def figures(self) -> ProfilerOverhead:
        return ProfilerOverhead(
            window_median_ms=round(self.window_median_ms, 3),
            unprofiled_median_ms=round(self.unprofiled_median_ms, 3),
            unprofiled_steps=self.unprofiled_steps,
            slowdown=round(self.slowdown, 3),
        )

    def note(self, with_stack: bool | None) -> str | None:
        """A warning when the window ran notably slower, or faster, than the same steps unprofiled."""
        if self.slowdown <= 1 / NOTABLE_SLOWDOWN:
            return (
                f"the {self.unprofiled_steps} unprofiled steps after the window were slower than the recorded ones (median "
                f"{self.unprofiled_median_ms:.1f} ms against {self.window_median_ms:.1f} ms): the window may not show what "
                "bounds the run later (prefetched batches running out, recompilation, other work on the machine)"
            )
        if self.slowdown < NOTABLE_SLOWDOWN:
            return None
        hint = " (record with `--no-stack` to shrink it)" if with_stack else ""
        return (
            f"the profiler slowed the recorded steps {self.slowdown:.1f}x: median {self.window_median_ms:.1f} ms against "
            f"{self.unprofiled_median_ms:.1f} ms for the {self.unprofiled_steps} unprofiled steps after the window, so host-side "
            f"times and savings in this report are inflated{hint}"
        )


@dataclass(frozen=True)
class UnprofiledSteps:
    """Per-step times (ms) of the window and of the unprofiled steps after it."""

    window_ms: np.ndarray
    step_ms: np.ndarray
    loader_wait_ms: np.ndarray | None  # aligned with step_ms; None in facts that lack it
    first: int = 0  # the run's step index of step_ms[0]
    optimizer_ms: np.ndarray | None = None  # aligned with step_ms: time in the optimizer's step; None in facts that lack it


def unprofiled_steps(recorded: FactsFile) -> UnprofiledSteps | None:
    """The steps after the window, when the facts hold at least 3 of them.

    The first step after the window is left out: the trace is written while it runs. A step
    the device clock timed (`device_step_times_ms`, CUDA runs) takes the device's time: the
    host's own clock swings around it on a device-bound run and runs ahead of it under CUDA
    graphs (advisor.capture.device_clock).
    """
    times, waits, profiled = recorded.step_times_ms, recorded.loader_wait_ms, recorded.profiled_steps
    updates = recorded.optimizer_step_ms
    if times is None or not profiled or max(profiled) >= len(times):
        return None
    times = steps_as_run(times, recorded.device_step_times_ms)
    first = max(profiled) + 2
    all_ms = np.asarray(times, dtype=np.float64)
    wait_ms = np.asarray(waits, dtype=np.float64) if waits is not None and len(waits) == len(times) else None
    update_ms = np.asarray(updates, dtype=np.float64) if updates is not None and len(updates) == len(times) else None
    after = all_ms[first:]
    if len(after) < MIN_UNPROFILED_STEPS or not np.isfinite(after).all() or (after <= 0).any():
        return None
    return UnprofiledSteps(
        all_ms[profiled], after, None if wait_ms is None else wait_ms[first:], first, None if update_ms is None else update_ms[first:]
    )


def profiler_overhead(recorded: FactsFile, window_median_ms: float | None = None) -> MeasuredOverhead | None:
    """Window vs after-window median step times (see unprofiled_steps); `window_median_ms`:
    the window's median as the trace times it (what the report shows), else the facts file's."""
    after = unprofiled_steps(recorded)
    if after is None:
        return None
    window = window_median_ms if window_median_ms is not None and window_median_ms > 0 else float(np.median(after.window_ms))
    return MeasuredOverhead(window, float(np.median(after.step_ms)), len(after.step_ms))


# Cores other processes kept busy, on average over the window, from which it is called noisy.
NOISY_OTHER_CORES = 0.5
# /proc counts CPU time in USER_HZ ticks, 100 a second on Linux.
PROC_TICK_S = 0.01


@dataclass(frozen=True)
class WindowOtherWork:
    """Other processes' CPU time during the profiled steps, in cores on average (`cores`), and
    the least of it /proc's ticks can tell from none over the window (`resolution`): each
    core's count and the script's own are read at the window's two ends, each off by up to a
    tick, while the samples between them cancel in the sum. A step of a few ms reads 0 or one
    whole tick over its time (1.4 cores for 7 ms); only the window's whole can say more."""

    cores: float
    resolution: float

    @property
    def noisy(self) -> bool:
        """Timed beside other work: at least half a core of it, beyond what the ticks resolve."""
        return self.cores - self.resolution >= NOISY_OTHER_CORES


def window_other_work(recorded: FactsFile) -> WindowOtherWork | None:
    """The facts file's `other_cpu_cores` (recorded per step by `advisor profile`) over the
    window: each step's figure weighted by its time (`step_times_ms`), so that the window's
    other CPU time is over its wall time; None when not recorded."""
    per_step, steps, times = recorded.other_cpu_cores, recorded.profiled_steps, recorded.step_times_ms
    if per_step is None or steps is None:
        return None
    got = [(per_step[k], times[k] if times is not None and k < len(times) else None) for k in steps if k < len(per_step) and per_step[k] is not None]
    if not got:
        return None
    if all(t is not None and t > 0 for _, t in got):
        window_s = sum(t for _, t in got) / 1e3
        cores = sum(c * t for c, t in got) / 1e3 / window_s
        resolution = ((recorded.cpu_count or 1) + 1) * PROC_TICK_S / window_s
    else:  # no step clock: their mean, at face value
        cores, resolution = sum(c for c, _ in got) / len(got), 0.0
    return WindowOtherWork(round(cores, 2), round(resolution, 2))


def noisy_window_note(recorded: FactsFile) -> str | None:
    """A note when the window was timed beside other work: its step and op times are inflated
    by waits for a core, the more so the more threads the training runs."""
    work = window_other_work(recorded)
    if work is None or not work.noisy:
        return None
    other, cores = work.cores, recorded.cpu_count
    of = f" of the {cores} cores" if cores is not None else ""
    return (
        f"the window was timed beside other work: other processes kept {other:.1f}{of} busy while it was recorded, so its "
        "step and op times include waits for a core (noisy); profile again on an idle machine to measure this run's own times"
    )


def noisy_window_caveat(recorded: FactsFile) -> str | None:
    """The noisy window's caveat in a few words, for the verdict beside the step figure it
    qualifies (`noisy_window_note` says it at length)."""
    work = window_other_work(recorded)
    if work is None or not work.noisy:
        return None
    other, cores = work.cores, recorded.cpu_count
    of = f" of {cores}" if cores is not None else ""
    return f"noisy window: other processes kept {other:.1f}{of} cores busy, so these times include waits for a core"
