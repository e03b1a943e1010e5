"""Savings by replay: each finding's fix replayed alone, and all of them together.

Per rank: the step graph is built once, the host is scaled to the unprofiled step times when
the facts file has them (`calibrate`: the profiler's own cost must not become advice), and
that replay is the baseline every saving is measured from. A finding's saving is the
baseline minus the replay with its change; the headline is the replay with every change at
once, so savings never add up past what the run could reach. The result is a few numbers per
rank (`RankWhatIf`), small and picklable for per-rank workers.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Annotated, Any, Literal

import msgspec
import numpy as np

from advisor.facts import typed_facts
from advisor.metrics.breakdown import DATALOADER_NAME, name_matches, text_of
from advisor.metrics.host_device import OPTIMIZER_STEP_SPAN
from advisor.metrics.intervals import merge
from advisor.metrics.one_time import cold_window
from advisor.metrics.unprofiled import unprofiled_steps
from advisor.units import saved_text
from advisor.whatif.graph import CALL, MARK_END, MARK_START, StepGraph, build_graph
from advisor.whatif.replay import Change, calibrate, replay_graph, replay_nodes


NonNegative = Annotated[float, msgspec.Meta(ge=0)]


class RankWhatIf(msgspec.Struct, forbid_unknown_fields=True):
    """A rank's step replayed (advisor.whatif): ms per step, medians; the JSON report's `whatif` is the slowest rank's."""

    rank: int
    measured_ms: NonNegative  # the window's median step (its mean where `statistic` is "mean")
    baseline_ms: NonNegative  # the replayed median step everything is measured from
    host_scale: NonNegative  # 1.0, or the host scale that takes the profiler's cost out
    loader_scale: NonNegative  # the DataLoader's scale to the unprofiled steps' wait for their batch
    remainder_ms: NonNegative  # what neither the scaled host nor the device explains, kept per step
    untimed_host_ms: NonNegative  # host time per step the trace does not show, replayed after its longest wait
    unprofiled_ms: NonNegative | None  # the unprofiled steps after the window, if recorded: their median (mean where `statistic` is)
    all_fixes_ms: NonNegative | None  # replayed with every modelled fix together
    # Without unprofiled steps: the profiler's host cost estimated from the trace (see
    # `profiler_cost`): the host scales of its high and low end and the replayed steps at them.
    scale_range: list[NonNegative] | None
    baseline_range_ms: list[NonNegative] | None
    fixes: list[str]  # rules whose fixes the headline replays
    savings: dict[str, NonNegative]  # rule -> replayed saving alone
    # "median", or "mean" where slow steps recur (see `recurring_slow_steps`): throughput is
    # the mean step, and a cost that hits a share of the steps is a cost per step on average.
    statistic: Literal["median", "mean"]
    # Where one-time work was taken out of the steps (the replay stands on that projection):
    # the window's step as measured, with it (the same statistic), which the headline states
    # and every saving's share is taken of; None where nothing was taken out.
    headline_ms: NonNegative | None = None
    # A CPU run's optimizer step scaled to its unprofiled steps' time in it (None: not timed,
    # or a run with a device, where host_scale holds for it too).
    optimizer_scale: NonNegative | None = None

    def to_dict(self) -> dict[str, Any]:
        """The replay as the JSON report writes it."""
        return msgspec.to_builtins(self)

    @property
    def all_fixes_saving_ms(self) -> float | None:
        return None if self.all_fixes_ms is None else max(self.baseline_ms - self.all_fixes_ms, 0.0)

    def headline(self, projected: bool = False, noisy: bool = False) -> str:
        """One line for the reports: measured step, replayed step, the step with every fix
        replayed (its saving from the replayed step, the same statistic). `projected`: the
        replay's steps are the window's without one-time work (metrics.summary.ProjectedWindow),
        and the line says so rather than "measured". `noisy`: the window was timed beside other
        work, where no estimate from the host events is the profiler's cost."""
        measured = "without one-time work (a projection)" if projected else "measured"
        out = f"{measured} {self.measured_ms:.2f} ms (window median)"
        if self.statistic == "mean":
            out = (f"{measured} {self.measured_ms:.2f} ms (window mean: slow steps recur, and throughput is the mean step; "
                   "every replayed figure is a mean)")
        if self.unprofiled_ms is not None and abs(self.baseline_ms - self.measured_ms) > 0.005 * self.measured_ms:
            if self.statistic == "mean":
                out += (f", replayed {self.baseline_ms:.2f} ms with host time ×{self.host_scale:.2f} to match the typical (median) "
                        f"unprofiled step (the unprofiled steps' mean is {self.unprofiled_ms:.2f} ms)")
            else:
                out += f", replayed {self.baseline_ms:.2f} ms with host time ×{self.host_scale:.2f} to match the unprofiled steps ({self.unprofiled_ms:.2f} ms)"
            if self.untimed_host_ms > 0.005:
                out += f", {self.untimed_host_ms:.2f} ms of it host time the trace does not show (replayed after each step's longest wait on the device)"
            if self.remainder_ms > 0.005:
                out += f", {self.remainder_ms:.2f} ms of which neither the host nor the device explains"
        elif self.unprofiled_ms is None and noisy:
            out += (
                f", replayed {self.baseline_ms:.2f} ms with host time ×{self.host_scale:.2f}: the profiler's own cost is not known on this "
                "noisy window (an estimate from its host events cannot tell it from the waits for a core), and no unprofiled steps "
                "were recorded to measure it (`advisor profile` times at least 5 after the window unless `--after-steps 0`)"
            )
        elif self.unprofiled_ms is None and self.scale_range is not None and self.baseline_range_ms is not None:
            lo, hi = self.baseline_range_ms
            out += (
                f", replayed {self.baseline_ms:.2f} ms (range {lo:.2f}–{hi:.2f}) with host time ×{self.host_scale:.2f} "
                f"(×{self.scale_range[0]:.2f}–×{self.scale_range[1]:.2f}): the profiler's own cost estimated from the host events it "
                "recorded, as no unprofiled steps were recorded (`advisor profile` times them after the window unless `--after-steps 0`)"
            )
        elif self.unprofiled_ms is None:
            out += ", host times as profiled, the profiler's own cost in them (no unprofiled steps to calibrate them)"
        saved = self.all_fixes_saving_ms
        if saved is not None:
            n = len(self.fixes)
            out += (
                f"; with the {n} replayed fix{'es' if n != 1 else ''} together: {self.all_fixes_ms:.2f} ms "
                f"({saved_text(saved, self.baseline_ms)} of the replayed {self.baseline_ms:.2f} ms)"
            )
        return out


