"""The user's own line of code behind an event, so a finding can say where to look.

Two places hold it: the 2021 schema's `Call stack` argument on each op ("file.py(42): fn;..."),
and, in current traces recorded with `with_stack=True`, `python_function` events that
enclose the op on the same thread ("train.py(42): <module>").
"""

from __future__ import annotations

import re
import sys

import numpy as np
import pandas as pd

from advisor.load.trace import TraceFrames
from advisor.metrics.breakdown import per_name, text_of

FRAME = re.compile(r"^(?P<file>.+?)\((?P<line>\d+)\): (?P<func>.+)$")
LIBRARY = re.compile(r"(site-packages|dist-packages|/lib/python3|/torch/|/torchvision/|<built-in|<frozen|^torch/|^threading\.py|advisor/capture/)")
# The profiler names a file by its path under the first folder of sys.path that holds it
# (torch.profiler.python_tracer), so an installed package's file reads `torchvision/models/
# resnet.py` and the user's script `train.py`: a path whose first folder is one of PyTorch's
# own packages, or of Python's, is library code, as the absolute paths LIBRARY names are.
# Other libraries' frames stay: a wait inside Lightning's loader is told to be there, and
# where the module builds its DataLoader is the fix (advisor.fix). (`test` is Python's
# package and many a user's folder.)
LIBRARY_PACKAGES = frozenset({"torch", "torchvision", "torchaudio", "torchtext", "torchdata", "functorch"}) | (
    frozenset(sys.stdlib_module_names) - {"test"}
)


def library_file(file: str) -> bool:
    """Whether a frame's file is library code rather than the user's."""
    if LIBRARY.search(file):
        return True
    top, folder, _ = file.replace("\\", "/").partition("/")
    return bool(folder) and top in LIBRARY_PACKAGES


def user_frame(stack: str | None) -> str | None:
    """The innermost frame of a 'Call stack' string that is not library code."""
    if not stack:
        return None
    for frame in str(stack).split(";"):
        frame = frame.strip()
        m = FRAME.match(frame)
        if m and not library_file(m.group("file")):
            return frame
    return None


NOT_IN_TRACE = "user line not in the trace: its Python stack stops at {frame}, where profiling started"


def source_lines(frames: TraceFrames, rows: pd.DataFrame, limit: int = 3) -> list[str]:
    """The most common user source lines behind the given host rows (most frequent first).

    A Python frame that was already running when profiling started (it encloses whole steps:
    the script's `main`, the training loop) is recorded at the line where profiling started,
    not at the line behind the op: when only such frames enclose the rows, the one line says
    that the user's line is not in the trace, naming where the stack stops."""
    found: list[str] = []
    if "call_stack" in rows and rows["call_stack"].notna().any():
        found = [f for f in _user_frames(rows["call_stack"]) if f]
    if not found:
        found = _enclosing_python_frames(frames, rows)
        if not found:
            outer = _enclosing_python_frames(frames, rows, outer=True)
            if outer:
                return [NOT_IN_TRACE.format(frame=pd.Series(outer).value_counts().index[0])]
    if not found:
        return []
    return pd.Series(found).value_counts().head(limit).index.tolist()


def _user_frames(stacks: pd.Series) -> list[str | None]:
    """user_frame of each non-null stack, in row order; a categorical column (a trace has few
    distinct stacks and many rows) is parsed once per distinct stack."""
    if not isinstance(stacks.dtype, pd.CategoricalDtype):
        return [user_frame(s) for s in stacks.dropna().astype(str)]
    codes = stacks.cat.codes.to_numpy()
    codes = codes[codes >= 0]
    categories = stacks.cat.categories
    per_stack = {c: user_frame(str(categories[c])) for c in np.unique(codes).tolist()}
    return [per_stack[c] for c in codes.tolist()]


def _open_at_start(frames: TraceFrames, frame_ts: np.ndarray, frame_end: np.ndarray, tid: object) -> np.ndarray:
    """Frames already running when profiling started: each encloses a whole ProfilerStep, or
    (without step markers) 90% or more of its thread's recorded host time."""
    steps = getattr(frames, "steps", None)
    if steps is not None and len(steps):
        ss, se = steps["start"].to_numpy(np.int64), steps["end"].to_numpy(np.int64)
        return ((frame_ts[:, None] <= ss[None, :]) & (frame_end[:, None] >= se[None, :])).any(axis=1)
    host = frames.host
    on = host[host["tid"] == tid]
    if len(on) == 0:
        return np.zeros(len(frame_ts), dtype=bool)
    lo, hi = int(on["ts"].min()), int(on["end"].max())
    return (frame_end - frame_ts) >= 0.9 * max(hi - lo, 1)


def _user_python_frames(frames: TraceFrames) -> dict[tuple[object, bool], tuple[np.ndarray, np.ndarray, pd.Series]]:
    """The user frames among the host's python_function events (`train.py(42): fn`, not
    library code) by thread and by whether they were open when profiling started: (starts,
    ends, names) of each. Made once per frames, each distinct name read once: every finding's
    source line reads them, and a trace recorded with stacks holds tens of thousands."""
    host, steps = frames.host, getattr(frames, "steps", None)
    kept = frames.__dict__.get("_user_python_frames")
    if kept is not None and kept[0] is host and kept[1] is steps:
        return kept[2]
    py = host[host["kind"] == "python"]
    user = py[per_name(py["name"], "user frame", _is_user_frame, dtype=bool, missing=False)]
    ts, end = user["ts"].to_numpy(np.int64), user["end"].to_numpy(np.int64)
    by_thread = {}
    for tid in user["tid"].unique():
        on = (user["tid"] == tid).to_numpy()
        open_at_start = _open_at_start(frames, ts[on], end[on], tid)
        for outer in (False, True):
            pick = np.flatnonzero(on)[open_at_start == outer]
            if len(pick):
                by_thread[(tid, outer)] = (ts[pick], end[pick], user["name"].iloc[pick])
    frames.__dict__["_user_python_frames"] = (host, steps, by_thread)
    return by_thread


def _is_user_frame(name: str) -> bool:
    """Whether a name is a frame (`file(line): fn`) of code that is not a library's."""
    m = FRAME.match(name)
    return m is not None and LIBRARY.search(name) is None and not library_file(m.group("file"))


def _enclosing_python_frames(frames: TraceFrames, rows: pd.DataFrame, outer: bool = False) -> list[str]:
    """The innermost user frame enclosing each row, leaving out frames open when profiling
    started (with outer=True: only those)."""
    if len(rows) == 0:
        return []
    by_thread = _user_python_frames(frames)
    out = []
    for tid, grp in rows.groupby("tid", observed=True):
        if (tid, outer) not in by_thread:
            continue
        starts, ends, names = by_thread[(tid, outer)]
        found = []
        for ts, end in zip(grp["ts"].to_numpy(np.int64), grp["end"].to_numpy(np.int64), strict=True):
            # innermost enclosing user frame: the latest-starting one that still covers the row
            i = np.searchsorted(starts, ts, side="right") - 1
            while i >= 0 and ends[i] < end:
                i -= 1
            if i >= 0:
                found.append(i)
        if found:
            out.extend(text_of(names.iloc[found]).tolist())
    return out
