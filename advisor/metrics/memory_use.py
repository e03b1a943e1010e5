"""How much device memory a run used, from the best source available, and how sure we are.

Three sources, best first: the facts file (`torch.cuda.max_memory_allocated/reserved` over the
whole run), the trace's `[memory]` events with running totals (current schema, window only),
and — for traces whose `[memory]` events carry only the size of each allocation (the 2021
schema) — the running sum of those sizes. That sum misses whatever was allocated before the
profiler started (weights, optimizer state), so it is only a lower bound of the peak; it is
still exact for changes, e.g. growth from one step to the next.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from advisor.facts import DeviceFacts
from advisor.metrics.memory import CPU_DEVICE_TYPE, allocated_per_step

FACTS = "facts"
TRACE = "trace"
LOWER_BOUND = "window lower bound"


@dataclass(frozen=True)
class MemoryUse:
    """Peak device memory and the device's size; `source` says how far the peaks can be trusted."""

    device_bytes: float | None
    peak_allocated: float | None
    peak_reserved: float | None
    source: str  # FACTS, TRACE, LOWER_BOUND, or "none"

    @property
    def peak(self) -> float | None:
        """Reserved when known (what the caching allocator holds), else allocated."""
        return self.peak_reserved if self.peak_reserved is not None else self.peak_allocated

    def share(self, value: float | None) -> float | None:
        if value is None or not self.device_bytes:
            return None
        return value / self.device_bytes

    def evidence(self, share: float) -> dict:
        """The memory figures a finding shows, with the share of the device its rule judged."""
        return {
            "peak_allocated_bytes": self.peak_allocated,
            "peak_reserved_bytes": self.peak_reserved,
            "device_memory_bytes": self.device_bytes,
            "memory_share": round(share, 4),
            "memory_source": self.source,
        }


def _num(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if np.isfinite(f) and f > 0 else None


def has_running_totals(frames) -> bool:
    """Whether the trace's accelerator `[memory]` events carry running totals (current schema)."""
    mem = frames.memory
    mem = mem[(mem["device_type"] != CPU_DEVICE_TYPE) & (mem["device_type"] >= 0)]
    return bool(len(mem)) and bool(mem["total_allocated"].notna().any() or mem["total_reserved"].notna().any())


def memory_use(metrics, facts_device: DeviceFacts | None = None) -> MemoryUse:
    """The rank's memory use: the facts' device figures where recorded (`ctx.recorded.device`), else the trace's."""
    facts_device = facts_device if facts_device is not None else DeviceFacts()
    device_bytes = _num(facts_device.total_memory_bytes) or _num(metrics.device.total_memory_bytes)
    alloc = _num(facts_device.max_memory_allocated_bytes)
    reserved = _num(facts_device.max_memory_reserved_bytes)
    if alloc is not None or reserved is not None:
        return MemoryUse(device_bytes, alloc, reserved, FACTS)
    alloc, reserved = _num(metrics.peak_allocated), _num(metrics.peak_reserved)
    if alloc is None and reserved is None:
        return MemoryUse(device_bytes, None, None, "none")
    # Without running totals the curve is rebuilt from allocation sizes: a lower bound.
    return MemoryUse(device_bytes, alloc, reserved, TRACE if has_running_totals(metrics.frames) else LOWER_BOUND)


def allocated_at_step_ends(metrics) -> tuple[pd.Series, str]:
    """Allocated bytes at the end of each step, and whether they are absolute (TRACE) or
    known only up to what was allocated before the window (LOWER_BOUND: the changes are exact)."""
    per_step = allocated_per_step(metrics.frames, metrics.steps)
    if per_step.notna().sum() == 0:
        return per_step, "none"
    return per_step, TRACE if has_running_totals(metrics.frames) else LOWER_BOUND


__all__ = ["MemoryUse", "memory_use", "allocated_at_step_ends", "has_running_totals", "FACTS", "TRACE", "LOWER_BOUND"]