# Slow steps recur where at least this many steps, and this share of them, take over
# SLOW_STEP times the median: the replay then prices the mean step.
RECURRING_SLOW_STEPS = 2
RECURRING_SLOW_SHARE = 0.2
SLOW_STEP = 1.5


def recurring_slow_steps(durations) -> bool:
    """Whether slow steps recur (a DataLoader stall every other step), rather than one cold
    step: at least RECURRING_SLOW_STEPS steps, and RECURRING_SLOW_SHARE of them, over
    SLOW_STEP times the median."""
    d = np.asarray(durations, dtype=np.float64)
    if len(d) < 3:
        return False
    slow = int((d > SLOW_STEP * np.median(d)).sum())
    return slow >= RECURRING_SLOW_STEPS and slow >= RECURRING_SLOW_SHARE * len(d)


# A run of more steps than this is replayed on the block of this many consecutive steps whose
# measured median is closest to the run's: the replay's cost stops growing with the trace.
MAX_REPLAY_STEPS = 8

# Without unprofiled steps, a window whose device is busy at most HOST_BOUND of the step is
# the host's; the profiler-cost estimate may not make the device busy more than DEVICE_BOUND
# of the replayed step: the verdict (which side holds the step) would then be the estimate's.
HOST_BOUND = 0.5
DEVICE_BOUND = 0.5

# Largest share of the unprofiled step left unexplained (a fixed remainder) before the
# calibration lets the host explain the step instead.
MAX_REMAINDER_SHARE = 0.5
# How close the replay with the unexplained time as host time must come to the unprofiled step.
STEP_HOST_FIT = 0.003


# Secant steps host_shorter_by takes at most to find the host scale.
HOST_SHORTER_STEPS = 4


