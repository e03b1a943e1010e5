"""The one definition of "the host waits for the device": the runtime calls in which the host can
block until work queued on the device is done. Every stage reads it from here: the replay's step
graph (advisor.whatif.graph: the calls whose time is elastic), the drawn timeline's "Sync (host
waits)" lane (advisor.whatif.timeline), the one-time work taken out of a window
(advisor.metrics.one_time: a wait is never one-time work of its own) and the host-sync and
allocator metrics (advisor.metrics.host_device), and through them the rules.

- SYNC_CALL, a synchronize: CUDA's and HIP's Stream/Device/Event/Ctx Synchronize; MTIA's runtime
  names its own without a prefix (`synchronize`, `synchronizeStream`, as in
  ../shared/traces/misc/mtia_inference.json.gz). It returns when the work it names is done.
- COPY_CALL (advisor.metrics.device_records), a copy: a synchronous one (cudaMemcpy, ROCm's
  hipMemcpyWithStream, which is how `.item()` reads a scalar back there) waits for its stream;
  an asynchronous one waits where the host memory is pageable (the host stages the bytes).
- FREE_CALL, a free: cudaFree/hipFree synchronise the device before they return.

Whether a call did wait is the trace's to say (`waited_calls`: every synchronize, a copy whose
call returned only after its own copy on the device ended, a free while the device had work):
the drawn timeline's sync lane shows those, the one-time filter leaves them (and every copy,
which lasts as long as its bytes take) in the steps; the replay's graph takes every
HOST_WAIT_CALL and tests each call's time against the device work it returned with; the
host-sync metric keeps the synchronizations and the copies to the host that returned only after
their copy (a pageable copy to the device and its own stream sync are `h2d-pageable-copy`'s, a
free `allocator-churn`'s). Not waits: cudaStreamWaitEvent (the device waits, not the host),
cudaEventQuery (a poll that returns at once), cudaMemsetAsync (enqueued).

The ops in which user code makes such a wait (`.item()`, a data-dependent shape, a tensor
in an `if`, a blocking `.cpu()`) are advisor.metrics.host_device.SYNC_CAUSES: the cause of a
wait, read off the op a wait call sits in, not a second list of waits.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from advisor.metrics.breakdown import name_matches
from advisor.metrics.device_records import COPY_CALL

SYNC_CALL = re.compile(r"^((cuda|hip)(Stream|Device|Event|Ctx)Synchronize|synchronize(Stream|Device|Event)?)$")
FREE_CALL = re.compile(r"^(cuda|hip)Free$")
HOST_WAIT_CALL = re.compile("|".join(f"(?:{p.pattern})" for p in (SYNC_CALL, COPY_CALL, FREE_CALL)))


def host_wait_calls(names: pd.Series) -> np.ndarray:
    """Per runtime call name: whether the host can wait for the device in it (HOST_WAIT_CALL)."""
    return np.asarray(name_matches(names, HOST_WAIT_CALL), dtype=bool)



def waited_calls(runtime: pd.DataFrame, device: pd.DataFrame) -> np.ndarray:
    """Per runtime call: a host-wait call (HOST_WAIT_CALL) in which the host did wait for the
    device, as the trace shows it:

    - a synchronize, always (it returns when the work it names is done, at once when none is left);
    - a copy, where its call returned only after its own copy on the device ended (the device
      record of the same correlation id); a copy call that returned first only enqueued it
      (../shared/traces/misc/a100_nccl.json.gz: 959 of its 960 cudaMemcpyAsync, device-to-device,
      return in ~9 µs before their copy ends). Without a device record of it: where the device
      had work during the call;
    - a free, where the device had work during the call: `cudaFree` for three seconds on an idle
      device (../shared/traces/corpus/a4000_gpu_only_vit_infer.json.gz) is the context's setup,
      the host's own time.
    """
    n = len(runtime)
    if n == 0:
        return np.zeros(0, dtype=bool)
    sync = np.asarray(name_matches(runtime["name"], SYNC_CALL), dtype=bool)
    copy = np.asarray(name_matches(runtime["name"], COPY_CALL), dtype=bool)
    free = np.asarray(name_matches(runtime["name"], FREE_CALL), dtype=bool)
    out = sync.copy()
    if not (copy | free).any() or len(device) == 0:
        return out
    from advisor.metrics.intervals import merge

    ts, end = runtime["ts"].to_numpy(np.int64), runtime["end"].to_numpy(np.int64)
    s, e = merge(device["ts"].to_numpy(np.int64), device["end"].to_numpy(np.int64))
    # the last device interval that starts before the call ends: busy during the call if it ends after the call starts
    i = np.searchsorted(s, end, side="left") - 1
    busy = (i >= 0) & (e[np.maximum(i, 0)] > ts)
    # a copy's own device record: the latest end among the device rows of its correlation id
    own_end = np.full(n, -1, dtype=np.int64)
    if "correlation" in runtime.columns and "correlation" in device.columns:
        ends = device.groupby("correlation", observed=True)["end"].max()
        mapped = pd.Series(runtime["correlation"].to_numpy()).map(ends)
        own_end = mapped.fillna(-1).to_numpy(np.int64)
    recorded = copy & (own_end >= 0)
    out |= recorded & (end >= own_end)
    out |= copy & ~recorded & busy
    out |= free & busy
    return out
