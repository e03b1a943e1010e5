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
from advisor.metrics.breakdown import name_matches, text_of

# The runtime calls that launch device work, and those that copy: one definition for every stage
# (metrics.host_device re-exports them for the rules and the what-if changes).
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
# Rules whose findings rest on the device's idle time: wrong where the device ran work the
# trace does not hold.
IDLE_RULES = frozenset(
    {"gpu-idle", "launch-bound", "host-sync", "step-time-variance", "straggler", "communication-exposed", "dataloader-stall"}
)
# What the host side alone supports when the device's kernels are missing (a capture phase:
# the launches are recorded, not run, so nothing about the loop's steps holds either).
# The `[memory]` events are the allocator's, recorded on the host side too: how near the
# device's memory the peak came stands without the kernels' records.
HOST_SIDE_RULES = frozenset({"inference-mode", "cpu-threads", "cpu-autocast", "cpu-optimizer", "memory-near-limit"})
# Rules that read the device's kernels alone, and still hold without the host's operators.
KERNEL_ONLY_RULES = frozenset({"tensor-cores-unused", "tf32-disabled", "unfused-elementwise", "h2d-pageable-copy"})
# Launched work that waits this much of the window to start, nothing recorded on the device
# meanwhile: the device ran (or waited for) work the trace does not hold.
UNRECORDED_LEAD_SHARE = 0.5
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
    host_missing: bool = False  # device records and runtime calls, but no operator on the host
    unrecorded_lead_ms: float | None = None  # launched work waited this long with nothing recorded on the device
    backlog: int = 0  # launches at the window's end with no device record: the profiler stopped with work queued

    @property
    def any(self) -> bool:
        return (
            self.kernels_missing
            or self.copies_missing
            or self.skew_ms is not None
            or self.host_missing
            or self.unrecorded_lead_ms is not None
            or self.backlog > 0
        )

    def supports(self, rule: str) -> bool:
        """Whether a rule's finding can stand on what the trace holds."""
        if self.kernels_missing:
            return rule in HOST_SIDE_RULES
        if self.host_missing:
            return rule in KERNEL_ONLY_RULES
        if self.skew_ms is not None and rule in KERNEL_RULES | COPY_RULES:
            return False
        if self.unrecorded_lead_ms is not None and rule in IDLE_RULES:
            return False
        return not (self.copies_missing and rule in COPY_RULES)

    def line(self) -> str | None:
        """The report's one-line warning, or None when the device side is whole."""
        if self.host_missing:
            return (
                "the host's operators are missing (the trace holds device activity and runtime calls only): "
                "no advice on what the host does or why the device waits; what the kernels themselves show still holds"
            )
        if self.unrecorded_lead_ms is not None:
            return (
                f"launched device work waited {self.unrecorded_lead_ms:,.1f} ms to start with nothing recorded on the device "
                "meanwhile (the device ran, or waited for, work the trace does not hold): no advice rests on the device's "
                "idle time"
            )
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
        if self.backlog:
            return (
                f"{self.backlog} of {self.launches} kernel launches have no kernel record, the window's last ones: the profiler "
                "stopped while the device was still working through them (the device ran behind the host); the device "
                "time of the last steps is incomplete"
            )
        return None


def _unrecorded_wait_ms(frames: TraceFrames) -> float | None:
    """Time the device's work waited after its launch with nothing recorded on the device
    meanwhile (a stream waiting on work the trace does not hold), when it is over
    UNRECORDED_LEAD_SHARE of the window; else None."""
    from advisor.metrics.steps import launches

    lk = launches(frames).sort_values("ts", kind="stable")
    ts = lk["ts"].to_numpy(np.int64)
    prev_end = np.concatenate([[np.iinfo(np.int64).min], np.maximum.accumulate(lk["end"].to_numpy(np.int64))[:-1]])
    launched = lk["launch_end"].to_numpy(np.float64)
    ok = np.isfinite(launched)
    if not ok.any():
        return None
    waited = ts[ok] - np.maximum(launched[ok].astype(np.int64), prev_end[ok])
    worst = float(np.clip(waited, 0, None).max())
    span = max(frames.window[1] - frames.window[0], 1)
    return worst / 1e6 if worst > UNRECORDED_LEAD_SHARE * span else None


def device_gaps(frames: TraceFrames) -> DeviceGaps:
    rt, dev, host = frames.runtime, frames.device, frames.host
    launches = int(name_matches(rt["name"], LAUNCH_CALL).sum()) if len(rt) else 0
    copy_calls = int(name_matches(rt["name"], COPY_CALL).sum()) if len(rt) else 0
    kinds = text_of(dev["kind"]) if len(dev) else np.array([], dtype=object)
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
    kinds_host = text_of(host["kind"]) if len(host) else np.array([], dtype=object)
    host_missing = len(dev) > 0 and len(rt) > 0 and not (kinds_host == "op").any()
    lead = None
    if len(dev) and len(rt) and skew is None and not kernels_missing:
        lead = _unrecorded_wait_ms(frames)
    backlog = _backlog(frames) if launches >= MIN_LAUNCHES and not kernels_missing and kernels else 0
    return DeviceGaps(
        launches, kernels, copy_calls, copies, bool(kernels_missing), bool(copies_missing), skew, bool(host_missing), lead, backlog
    )


# Launches without a kernel record count as a backlog from this share of all launches up,
# when nearly all of them (BACKLOG_TAIL) come after the last launch that has one.
BACKLOG_SHARE = 0.2
BACKLOG_TAIL = 0.9


def _backlog(frames: TraceFrames) -> int:
    """How many kernel launches at the window's end have no device record (the profiler
    stopped with the device behind the host: what was queued never ran while it recorded);
    0 when the unrecorded launches are few or spread through the window."""
    rt = frames.runtime
    launch = rt[name_matches(rt["name"], LAUNCH_CALL) & (rt["correlation"] >= 0).to_numpy()]
    recorded = launch["correlation"].isin(frames.device["correlation"]).to_numpy()
    unrecorded = int((~recorded).sum())
    if not recorded.any() or unrecorded < BACKLOG_SHARE * len(launch):
        return 0
    last_recorded = int(launch["ts"].to_numpy(np.int64)[recorded].max())
    after = int((launch["ts"].to_numpy(np.int64)[~recorded] > last_recorded).sum())
    return unrecorded if after >= BACKLOG_TAIL * unrecorded else 0
