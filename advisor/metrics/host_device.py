"""Measurements of the host and the device waiting on each other, shared by several rules.

The copy, sync, launch, optimizer and allocator rules all ask the same questions of a trace —
which host op launched this copy, was the device idle while the host sat in this call, which
calls are the loop's own waits — and they must answer them the same way. Everything here is a
function of the trace frames and the step spans; the op tree and the idle timeline are built
once per rank (Metrics.shared). Rules measure on the rank's one timeline: what a fix saves
comes from the replay (`advisor.whatif`), which counts each millisecond once by construction.

The cost of a blocking host call is measured the same way everywhere: while the host is stuck
in the call, the device either works (it drains what was queued) or idles. After the call
returns, the device idles until the host has launched new work. Idle time inside the call is
caused by the call (the host could not queue work); the idle gap after it is caused by the
call only as far as the host could have prepared that work while the device was still busy
during the call. So a call costs `idle_during + min(busy_during, idle_after)` — never more
than its own duration, and nothing when the device had a deep enough queue to cover it.

The idle timeline every measurement here reads is advisor.metrics.timeline. The rest stays one
module of about 630 lines: the copy, sync, launch, optimizer and allocator measurements share
the patterns and the op-tree lookups above, so each question is answered one way.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from advisor.load.trace import TraceFrames
from advisor.metrics.breakdown import (
    name_group,
    name_matches,
    communication_kernels,
    text_of,
)
# One definition of a launch and of a copy call for every stage (the device-records check, the
# rules, the what-if changes): device_records'.
from advisor.metrics.device_records import COPY_CALL as COPY_CALL
from advisor.metrics.device_records import LAUNCH_CALL as LAUNCH_CALL
from advisor.metrics.hierarchy import OpTree, op_tree
from advisor.metrics.host_waits import FREE_CALL as FREE_CALL  # the rules read them from here
from advisor.metrics.host_waits import SYNC_CALL as SYNC_CALL
from advisor.metrics.intervals import covers, merge, overlap_with, sorted_unique
from advisor.metrics.summary import Metrics
from advisor.metrics.timeline import Timeline
from advisor.metrics.timeline import timeline as timeline  # the rules read it from here
from advisor.metrics.shapes import is_shape

MEMSET_CALL = re.compile(r"Memset")
MALLOC_CALL = re.compile(r"^(cuda|hip)Malloc(Managed|Pitch)?$")
COPY_OP = re.compile(r"^aten::(to|_to_copy|copy_|cpu|cuda)$")
ATEN_OP = re.compile(r"^aten::")
ZERO_GRAD_SPAN = re.compile(r"zero_grad", re.IGNORECASE)
ZERO_OP = re.compile(r"^aten::(zero_|fill_|_foreach_zero_|zeros_like|_foreach_fill_)$")
OPTIMIZER_STEP_SPAN = re.compile(r"^Optimizer\.step#")
# The optimizer's own spans (step and zero_grad): work outside the model's forward and backward.
OPTIMIZER_SPAN = re.compile(r"^Optimizer\.(step|zero_grad)#")
MULTI_TENSOR_OP = re.compile(r"^aten::(_foreach_|_fused_)")
MULTI_TENSOR_KERNEL = re.compile(r"multi_tensor_apply|_foreach_|fused_adam|FusedAdam|fused_sgd|FusedSGD|_fused_", re.IGNORECASE)
DATA_PARALLEL_SPAN = re.compile(r"^DataParallel\.forward$")
DATA_PARALLEL_BACKWARD = re.compile(r"^(autograd::engine::evaluate_function: )?(Broadcast|ReduceAddCoalesced|Gather|Scatter)Backward\d*$")
EMPTY_CACHE_FRAME = re.compile(r"empty_cache")
# Frees inside ops a window of one pass needs before its allocator calls are churn.
ONE_PASS_CHURN_FREES = 20
EMPTY_FACTORY_OP = re.compile(r"^aten::(empty|empty_like|empty_strided)$")
# Factories that build a tensor from nothing: made on the device, no copy is needed at all.
FACTORY_OP = re.compile(
    r"^aten::(zeros|ones|empty|full|rand|randn|randint|randperm|arange|linspace|logspace|eye|normal|"
    r"zeros_like|ones_like|empty_like|full_like|rand_like|randn_like|randint_like|bernoulli|empty_strided)$"
)

# Pinned host→device bandwidth one can count on (GB/s) by compute capability: PCIe 3 for
# Pascal/Volta/Turing boards, PCIe 4 for Ampere/Ada, PCIe 5 for Hopper/Blackwell. Realistic
# figures, about 75-80% of the link's peak, so the saving is not overstated.
PINNED_GBPS_BY_ARCH = [(9.0, 50.0), (8.0, 24.0), (0.0, 12.0)]
# Copies smaller than this are latency-bound: pinning changes their device time very little.
BANDWIDTH_BOUND_BYTES = 256 * 1024



# --- runtime calls and what they launched -------------------------------------------------
def runtime_calls(frames: TraceFrames, pattern: re.Pattern) -> pd.DataFrame:
    rt = frames.runtime
    return rt[name_matches(rt["name"], pattern)]


def copy_launches(frames: TraceFrames, kind: str) -> pd.DataFrame:
    """Device copies of one direction with the runtime call that launched them.

    Columns: the device row's name, ts, end, dur, bytes, copy_src, copy_dst, correlation,
    plus call_ts, call_end, call_tid (NaN/None when the trace lost the call).
    """
    dev = frames.device
    mask = ((dev["kind"] == "memcpy") & (dev["copy_kind"] == kind)).to_numpy()
    c = dev.loc[mask, ["name", "ts", "end", "dur", "bytes", "copy_src", "copy_dst", "correlation", "stream"]]  # columns first: no copy of the rest
    rt = frames.runtime
    # Only the calls of these copies (first call per correlation id, as over all calls).
    corr = rt["correlation"]
    rt = rt.loc[((corr >= 0) & corr.isin(c["correlation"])).to_numpy(), ["correlation", "ts", "end", "tid"]]
    rt = rt.drop_duplicates("correlation")
    rt = rt.rename(columns={"ts": "call_ts", "end": "call_end", "tid": "call_tid"})
    out = c.merge(rt, on="correlation", how="left")
    out["call_tid"] = out["call_tid"].astype(str)
    return out


def rank_copy_launches(m: Metrics, kind: str) -> pd.DataFrame:
    """copy_launches once per rank and direction: the copy and the sync rules both ask."""
    return m.shared(f"host_device.copy_launches.{kind}", lambda: copy_launches(m.frames, kind))


def device_exposed_fraction(tl: Timeline, ts: np.ndarray, end: np.ndarray, kernel_mask: np.ndarray | None = None) -> np.ndarray:
    """Share of each device interval not covered by compute kernels (kernels that are not collectives)."""
    dev = tl.frames.device
    if kernel_mask is None:
        kernel_mask = (dev["kind"] == "kernel").to_numpy() & ~communication_kernels(tl.frames)
    ks, ke = merge(dev["ts"].to_numpy(np.int64)[kernel_mask], dev["end"].to_numpy(np.int64)[kernel_mask])
    ts = np.asarray(ts, dtype=np.int64)
    end = np.asarray(end, dtype=np.int64)
    length = np.maximum(end - ts, 1)
    hidden = overlap_with(ks, ke, ts, end)
    return np.clip(1.0 - hidden / length, 0.0, 1.0)


# --- host→device copies -------------------------------------------------------------------
def h2d_copies(tl: Timeline, tree: OpTree | None = None) -> pd.DataFrame:
    """Host→device copies inside steps, each with the host op that asked for it.

    Adds: in_step (bool), copy_op (position of the outermost aten::to/copy_ around the launch,
    -1 if unknown), block_end (the end of the host's wait: the launch call or a stream sync
    inside the same copy op, whichever is later), numel (elements of the copied tensor when
    shapes were recorded), cpu_made (the tensor was made by a factory op on the CPU right
    before: claimed by `cpu-tensor-then-copy`).
    """
    # Depends only on the steps and the op tree, not on the timeline's DataLoader threshold.
    return tl.metrics.shared("host_device.h2d_copies", lambda: _h2d_copies(tl, tree if tree is not None else op_tree_of(tl.metrics)))


def _h2d_copies(tl: Timeline, tree: OpTree) -> pd.DataFrame:
    frames = tl.frames
    c = rank_copy_launches(tl.metrics, "HtoD")
    c = c[tl.in_steps(c["ts"].to_numpy(np.int64))].reset_index(drop=True)
    has_call = c["call_ts"].notna().to_numpy()
    call_ts = c["call_ts"].fillna(c["ts"]).to_numpy(np.int64)
    call_end = c["call_end"].fillna(c["ts"]).to_numpy(np.int64)
    inner = np.where(has_call, tree.innermost(call_ts, c["call_tid"].to_numpy()), -1)
    copy_op = tree.nearest_ancestor(inner, tree.mask(COPY_OP), outermost=True)
    c["copy_op"] = copy_op
    # Syncs made by the same copy op (a blocking copy waits for its stream).
    syncs = runtime_calls(frames, SYNC_CALL)
    block_end = call_end.copy()
    if len(syncs) and (copy_op >= 0).any():
        s_inner = tree.innermost(syncs["ts"].to_numpy(np.int64), text_of(syncs["tid"]))
        s_op = tree.nearest_ancestor(s_inner, tree.mask(COPY_OP), outermost=True)
        ends = pd.Series(syncs["end"].to_numpy(np.int64)[s_op >= 0]).groupby(s_op[s_op >= 0]).max()
        extra = pd.Series(copy_op).map(ends).to_numpy(np.float64)
        block_end = np.where(np.isfinite(extra), np.maximum(block_end, np.nan_to_num(extra).astype(np.int64)), block_end)
    c["call_ts"] = call_ts
    c["call_end"] = call_end
    c["block_end"] = block_end
    c["numel"] = _numel(tree, copy_op)
    if len(tree.ops) == 0:  # device work but no host ops recorded: no op made any tensor
        prev = np.full(len(c), -1, dtype=np.int64)
        cpu_made = np.zeros(len(c), dtype=bool)
    else:
        prev = np.where(copy_op >= 0, tree.prev_sibling[np.clip(copy_op, 0, None)], -1)
        # an uninitialised tensor made right before a copy is its destination (torch.empty on
        # the device launches nothing either), not data made on the CPU
        is_factory = tree.mask(FACTORY_OP) & ~tree.mask(EMPTY_FACTORY_OP)
        launched = _launched_device_work(tree, frames)
        cpu_made = (prev >= 0) & is_factory[np.clip(prev, 0, None)] & ~launched[np.clip(prev, 0, None)]
        if cpu_made.any():
            # the factory's tensor is the one copied only where the sizes agree (the factory's
            # own fill, e.g. aten::zero_, records the tensor it made): a [1] tensor made before
            # a 154 MB copy is another tensor
            made_numel = _numel(tree, _first_child(tree, np.where(cpu_made, prev, -1)))
            copied = c["numel"].to_numpy(np.float64)
            known = np.isfinite(made_numel) & np.isfinite(copied)
            cpu_made &= ~(known & (made_numel != copied))
    c["cpu_made"] = cpu_made
    names = text_of(tree.ops["name"])
    c["factory_op"] = np.where(cpu_made, names[np.clip(prev, 0, None)] if len(names) else None, None)
    c["factory_pos"] = np.where(cpu_made, prev, -1)
    return c


def _first_child(tree: OpTree, pos: np.ndarray) -> np.ndarray:
    """Position of each op's first child op (-1: none, or pos is -1)."""
    parent = np.asarray(tree.parent)
    kids = np.flatnonzero(parent >= 0)
    if len(kids) == 0:
        return np.full(len(pos), -1, dtype=np.int64)
    first = pd.Series(kids).groupby(parent[kids]).min()
    out = pd.Series(pos).map(first).to_numpy(np.float64)
    return np.where(np.isfinite(out) & (pos >= 0), np.nan_to_num(out, nan=-1), -1).astype(np.int64)


