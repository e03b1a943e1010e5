"""Step ends on the device: a CUDA event recorded on the current stream at each step's end.

The host's step clock says when the host finished launching a step. On a device-bound run the
host runs ahead until the launch queue is full and then waits, so its per-step times swing
(11 to 33 ms around a 24 ms device step on ResNet-18), and with CUDA graphs (one launch per
step) the host can finish many steps before the device does: host steps of 17 ms for 24 ms of
device work. The interval between two consecutive events is the step as the device ran it:
where the device waits for the host it is the host's step, where the host waits for the
device it is the device's. Recording an event costs a few microseconds of host time and
nothing on the device; elapsed times are read once both events have completed, so no step
waits for the device and finished events are released as the run goes.
"""

from __future__ import annotations

from collections import deque
from typing import Any


class DeviceStepClock:
    """Per-step device times (ms) from events recorded at each step's end; None where unknown."""

    def __init__(self, torch: Any):
        self.torch = torch
        self.times: list[float | None] = []
        self._pending: deque[tuple[int, Any]] = deque()  # (step index, event), oldest first
        self._last: tuple[int, Any] | None = None  # the newest event whose interval is taken
        self._broken = False

    def mark(self) -> None:
        """Record the end of the step that just ended (call once per step, on the host)."""
        index = len(self.times)
        self.times.append(None)
        event = self._record()
        if event is not None:
            self._pending.append((index, event))
        self._collect(wait=False)

    def _record(self) -> Any:
        cuda = self.torch.cuda
        if self._broken:
            return None
        try:
            # Before the script has touched CUDA there is nothing to time, and the clock must
            # not create a context of its own; inside a graph capture an event would join the graph.
            if not cuda.is_initialized() or cuda.is_current_stream_capturing():
                return None
            event = cuda.Event(enable_timing=True)
            event.record()
            return event
        except Exception:  # a device in a bad state: stop timing, never break the run
            self._broken = True
            return None

    def _collect(self, wait: bool) -> None:
        while self._pending:
            index, event = self._pending[0]
            try:
                if not wait and not event.query():
                    return
                if wait:
                    event.synchronize()
                if self._last is not None and self._last[0] == index - 1:
                    self.times[index] = max(self._last[1].elapsed_time(event), 0.0)
            except Exception:
                self._broken = True
                self._pending.clear()
                return
            self._last = (index, event)
            self._pending.popleft()

    def step_times_ms(self) -> list[float | None] | None:
        """Every step's device time, waiting for the last events; None when no interval was timed."""
        if self._pending and not self._broken:
            self._collect(wait=True)
        return self.times if any(t is not None for t in self.times) else None