class RankReplay:
    """One rank's graph and calibrated baseline, built on first use (shared by the rules)."""

    def __init__(self, metrics, facts: dict[str, Any] | None):
        self.metrics = metrics
        self.facts = facts
        self._graph: StepGraph | None = None
        self._scale: float | None = None
        self._baseline: float | None = None
        self._unprofiled: float | None = None
        self._unprofiled_mean: float | None = None
        self._base: Change | None = None
        self.loader_scale: float = 1.0
        self.optimizer_scale: float | None = None  # the optimizer step's own scale (CPU runs with it timed)
        self.remainder_ms: float = 0.0
        self.step_host_ms: float = 0.0  # unprofiled host time placed at each step's start
        self._rows: tuple[np.ndarray, np.ndarray] | None = None  # calls and device ops of a replayed block
        self._replayed: dict[int, tuple[Change, float]] = {}
        # id(change) -> (change, the change cut to the replayed block); ids of merged changes -> (changes, merge)
        self._cut: dict[int, tuple[Change, Change]] = {}
        self._merged: dict[tuple[int, ...], tuple[list[Change], Change]] = {}
        self.scale_range: list[float] | None = None  # host scales at the profiler cost estimate's high and low end
        # id(change) -> (change, ms, what): the step a fix leaves at least (see `leaves`)
        self._leaves: dict[int, tuple[Change, float, str]] = {}
        # id(change) -> (change, why): the bound that capped a change's replayed saving
        self._capped: dict[int, tuple[Change, str]] = {}
        self._gain_capped: dict[int, tuple[Change, str]] = {}  # the same, on top of the fixes above it
        self._removable: dict[tuple[int, int], tuple[Change, Change | None, tuple[float, list[tuple[str, float]]]]] = {}
        self._nodes: dict[int, tuple[Change | None, tuple]] = {}  # id(fixes above) -> their replay's nodes

    @property
    def available(self) -> bool:
        m = self.metrics
        return getattr(self, "_detached", False) or (hasattr(m.frames, "runtime") and len(m.steps) > 0)

    def detached(self) -> "RankReplay":
        """This replay without the rank's frames: its graph, calibrated baseline and summary
        built first, so that it replays any change of the rank's rows after the frames are gone."""
        import copy

        from advisor.metrics.summary import without_frames

        _ = self.graph, self.base, self.baseline_ms
        out = copy.copy(self)
        out.metrics = without_frames(self.metrics)
        out._replayed = {}  # the rules' replays are settled: not carried
        out._cut, out._merged = {}, {}
        out._leaves, out._capped, out._gain_capped, out._removable, out._nodes = dict(self._leaves), {}, {}, {}, {}
        out._detached = True
        return out

    @property
    def graph(self) -> StepGraph:
        if self._graph is None:
            self._graph, self._rows = sampled_graph(self.metrics.frames, self.metrics.steps)
        return self._graph

    @property
    def first_step(self) -> int:
        """Row in metrics.steps of the graph's first step (0 unless a block of a long run is replayed)."""
        return replayed_block(self.metrics.steps).start

    def in_block(self, change: Change) -> Change:
        """The change cut to the calls and device ops of the replayed block (a whole run: as it
        is), once per change object. Every replay cuts its changes so: a row outside the block
        changes no replay, and a change kept cut (a stored view's) replays as the whole one."""
        _ = self.graph
        if self._rows is None:
            return change
        seen = self._cut.get(id(change))
        if seen is not None and seen[0] is change:
            return seen[1]
        out = self._cut_to_block(change)
        self._cut[id(change)] = (change, out)
        return out

    def _cut_to_block(self, change: Change) -> Change:
        rt_in, dev_in = self._rows
        return replace(
            change,
            call_scale=_rows_in(change.call_scale, rt_in),
            unwait=_set_in(change.unwait, rt_in),
            device_scale=_rows_in(change.device_scale, dev_in),
            device_add=_rows_in(change.device_add, dev_in),
            tight_launch=_set_in(change.tight_launch, dev_in),
        )

    @property
    def base(self) -> Change:
        """The profiler's cost taken out: the DataLoader spans at the unprofiled steps' own
        wait for their batch, every other host gap and call scaled by one factor (see
        `calibrate`); what still separates that replay from the unprofiled median step is
        kept as a fixed remainder per step. The device is never scaled."""
        if self._base is None:
            after = unprofiled_steps(typed_facts(self.facts))
            base = Change()
            if after is not None:
                self._unprofiled = float(np.median(after.step_ms))
                self._unprofiled_mean = float(np.mean(after.step_ms))
                dl_s, dl_e = dataloader_spans(self.metrics.frames)
                window_wait = float((dl_e - dl_s).sum()) / max(len(self.metrics.steps), 1) / 1e6
                if after.loader_wait_ms is not None and window_wait > 0:
                    self.loader_scale = min(float(np.median(after.loader_wait_ms)) / window_wait, 1.0)
                # A CPU run's optimizer step at its own unprofiled time, measured rather than
                # assumed to shrink with the rest of the host: the profiler's cost per ms differs
                # between a loop of small ops and the model's large ones (on AdvisorBench's
                # tabular_optimizer, x0.60 to x0.67 against x0.57 to x0.58 for the rest).
                # (On a device, the host's step can hold waits for the launch queue.)
                op_s, op_e = optimizer_step_spans(self.metrics.frames)
                window_update = float((op_e - op_s).sum()) / max(len(self.metrics.steps), 1) / 1e6
                if after.optimizer_ms is not None and window_update > 0 and len(self.graph.d_dur) == 0:
                    self.optimizer_scale = min(float(np.median(after.optimizer_ms)) / window_update, 1.0)

                def build(scale: float) -> Change:
                    c = Change(host_scale=scale)
                    if len(dl_s):  # DataLoader time at loader_scale of its window figure, whatever the host scale
                        c.host_own.append((dl_s, dl_e, self.loader_scale))
                    if self.optimizer_scale is not None:
                        c.host_own.append((op_s, op_e, self.optimizer_scale))
                    return c

                # Without device work nothing can hide the host: the scale that meets the
                # unprofiled step is the only reading (the fastest host is for a device that may bound it).
                base = build(calibrate(self.graph, self._unprofiled, build, fastest=len(self.graph.d_dur) > 0))
                # What the scaled host and the device do not explain (the replay of the
                # fastest host still short of the unprofiled step) stays as it is per step,
                # unless that is a large part of the step: then the host is the likelier
                # cause (autocast's casts, a compiled graph's guards), scaled to explain it all.
                rest = self._unprofiled - replay_graph(self.graph, base).median_ms
                if rest > MAX_REMAINDER_SHARE * self._unprofiled:
                    base = build(calibrate(self.graph, self._unprofiled, build, fastest=False))
                    rest = self._unprofiled - replay_graph(self.graph, base).median_ms
                base, rest = self._as_step_host_time(base, max(rest, 0.0))
                self.remainder_ms = rest
            else:
                cost = profiler_cost(self.metrics, self.graph, self.metrics.steps.iloc[replayed_block(self.metrics.steps)])
                if cost is not None:
                    cost = self._host_bound_kept(cost)
                    base = Change(host_scale=cost[1])
                    self.scale_range = [cost[0], cost[2]]
            self._base = base
        return self._base

    def _host_bound_kept(self, cost: tuple[float, float, float]) -> tuple[float, float, float]:
        """The profiler-cost scales, unless they turn a window the host holds (the device busy
        at most HOST_BOUND of the measured step) into one the device holds (busy more than
        DEVICE_BOUND of the replayed step): an estimate, not a measurement, must not decide
        that verdict. Then the least host time is taken out that keeps the host's reading
        (the estimate's low end, else none), and a note says so."""
        m = self.metrics
        if len(m.steps) == 0 or len(self.graph.d_dur) == 0:
            return cost
        util = m.utilization.to_numpy(np.float64)
        dur_ms = m.steps["duration"].to_numpy(np.float64) / 1e6
        if len(util) != len(dur_ms) or float(np.median(util)) > HOST_BOUND:
            return cost
        busy_ms = float(np.median(util * dur_ms))

        def device_bound(scale: float) -> bool:
            return busy_ms > DEVICE_BOUND * replay_graph(self.graph, Change(host_scale=scale)).median_ms

        if not device_bound(cost[1]):
            return cost
        kept = cost[2] if not device_bound(cost[2]) else 1.0
        m.notes.append(
            f"the profiler's own cost estimated from the recorded host events (host time ×{cost[1]:.2f}) would make the "
            f"device, busy {float(np.median(util)):.0%} of the measured step, hold the replayed step: without unprofiled steps "
            f"to measure it, the host-bound reading is kept (host time ×{kept:.2f}); `advisor profile --full` records them"
        )
        return (min(kept, cost[0]) if kept < 1.0 else 1.0, kept, kept)

    def _as_step_host_time(self, base: Change, rest_ms: float) -> tuple[Change, float]:
        """Place the unexplained time as host time in each step, if that replays to the
        unprofiled step; else keep it as a fixed remainder per step.

        Time the trace does not show is most likely the loop's own Python (the profiler times
        operators and runtime calls, not the loop around them: printing a loss, logging, the
        iteration itself). It is placed where the host resumes after its longest wait on the
        device in each step (a `.item()`, a synchronize), or at the step's start when it never
        waits: on the step's path while the host catches up with the device every step, and
        hidden by a fix that lets the host run ahead, as on the real run. Placed there it must
        reproduce the unprofiled median (within STEP_HOST_FIT); where it cannot (the device
        bounds the step), it stays a fixed remainder.
        """
        if rest_ms <= 0.005 or self._unprofiled is None:
            return base, rest_ms
        nodes = resume_nodes(self.graph, base)
        if len(nodes) == 0:
            return base, rest_ms
        target = self._unprofiled
        added = rest_ms
        for _ in range(4):
            trial = Change.merge([base, Change(untimed_host={int(n): added * 1e6 for n in nodes})])
            got = replay_graph(self.graph, trial).median_ms
            if abs(got - target) <= STEP_HOST_FIT * target:
                self.step_host_ms = added
                return trial, 0.0
            added += target - got
            if added <= 0 or added > 2 * rest_ms:
                break
        return base, rest_ms

    @property
    def host_scale(self) -> float:
        return self.base.host_scale

    @property
    def measured_host_scale(self) -> float | None:
        """The host scale the unprofiled steps measured (None where it is estimated from the
        trace's events, or there is none)."""
        base = self.base
        return base.host_scale if self._unprofiled is not None else None

    @functools.cached_property
    def statistic(self) -> str:
        """"mean" where slow steps recur in the window (throughput is the mean step), else
        "median". Asked at every replay: worked out once (the steps do not change)."""
        return "mean" if recurring_slow_steps(self.metrics.steps["duration"].to_numpy(np.float64)) else "median"

    def _of(self, result) -> float:
        return result.mean_ms if self.statistic == "mean" else result.median_ms

    @property
    def baseline_ms(self) -> float:
        if self._baseline is None:
            self._baseline = self._of(replay_graph(self.graph, self.base)) + self.remainder_ms
        return self._baseline

    def merged(self, changes: list[Change]) -> Change:
        """`Change.merge(changes)` as the replay takes it: each change cut to the replayed block
        first (the same rows and values as the merge cut afterwards), so a fix's tables over a
        long run are not merged whole; the same list of change objects gives the same merge
        object, whose replay is then not repeated (`replayed_ms`)."""
        key = tuple(id(c) for c in changes)
        seen = self._merged.get(key)
        if seen is not None and all(a is b for a, b in zip(seen[0], changes, strict=True)):
            return seen[1]
        if len(changes) > 2:  # the merge of all but the last continued (the greedy ranking's rounds share it)
            out = Change.merge([self.in_block(changes[-1])], onto=self.merged(changes[:-1]))
        else:
            out = Change.merge([self.in_block(c) for c in changes])
        self._merged[key] = (list(changes), out)
        floors = [self._leaves[id(c)] for c in changes if id(c) in self._leaves and self._leaves[id(c)][0] is c]
        if floors:  # the fixes together leave at least what the one that leaves most does
            _, ms, what = max(floors, key=lambda t: t[1])
            self._leaves[id(out)] = (out, ms, what)
        if self._rows is not None:
            self._cut[id(out)] = (out, out)  # already cut
        return out

    def replayed_ms(self, change: Change) -> float:
        """The replayed step with `change` (ms); a change replayed before (the same object: a
        rule's replayed saving, then the engine's) is not replayed again."""
        seen = self._replayed.get(id(change))
        if seen is not None and seen[0] is change:
            return seen[1]
        out = self._bounded(change, self._replayed_ms(change))
        self._replayed[id(change)] = (change, out)
        return out

    # --- the bounds every replayed saving keeps (one place: every saving, alone, together
    # or on top of other fixes, is the baseline minus `replayed_ms`) ---------------------------

    def loader_scale_of_base(self) -> float:
        """The DataLoader's scale in the baseline (its unprofiled wait against the window's),
        once the baseline is calibrated."""
        _ = self.base
        return self.loader_scale

    def leaves(self, change: Change, ms: float, what: str) -> None:
        """Say that the step with `change` is never below `ms` (replayed units, per step): the
        work the fix leaves on the step's path (`what`: loading L ms with n workers, L/n)."""
        if ms > 0:
            self._leaves[id(change)] = (change, float(ms), what)

    def capped_by(self, change: Change, on_top: bool = False) -> str | None:
        """Which bound capped the change's replayed saving (last on top of other fixes, else
        alone; `on_top`: only on top of them), in words; None where none did."""
        for capped in (self._gain_capped,) if on_top else (self._gain_capped, self._capped):
            seen = capped.get(id(change))
            if seen is not None and seen[0] is change:
                return seen[1]
        return None

    def _bounded(self, change: Change, replayed: float) -> float:
        """The replayed step with `change`, never shorter than the baseline less what the change
        removes (`removable`), nor than the work it leaves (`leaves`); the bound that capped it
        is kept for the finding's message (`capped_by`)."""
        if self._is_base(change) or len(self.graph.step_ids) == 0:
            return replayed
        base = self.baseline_ms
        removed, parts = self.removable(change)
        least = base - removed
        why = None
        if replayed < least - BOUND_SLACK_MS:
            said = ", ".join(f"{what} {ms:.2f}" for what, ms in parts if ms >= 0.005) or "nothing in the window"
            why = (f"capped at the {removed:.2f} ms per step of what the fix changes in the window ({said} ms): "
                   f"the replay gave {base - replayed:.2f} ms")
            replayed = least
        floor = self._leaves.get(id(change))
        if floor is not None and floor[0] is change and replayed < floor[1] - BOUND_SLACK_MS:
            why = (f"capped at the step the fix leaves: {floor[2]} ({floor[1]:.2f} ms per step); the replay gave a "
                   f"{replayed:.2f} ms step")
            replayed = floor[1]
        if why is not None:
            self._capped[id(change)] = (change, why)
        return replayed

    def _waits_on(self, on: Change | None, before_window: np.ndarray) -> np.ndarray:
        """Per host node, how long it waits on the window's device work in the replay of the
        baseline with `on` (the fixes ranked above; None: the baseline alone), in ns: from when
        its own cost is done, or the device work queued before the window (`before_window`, a
        mask of device ops) is, whichever is later, to its end."""
        key = id(on)
        seen = self._nodes.get(key)
        if seen is None or seen[0] is not on:
            seen = (on, replay_nodes(self.graph, self.base if on is None else self.with_base(on)))
            self._nodes[key] = seen
        start, end, _, d_end = seen[1]
        g = self.graph
        ready = start + g.h_base * self.base.host_scale * (1.0 if on is None else on.host_scale)
        if before_window.any():
            ready = np.maximum(ready, float(np.max(d_end[before_window])))
        waits = np.clip(end - ready, 0, None)
        return np.where(np.diff(g.wait_ptr) > 0, waits, 0.0)

    def gain_ms(self, before_ms: float, together: Change, change: Change, above: Change | None = None) -> float:
        """What `change` saves on top of a step of `before_ms` (the replay of `above`, the fixes
        ranked above it): that step less the replay of `together` (those fixes and this one),
        never past what the change itself removes there (`removable`, its waits as long as the
        replay with `above` holds them); the bound that capped it is kept for its message."""
        gain = before_ms - self.replayed_ms(together)
        removed, parts = self.removable(change, above)
        if gain > removed + BOUND_SLACK_MS:
            said = ", ".join(f"{what} {ms:.2f}" for what, ms in parts if ms >= 0.005) or "nothing in the window"
            self._gain_capped[id(change)] = (change, f"capped at the {removed:.2f} ms per step of what the fix changes in the window ({said} ms): "
                                                     f"the replay gave {gain:.2f} ms on top of the fixes above it")
            return removed
        self._gain_capped.pop(id(change), None)
        return gain

    def _is_base(self, change: Change) -> bool:
        return change is self._base

    def removable(self, change: Change, above: Change | None = None) -> tuple[float, list[tuple[str, float]]]:
        """The most `change` can take off the replayed step (ms), and its parts: the device work
        it removes or shortens, the launch gaps it closes, the host calls and host time it takes
        off, the waits it removes on work the window launched, and its share of the host time
        the trace does not show. Each is counted in the step of the window it falls in; the
        bound is their mean over the replayed steps where the replay prices the mean step, and
        the largest step's where it prices the median. Never time outside the window: device
        work queued before the first step (a wait on it is no wait a fix of the step removes),
        nor, in a window whose every step holds one-time work, the host's first-call time; never
        work the trace does not show beyond the unexplained time the calibration placed. A
        larger batch (`per_sample`) spreads at most the whole step over its samples. `above`:
        the fixes ranked above it, on whose replay its waits are measured (None: the baseline)."""
        key = (id(change), id(above))
        seen = self._removable.get(key)
        if seen is not None and seen[0] is change and seen[1] is above:
            return seen[2]
        out = self._removable_of(change, above)
        self._removable[key] = (change, above, out)
        return out

    def _removable_of(self, change: Change, above: Change | None) -> tuple[float, list[tuple[str, float]]]:
        g = self.graph
        n = len(g.step_ids)
        names = ("device work", "launch gaps", "host time", "waits on the window's device work", "host time the trace does not show")
        if n == 0:
            return 0.0, [(name, 0.0) for name in names]
        per = np.zeros((len(names), n))  # ns removed, per part and step
        block = self.in_block(change)
        starts = g.step_host_start.astype(np.int64)
        lo, hi = int(min(starts.min(), g.step_start.min())), int(g.step_end.max())
        in_window = (g.h_ts >= lo) & (g.h_ts <= hi)

        def step_of(ts: np.ndarray) -> np.ndarray:
            return np.clip(np.searchsorted(starts, ts, side="right") - 1, 0, n - 1)

        # device ops the window launched: by a step, or by a call inside the window (never
        # work in flight when it opened, nor work queued before its first step)
        launched_in = (g.h_kind[g.d_launch] == CALL) & in_window[g.d_launch] if len(g.h_ts) else np.zeros(len(g.d_dur), dtype=bool)
        in_steps = ((g.d_step >= 0) | launched_in) & ~g.d_before_first_step
        op_step = np.where(g.d_step >= 0, g.d_step, step_of(g.h_ts[g.d_launch]) if len(g.h_ts) else 0)
        pos = _positions(g.device_row)
        if block.device_scale:
            at = pos(np.fromiter(block.device_scale.keys(), np.int64, len(block.device_scale)))
            f = np.fromiter(block.device_scale.values(), np.float64, len(block.device_scale))
            ok = (at >= 0) & (f < 1.0)
            ok[ok] = in_steps[at[ok]]
            np.add.at(per[0], op_step[at[ok]], (1.0 - np.clip(f[ok], 0.0, 1.0)) * g.d_dur[at[ok]])
        if block.device_scale_all < 1.0:
            np.add.at(per[0], op_step[in_steps], (1.0 - max(block.device_scale_all, 0.0)) * g.d_dur[in_steps])
        if block.tight_launch:
            at = pos(np.fromiter(block.tight_launch, np.int64, len(block.tight_launch)))
            at = at[at >= 0]
            at = at[in_steps[at]]
            np.add.at(per[1], op_step[at], np.clip(g.d_gap[at], 0, None) + np.clip(g.d_delay[at] - g.d_latency[at], 0, None))
        cold = cold_window(self.metrics)
        node = _positions(g.runtime_row)
        node_step = step_of(g.h_ts)
        unwait_nodes = np.zeros(len(g.h_ts), dtype=bool)
        if block.unwait:
            at = node(np.fromiter(block.unwait, np.int64, len(block.unwait)))
            at = at[at >= 0]
            at = at[in_window[at]]
            unwait_nodes[at] = True
            # a wait counts only on device work the window launched: in the baseline's replay
            # (a faster host, calibrated, reaches the same wait earlier), the part of the wait
            # after the device work queued before the window is done
            waits = self._waits_on(above, ~in_steps)
            np.add.at(per[3], node_step[at], waits[at])
        if block.call_scale:
            at = node(np.fromiter(block.call_scale.keys(), np.int64, len(block.call_scale)))
            f = np.fromiter(block.call_scale.values(), np.float64, len(block.call_scale))
            ok = (at >= 0) & (f < 1.0)
            ok[ok] = in_window[at[ok]]
            at, f = at[ok], f[ok]
            own = np.where(unwait_nodes[at], g.h_base[at], g.h_dur[at])
            np.add.at(per[2], node_step[at], (1.0 - np.clip(f, 0.0, 1.0)) * np.clip(own, 0, None))
        # host windows: a share of them removed (host_remove), or kept at a factor (host_own)
        ends = np.append(starts[1:], hi)
        shares = [(s_, e_, frac) for s_, e_, frac in block.host_remove] + [(s_, e_, 1.0 - f_) for s_, e_, f_ in block.host_own]
        for s_, e_, share in shares:
            if share <= 0:
                continue
            s_, e_ = np.asarray(s_, dtype=np.int64), np.asarray(e_, dtype=np.int64)
            for k in range(n):
                per[2, k] += min(share, 1.0) * float(np.clip(np.minimum(e_, ends[k]) - np.maximum(s_, starts[k]), 0, None).sum())
        if block.host_scale < 1.0:
            host_ns = np.clip(g.h_gap, 0, None) + np.clip(g.h_dur, 0, None)
            np.add.at(per[2], node_step[in_window], (1.0 - max(block.host_scale, 0.0)) * host_ns[in_window])
        if cold:  # first-call host time: not a step's to give back
            per[2:4] = 0.0
        else:
            per[4] += min(max(block.remainder_share, 0.0), 1.0) * (self.remainder_ms + self.step_host_ms) * 1e6
        step = int(np.argmax(per.sum(axis=0)))
        taken = per.mean(axis=1) if self.statistic == "mean" else per[:, step]
        parts = [(name, float(ns) / 1e6) for name, ns in zip(names, taken, strict=True)]
        total = sum(ms for _, ms in parts)
        if block.per_sample > 1.0:
            spread = self.baseline_ms * (1.0 - 1.0 / block.per_sample)
            parts.append(("the step spread over a larger batch", spread))
            total += spread
        return total, parts

    def _replayed_ms(self, change: Change) -> float:
        remainder = self.remainder_ms * (1.0 - min(max(change.remainder_share, 0.0), 1.0))
        return self._of(replay_graph(self.graph, Change.merge([self.base, self.in_block(change)]))) + remainder / change.per_sample

    def with_base(self, change: Change) -> Change:
        """The baseline with `change` on it, as the replayed graph takes it (for replay_step)."""
        return Change.merge([self.base, self.in_block(change)])

    def saving_ms(self, change: Change) -> float:
        """Baseline minus the replay with `change` (never below 0)."""
        return max(self.baseline_ms - self.replayed_ms(change), 0.0)

    def host_shorter_by(self, ms: float) -> Change | None:
        """A change that makes the host's work `ms` shorter per replayed step, spread over all
        of it as a host scale: for a fix whose gain is in every host op (autograd's
        bookkeeping, a CPU-only run's arithmetic), so that it composes with another fix of the
        same ops by multiplying (more threads and a faster kernel each shorten what the other
        leaves) rather than the larger of two removals winning. None where the step is
        shorter than `ms` or the run cannot be replayed."""
        if not self.available or ms <= 0:
            return None
        base = self.baseline_ms
        if base <= ms:
            return None
        from advisor.whatif.replay import HOST_SCALE_FLOOR

        # The saving grows with 1 - scale, not quite in proportion (the DataLoader's own
        # scale, the remainder): secant steps from the proportional guess, to 2% of `ms`.
        x0, y0 = 0.0, 0.0
        x1 = ms / base
        y1 = self.saving_ms(Change(host_scale=1.0 - x1))
        for _ in range(HOST_SHORTER_STEPS):
            if abs(y1 - ms) <= 0.02 * ms or abs(y1 - y0) <= 1e-9:
                break
            x0, y0, x1 = x1, y1, x1 + (ms - y1) * (x1 - x0) / (y1 - y0)
            x1 = min(max(x1, 0.0), 1.0 - HOST_SCALE_FLOOR)
            y1 = self.saving_ms(Change(host_scale=1.0 - x1))
        return Change(host_scale=1.0 - x1)

    def _unprofiled_of_statistic(self) -> float | None:
        """The unprofiled steps' figure in the replay's statistic: where slow steps recur (an
        epoch's restarted workers every few steps) their mean, as the replayed step is, else
        their median. (The host's calibration matches the typical step, the median.)"""
        _ = self.base
        return self._unprofiled_mean if self.statistic == "mean" else self._unprofiled

    def summary(self) -> RankWhatIf:
        d = self.metrics.steps["duration"].to_numpy(np.float64)
        measured = float(np.mean(d) if self.statistic == "mean" else np.median(d)) / 1e6
        scale = self.host_scale
        scales = ranged = None
        if self.scale_range is not None:
            scales = [round(x, 4) for x in self.scale_range]
            ranged = [round(self._of(replay_graph(self.graph, Change(host_scale=x))), 3) for x in self.scale_range]
        headline = None
        if getattr(self.metrics, "measured", None) is not None:
            h = np.asarray(self.metrics.headline_step_ms, dtype=np.float64)
            if len(h):
                headline = float(np.mean(h) if self.statistic == "mean" else np.median(h))
        return RankWhatIf(
            self.metrics.rank, measured, self.baseline_ms, scale, self.loader_scale, self.remainder_ms, self.step_host_ms, self._unprofiled_of_statistic(),
            all_fixes_ms=None, scale_range=scales, baseline_range_ms=ranged, fixes=[], savings={}, statistic=self.statistic,
            headline_ms=headline, optimizer_scale=None if self.optimizer_scale is None else round(self.optimizer_scale, 4),
        )