def _numel(tree: OpTree, pos: np.ndarray) -> np.ndarray:
    """Elements of the first input of each op (the tensor being copied), NaN when unknown."""
    dims = tree.ops["input_dims"].to_numpy()
    out = np.full(len(pos), np.nan)
    for i, p in enumerate(pos):
        if p < 0:
            continue
        d = dims[p]
        first = d[0] if isinstance(d, list) and d else None
        if is_shape(first, 1):
            out[i] = float(np.prod(first, dtype=np.float64))
    return out


def first_input_shape(tree: OpTree, pos: int) -> list[int] | None:
    if pos < 0:
        return None
    d = tree.ops["input_dims"].iloc[pos]
    first = d[0] if isinstance(d, list) and d else None
    return list(first) if is_shape(first) else None


def _launched_device_work(tree: OpTree, frames: TraceFrames) -> np.ndarray:
    """Mask over ops: a runtime call (launch, copy, memset) happened inside the op."""
    rt = frames.runtime
    work = rt[name_matches(rt["name"], LAUNCH_CALL) | name_matches(rt["name"], COPY_CALL) | name_matches(rt["name"], MEMSET_CALL)]
    out = np.zeros(len(tree.ops), dtype=bool)
    if len(work) == 0:
        return out
    pos = tree.innermost(work["ts"].to_numpy(np.int64), text_of(work["tid"]))
    pos = pos[pos >= 0]
    # Mark the op and all its ancestors.
    cur = sorted_unique(pos)
    while len(cur):
        out[cur] = True
        cur = sorted_unique(tree.parent[cur])
        cur = cur[(cur >= 0) & ~out[np.clip(cur, 0, None)]]
    return out


