"""Whether the trace's device side is there and lines up with the host's.

A trace can hold the host's launches without the device's records of them: a graph-capture
phase (the launches are captured, not run), a profiler started without device activity, a
buffer that overflowed. Its device timeline can also sit apart from the host's (clocks of the
two sides not aligned: the device's work starting after the host's last event). Advice that
rests on the device's records (idle time, kernels, copies) is then built on what is not
there; what the host side shows still holds. `device_gaps` says which side is missing, in
one line for the report, and which findings cannot stand on it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from advisor.load.trace import TraceFrames
from advisor.metrics.breakdown import _matches

LAUNCH_CALL = re.compile(
    r"^(cudaLaunch|cuLaunch|hipLaunch|hipExtLaunch|hipModuleLaunch|hipExtModuleLaunch|cudaGraphLaunch|hipGraphLaunch|mtiaLaunch)"
)
COPY_CALL = re.compile(r"^(cuda|hip|mtia)Memcpy")
# Launches without a kernel record: at least this many, and kernels under this share of them.
MIN_LAUNCHES = 20
KERNEL_SHARE = 0.1
MIN_COPY_CALLS = 5

# Rules whose findings rest on the device's kernels and its idle time.
KERNEL_RULES = frozenset(
    {
        "gpu-idle",
        "launch-bound",
        "tensor-cores-unused",
        "tf32-disabled",
        "unfused-elementwise",
        "channels-last",
        "compile-graph-breaks",
        "communication-exposed",
        "straggler",
        "host-sync",
        "spare-gpu-memory",
        "step-time-variance",
        "cudnn-benchmark",
        "zero-grad-memset",
        "single-tensor-optimizer",
        "unbucketed-allreduce",
    }
)
# Rules whose findings rest on the device's copy records.
COPY_RULES = frozenset({"h2d-pageable-copy", "h2d-copy-volume", "d2d-copy-volume", "cpu-tensor-then-copy"})


@dataclass(frozen=True)
class DeviceGaps:
    launches: int
    kernels: int
    copy_calls: int
    copies: int
    kernels_missing: bool
    copies_missing: bool
    skew_ms: float | None  # how far the device timeline sits outside the host's (None: it does not)

    @property
    def any(self) -> bool:
        return self.kernels_missing or self.copies_missing or self.skew_ms is not None

    def unsupported(self) -> frozenset[str]:
        """The rules whose findings rest on the missing or skewed side."""
        out: set[str] = set()
        if self.kernels_missing or self.skew_ms is not None:
            out |= KERNEL_RULES | COPY_RULES
        if self.copies_missing:
            out |= COPY_RULES
        return frozenset(out)

    def line(self) -> str | None:
        """The report's one-line warning, or None when the device side is whole."""
        if self.skew_ms is not None:
            return (
                f"the device timeline lies {self.skew_ms:,.1f} ms outside the host's (the two clocks are not aligned): "
                "no advice from the device's idle time or kernels; what the host side shows still holds"
            )
        if self.kernels_missing:
            what = "no device records" if self.kernels == 0 else f"only {self.kernels} kernel record{'s' if self.kernels != 1 else ''}"
            return (
                f"the device's activity is missing: {self.launches} kernel launches but {what} (a graph capture, or the "
                "profiler recorded no device activity): no advice from the device's side; what the host side shows still holds"
            )
        if self.copies_missing:
            return (
                f"the device's copy records are missing: {self.copy_calls} copy calls but no copy on the device: "
                "no advice about copies' device time"
            )
        return None


def device_gaps(frames: TraceFrames) -> DeviceGaps:
    rt, dev, host = frames.runtime, frames.device, frames.host
    launches = int(_matches(rt["name"], LAUNCH_CALL).sum()) if len(rt) else 0
    copy_calls = int(_matches(rt["name"], COPY_CALL).sum()) if len(rt) else 0
    kinds = dev["kind"].astype(str).to_numpy() if len(dev) else np.array([], dtype=object)
    kernels = int((kinds == "kernel").sum())
    copies = int((kinds == "memcpy").sum())
    kernels_missing = (launches >= MIN_LAUNCHES and kernels < KERNEL_SHARE * launches) or (launches + copy_calls > 0 and len(dev) == 0)
    copies_missing = copy_calls >= MIN_COPY_CALLS and copies == 0 and len(dev) > 0
    skew = None
    if len(dev) and len(host):
        h0, h1 = int(host["ts"].min()), int(host["end"].max())
        d0, d1 = int(dev["ts"].min()), int(dev["end"].max())
        if d0 >= h1:
            skew = (d0 - h1) / 1e6
        elif d1 <= h0:
            skew = (h0 - d1) / 1e6
    return DeviceGaps(launches, kernels, copy_calls, copies, bool(kernels_missing), bool(copies_missing), skew)