# Replayed savings may pass their bound by this much (ms per step) before they are capped:
# rounding in the replay, not a promise.
BOUND_SLACK_MS = 0.01


def _positions(rows: np.ndarray):
    """A lookup from frame rows to their positions in `rows` (-1 where absent)."""
    order = np.argsort(rows, kind="stable")
    sorted_rows = rows[order]

    def at(wanted: np.ndarray) -> np.ndarray:
        if len(sorted_rows) == 0:
            return np.full(len(wanted), -1, dtype=np.int64)
        i = np.clip(np.searchsorted(sorted_rows, wanted), 0, len(sorted_rows) - 1)
        return np.where(sorted_rows[i] == wanted, order[i], -1).astype(np.int64)

    return at


def replayed_block(steps) -> slice:
    """The steps a rank's replay stands on: all of them, or for a run longer than
    MAX_REPLAY_STEPS the consecutive MAX_REPLAY_STEPS whose median measured step is closest
    to the run's median (the earliest such block). Consecutive, so each step starts with the
    device work the one before it left queued, as it did on the run."""
    n = len(steps)
    if n <= MAX_REPLAY_STEPS:
        return slice(0, n)
    d = steps["duration"].to_numpy(np.float64)
    windows = np.lib.stride_tricks.sliding_window_view(d, MAX_REPLAY_STEPS)
    if recurring_slow_steps(d):  # the block whose mean is the run's: its slow steps in their share
        first = int(np.argmin(np.abs(np.mean(windows, axis=1) - np.mean(d))))
        return slice(first, first + MAX_REPLAY_STEPS)
    first = int(np.argmin(np.abs(np.median(windows, axis=1) - np.median(d))))
    return slice(first, first + MAX_REPLAY_STEPS)


