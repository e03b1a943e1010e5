"""Time per nn.Module, where the trace records module calls (as HTA's and TraceLens' module views).

With `with_stack=True` (or `experimental_config=_ExperimentalConfig(verbose=True)`), the
profiler's Python tracer writes each module call as a `python_function` event named
`nn.Module: <Class>_<n>` (n counts the instances of that class). Calls nest on their thread,
so each call has a path (`Net_0/BatchNorm2d_1`): the modules open around it when it started.

Per path, over the calls that start inside the steps: the calls, their host time (the
calls' spans, children included) and the device time of the work they launched (kernels,
copies and memsets whose launch call runs inside the module's span on the module's thread,
children included). Work launched from another thread (autograd's backward thread) belongs
to no module here: the backward pass of a module is not its forward's call.
"""

from __future__ import annotations

import msgspec
import numpy as np
import pandas as pd

from advisor.load.trace import TraceFrames
from advisor.metrics.breakdown import name_matches, text_of
from advisor.metrics.steps import MODULE_CALL

MAX_MODULES = 100  # rows kept, by device time then host time
PREFIX = "nn.Module: "


class ModuleRow(msgspec.Struct, forbid_unknown_fields=True):
    """One module path: calls, host ms and device ms over the steps (children included)."""

    path: str
    module: str
    depth: int
    calls: int
    host_ms: float
    device_ms: float
    device_ops: int


class ModuleTime(msgspec.Struct, forbid_unknown_fields=True):
    """Time per nn.Module path over a rank's steps (`steps` of them): the `MAX_MODULES` paths
    with the most device time (then host time), and how many paths were left out."""

    steps: int
    rows: list[ModuleRow]
    left_out: int


def module_time(frames: TraceFrames, steps: pd.DataFrame) -> ModuleTime | None:
    """ModuleTime of a rank; None where its trace records no module call inside the steps."""
    host = frames.host
    if len(host) == 0 or len(steps) == 0:
        return None
    kinds = host["kind"]
    is_python = (kinds == "python").to_numpy()
    if not is_python.any():
        return None
    sel = np.flatnonzero(is_python)
    sel = sel[name_matches(host["name"].iloc[sel], MODULE_CALL)]
    if len(sel) == 0:
        return None
    ts = host["ts"].to_numpy(np.int64)[sel]
    end = host["end"].to_numpy(np.int64)[sel]
    tid = text_of(host["tid"].iloc[sel])
    name = np.array([n[len(PREFIX):] for n in text_of(host["name"].iloc[sel])], dtype=object)
    lo, hi = int(steps["start"].min()), int(steps["end"].max())

    # each call's path: the calls open around it on its thread (outermost first)
    order = np.lexsort((-end, ts, tid))
    path = np.empty(len(sel), dtype=object)
    depth = np.zeros(len(sel), dtype=np.int64)
    stack: list[tuple[int, str]] = []  # (end, path)
    current = None
    for i in order:
        if tid[i] != current:
            stack, current = [], tid[i]
        while stack and stack[-1][0] <= ts[i]:
            stack.pop()
        p = f"{stack[-1][1]}/{name[i]}" if stack else name[i]
        path[i], depth[i] = p, len(stack)
        stack.append((end[i], p))

    inside = (ts >= lo) & (ts < hi)
    if not inside.any():
        return None

    # device work launched inside each call, on its thread: per thread, the launches in time
    # order with the running sum of their device time
    device_ns = np.zeros(len(sel), dtype=np.float64)
    device_ops = np.zeros(len(sel), dtype=np.int64)
    dev, rt = frames.device, frames.runtime
    if len(dev) and len(rt):
        launch = pd.Series(np.arange(len(rt)), index=rt["correlation"].to_numpy(np.int64))
        launch = launch[~launch.index.duplicated()]
        at = launch.reindex(dev["correlation"].to_numpy(np.int64)).to_numpy()
        ok = ~np.isnan(at)
        at = at[ok].astype(np.int64)
        l_ts = rt["ts"].to_numpy(np.int64)[at]
        l_tid = text_of(rt["tid"].iloc[at])
        d = (dev["end"].to_numpy(np.int64) - dev["ts"].to_numpy(np.int64))[ok].astype(np.float64)
        for t in pd.unique(tid):
            mine = l_tid == t
            if not mine.any():
                continue
            o = np.argsort(l_ts[mine], kind="stable")
            lt = l_ts[mine][o]
            cum = np.concatenate([[0.0], np.cumsum(d[mine][o])])
            rows = np.flatnonzero(tid == t)
            a = np.searchsorted(lt, ts[rows], side="left")
            b = np.searchsorted(lt, end[rows], side="right")
            device_ns[rows] = cum[b] - cum[a]
            device_ops[rows] = b - a

    table = pd.DataFrame({"path": path[inside], "module": name[inside], "depth": depth[inside], "host": (end - ts)[inside].astype(np.float64),
                          "device": device_ns[inside], "ops": device_ops[inside]})
    g = table.groupby("path", sort=False).agg(module=("module", "first"), depth=("depth", "first"), calls=("host", "size"),
                                              host=("host", "sum"), device=("device", "sum"), ops=("ops", "sum"))
    g = g.sort_values(["device", "host"], ascending=False, kind="stable")
    kept = g.head(MAX_MODULES)
    rows = [ModuleRow(str(p), str(r.module), int(r.depth), int(r.calls), float(r.host) / 1e6, float(r.device) / 1e6, int(r.ops))
            for p, r in zip(kept.index, kept.itertuples(index=False), strict=True)]
    return ModuleTime(int(len(steps)), rows, int(len(g) - len(kept)))