def pinned_bandwidth(m: Metrics, copies: pd.DataFrame) -> tuple[float, str]:
    """The host→device bandwidth pinned memory gives on this machine (GB/s) and where it came from.

    Measured on the trace's own large pinned copies when it has some; otherwise a realistic
    figure for the GPU's generation (PCIe 3 / 4 / 5); otherwise twice the measured pageable
    bandwidth. Never below the measured pageable bandwidth.
    """
    big_pinned = copies[(copies["copy_src"] == "Pinned") & (copies["bytes"] >= 1 << 20) & (copies["dur"] > 0)]
    pageable = copies[(copies["copy_src"] == "Pageable") & (copies["bytes"] >= BANDWIDTH_BOUND_BYTES) & (copies["dur"] > 0)]
    pageable_bw = float((pageable["bytes"] / pageable["dur"]).median()) if len(pageable) else 0.0
    if len(big_pinned):
        bw = float((big_pinned["bytes"] / big_pinned["dur"]).median())
        how = f"measured on this trace's {len(big_pinned)} large pinned copies"
    elif m.device.capability is not None and m.device.capability > 0:
        bw = next(b for cc, b in PINNED_GBPS_BY_ARCH if m.device.capability >= cc)
        link = {50.0: "PCIe 5", 24.0: "PCIe 4", 12.0: "PCIe 3"}[bw]
        how = f"typical pinned bandwidth of a {link} link (compute capability {m.device.compute_capability})"
    elif pageable_bw > 0:
        bw = 2.0 * pageable_bw
        how = "twice the measured pageable bandwidth (the GPU generation is not in the trace)"
    else:
        bw = 12.0
        how = "typical pinned bandwidth of a PCIe 3 link (the GPU generation is not in the trace)"
    return max(bw, pageable_bw), how


