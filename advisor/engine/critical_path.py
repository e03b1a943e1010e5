"""What holds a replayed step (the device's own work or the host's), the measured step every
share is taken of, and whether a replayed saving departs from its rule's estimate."""

from __future__ import annotations

import numpy as np

from advisor.engine.contract import Finding
from advisor.metrics.events import rank_events
from advisor.metrics.summary import Metrics
from advisor.whatif.replay import Change
from advisor.whatif.savings import RankReplay, RankWhatIf


# A replayed saving alone within [ESTIMATE_BAND[0]×, ESTIMATE_BAND[1]×] of its rule's first-order
# estimate keeps to it; outside, the finding names what holds the replayed step and the reports
# print the estimate beside the saving.
ESTIMATE_BAND = (0.5, 2.0)


def departs_from_estimate(estimate: float | None, replayed: float | None) -> bool:
    """Whether a replayed saving (alone) departs from its rule's estimate (`evidence.estimate_ms`)."""
    if not isinstance(estimate, (int, float)) or replayed is None:
        return False
    return not (ESTIMATE_BAND[0] * estimate <= replayed <= ESTIMATE_BAND[1] * estimate)


def _device_ms_with(m: Metrics, change: Change) -> float:
    """The device's busy time per step with `change` applied: the window's busy time scaled by
    what the change does to the device ops' summed time (and per current step's samples)."""
    device_ms = (m.gpu_utilization or 0.0) * m.mean_step_ns / 1e6
    if not (change.device_scale or change.device_add or change.device_scale_all != 1.0 or change.per_sample != 1.0):
        return device_ms
    dur = rank_events(m).device["dur"].to_numpy(np.float64)
    before = float(dur.sum())
    if before <= 0:
        return device_ms
    rows = np.fromiter(change.device_scale.keys(), dtype=np.int64, count=len(change.device_scale))
    factors = np.fromiter(change.device_scale.values(), dtype=np.float64, count=len(change.device_scale))
    ok = (rows >= 0) & (rows < len(dur))
    after = (before + float((dur[rows[ok]] * (factors[ok] - 1.0)).sum())) * change.device_scale_all + float(sum(change.device_add.values()))
    return device_ms * max(after, 0.0) / before / max(change.per_sample, 1e-9)


def critical_path(m: Metrics, replay: RankReplay, change: Change) -> str:
    """One clause naming what holds the replayed step with `change` applied, with its time:
    the device's own work (as the change leaves it) where it fills most of the step, else the
    host's. Neither is ever stated as more than the replayed step."""
    step = replay.replayed_ms(change)
    bd = m.breakdown_mean_ms
    util = m.gpu_utilization
    device_ms = _device_ms_with(m, change)
    host_ms = sum(bd.get(c, 0.0) for c in ("runtime", "dataloader", "cpu_exec", "other"))
    d = 2 if step < 1.0 else 1  # a sub-millisecond step keeps its figures
    if util is not None and device_ms >= 0.8 * step:
        return f"the device's own work holds the step, {min(device_ms, step):.{d}f} ms of the {step:.{d}f} ms replayed step"
    loader = bd.get("dataloader", 0.0)
    if change.host_remove and loader > 0:
        # a fix that takes host windows off (the DataLoader's wait): what it leaves of the host
        host_ms = max(host_ms - max(replay.baseline_ms - step, 0.0), 0.0)
        loader = min(loader, host_ms)
    host_ms = min(host_ms, step)
    parts = f", {min(loader, host_ms):.{d}f} ms of it the DataLoader" if loader >= 0.05 * max(host_ms, 1e-9) and loader > 0 else ""
    return f"the host's own work holds the step, {host_ms:.{d}f} ms per step outside device work{parts}, of the {step:.{d}f} ms replayed step"


def _own_step_ms(f: Finding) -> float | None:
    """The step a finding without a replayed fix measured itself on: the unprofiled steps'
    mean (`evidence.unprofiled_step_ms`), where its rule read them; else None."""
    own = f.evidence.get("unprofiled_step_ms") if f.change is None else None
    return float(own) if isinstance(own, (int, float)) and own > 0 else None


def measured_step_ms(summary: RankWhatIf) -> float:
    """The measured step every share is taken of: the unprofiled steps' median where the run
    recorded them, else the window's median as measured, the headline's (with any one-time
    work in it: never the projection without it, nor the profiler-corrected replay)."""
    if summary.unprofiled_ms is not None:
        return summary.unprofiled_ms
    return summary.headline_ms if summary.headline_ms is not None else summary.measured_ms


def critical_path_of_base(replay: RankReplay, change: Change) -> str:
    """What the fix alone leaves on the replayed step, in a few words."""
    return f"the replayed step goes from {replay.baseline_ms:.1f} to {replay.replayed_ms(change):.1f} ms"