def sampled_graph(frames, steps) -> tuple[StepGraph, tuple[np.ndarray, np.ndarray] | None]:
    """The step graph of the replayed block (see replayed_block), with its calls and device
    ops named by their rows in the rank's frames as a fix names them; and, for a block,
    which rows of frames.runtime and frames.device it holds (None: the whole run)."""
    block = replayed_block(steps)
    if block.stop - block.start == len(steps):
        return build_graph(frames, steps), None
    sub = steps.iloc[block].reset_index(drop=True)
    lo = int(min(sub["host_start"].min(), sub["start"].min()))
    hi = int(max(sub["host_end"].max(), sub["end"].max()))
    rt_ts, dev_ts = frames.runtime["ts"].to_numpy(np.int64), frames.device["ts"].to_numpy(np.int64)
    rt_in = (rt_ts >= lo) & (rt_ts <= hi)
    dev_in = (dev_ts >= lo) & (dev_ts <= hi)
    rt_rows, dev_rows = np.nonzero(rt_in)[0], np.nonzero(dev_in)[0]
    part = _Part(frames.runtime.iloc[rt_rows].reset_index(drop=True), frames.device.iloc[dev_rows].reset_index(drop=True))
    # the block's last step is the run's last (ended by its mark where the host paced it) only at the run's end
    marks = bool(len(frames.steps)) and block.stop == len(steps)
    g = build_graph(part, sub, step_marks=marks)  # type: ignore[arg-type]
    if len(rt_rows):  # a CPU run's block has no runtime calls to name
        g.runtime_row = np.where(g.runtime_row >= 0, rt_rows[np.maximum(g.runtime_row, 0)], -1)
    if len(dev_rows):
        g.device_row = dev_rows[g.device_row]
    return g, (rt_in, dev_in)