# --- syncs --------------------------------------------------------------------------------
SYNC_CAUSES = [
    ("item", re.compile(r"^aten::(item|_local_scalar_dense)$"), ".item() / float(t) / int(t)"),
    ("data-dependent shape", re.compile(r"^aten::(nonzero|nonzero_static|masked_select|unique\w*|_unique\w*|repeat_interleave|argwhere|where)$"), "nonzero / boolean-mask indexing / unique"),
    ("python bool", re.compile(r"^aten::(is_nonzero|equal|allclose)$"), "if tensor: / torch.equal / allclose"),
    ("blocking copy", re.compile(r"^aten::(to|_to_copy|copy_|cpu|numpy|tolist)$"), ".cpu() / .numpy() / .tolist() / print(t) / .to() without non_blocking"),
]


def sync_calls(tl: Timeline, tree: OpTree | None = None) -> pd.DataFrame:
    """Calls in which the host waits for the device, inside the host's steps.

    Stream/device/event synchronizations, and device→host copies whose launch call returned
    only after the copy was done. Syncs that a pageable host→device copy makes (its own
    stream sync) are left out: they are `h2d-pageable-copy`'s. Columns: name, ts, end, tid,
    cause (item, data-dependent shape, python bool, blocking copy, explicit, other), op
    (position of the op that made it, -1 none).
    """
    # Depends only on the host steps and the op tree: `host-sync` and `gpu-idle` read the same calls.
    return tl.metrics.shared("host_device.sync_calls", lambda: _sync_calls(tl, tree if tree is not None else op_tree_of(tl.metrics)))


def _sync_calls(tl: Timeline, tree: OpTree) -> pd.DataFrame:
    frames = tl.frames
    sy = runtime_calls(frames, SYNC_CALL)[["name", "ts", "end", "tid"]].copy()
    sy["name"] = sy["name"].astype(str)
    d2h = rank_copy_launches(tl.metrics, "DtoH")
    d2h = d2h[d2h["call_ts"].notna() & (d2h["call_end"] >= d2h["end"])]
    blocking = pd.DataFrame(
        {
            "name": "blocking copy to host (" + d2h["name"].astype(str) + ")",
            "ts": d2h["call_ts"].to_numpy(np.int64),
            "end": d2h["call_end"].to_numpy(np.int64),
            "tid": d2h["call_tid"].to_numpy(),
        }
    )
    calls = pd.concat([sy, blocking], ignore_index=True)
    calls["tid"] = calls["tid"].astype(str)
    calls = calls[tl.in_host_steps(calls["ts"].to_numpy(np.int64))].reset_index(drop=True)
    if len(calls) == 0:
        return calls.assign(cause=pd.Series(dtype=str), op=pd.Series(dtype=np.int64))
    inner = tree.innermost(calls["ts"].to_numpy(np.int64), calls["tid"].to_numpy())
    # Left out: the stream syncs of pageable host→device copies.
    h2d = rank_copy_launches(tl.metrics, "HtoD")
    pageable_ops = set()
    if len(h2d):
        pg = h2d[(h2d["copy_src"] == "Pageable") & h2d["call_ts"].notna()]
        p_inner = tree.innermost(pg["call_ts"].to_numpy(np.int64), pg["call_tid"].to_numpy())
        pageable_ops = set(tree.nearest_ancestor(p_inner, tree.mask(COPY_OP), outermost=True).tolist()) - {-1}
    copy_owner = tree.nearest_ancestor(inner, tree.mask(COPY_OP), outermost=True)
    own = np.isin(copy_owner, list(pageable_ops)) & ~calls["name"].str.startswith("blocking copy").to_numpy()
    calls = calls[~own].reset_index(drop=True)
    inner = inner[~own]
    cause = np.full(len(calls), "other", dtype=object)
    op = np.full(len(calls), -1, dtype=np.int64)
    for label, pattern, _ in reversed(SYNC_CAUSES):  # first listed wins
        pos = tree.nearest_ancestor(inner, tree.mask(pattern), outermost=True)
        cause[pos >= 0] = label
        op[pos >= 0] = pos[pos >= 0]
    aten_any = tree.nearest_ancestor(inner, tree.mask(ATEN_OP), outermost=True)
    explicit = (cause == "other") & (aten_any < 0)
    cause[explicit] = "explicit"
    other = (cause == "other") & (aten_any >= 0)
    op[other] = aten_any[other]
    calls["cause"] = cause
    calls["op"] = op
    return calls


