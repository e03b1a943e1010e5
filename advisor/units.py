"""How a run's step time and throughput are told, the same in every command and format.

One definition everywhere (report, diff, gate, whatif, the Python API): the mean step of the
window, which the breakdown's slices add up to and which a training run's wall time is made
of (steps x mean step); throughput is samples over that mean step. The median and the other
order statistics are shown only as labelled context.
"""

from __future__ import annotations

import math


def rate(x: float) -> str:
    """A throughput figure, rounded the same way everywhere: whole numbers from 100 up
    (15,197), three significant digits below (37.4, 4.12)."""
    if not math.isfinite(x):
        return "n/a"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:,.1f}" if abs(x) >= 10 else f"{x:,.2f}"


def step_ms(x: float | None) -> str:
    """A step time in milliseconds, two decimals everywhere (78.60 ms)."""
    return "n/a" if x is None or not math.isfinite(x) else f"{x:.2f} ms"


def saved_text(saved_ms: float, baseline_ms: float, digits: int = 0) -> str:
    """A saving as every command and format prints it: a positive number of ms "saved" and its
    share of the replayed step it is taken from (`58.63 ms saved, 93%`). A step change (diff,
    gate) carries its sign instead."""
    share = f", {100 * saved_ms / baseline_ms:.{digits}f}%" if baseline_ms > 0 else ""
    return f"{saved_ms:.2f} ms saved{share}"