@dataclass
class _Part:
    """The frames build_graph reads, cut to a block of steps."""

    runtime: Any
    device: Any


def _rows_in(d: dict[int, float], inside: np.ndarray) -> dict[int, float]:
    """The entries of a per-row table whose rows are in the block."""
    if not d:
        return d
    keys = np.fromiter(d.keys(), dtype=np.int64, count=len(d))
    ok = (keys >= 0) & (keys < len(inside))
    ok[ok] = inside[keys[ok]]
    if ok.all():
        return d
    values = np.fromiter(d.values(), dtype=np.float64, count=len(d))
    return dict(zip(keys[ok].tolist(), values[ok].tolist(), strict=True))


def _set_in(rows: set[int], inside: np.ndarray) -> set[int]:
    """The rows of a set that are in the block."""
    if not rows:
        return rows
    r = np.fromiter(rows, dtype=np.int64, count=len(rows))
    ok = (r >= 0) & (r < len(inside))
    ok[ok] = inside[r[ok]]
    return rows if ok.all() else set(r[ok].tolist())


def _merged_host_spans(frames, pattern) -> tuple[np.ndarray, np.ndarray]:
    host = frames.host
    spans = host[name_matches(host["name"], pattern)]
    return merge(spans["ts"].to_numpy(np.int64), spans["end"].to_numpy(np.int64))