# --- spans other rules own ----------------------------------------------------------------
def zero_grad_memsets(tl: Timeline, tree: OpTree) -> pd.DataFrame:
    """zero_grad spans that zero the gradients (aten::zero_/fill_/_foreach_zero_ inside)."""
    spans = np.nonzero(tree.mask(ZERO_GRAD_SPAN) & ~tree.mask(ATEN_OP))[0]
    if len(spans) == 0:
        return tree.ops.iloc[[]].assign(pos=pd.Series(dtype=np.int64), zero_ops=pd.Series(dtype=np.int64))
    is_zero = tree.mask(ZERO_OP)
    zero_pos = np.nonzero(is_zero)[0]
    # Count each zeroing once: not the fill_ that a zero_ runs inside.
    zero_pos = zero_pos[~is_zero[np.clip(tree.parent[zero_pos], 0, None)] | (tree.parent[zero_pos] < 0)]
    span_mask = np.zeros(len(tree.ops), dtype=bool)
    span_mask[spans] = True
    owner = tree.nearest_ancestor(zero_pos, span_mask)
    counts = pd.Series(owner[owner >= 0]).value_counts()
    rows = tree.ops.iloc[counts.index.to_numpy()].copy()
    rows["pos"] = counts.index.to_numpy()
    rows["zero_ops"] = counts.to_numpy()
    rows = rows[tl.in_host_steps(rows["ts"].to_numpy(np.int64))]
    return rows.sort_values("ts")


def launches_in_spans(tl: Timeline, tree: OpTree, spans: np.ndarray) -> pd.DataFrame:
    """Kernel launches (runtime call + the device row it started) made inside the given op positions."""
    calls, inner = launch_calls(tl, tree)
    if len(calls) == 0 or len(spans) == 0:
        return pd.DataFrame(columns=["span", "call_ts", "correlation", "kernel", "k_ts", "k_end", "k_dur"])
    owner = tree.nearest_ancestor(inner, _mask_of(len(tree.ops), spans))
    mine = calls[owner >= 0].reset_index(drop=True)
    return mine.assign(span=owner[owner >= 0])[LAUNCH_COLUMNS]


LAUNCH_COLUMNS = ["name", "call_ts", "end", "tid", "correlation", "span", "kernel", "k_ts", "k_end", "k_dur"]


def launch_calls(tl: Timeline, tree: OpTree) -> tuple[pd.DataFrame, np.ndarray]:
    """Every kernel launch call joined to the device row it started, and the innermost op open
    around each call: built once per rank (the optimizer and zero_grad rules both ask)."""
    return tl.metrics.shared("host_device.launch_calls", lambda: _launch_calls(tl.frames, tree))


def _launch_calls(frames: TraceFrames, tree: OpTree) -> tuple[pd.DataFrame, np.ndarray]:
    rt = runtime_calls(frames, LAUNCH_CALL)[["name", "ts", "end", "tid", "correlation"]]
    if len(rt) == 0:
        return rt, np.zeros(0, dtype=np.int64)
    inner = tree.innermost(rt["ts"].to_numpy(np.int64), text_of(rt["tid"]))
    dev = frames.device
    k = dev[dev["correlation"] >= 0][["correlation", "name", "ts", "end", "dur"]].drop_duplicates("correlation")
    k = k.rename(columns={"name": "kernel", "ts": "k_ts", "end": "k_end", "dur": "k_dur"})
    return rt.rename(columns={"ts": "call_ts"}).merge(k, on="correlation", how="left"), inner


def per_parameter_optimizer_steps(tl: Timeline, tree: OpTree, min_launches: int) -> pd.DataFrame:
    """Optimizer.step spans inside steps that launch one small kernel per parameter.

    A step is per-parameter when it launches at least `min_launches` kernels, runs no
    `_foreach_`/`_fused_` op and no multi-tensor kernel. Columns: the span's op row plus pos,
    launches, kernel_ns, optimizer.
    """
    # Depends only on the host steps and the op tree, not on the timeline's DataLoader threshold.
    return tl.metrics.shared(
        f"host_device.per_parameter_optimizer_steps.{min_launches}", lambda: _per_parameter_optimizer_steps(tl, tree, min_launches)
    )


