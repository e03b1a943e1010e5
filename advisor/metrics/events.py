"""What a rule may read of one rank's trace: its events as typed tables, nothing of the file.

Rules see a rank through its metrics and this view, never through the loader's frames: no
path, no metadata, no raw header, so a change in how a trace is read stops here. The tables
are the loader's own frames (no copy; treat them as read-only) with the columns below, and
their rows keep the loader's row numbers, so a fix (`advisor.whatif.changes`) names the rows a
rule detected. Times are int64 ns on the trace's clock, durations int64 ns.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping

import pandas as pd

# Every column a table of the view holds, with what it is. The loader gives each of them
# (tests/test_structure.py checks it on real traces); rules may rely on nothing else. Text
# columns are categorical, NaN where the trace has nothing.
COLUMNS: dict[str, dict[str, str]] = {
    "host": {
        "name": "operator, annotation or Python function name",
        "tid": "host thread",
        "ts": "start (int64 ns)",
        "dur": "duration (int64 ns)",
        "end": "ts + dur (int64 ns)",
        "kind": "event category: cpu_op, user_annotation, python, ...",
        "external_id": "links an op to the runtime calls it made (int64, -1 when absent)",
        "call_stack": "the user's Python stack where recorded",
        "input_dims": "operator input shapes where recorded (list, None when absent)",
        "input_types": "operator input dtypes where recorded",
        "concrete_inputs": "operator scalar arguments as text where recorded (list: stride, padding, is_causal; None when absent)",
        "sequence": "autograd's sequence number: set on an op dispatched through autograd with grad mode on (int64, -1 when absent)",
    },
    "runtime": {
        "name": "CUDA/HIP runtime or driver call: cudaLaunchKernel, cudaMemcpyAsync, ...",
        "tid": "host thread",
        "ts": "start (int64 ns)",
        "dur": "duration (int64 ns)",
        "end": "ts + dur (int64 ns)",
        "correlation": "links the call to the device op it launched (int64, -1 when none)",
        "external_id": "links the call to the op that made it (int64, -1 when absent)",
    },
    "device": {
        "name": "kernel name, or the copy's or memset's description",
        "tid": "stream as the trace names it",
        "kind": "kernel, memcpy or memset",
        "device": "device index (int64)",
        "stream": "stream id (int64)",
        "ts": "start (int64 ns)",
        "dur": "duration (int64 ns)",
        "end": "ts + dur (int64 ns)",
        "correlation": "links the op to the runtime call that launched it (int64)",
        "external_id": "the launching op's id (int64, -1 when absent)",
        "registers": "registers per thread (float32, NaN when absent)",
        "shared_memory": "shared memory per block, bytes (float32, NaN when absent)",
        "blocks_per_sm": "blocks per SM as launched (float32, NaN when absent)",
        "warps_per_sm": "warps per SM as launched (float32, NaN when absent)",
        "occupancy": "estimated achieved occupancy, % (float32, NaN when absent)",
        "grid": "grid dimensions, as \"[x, y, z]\"",
        "block": "block dimensions, as \"[x, y, z]\"",
        "bytes": "bytes copied or set (float64, NaN for kernels)",
        "msg_bytes": "a collective kernel's message size, bytes (`In msg nelems` x dtype size; float64, NaN elsewhere)",
        "msg_out_bytes": "a collective kernel's output size, bytes (`Out msg nelems` x dtype size; float64, NaN elsewhere)",
        "group_size": "the ranks of a collective kernel's process group (`Group size`; int64, -1 when absent)",
        "process_group": "a collective kernel's process group: its `Process Group Name`, else \"ranks [..]\" (missing when absent)",
        "copy_kind": "HtoD, DtoH, DtoD, ... for copies",
        "copy_src": "source memory of a copy: Pageable, Pinned, Device, ...",
        "copy_dst": "destination memory of a copy",
        "bandwidth_gbps": "copy bandwidth, GB/s (float64, NaN when absent)",
    },
    "memory": {
        "ts": "time of the allocation or free (int64 ns)",
        "device_type": "the allocator's device type (int64)",
        "device_id": "device index (int64)",
        "bytes": "bytes allocated (positive) or freed (negative) (float64)",
        "total_allocated": "allocated bytes after the event (float64)",
        "total_reserved": "reserved bytes after the event (float64)",
    },
    "steps": {
        "step": "step number (int64)",
        "name": "ProfilerStep#N",
        "start": "start (int64 ns)",
        "end": "end (int64 ns)",
        "tid": "host thread",
    },
}


@dataclass(frozen=True)
class RankEvents:
    """One rank's events, as rules read them (see the module docstring and COLUMNS).

    - `host`: operators, annotations and Python functions on the host threads;
    - `runtime`: the runtime calls that launch, copy, set memory and synchronise;
    - `device`: kernels, copies and memsets on the device;
    - `memory`: the allocator's instant events;
    - `steps`: the `ProfilerStep#N` spans;
    - `distributed`: the trace's distributed info (rank, world_size, backend, ...), read-only.
    """

    host: pd.DataFrame
    runtime: pd.DataFrame
    device: pd.DataFrame
    memory: pd.DataFrame
    steps: pd.DataFrame
    distributed: Mapping[str, Any]

    @property
    def has_device(self) -> bool:
        return len(self.device) > 0

    @classmethod
    def of(cls, frames) -> "RankEvents":
        return cls(frames.host, frames.runtime, frames.device, frames.memory, frames.steps, MappingProxyType(dict(frames.distributed)))


def rank_events(metrics) -> RankEvents:
    """The rank's events for its rules (built once per rank)."""
    return metrics.shared("events.view", lambda: RankEvents.of(metrics.frames))
