"""Which rules rest on the device's own records, as the tests read each rule's description
(its module docstring under rules/), not the code's own list (metrics.device_records): a
trace without kernel or copy records must get none of their findings."""

from __future__ import annotations

# Findings that rest on the device's kernels or its idle time between them.
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
        "cudnn-benchmark",  # cuDNN's fallback convolution kernels
        "zero-grad-memset",  # one memset or fill kernel per parameter
    }
)
# Findings that rest on the device's copy records.
COPY_RULES = frozenset({"h2d-pageable-copy", "h2d-copy-volume", "d2d-copy-volume"})

# Of those, the rules whose description says they also read a CPU-only run's own ops (no device
# listed at all): `unfused-elementwise` prices eager elementwise chains from the host ops there.
# On a run that lists a GPU but has no kernel records they still must not fire.
CPU_RUN_RULES = frozenset({"unfused-elementwise"})