def _per_parameter_optimizer_steps(tl: Timeline, tree: OpTree, min_launches: int) -> pd.DataFrame:
    spans = np.nonzero(tree.mask(OPTIMIZER_STEP_SPAN))[0]
    spans = spans[tl.in_host_steps(tree.ops["ts"].to_numpy(np.int64)[spans])]
    if len(spans) == 0:
        return tree.ops.iloc[[]].assign(
            pos=pd.Series(dtype=np.int64), launches=pd.Series(dtype=np.int64), kernel_ns=pd.Series(dtype=np.int64), optimizer=pd.Series(dtype=str)
        )
    lk = launches_in_spans(tl, tree, spans)
    multi_op = tree.nearest_ancestor(np.nonzero(tree.mask(MULTI_TENSOR_OP))[0], _mask_of(len(tree.ops), spans))
    has_multi_op = set(multi_op[multi_op >= 0].tolist())
    multi_kernel = set(lk.loc[name_matches(lk["kernel"], MULTI_TENSOR_KERNEL), "span"].tolist()) if len(lk) else set()
    # Launches and kernel ns per span (spans are sorted positions, each launch names one).
    span_i = np.searchsorted(spans, lk["span"].to_numpy(np.int64))
    k_dur = np.nan_to_num(lk["k_dur"].to_numpy(np.float64))
    rows = tree.ops.iloc[spans].copy()
    rows["pos"] = spans
    rows["launches"] = np.bincount(span_i, minlength=len(spans)).astype(np.int64)
    rows["kernel_ns"] = np.bincount(span_i, weights=k_dur, minlength=len(spans)).astype(np.int64)
    rows["optimizer"] = rows["name"].astype(str).str.replace(r"^Optimizer\.step#", "", regex=True).str.replace(r"\.step$", "", regex=True)
    per_param = (
        (rows["launches"] >= min_launches)
        & ~rows["pos"].isin(has_multi_op | multi_kernel)
        & ~rows["optimizer"].str.contains("fused", case=False)
    )
    return rows[per_param.to_numpy()]


BUILTIN_CALL = re.compile(r"^<built-in (?:method|function) (\w+)")


def optimizer_dispatch_windows(tl: Timeline, tree: OpTree, spans: np.ndarray) -> tuple[np.ndarray, np.ndarray, pd.DataFrame]:
    """The host time a per-parameter optimizer step spends dispatching its per-tensor ops.

    Each op directly under an `Optimizer.step` span that launched a kernel (`aten::mul_`,
    `aten::lerp_`, ...) is one per-parameter dispatch; the Python binding that called it
    (`<built-in method mul_ of Tensor ...>` around it, when the trace has Python frames) is
    part of it.
    Returns the merged windows of those dispatches and the dispatch ops themselves (their
    op-tree rows plus `pos` and `span`). The rest of the step (Python bookkeeping per
    parameter, the step counters on the host) is not dispatch and stays.
    """
    calls, inner = launch_calls(tl, tree)
    span_mask = _mask_of(len(tree.ops), spans)
    empty = np.zeros(0, dtype=np.int64)
    if len(calls) == 0 or len(spans) == 0:
        return empty, empty, tree.ops.iloc[[]].assign(pos=pd.Series(dtype=np.int64), span=pd.Series(dtype=np.int64))
    owner = tree.nearest_ancestor(inner, span_mask)
    cur = inner[owner >= 0]
    # Walk each launching op up to the child of its span: the op the step dispatched.
    for _ in range(int(tree.depth.max(initial=0)) + 2):
        parent = tree.parent[cur]
        up = (parent >= 0) & ~span_mask[np.clip(parent, 0, None)]
        if not up.any():
            break
        cur = np.where(up, parent, cur)
    pos = sorted_unique(cur[~span_mask[cur]])
    ops = tree.ops.iloc[pos].assign(pos=pos, span=tree.parent[pos])
    s, e = ops["ts"].to_numpy(np.int64), ops["end"].to_numpy(np.int64)
    host = tl.frames.host
    py = host[(host["kind"] == "python").to_numpy()]
    if len(py) and len(ops):
        method = name_group(py["name"], BUILTIN_CALL)
        dispatched = set(ops["name"].astype(str).str.replace(r"^aten::", "", regex=True))
        wrap = py[pd.Series(method).isin(dispatched).to_numpy()]
        ss, se = tree.ops["ts"].to_numpy(np.int64)[spans], tree.ops["end"].to_numpy(np.int64)[spans]
        order = np.argsort(ss)
        ss, se = ss[order], se[order]
        w_ts, w_end = wrap["ts"].to_numpy(np.int64), wrap["end"].to_numpy(np.int64)
        i = np.searchsorted(ss, w_ts, side="right") - 1
        inside = (i >= 0) & (w_end <= se[np.clip(i, 0, None)])
        # ... and holds a dispatch op (a same-named call on a CPU tensor launches nothing)
        by_ts = np.argsort(s, kind="stable")
        o_ts, o_end = s[by_ts], e[by_ts]
        j = np.searchsorted(o_ts, w_ts, side="left")
        jj = np.clip(j, 0, max(len(o_ts) - 1, 0))
        holds = (j < len(o_ts)) & (o_ts[jj] <= w_end) & (o_end[jj] <= w_end)
        keep = inside & holds
        s, e = np.concatenate([s, w_ts[keep]]), np.concatenate([e, w_end[keep]])
    ws, we = merge(s, e)
    return ws, we, ops