def dataloader_spans(frames) -> tuple[np.ndarray, np.ndarray]:
    """Merged DataLoader spans of a rank's host (where the loop waits for its batch)."""
    return _merged_host_spans(frames, DATALOADER_NAME)


def optimizer_step_spans(frames) -> tuple[np.ndarray, np.ndarray]:
    """Merged `Optimizer.step#...` spans of a rank's host (the update, its zero_grad not included)."""
    return _merged_host_spans(frames, OPTIMIZER_STEP_SPAN)


def rank_replay(metrics, facts: dict[str, Any] | None) -> RankReplay:
    """The rank's replay, built once per rank (Metrics.shared)."""
    return metrics.shared("whatif.replay", lambda: RankReplay(metrics, facts))


def resume_nodes(g: StepGraph, base: Change) -> np.ndarray:
    """Per step, the host node after the step's longest wait on the device in the replay of
    `base` (after the step's start mark when the host never waits)."""
    start, end, _, _ = replay_nodes(g, base)
    kind = g.h_kind
    n = len(g.step_ids)
    first = np.full(n, -1, dtype=np.int64)
    last = np.full(n, -1, dtype=np.int64)
    sm, em = np.nonzero(kind == MARK_START)[0], np.nonzero(kind == MARK_END)[0]
    first[g.h_step[sm]] = sm
    last[g.h_step[em]] = em
    waited = np.where(np.diff(g.wait_ptr) > 0, end - start - g.h_dur * base.host_scale, 0.0)
    out = []
    for f, e in zip(first, last, strict=True):
        if f < 0 or e <= f:
            continue
        w = waited[f:e]
        i = f + int(np.argmax(w)) if len(w) and w.max() > 0 else f
        out.append(min(i + 1, e))
    return np.asarray(out, dtype=np.int64)


