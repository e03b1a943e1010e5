"""What each trace event `cat` is (host, runtime, device, sync work), and the limits past
which a recorded value is not a real one."""

from __future__ import annotations

import re


# --- what each `cat` is -------------------------------------------------------------------
HOST_CATS = {
    "cpu_op": "op",
    "operator": "op",
    "user_annotation": "annotation",
    "python_function": "python",
    "python": "python",
}
RUNTIME_CATS = {"cuda_runtime", "runtime", "cuda_driver", "mtia_runtime"}
DEVICE_CATS = {
    "kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "memcpy": "memcpy",
    "gpu_memset": "memset",
    "memset": "memset",
    "mtia_ccp_events": "kernel",
}
# MTIA command-processor events that are bookkeeping, not device work.
MTIA_NOT_WORK = ("event_wait", "event_record", "synchronize")
MTIA_DEVICE_CAT = "mtia_ccp_events"
SYNC_CATS = {"cuda_sync"}
# Kernels replayed by CUPTI's range profiler to read hardware counters: the trace then has
# these instead of kernel events, and every launch call lasts as long as the replays.
RANGE_PROFILER_CAT = "cuda_profiler_range"
PROFILER_SESSION_CAT = "trace"  # the profiler's own span over the recording: where a step marker can end at the latest
SCHEMA_2021_CATS = ("Operator", "Kernel", "Runtime")
MEMORY_EVENT = "[memory]"

STEP_NAME = re.compile(r"^ProfilerStep#(\d+)$")
COPY_NAME = re.compile(r"^Memcpy (\w+) \((\w+) -> (\w+)\)")

# Times further apart than this (µs; 11.6 days) are not one profiling window; in int64 ns they
# and their sums stay far from overflowing. Byte counts from 2**53 up are not real sizes.
MAX_SPAN_US = 1e12
MAX_BYTES = float(2**53)
# No link or memory moves bytes faster than this (GB/s; HBM3e is about 8,000): a copy that
# claims more in its recorded time has a byte count or a duration that cannot be measured.
MAX_COPY_GBPS = 50_000.0

HOST_KINDS = ["op", "annotation", "python"]
DEVICE_KINDS = ["kernel", "memcpy", "memset"]
# event groups, by category
IGNORED, HOST, RUNTIME, DEVICE, SYNC = 0, 1, 2, 3, 4
