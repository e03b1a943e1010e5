"""What `torch.autocast` would add to an fp32 run: its casts, read from the run's own ops.

Autocast runs each op of its lower-precision list (linear, matmul, convolution, attention,
RNNs) in bf16/fp16 and first casts the op's fp32 tensor inputs; an op of its fp32 list
(layer_norm, losses, ...) casts 16-bit inputs back to fp32. Each cast is an `aten::to` ->
`aten::_to_copy`: an allocation and a copy kernel. A cast of a tensor that requires grad adds
a `ToCopyBackward0` node to the backward, which casts the gradient back; an elementwise op
that mixes a 16-bit and an fp32 tensor (a residual add) promotes to fp32, and its backward
casts the gradient of the 16-bit side.

An fp32 trace recorded with `record_shapes=True` holds each op's input types and shapes, not
which tensor flows where, so the dtype autocast would give the activation is followed along
the forward's top-level ops in order: an autocast op makes it 16-bit; an fp32-list op, or an
op with a second floating tensor input (a residual, a position embedding), makes it fp32;
anything else (views, unary elementwise ops, dropout, reductions, batch norm, whose fp32
weights and statistics do not promote a 16-bit input) keeps it. An op that mixes the
activation with a second tensor of the batch (same leading dimension and rank: a residual
add) gives the lower precision only where both are 16 bit: the second is the residual
stream, whose dtype is the last such op's result (a ResNet's stays 16 bit; a ViT's is fp32
from its position embedding on); a second tensor that is not the batch's (a position
embedding, a bias) is an fp32 parameter and promotes. The inputs after
the first of linear, convolution and RNN ops are parameters: fp32, cast every step. Two
16-bit activations multiplied together read as a promotion: the walk over-counts there.

On the fp32 ViT of `../shared/whatif/h100_vit` this predicts the 190 casts per step its bf16
run recorded (87 forward, 86 `ToCopyBackward0`, 17 in residual adds' backward).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np
import orjson
import pandas as pd

from advisor.metrics.breakdown import name_matches, row_groups, text_of, text_or_empty
from advisor.metrics.hierarchy import OpTree, op_tree
from advisor.metrics.shapes import numel

# Ops autocast runs in 16 bit (CUDA's lower-precision list), by the name the trace shows.
LOWER_PRECISION_OP = re.compile(
    r"^aten::(conv[123]d|conv_tbc|conv_transpose[123]d|convolution|_convolution|prelu|addmm|addmv|addr|matmul|einsum|mm|mv|"
    r"linear|addbmm|baddbmm|bmm|chain_matmul|linalg_multi_dot|lstm_cell|gru_cell|rnn_tanh_cell|rnn_relu_cell|lstm|gru|"
    r"rnn_tanh|rnn_relu|scaled_dot_product_attention|_scaled_dot_product_\w*attention\w*)$"
)
# Of those, ops whose inputs after the first are parameters (weights, biases).
PARAMETER_OP = re.compile(r"^aten::(conv[123]d|conv_tbc|conv_transpose[123]d|convolution|_convolution|prelu|linear|\w+_cell|lstm|gru|rnn_tanh|rnn_relu)$")
# Ops autocast runs in fp32, casting 16-bit inputs up first.
FP32_CAST_OP = re.compile(
    r"^aten::(acos|asin|cosh|erfinv|exp|expm1|log|log10|log2|log1p|reciprocal|rsqrt|sinh|tan|pow|softplus|layer_norm|"
    r"group_norm|frobenius_norm|nuclear_norm|cosine_similarity|poisson_nll_loss|cosine_embedding_loss|nll_loss|nll_loss2d|"
    r"nll_loss_nd|hinge_embedding_loss|kl_div|l1_loss|smooth_l1_loss|huber_loss|mse_loss|margin_ranking_loss|"
    r"multilabel_margin_loss|soft_margin_loss|triplet_margin_loss|multi_margin_loss|binary_cross_entropy_with_logits|"
    r"dist|pdist|cdist|renorm|logsumexp|cross_entropy_loss)$"
)
# Ops autocast asks for an fp32 result without a separate cast (the kernel reads 16 bit).
FP32_OUTPUT_OP = re.compile(r"^aten::(softmax|log_softmax|_softmax|_log_softmax|sum|prod|cumsum|cumprod|norm)$")
# Ops whose output keeps the activation's dtype whatever their parameters' (batch norm runs a
# 16-bit input with fp32 weights and statistics, and returns 16 bit): not a promotion.
KEEPS_DTYPE_OP = re.compile(r"^aten::(batch_norm|instance_norm|_batch_norm_impl_index|native_batch_norm|cudnn_batch_norm|miopen_batch_norm)$")
# Host spans that are not the forward pass: backward nodes, the optimizer, the DataLoader.
NOT_FORWARD = re.compile(r"^autograd::engine::evaluate_function|^Optimizer\.|DataLoader|^enumerate\(")
LOADER_SPAN = re.compile(r"DataLoader|^enumerate\(")
BACKWARD_NODE = re.compile(r"^autograd::engine::evaluate_function: ")
# Backward nodes that only reshape or pass the gradient on: what running a node costs the host.
PASS_THROUGH_NODE = re.compile(r"^autograd::engine::evaluate_function: (View|T|Transpose|Clone|Permute|Reshape\w*|Unsqueeze|Squeeze|Expand|Select|Slice|UnsafeView)Backward\d*$")
# Host ops that allocate a tensor and launch one copy kernel: what a cast costs the host.
COPY_OP = ("aten::clone", "aten::_to_copy", "aten::copy_")
DTYPE_BYTES = {"float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "long int": 8, "int": 4, "short int": 2,
               "bool": 1, "unsigned char": 1, "signed char": 1}
FLOATING = ("float", "c10::Half", "c10::BFloat16", "double")
# Copies below this size measure launch latency, not bandwidth.
MIN_BANDWIDTH_BYTES = 1 << 20


@dataclass
class AutocastCasts:
    """The casts autocast would add to the run's steps, and what the run says they cost.

    `casts`: one row per cast: `step` (index into metrics.steps), `ts` (host time where it
    happens: the op that casts, or the start of its step's backward), `kind` ("forward",
    "backward": a ToCopyBackward0 node, "promote": a 16-bit gradient in a mixed op's
    backward), `op`, `numel` and `bytes` (fp32 read plus 16-bit written).
    Costs, as the window measured them: `copy_ns` (median host time of an op that allocates
    and launches one copy on the device; ops that move data between host and device, which may
    wait, are left out), `node_ns` (median host time of a backward node that only passes
    its gradient on), `bandwidth` (bytes/ns of the run's own device copies; 0 when unknown).
    """

    casts: pd.DataFrame
    copy_ns: float
    node_ns: float
    bandwidth: float
    n_steps: int

    def host_ns(self) -> np.ndarray:
        """Window host time of each cast: a copy op, plus a backward node for ToCopyBackward0."""
        kind = self.casts["kind"].to_numpy()
        return np.where(kind == "backward", self.copy_ns + self.node_ns, self.copy_ns)

    def device_ns(self) -> np.ndarray:
        """Device time of each cast: its bytes at the run's own copy bandwidth."""
        if self.bandwidth <= 0:
            return np.zeros(len(self.casts))
        return self.casts["bytes"].to_numpy(np.float64) / self.bandwidth

    def per_step(self, kind: str | None = None) -> float:
        n = len(self.casts) if kind is None else int((self.casts["kind"] == kind).sum())
        return n / max(self.n_steps, 1)

    def forward_only(self) -> AutocastCasts:
        """The casts of a run that never runs its backward (inference, evaluation): the
        forward's alone, no ToCopyBackward0 node and no gradient cast back."""
        return replace(self, casts=self.casts[(self.casts["kind"] == "forward").to_numpy()].reset_index(drop=True))


@lru_cache(maxsize=8192)
def input_type_names(text: str) -> tuple[str, ...]:
    try:
        out = orjson.loads(text)
    except orjson.JSONDecodeError:
        return ()
    return tuple(t if isinstance(t, str) else "" for t in out) if isinstance(out, list) else ()


def _float_inputs_of(types_text: np.ndarray, dims: np.ndarray, rows: np.ndarray) -> list[list[tuple[int, int, int, int]]]:
    """_float_inputs of each row, worked out once per distinct (types, shapes): a run repeats the
    same ops every step, and equal shapes are one object in the frames."""
    memo: dict[tuple[str, int], list[tuple[int, int, int, int]]] = {}
    out = []
    for i in rows:
        d = dims[i]
        key = (types_text[i], id(d))
        got = memo.get(key)
        if got is None:
            got = memo[key] = _float_inputs(input_type_names(types_text[i]), d)
        out.append(got)
    return out


def _float_inputs(types: tuple[str, ...], dims) -> list[tuple[int, int, int, int]]:
    """(position, number of dimensions, numel, leading dimension) of the floating tensor inputs."""
    dims = dims if isinstance(dims, list) else []
    out = []
    for i, t in enumerate(types):
        if t in FLOATING and i < len(dims) and isinstance(dims[i], list):
            n = numel(dims[i])
            if n > 0:
                out.append((i, len(dims[i]), n, int(dims[i][0]) if dims[i] else 1))
    return out


def autocast_casts(metrics, half_bytes: int = 2) -> AutocastCasts | None:
    """The casts autocast would add per step (see the module docstring); None without op shapes."""
    return metrics.shared(f"autocast.casts.{half_bytes}", lambda: _autocast_casts(metrics, half_bytes))


def _autocast_casts(metrics, half_bytes: int) -> AutocastCasts | None:
    steps = metrics.steps
    tree = metrics.shared("host_device.op_tree", lambda: op_tree(metrics.frames))
    ops = tree.ops
    if len(ops) == 0 or len(steps) == 0 or "input_types" not in ops:
        return None
    types_text = text_or_empty(ops["input_types"])
    if not (types_text != "").any():
        return None  # recorded without record_shapes: no input types to follow
    is_op = text_of(ops["kind"]) == "op"
    parent = np.clip(tree.parent, 0, None)
    op_above = np.where(tree.parent >= 0, tree.nearest_ancestor(parent, is_op), -1)
    excluded = tree.nearest_ancestor(np.arange(len(ops)), tree.mask(NOT_FORWARD)) >= 0
    ts = ops["ts"].to_numpy(np.int64)
    hs, he = steps["host_start"].to_numpy(np.int64), steps["host_end"].to_numpy(np.int64)
    step = np.searchsorted(hs, ts, side="right") - 1
    in_step = (step >= 0) & (ts < he[np.clip(step, 0, None)])
    top = np.nonzero(is_op & (op_above < 0) & ~excluded & in_step)[0]
    names = text_of(ops["name"])
    lower = name_matches(ops["name"], LOWER_PRECISION_OP)
    param_op = name_matches(ops["name"], PARAMETER_OP)
    fp32_cast = name_matches(ops["name"], FP32_CAST_OP)
    fp32_out = name_matches(ops["name"], FP32_OUTPUT_OP)
    keeps = name_matches(ops["name"], KEEPS_DTYPE_OP)
    # Where each step's backward starts (backward casts happen there), else its forward op.
    nodes = np.nonzero(tree.mask(BACKWARD_NODE) & in_step)[0]
    bw_start = np.full(len(steps), -1, dtype=np.int64)
    if len(nodes):
        first = pd.Series(ts[nodes]).groupby(step[nodes]).min()
        bw_start[first.index.to_numpy()] = first.to_numpy()
    dims = ops["input_dims"].to_numpy()
    per_elem = 4 + half_bytes
    inputs = _float_inputs_of(types_text, dims, top)
    flags = lower[top] | param_op[top] << 1 | fp32_cast[top] << 2 | fp32_out[top] << 3 | keeps[top] << 4
    # What the walk reads of an op, as one code: steps whose ops read alike are walked once
    # (a training loop's steps all are). _float_inputs_of gives equal inputs one list object.
    code = row_groups([flags, np.fromiter(map(id, inputs), dtype=np.int64, count=len(top))])
    top_step = step[top]
    walked: dict[bytes, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
    parts: list[tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
    for s in np.unique(top_step):
        at = np.flatnonzero(top_step == s)
        key = code[at].tobytes()
        casts_of = walked.get(key)
        if casts_of is None:
            casts_of = walked[key] = _step_casts([inputs[j] for j in at], lower[top[at]], param_op[top[at]], fp32_cast[top[at]], fp32_out[top[at]], keeps[top[at]])
        pos, kind, numel, at_op = casts_of
        i = top[at[pos]]
        back = int(bw_start[s])
        parts.append((int(s), np.where(at_op | (back < 0), ts[i], back), kind, names[i], numel))
    # one block of rows per step (none: one empty block, so the columns keep their types)
    parts = parts or [(0, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=object), np.zeros(0, dtype=object), np.zeros(0, dtype=np.int64))]
    casts = pd.DataFrame(
        {
            "step": np.concatenate([np.full(len(ts_of), s, dtype=np.int64) for s, ts_of, _, _, _ in parts]),
            "ts": np.concatenate([p[1] for p in parts]),
            "kind": np.concatenate([p[2] for p in parts]),
            "op": np.concatenate([p[3] for p in parts]),
            "numel": np.concatenate([p[4] for p in parts]),
        }
    )
    casts["bytes"] = casts["numel"].astype(np.int64) * per_elem
    return AutocastCasts(casts, _copy_ns(metrics, tree, in_step), _node_ns(tree, in_step), _copy_bandwidth(metrics, tree, types_text), len(steps))


def _step_casts(inputs_of: list, lower: np.ndarray, param_op: np.ndarray, fp32_cast: np.ndarray, fp32_out: np.ndarray,
                keeps: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The casts of one step, walking its top-level forward ops in order (the module
    docstring): for each cast, the position of the op that makes it, its kind, its numel and
    whether it happens at that op (a forward cast) or at the start of the step's backward."""
    out: list[tuple[int, str, int, bool]] = []
    low = False  # the activation's dtype under autocast: 16 bit or fp32 (data arrive in fp32)
    stream_low: bool | None = None  # the residual stream's: the last mixing op's result, from the first autocast op's
    touched = False  # a parameter or a second tensor has joined: activations require grad
    for j, inputs in enumerate(inputs_of):
        if not inputs:
            continue
        if lower[j]:
            for pos, _, n, _ in inputs:
                parameter = param_op[j] and pos > 0
                if parameter or not low:
                    out.append((j, "forward", n, True))
                    if parameter or touched:
                        out.append((j, "backward", n, False))
            low, touched = True, True
            if stream_low is None:
                stream_low = True
        elif fp32_cast[j]:
            if low:
                pos, _, n, _ = inputs[0]
                out.append((j, "forward", n, True))
                if touched:
                    out.append((j, "backward", n, False))
            low = False
        elif fp32_out[j]:
            low = False
        elif keeps[j]:
            touched = True  # its weights require grad; the activation keeps its dtype
        elif sum(1 for _, ndim, _, _ in inputs if ndim > 0) >= 2:  # a 0-dim tensor does not promote
            # The second tensor: another activation of the batch (a residual: the stream's
            # dtype), or a parameter (a position embedding, a bias: fp32).
            second = next(x for x in inputs[1:] if x[1] > 0)
            other_low = bool(stream_low) if second[3] == inputs[0][3] and inputs[0][1] == second[1] else False
            out_low = low and other_low
            if low and not out_low and touched:
                out.append((j, "promote", inputs[0][2], False))
            low, touched, stream_low = out_low, True, out_low
    kind = np.empty(len(out), dtype=object)
    kind[:] = [k for _, k, _, _ in out]
    return (np.array([j for j, _, _, _ in out], dtype=np.int64), kind, np.array([n for _, _, n, _ in out], dtype=np.int64),
            np.array([f for _, _, _, f in out], dtype=bool))


def _median_ns(tree: OpTree, mask: np.ndarray) -> float:
    d = (tree.ops["end"].to_numpy(np.int64) - tree.ops["ts"].to_numpy(np.int64))[mask]
    return float(np.median(d)) if len(d) else 0.0


def _copy_ns(metrics, tree: OpTree, in_step: np.ndarray) -> float:
    """Median host time of a cast: a copy op of the step's own work that launched one kernel on
    the device. Not one that moves a batch between host and device (that one may wait for the
    device, or for pageable memory), and not the DataLoader's copies in the main process (CPU
    copies of whole images, ~72 µs each on the V100 ResNet-50: their cost is no cast's). Where
    the run has no such copy, an op that launched exactly one kernel: what the dispatcher
    charges for one op and one launch at this host's pace."""
    names = text_of(tree.ops["name"])
    moves = _holding_a_transfer(metrics, tree)
    loader = tree.nearest_ancestor(np.arange(len(tree.ops)), tree.mask(LOADER_SPAN)) >= 0
    one_kernel = _launching_one_kernel(metrics, tree)
    own = in_step & ~moves & ~loader & one_kernel
    for name in COPY_OP:
        cost = _median_ns(tree, (names == name) & own)
        if cost > 0:
            return cost
    parent = tree.parent
    outermost = own & ~np.where(parent >= 0, one_kernel[np.clip(parent, 0, None)], False)
    return _median_ns(tree, outermost)


def _launching_one_kernel(metrics, tree: OpTree) -> np.ndarray:
    """Mask over ops: those around exactly one kernel launch (an `aten::clone` with the
    `aten::copy_` that launches inside it counts, as both do)."""
    ops = tree.ops
    count = np.zeros(len(ops), dtype=np.int64)
    lk = metrics.launches
    if len(lk) == 0 or len(ops) == 0:
        return count > 0
    lk = lk[(text_of(lk["kind"]) == "kernel") & lk["launch_ts"].notna().to_numpy()]
    ts, end = ops["ts"].to_numpy(np.int64), ops["end"].to_numpy(np.int64)
    l_ts = lk["launch_ts"].to_numpy(np.float64).astype(np.int64)
    l_tid = text_of(lk["launch_tid"])
    rows_of = tree.rows_by_thread()
    for t in pd.unique(l_tid):
        mine = np.sort(l_ts[l_tid == t])
        rows = rows_of.get(t, np.zeros(0, dtype=np.int64))
        count[rows] = np.searchsorted(mine, end[rows], side="left") - np.searchsorted(mine, ts[rows], side="left")
    return count == 1


def _holding_a_transfer(metrics, tree: OpTree) -> np.ndarray:
    """Mask over ops: the op that launched a host-device copy, and every op around it."""
    out = np.zeros(len(tree.ops), dtype=bool)
    lk = metrics.launches
    if len(lk) == 0:
        return out
    lk = lk[(text_of(lk["kind"]) == "memcpy") & lk["launch_ts"].notna().to_numpy()]
    if len(lk) == 0:
        return out
    rows = tree.innermost(lk["launch_ts"].to_numpy(np.float64).astype(np.int64), text_of(lk["launch_tid"]))
    rows = np.unique(rows[rows >= 0])
    while len(rows):
        out[rows] = True
        up = tree.parent[rows]
        rows = np.unique(up[(up >= 0)])
        rows = rows[~out[rows]]
    return out


def _node_ns(tree: OpTree, in_step: np.ndarray) -> float:
    cost = _median_ns(tree, tree.mask(PASS_THROUGH_NODE) & in_step)
    return cost if cost > 0 else _median_ns(tree, tree.mask(BACKWARD_NODE) & in_step)


def _copy_bandwidth(metrics, tree: OpTree, types_text: np.ndarray) -> float:
    """Bytes per ns of the run's own device-to-device copy kernels (`aten::copy_`, 1 MiB or more)."""
    ops = tree.ops
    names = text_of(ops["name"])
    sel = np.nonzero(names == "aten::copy_")[0]
    if len(sel) == 0:
        return 0.0
    dims = ops["input_dims"].to_numpy()
    memo: dict[tuple[str, int], int] = {}  # per distinct (types, shapes): equal shapes are one object in the frames

    def copied_bytes(i: int) -> int:
        key = (types_text[i], id(dims[i]))
        got = memo.get(key)
        if got is None:
            got = memo[key] = sum(DTYPE_BYTES.get(t, 0) * numel(d) for t, d in zip(input_type_names(types_text[i])[:2], (dims[i] or [])[:2], strict=False))
        return got

    nbytes = np.array([copied_bytes(i) for i in sel], dtype=np.float64)
    keep = nbytes >= MIN_BANDWIDTH_BYTES
    sel, nbytes = sel[keep], nbytes[keep]
    if len(sel) == 0:
        return 0.0
    lk = metrics.launches
    lk = lk[(text_of(lk["kind"]) == "kernel") & lk["launch_ts"].notna().to_numpy()]
    if len(lk) == 0:
        return 0.0
    order = np.argsort(lk["launch_ts"].to_numpy(np.float64), kind="stable")
    launch_ts = lk["launch_ts"].to_numpy(np.float64)[order]
    launch_tid = text_of(lk["launch_tid"])[order]
    dur = (lk["end"].to_numpy(np.int64) - lk["ts"].to_numpy(np.int64))[order]
    op_ts, op_end = ops["ts"].to_numpy(np.int64)[sel], ops["end"].to_numpy(np.int64)[sel]
    op_tid = tree.thread[sel]
    total_b = total_ns = 0.0
    for t in pd.unique(op_tid):
        mine = launch_tid == t
        lts, ldur = launch_ts[mine], dur[mine]
        at = op_tid == t
        j = np.searchsorted(lts, op_ts[at], side="left")
        ok = j < len(lts)
        ok[ok] = lts[j[ok]] < op_end[at][ok]
        total_b += float(nbytes[at][ok].sum())
        total_ns += float(ldur[j[ok]].sum())
    return total_b / total_ns if total_ns > 0 else 0.0
