"""How much the profiler itself slowed the recorded steps, from the facts file's step clock.

`advisor profile` times every step of the run, profiled or not. When the run goes on after
the window (`--full`), the steps after it are the same work without the profiler: comparing
medians says whether the window is representative. Python stack recording can cost more
than a compiled step, and then every host-side figure of the trace is inflated.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

MIN_UNPROFILED_STEPS = 3
NOTABLE_SLOWDOWN = 1.25


@dataclass(frozen=True)
class ProfilerOverhead:
    window_median_ms: float
    unprofiled_median_ms: float
    unprofiled_steps: int

    @property
    def slowdown(self) -> float:
        return self.window_median_ms / self.unprofiled_median_ms

    def to_dict(self) -> dict[str, Any]:
        return {
            "window_median_ms": round(self.window_median_ms, 3),
            "unprofiled_median_ms": round(self.unprofiled_median_ms, 3),
            "unprofiled_steps": self.unprofiled_steps,
            "slowdown": round(self.slowdown, 3),
        }

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


def profiler_overhead(facts: dict[str, Any] | None) -> ProfilerOverhead | None:
    """Window vs after-window step times, when the facts hold enough steps after the window.

    The first step after the window is left out: the trace is written while it runs.
    """
    times = (facts or {}).get("step_times_ms")
    profiled = (facts or {}).get("profiled_steps")
    if not isinstance(times, list) or not isinstance(profiled, list) or not profiled:
        return None
    if not all(isinstance(i, int) and 0 <= i < len(times) for i in profiled):
        return None
    window = [float(times[i]) for i in profiled]
    after = [float(t) for t in times[max(profiled) + 2 :] if isinstance(t, (int, float)) and t > 0]
    if len(after) < MIN_UNPROFILED_STEPS:
        return None
    unprofiled = statistics.median(after)
    if unprofiled <= 0:
        return None
    return ProfilerOverhead(statistics.median(window), unprofiled, len(after))