def _mask_of(n: int, pos: np.ndarray) -> np.ndarray:
    m = np.zeros(n, dtype=bool)
    m[np.asarray(pos, dtype=np.int64)] = True
    return m


def data_parallel_spans(tl: Timeline, tree: OpTree) -> pd.DataFrame:
    """DataParallel.forward spans and the backward nodes of its scatter/broadcast/gather, inside steps."""
    hit = tree.mask(DATA_PARALLEL_SPAN) | tree.mask(DATA_PARALLEL_BACKWARD)
    pos = np.nonzero(hit)[0]
    # Keep only the outermost of nested hits (e.g. evaluate_function wrapping the node).
    outer = tree.nearest_ancestor(pos, hit, outermost=True)
    pos = sorted_unique(outer[outer >= 0])
    rows = tree.ops.iloc[pos].copy()
    rows["pos"] = pos
    return rows[tl.in_host_steps(rows["ts"].to_numpy(np.int64))]


def allocator_calls(tl: Timeline, tree: OpTree, warmup_steps: int) -> pd.DataFrame:
    """cudaMalloc/cudaFree calls inside steps, each with the rule that owns it.

    owner = "empty-cache" for a cudaFree made outside any aten op (the Python loop emptying
    the cache; inside an op a cudaFree is the allocator's own retry after a failed
    allocation) and for the cudaMalloc calls that follow it in the same and the next step
    (re-acquiring what was given back); "allocator-churn" for the other calls after the first
    `warmup_steps` steps; "warm-up" for calls during the first steps. In a window of no more
    steps than that, the frees and the mallocs after a step's first free are churn.
    """
    # Depends only on the steps and the op tree: both allocator rules share it.
    return tl.metrics.shared(f"host_device.allocator_calls.{warmup_steps}", lambda: _allocator_calls(tl, tree, warmup_steps))


def owned_allocator_calls(tl: Timeline, owner: str, warmup_steps: int, min_share: float) -> tuple[pd.DataFrame, Timeline, OpTree, float] | None:
    """The allocator calls `owner` owns, with their blocking cost, and what they cost per step
    (None when there are none or they cost less than `min_share` of the step)."""
    m = tl.metrics
    tree = op_tree_of(m)
    calls = allocator_calls(tl, tree, warmup_steps=warmup_steps)
    if len(calls) == 0 or not (calls["owner"] == owner).any():
        return None
    cost = tl.blocking_cost(calls["ts"].to_numpy(np.int64), calls["end"].to_numpy(np.int64))
    mine = pd.concat([calls, cost], axis=1)
    mine = mine[mine["owner"] == owner]
    saving = per_step(mine["cost"].sum(), tl)
    step_ms = m.mean_step_ns / 1e6
    if saving <= 0 or step_ms <= 0 or saving / step_ms < min_share:
        return None
    return mine, tl, tree, saving


def _allocator_calls(tl: Timeline, tree: OpTree, warmup_steps: int) -> pd.DataFrame:
    rt = runtime_calls(tl.frames, MALLOC_CALL)
    fr = runtime_calls(tl.frames, FREE_CALL)
    rows = tl.frames.runtime.index  # each call's row of frames.runtime, as a replayed change names it
    calls = pd.concat([rt.assign(call="malloc", row=rows.get_indexer(rt.index)), fr.assign(call="free", row=rows.get_indexer(fr.index))])[
        ["name", "ts", "end", "dur", "tid", "call", "row"]
    ]
    calls = calls.sort_values("ts", kind="stable").reset_index(drop=True)
    calls["name"] = calls["name"].astype(str)
    calls["tid"] = calls["tid"].astype(str)
    step = tl.step_index(calls["ts"].to_numpy(np.int64))
    host_in = tl.in_host_steps(calls["ts"].to_numpy(np.int64))
    calls["step_i"] = step
    calls = calls[(step >= 0) & host_in].reset_index(drop=True)
    if len(calls) == 0:
        return calls.assign(owner=pd.Series(dtype=str), in_op=pd.Series(dtype=bool))
    inner = tree.innermost(calls["ts"].to_numpy(np.int64), calls["tid"].to_numpy())
    in_op = tree.nearest_ancestor(inner, tree.mask(ATEN_OP)) >= 0
    python_empty = _inside_python_frame(tl.frames, calls, EMPTY_CACHE_FRAME)
    calls["in_op"] = in_op
    is_empty = (calls["call"] == "free").to_numpy() & (~in_op | python_empty)
    owner = np.where(calls["step_i"].to_numpy() < warmup_steps, "warm-up", "allocator-churn").astype(object)
    is_free = (calls["call"] == "free").to_numpy()
    if tl.n_steps <= warmup_steps and int((is_free & in_op).sum()) >= ONE_PASS_CHURN_FREES:
        # No step after the warm-up (a window of one pass): a warm-up's allocations only grow
        # the cache; frees inside ops, again and again, and the mallocs after the first, are
        # the cache given back and asked for again within the pass (a cold start's few frees,
        # the context's cudaFree(0) among them, are not).
        first_free = pd.Series(np.where(is_free, calls["ts"].to_numpy(np.int64), np.iinfo(np.int64).max)).groupby(
            calls["step_i"].to_numpy()
        ).transform("min").to_numpy()
        churn = is_free | (calls["ts"].to_numpy(np.int64) > first_free)
        owner[churn] = "allocator-churn"
    owner[is_empty] = "empty-cache"
    if is_empty.any():
        first_free = calls.loc[is_empty].groupby("step_i")["ts"].min()
        for si, t0 in first_free.items():
            follow = (calls["call"] == "malloc").to_numpy() & (
                ((calls["step_i"] == si) & (calls["ts"] > t0)) | (calls["step_i"] == si + 1)
            ).to_numpy()
            owner[follow] = "empty-cache"
    calls["owner"] = owner
    return calls