# The profiler's host cost per host event it records (an operator or, with stacks, a Python
# function), µs: low, central, high. From this project's runs whose steps after the window were
# host-bound (window median minus unprofiled median over the recorded events per step):
# sample_runs/resnet18_cifar/runs/gpu_baseline 1.9, gpu_workers 2.4, ../shared/whatif/h100_vit
# no_sync 1.9 and tf32 1.9; ViT baseline and workers 1.0 and 1.2, where part of the host's
# time is off the step's path (so a lower bound).
PROFILER_NS_PER_EVENT = (1_000.0, 1_900.0, 2_400.0)


def profiler_cost(metrics, g: StepGraph, steps=None) -> tuple[float, float, float] | None:
    """Host scales (at the high, central and low cost per event) that take the profiler's own
    cost out of a window that has no unprofiled steps to calibrate against.

    The cost is the host events the profiler recorded in the steps the graph replays (`steps`:
    the graph's block of a long run, default all of them; operators, Python functions with
    stacks on) times PROFILER_NS_PER_EVENT, each at most the event's own recorded span, spread
    over the host time the graph replays (its gaps and calls): events and host time from the
    same steps. None without host events or steps."""
    steps = metrics.steps if steps is None else steps
    if len(steps) == 0 or len(g.h_gap) == 0:
        return None
    host = metrics.frames.host
    kind = text_of(host["kind"])
    ts = host["ts"].to_numpy(np.int64)
    lo, hi = int(steps["start"].min()), int(steps["end"].max())
    recorded = ((kind == "op") | (kind == "python")) & (ts >= lo) & (ts < hi)
    events = int(recorded.sum())
    host_ns = float(np.clip(g.h_gap, 0, None).sum() + np.clip(g.h_dur, 0, None).sum())
    if events == 0 or host_ns <= 0:
        return None
    from advisor.whatif.replay import HOST_SCALE_FLOOR

    # No event costs the profiler more than the event's own recorded span (a Python call of
    # 0.3 µs did not hide 1.9 µs of the profiler's work): the trace bounds the estimate.
    own = np.clip((host["end"] - host["ts"]).to_numpy(np.float64)[recorded], 0, None)
    return tuple(float(max(1.0 - float(np.minimum(own, c).sum()) / host_ns, HOST_SCALE_FLOOR)) for c in reversed(PROFILER_NS_PER_EVENT))  # type: ignore[return-value]