def _inside_python_frame(frames: TraceFrames, rows: pd.DataFrame, pattern: re.Pattern) -> np.ndarray:
    host = frames.host
    py = host[(host["kind"] == "python") & name_matches(host["name"], pattern)]
    out = np.zeros(len(rows), dtype=bool)
    for tid, g in py.groupby("tid", observed=True):
        s, e = merge(g["ts"].to_numpy(np.int64), g["end"].to_numpy(np.int64))
        sel = (text_of(rows["tid"]) == str(tid))
        out[sel] = covers(s, e, rows["ts"].to_numpy(np.int64)[sel])
    return out


def per_step(total_ns: float, tl: Timeline) -> float:
    """ns over the window → ms per step."""
    return float(total_ns) / max(tl.n_steps, 1) / 1e6


def held_windows(tl: Timeline) -> tuple[np.ndarray, np.ndarray]:
    """Merged windows in which the host was held in a call that waits: a synchronize or a
    blocking copy to the host (`sync_calls`), a pageable host→device copy (until its call or
    its stream sync returns), a cudaMalloc/cudaFree. Device idle time inside them is that
    call's, not time the device spent waiting for the host's next launch."""
    return tl.metrics.shared("host_device.held_windows", lambda: _held_windows(tl))


def _held_windows(tl: Timeline) -> tuple[np.ndarray, np.ndarray]:
    tree = op_tree_of(tl.metrics)
    syncs = sync_calls(tl, tree)
    copies = h2d_copies(tl, tree)
    pageable = copies[copies["copy_src"] == "Pageable"]
    alloc = allocator_calls(tl, tree, warmup_steps=0)
    s = np.concatenate([syncs["ts"].to_numpy(np.int64), pageable["call_ts"].to_numpy(np.int64), alloc["ts"].to_numpy(np.int64)])
    e = np.concatenate([syncs["end"].to_numpy(np.int64), pageable["block_end"].to_numpy(np.int64), alloc["end"].to_numpy(np.int64)])
    return merge(s, e)


def optimizer_step_windows(tl: Timeline) -> tuple[np.ndarray, np.ndarray]:
    """Merged windows of the optimizer's step spans (`Optimizer.step#...`) inside the host's steps."""
    return tl.metrics.shared("host_device.optimizer_step_windows", lambda: _optimizer_step_windows(tl))


def _optimizer_step_windows(tl: Timeline) -> tuple[np.ndarray, np.ndarray]:
    host = tl.frames.host
    rows = host[name_matches(host["name"], OPTIMIZER_STEP_SPAN)]
    rows = rows[tl.in_host_steps(rows["ts"].to_numpy(np.int64))]
    return merge(rows["ts"].to_numpy(np.int64), rows["end"].to_numpy(np.int64))


def op_tree_of(m: Metrics) -> OpTree:
    """The rank's op tree, built once and shared by the rules."""
    return m.shared("host_device.op_tree", lambda: op_tree(m.frames))


def candidates(tl: Timeline, find) -> tuple[pd.DataFrame, Timeline, OpTree] | None:
    """What a host-side rule starts from: `find(timeline, op_tree)`'s rows, the timeline and the
    op tree; None on CPU-only runs, runs without steps, or no rows."""
    m = tl.metrics
    if not m.has_device or m.mean_step_ns <= 0:
        return None
    tree = op_tree_of(m)
    rows = find(tl, tree)
    if len(rows) == 0:
        return None
    return rows, tl, tree
