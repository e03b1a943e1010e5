"""What one op costs: FLOPs and bytes from its shapes, dtypes and scalar arguments.

For every op with a cost model (GEMMs, convolutions forward and backward, attention, the
norms, softmax, common elementwise ops and reductions, the optimizers' multi-tensor ops,
Inductor's compiled Triton kernels),
from its input shapes, dtypes and scalar arguments (`record_shapes=True`): the FLOPs it does
and the bytes it must move at least (each input read once, each output written once).
`advisor.metrics.roofline` sets these against the time the op's kernels took and the
device's ceilings.

The formulas follow PyTorch's own flop counter (`torch.utils.flop_counter`) and AMD's
TraceLens performance model, so the figures compare: a GEMM is 2·M·N·K FLOPs (plus M·N for a
bias) and reads A and B and writes C; a convolution is 2·(weight elements per output
channel)·(output elements); attention is 4·B·H·Nq·Nkv·d (half of it when causal), its backward
2.5 times that (flash recomputes the scores); a norm, softmax or elementwise op is a few FLOPs
per element and each tensor moved once. `benchmarks/roofline_vs_tracelens.py` checks the two
agree on real traces.

It stays one module of about 700 lines: one section per op family (GEMMs, convolutions,
attention, norms and softmax, elementwise ops, reductions and optimizers) over one set of
shape and dtype readers, which five modules would have to share.
"""


from __future__ import annotations

import re
from dataclasses import dataclass

import orjson

from advisor.metrics.shapes import is_shape


# Bytes per element of the dtypes the trace names (`Input type`); Scalar is a 4-byte argument.
BPE = {
    "double": 8, "long int": 8, "float": 4, "int": 4, "Scalar": 4, "c10::Half": 2, "c10::BFloat16": 2, "short int": 2,
    "bool": 1, "unsigned char": 1, "signed char": 1, "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1,
    "c10::Float8_e4m3fnuz": 1, "c10::Float8_e5m2fnuz": 1, "c10::Float8_e8m0fnu": 1,
}
# Which matrix ceiling a dtype runs against.
PRECISION_OF_DTYPE = {"float": "fp32", "c10::Half": "fp16", "c10::BFloat16": "bf16", "signed char": "int8",
                      "c10::Float8_e4m3fn": "fp8", "c10::Float8_e5m2": "fp8", "c10::Float8_e4m3fnuz": "fp8", "c10::Float8_e5m2fnuz": "fp8"}
MATRIX_KINDS = ("gemm", "conv", "attention")

UNARY_OPS = {
    "copy_", "_to_copy", "clone", "contiguous", "relu", "relu_", "gelu", "gelu_", "silu", "silu_", "sigmoid", "sigmoid_", "tanh", "tanh_",
    "neg", "neg_", "exp", "exp_", "log", "rsqrt", "sqrt", "abs", "clamp", "clamp_", "clamp_min", "clamp_min_", "clamp_max", "clamp_max_",
    "pow", "pow_", "hardtanh", "hardtanh_", "leaky_relu", "leaky_relu_", "reciprocal", "sin", "cos", "fill_", "zero_", "native_dropout",
}
BINARY_OPS = {
    "add", "add_", "sub", "sub_", "mul", "mul_", "div", "div_", "maximum", "minimum", "where", "threshold_backward",
    "sigmoid_backward", "tanh_backward", "gelu_backward", "silu_backward", "hardtanh_backward", "native_dropout_backward",
    "eq", "ne", "lt", "gt", "le", "ge", "masked_fill", "masked_fill_", "lerp_", "addcmul_", "addcdiv_",
}
REDUCE_OPS = {"sum", "nansum", "mean", "amax", "amin", "max", "min", "argmax", "argmin", "norm", "linalg_norm", "linalg_vector_norm", "var", "std",
              "var_mean", "std_mean", "prod", "all", "any", "logsumexp"}
# Reductions whose `dim` argument is their third input (after the order `p`), not the second.
REDUCE_DIM_THIRD = {"norm", "linalg_norm", "linalg_vector_norm"}
UPSAMPLE_NEAREST = {"upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d"}
SCAN_OPS = {"cumsum", "cumsum_", "cumprod", "cumprod_"}  # one output element per input element
# Library GEMMs outside aten with linear's signature (x [..., K], weight [N, K], bias or none):
# AITER's bf16/fp16 GEMM and vLLM's ROCm GEMM.
LINEAR_LIKE = {"aiter::gemm_a16w16", "vllm::rocm_unquantized_gemm"}
# AITER's norms: op -> (position of x, of the weight, fused residual add); _groupnorm_run takes
# group_norm's arguments (x, groups, weight, bias, eps).
LIBRARY_NORMS = {
    "aiter::rms_norm": (0, 1, False),  # (x, weight, eps)
    "aiter::rmsnorm": (1, 2, False),  # (out, x, weight, eps)
    "aiter::add_rmsnorm": (1, 4, True),  # (out, x, residual_in, residual_out, weight, eps)
    "aiter::rmsnorm2d_fwd_with_add_ck": (1, 4, True),
    "aiter::_groupnorm_run": None,
}
# The gated SiLU of LLM MLPs, silu_and_mul(out [..., d], input [..., 2d]) of AITER, SGLang and vLLM.
GATED_SILU = {"aiter::silu_and_mul", "sgl_kernel::silu_and_mul", "_C::silu_and_mul"}
FUSED_OPTIMIZER = re.compile(r"^aten::_fused_(adam|adamw|sgd|adagrad)_?$")
FOREACH = re.compile(r"^aten::_foreach_(\w+?)_?$")


@dataclass(frozen=True)
class Cost:
    kind: str  # gemm, conv, attention, norm, softmax, elementwise, reduce, optimizer
    flops: float
    bytes: float
    dtype: str
    shape: str  # what the table shows: M×N×K for a GEMM, the inputs' shapes otherwise
    m: int = 0  # GEMM dimensions (0: not a GEMM)
    n: int = 0
    k: int = 0
    batch: int = 1


def _prod(shape) -> int:
    out = 1
    for d in shape:
        out *= int(d)
    return out


def _is_dims(s) -> bool:
    return isinstance(s, list) and is_shape(s)


def _shape(dims, i) -> list[int] | None:
    if not isinstance(dims, list) or i >= len(dims):
        return None
    s = dims[i]
    return s if _is_dims(s) else None


def _ints(concrete, i) -> list[int] | None:
    """A scalar argument that is an int list ("[1, 1]") or one int ("2")."""
    if not isinstance(concrete, list) or i >= len(concrete):
        return None
    text = concrete[i]
    if not isinstance(text, str) or not text.strip():
        return None
    try:
        v = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    if isinstance(v, int) and not isinstance(v, bool):
        return [v]
    if isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        return v
    return None


def _floats(concrete, i) -> list[float] | None:
    """A scalar argument that is a list of numbers ("[2., 2.]")."""
    if not isinstance(concrete, list) or i >= len(concrete) or not isinstance(concrete[i], str):
        return None
    try:
        v = [float(p) for p in concrete[i].strip("[] ").split(",") if p.strip()]
    except ValueError:
        return None
    return v or None


def _flag(concrete, i) -> bool | None:
    if not isinstance(concrete, list) or i >= len(concrete) or not isinstance(concrete[i], str):
        return None
    t = concrete[i].strip().lower()
    return True if t == "true" else False if t == "false" else None


def _flags(concrete, i) -> list[bool] | None:
    if not isinstance(concrete, list) or i >= len(concrete) or not isinstance(concrete[i], str):
        return None
    parts = [p.strip().lower() for p in concrete[i].strip("[] ").split(",") if p.strip()]
    return [p == "true" for p in parts] if parts and all(p in ("true", "false") for p in parts) else None


def _fmt(s) -> str:
    return "[" + ",".join(str(x) for x in s) + "]"


# --- GEMMs -----------------------------------------------------------------------------------
def _gemm(m, n, k, bias: bool, bpe: int, dtype: str, batch: int = 1, out_bpe: int | None = None) -> Cost:
    out_bpe = bpe if out_bpe is None else out_bpe
    flops = batch * (2.0 * m * n * k + (m * n if bias else 0))
    moved = batch * ((m * k + k * n) * bpe + m * n * out_bpe + (n * bpe if bias else 0))
    label = f"{batch}×{m}×{n}×{k}" if batch > 1 else f"{m}×{n}×{k}"
    return Cost("gemm", flops, moved, dtype, label, m, n, k, batch)


def _cost_gemm(name: str, types: tuple, dims) -> Cost | None:
    if name in ("mm", "_int_mm", "_scaled_mm"):
        a, b = _shape(dims, 0), _shape(dims, 1)
        if not a or not b or len(a) != 2 or len(b) != 2:
            return None
        bpe = BPE.get(types[0] if types else "", 0)
        if name == "_scaled_mm":
            bias = bool(_shape(dims, 4))
            return _gemm(a[0], b[1], a[1], bias, bpe, types[0], out_bpe=2 if bpe == 1 else bpe) if bpe else None
        return _gemm(a[0], b[1], a[1], False, bpe, types[0], out_bpe=4 if name == "_int_mm" else None) if bpe else None
    if name in ("addmm", "addmm_"):
        a, b = _shape(dims, 1), _shape(dims, 2)
        if not a or not b or len(a) != 2 or len(b) != 2 or len(types) < 2:
            return None
        bpe = BPE.get(types[1], 0)
        return _gemm(a[0], b[1], a[1], True, bpe, types[1]) if bpe else None
    if name == "bmm":
        a, b = _shape(dims, 0), _shape(dims, 1)
        if not a or not b or len(a) != 3 or len(b) != 3:
            return None
        bpe = BPE.get(types[0] if types else "", 0)
        return _gemm(a[1], b[2], a[2], False, bpe, types[0], batch=a[0]) if bpe else None
    if name in ("baddbmm", "baddbmm_"):
        a, b = _shape(dims, 1), _shape(dims, 2)
        if not a or not b or len(a) != 3 or len(b) != 3 or len(types) < 2:
            return None
        bpe = BPE.get(types[1], 0)
        return _gemm(a[1], b[2], a[2], True, bpe, types[1], batch=a[0]) if bpe else None
    if name == "linear":
        x, w = _shape(dims, 0), _shape(dims, 1)
        if not x or not w or len(w) != 2:
            return None
        bpe = BPE.get(types[0] if types else "", 0)
        return _gemm(_prod(x[:-1]), w[0], w[1], bool(_shape(dims, 2)), bpe, types[0]) if bpe else None
    return None


# --- convolutions ----------------------------------------------------------------------------
def _conv_out(x, w, stride, padding, dilation, transposed=False, output_padding=None) -> list[int] | None:
    nd = len(x) - 2
    if nd < 1 or len(w) != len(x):
        return None

    def spread(v, default):
        v = v if v else [default]
        return v * nd if len(v) == 1 else v

    stride, padding, dilation = spread(stride, 1), spread(padding, 0), spread(dilation, 1)
    output_padding = spread(output_padding, 0)
    if not all(len(v) == nd for v in (stride, padding, dilation, output_padding)):
        return None
    if min(stride + dilation) < 1 or min(padding + output_padding) < 0:
        return None  # arguments PyTorch refuses: no output shape follows from them
    if transposed:
        spatial = [(x[2 + i] - 1) * stride[i] - 2 * padding[i] + dilation[i] * (w[2 + i] - 1) + output_padding[i] + 1 for i in range(nd)]
        out = [x[0], w[1]] + spatial  # grouped transposed convolutions are left to TraceLens's own reading
    else:
        spatial = [(x[2 + i] + 2 * padding[i] - dilation[i] * (w[2 + i] - 1) - 1) // stride[i] + 1 for i in range(nd)]
        out = [x[0], w[0]] + spatial
    return out if min(spatial) >= 0 else None  # a kernel larger than its padded input: PyTorch refuses it


def _conv_fwd(x, w, out, bias: bool, bpe: int, dtype: str, transposed: bool = False) -> Cost:
    # FLOPs are the multiply-adds only: the bias add (one per output element, at most
    # 1/(2·Cin·kernel) of them) is left out, as PyTorch's flop counter and TraceLens do; its read
    # of the bias vector is counted in the bytes.
    per_out = 2.0 * _prod(w[1:])
    flops = (_prod(x) if transposed else _prod(out)) * per_out
    moved = (_prod(x) + _prod(w) + _prod(out) + (out[1] if bias else 0)) * bpe
    return Cost("conv", flops, moved, dtype, f"x{_fmt(x)} w{_fmt(w)} → {_fmt(out)}")


# Forward convolution signatures: (position of stride, padding, dilation, transposed,
# output_padding, groups; bias input or None) by op.
_CONV_ARGS = {
    "convolution": (3, 4, 5, 6, 7, 2),
    "_convolution": (3, 4, 5, 6, 7, 2),
    "cudnn_convolution": (3, 2, 4, None, None, None),
    "miopen_convolution": (4, 3, 5, None, None, 2),
    "mkldnn_convolution": (4, 3, 5, None, None, 2),
    "cudnn_convolution_relu": (3, 4, 5, None, None, 2),
}


def _key(*shapes) -> tuple:
    return tuple(tuple(x) for x in shapes)


def conv_shapes(host_ops_dims) -> dict[tuple, list[int]]:
    """What the backward convolutions of a training trace tell about each convolution's shapes,
    for traces without scalar arguments (stride, padding): from (op name, Input Dims) of the
    backward ops, keyed ("out", x, w) -> output, ("x", gy, w) -> input, ("w", gy, x) -> weight."""
    out: dict[tuple, list[int]] = {}
    for name, dims in host_ops_dims:
        if name == "aten::convolution_backward":
            gy, x, w = _shape(dims, 0), _shape(dims, 1), _shape(dims, 2)
        elif name in ("aten::cudnn_convolution_backward", "aten::miopen_convolution_backward"):
            x, gy, w = _shape(dims, 0), _shape(dims, 1), _shape(dims, 2)
        else:
            continue
        if gy and x and w and len(gy) == len(x) == len(w) >= 3:
            out[("out",) + _key(x, w)] = gy
            out[("x",) + _key(gy, w)] = x
            out[("w",) + _key(gy, x)] = w
    return out


def _cost_conv(name: str, types: tuple, dims, concrete, known: dict | None = None) -> Cost | None:
    known = known or {}
    if name in ("cudnn_convolution_backward_input", "cudnn_convolution_backward_weight"):
        gy, other = _shape(dims, 1), _shape(dims, 2)
        if not gy or not other or len(types) < 3:
            return None
        found = known.get(("x" if name.endswith("input") else "w",) + _key(gy, other))
        if not found:
            return None
        x, w = (found, other) if name.endswith("input") else (other, found)
        bpe = BPE.get(types[1], 0)
        if not bpe:
            return None
        fwd = _conv_fwd(x, w, gy, False, bpe, types[1])
        return Cost("conv", fwd.flops, (_prod(gy) + _prod(w) + _prod(x)) * bpe, types[1], fwd.shape)
    if name in _CONV_ARGS:
        x, w = _shape(dims, 0), _shape(dims, 1)
        if not x or not w or len(x) < 3 or not types:
            return None
        s, p, d, t, op_, b = _CONV_ARGS[name]
        stride, padding, dilation = _ints(concrete, s), _ints(concrete, p), _ints(concrete, d)
        transposed = bool(_flag(concrete, t)) if t is not None else False
        if stride is None and padding is None:
            out = known.get(("out",) + _key(x, w))  # no scalar arguments: the backward's gradient has the output's shape
        else:
            out = _conv_out(x, w, stride, padding, dilation, transposed, _ints(concrete, op_) if op_ is not None else None)
        bpe = BPE.get(types[0], 0)
        if not out or not bpe:
            return None
        bias = b is not None and bool(_shape(dims, b))
        return _conv_fwd(x, w, out, bias, bpe, types[0], transposed)
    if name == "convolution_backward":
        gy, x, w = _shape(dims, 0), _shape(dims, 1), _shape(dims, 2)
        if not gy or not x or not w or len(types) < 3:
            return None
        bpe = BPE.get(types[1], 0)
        if not bpe:
            return None
        mask = _flags(concrete, 10) or [True, True, bool(_shape(dims, 3))]
        transposed = bool(_flag(concrete, 7))
        fwd = _conv_fwd(x, w, gy, False, bpe, types[1], transposed)
        # The gradients the output mask asks for, each its multiply-adds and one pass reading gy
        # and the other operand and writing the gradient. The bias gradient (mask[2]) is not
        # counted: on cuDNN and MIOpen it is a child `aten::sum` of gy over batch and space, with
        # its own kernel, costed on its own row (as TraceLens reads it).
        passes = int(mask[0]) + int(mask[1])
        flops = fwd.flops * passes
        moved = (_prod(gy) + _prod(w) + _prod(x)) * bpe * passes
        return Cost("conv", flops, moved, types[1], fwd.shape)
    return None


# --- attention -------------------------------------------------------------------------------
# name -> (layout of q/k/v: "bhnd" or "bnhd", position of q, causal flag position, causal from
# a mask-type int position, backward).
_SDPA = {
    "_scaled_dot_product_flash_attention": ("bhnd", 0, 4, None, False),
    "_scaled_dot_product_efficient_attention": ("bhnd", 0, 6, None, False),
    "_scaled_dot_product_cudnn_attention": ("bhnd", 0, 6, None, False),
    "_cudnn_attention_forward": ("bhnd", 0, 10, None, False),
    "_cudnn_attention_backward": ("bhnd", 1, 14, None, True),
    "_scaled_dot_product_flash_attention_for_cpu": ("bhnd", 0, 4, None, False),
    "_flash_attention_forward": ("bnhd", 0, 8, None, False),
    "_efficient_attention_forward": ("bnhd", 0, None, 9, False),
    "_scaled_dot_product_flash_attention_backward": ("bhnd", 1, 11, None, True),
    "_scaled_dot_product_efficient_attention_backward": ("bhnd", 1, 11, None, True),
    "_scaled_dot_product_cudnn_attention_backward": ("bhnd", 1, 12, None, True),
    "_flash_attention_backward": ("bnhd", 1, 11, None, True),
    "_efficient_attention_backward": ("bnhd", 1, None, 14, True),
}


def _cost_attention(name: str, types: tuple, dims, concrete) -> Cost | None:
    spec = _SDPA.get(name)
    if spec is None:
        return None
    layout, qi, causal_at, mask_at, backward = spec
    q, k, v = _shape(dims, qi), _shape(dims, qi + 1), _shape(dims, qi + 2)
    if not q or not k or not v or len(q) != 4 or len(k) != 4 or len(v) != 4 or len(types) <= qi:
        return None
    if layout == "bhnd":
        b, hq, nq, dqk = q
        hkv, nkv, dv = k[1], k[2], v[3]
    else:
        b, nq, hq, dqk = q
        nkv, hkv, dv = k[1], k[2], v[3]
    bpe = BPE.get(types[qi], 0)
    if not bpe or hkv == 0:
        return None
    if causal_at is not None:
        causal = bool(_flag(concrete, causal_at))
    else:
        mask = _ints(concrete, mask_at)
        causal = bool(mask and mask[0] != 0)
    causal = causal and nq == nkv
    scores = 2.0 * b * hq * nq * nkv
    q_el, k_el, v_el, o_el = b * nq * hq * dqk, b * nkv * hkv * dqk, b * nkv * hkv * dv, b * nq * hq * dv
    if not backward:
        flops = scores * (dqk + dv)
        moved = (q_el + k_el + v_el + o_el) * bpe
    else:
        flash = "flash" in name
        gqa = b * nkv * (dv + dqk) * (hq // hkv - 1)
        flops = scores * ((dqk if flash else 0) + dv + dv + dqk + dqk) + gqa
        moved = (2 * (q_el + k_el + v_el) + o_el) * bpe
    if causal:
        flops /= 2
    label = f"B{b} H{hq}/{hkv} Nq{nq} Nkv{nkv} d{dqk}" + (" causal" if causal else "")
    return Cost("attention", flops, moved, types[qi], label, batch=b)


# --- norms, softmax ---------------------------------------------------------------------------
def _norm(n_el: int, c: int, bpe: int, dtype: str, label: str, affine: bool, bias: bool, training: bool) -> Cost:
    flops = 3 * c + (3 * n_el if training else 0) + 3 * c + 2 * n_el
    weights = 2 + (1 if affine else 0) + (1 if affine and bias else 0) + (2 if training else 0)
    return Cost("norm", float(flops), float(2 * n_el * bpe + weights * c * bpe), dtype, label)


def _norm_bwd(n_el: int, c: int, bpe: int, dtype: str, label: str, affine: bool, bias: bool, training: bool, grad_in: bool) -> Cost:
    per_c = (0 if training else 3) + 4 * (n_el / c)
    per_c += (5 if training else 0) * (n_el / c) if grad_in else 2 * (n_el / c)
    moved = n_el * bpe + n_el * bpe * (2 if grad_in and training else 1)
    moved += (c * bpe if training else 0) + ((c * bpe + (c * bpe * (2 if bias else 1) if training else 0)) if affine else 0)
    return Cost("norm", float(c * per_c), float(moved), dtype, label)


def _cost_layer_or_rms_norm(name: str, types: tuple, dims, concrete) -> Cost | None:
    x = _shape(dims, 0)
    if not x or not types:
        return None
    bpe = BPE.get(types[0], 0)
    shape = _ints(concrete, 1)
    c = _prod(shape) if shape else (_prod(_shape(dims, 2)) if _shape(dims, 2) else 0)
    if not bpe or not c:
        return None
    n_el = _prod(x)
    if "rms" in name:
        affine = bool(_shape(dims, 2))
        flops = n_el / c * (2 * c + 2) + n_el * (2 if affine else 1)
        return Cost("norm", float(flops), float(2 * n_el * bpe + (c * bpe if affine else 0)), types[0], _fmt(x))
    return _norm(n_el, c, bpe, types[0], _fmt(x), bool(_shape(dims, 2)), bool(_shape(dims, 3)), True)


def _cost_layer_norm_backward(name: str, types: tuple, dims, concrete) -> Cost | None:
    x = _shape(dims, 1)
    if not x or len(types) < 2:
        return None
    shape = _ints(concrete, 2)
    mask = _flags(concrete, 7) or [True, True, True]
    bpe = BPE.get(types[1], 0)
    c = _prod(shape) if shape else (_prod(_shape(dims, 5)) if _shape(dims, 5) else 0)
    if not bpe or not c:
        return None
    return _norm_bwd(_prod(x), c, bpe, types[1], _fmt(x), mask[1], mask[2] if len(mask) > 2 else False, True, mask[0])


def _cost_rms_norm_backward(name: str, types: tuple, dims, concrete) -> Cost | None:
    # (grad_out, input, normalized_shape, rstd, weight, output_mask): x̂ = x·rstd, the grad
    # scaled by the weight where there is one, a dot product and grad_in where asked, grad_weight
    # where asked (accumulated over rows when there are several).
    x = _shape(dims, 1)
    shape = _ints(concrete, 2)
    bpe = BPE.get(types[1], 0) if len(types) > 1 else 0
    if not x or not shape or not bpe:
        return None
    n_el, c = _prod(x), _prod(shape)
    affine = bool(_shape(dims, 4))
    mask = _flags(concrete, 5) or [True, affine]
    flops = (n_el if affine else 0) + n_el + (6 * n_el if mask[0] else 0)
    if len(mask) > 1 and mask[1] and affine:
        flops += n_el + (n_el if n_el > c else 0)
    return Cost("norm", float(flops), float(3 * n_el * bpe + (2 * c * bpe if affine else 0)), types[1], _fmt(x))


def _channels_input(dims, types: tuple, at: int) -> tuple[list[int], int] | None:
    """The input at `at` as (shape, bytes per element), where it has a channel dimension
    (N, C, ...) and a dtype of known size; None otherwise."""
    x = _shape(dims, at)
    if not x or len(x) < 2 or len(types) <= at:
        return None
    bpe = BPE.get(types[at], 0)
    return (x, bpe) if bpe else None


def _cost_group_norm(name: str, types: tuple, dims, concrete) -> Cost | None:
    # Statistics computed from the input, the affine transform per channel where there is a
    # weight: group_norm(x, groups, weight, bias, ...), native_group_norm(x, weight, bias, N,
    # C, HxW, groups, eps), instance_norm(x, weight, bias, running_mean, running_var,
    # use_input_stats, ...).
    found = _channels_input(dims, types, 0)
    if found is None:
        return None
    x, bpe = found
    w_at = 2 if name == "group_norm" else 1
    training = _flag(concrete, 5) if name == "instance_norm" else True
    return _norm(_prod(x), x[1], bpe, types[0], _fmt(x), bool(_shape(dims, w_at)), bool(_shape(dims, w_at + 1)), True if training is None else training)


def _cost_group_norm_backward(name: str, types: tuple, dims, concrete) -> Cost | None:
    # (grad_out, input, mean, rstd, weight, N, C, HxW, groups, output_mask)
    found = _channels_input(dims, types, 1)
    if found is None:
        return None
    x, bpe = found
    mask = _flags(concrete, 9) or [True, True, True]
    affine = bool(_shape(dims, 4))
    return _norm_bwd(_prod(x), x[1], bpe, types[1], _fmt(x), affine, affine and len(mask) > 2 and mask[2], True, mask[0])


def _cost_batch_norm(name: str, types: tuple, dims, concrete) -> Cost | None:
    found = _channels_input(dims, types, 0)
    if found is None:
        return None
    x, bpe = found
    training = _flag(concrete, 5)
    return _norm(_prod(x), x[1], bpe, types[0], _fmt(x), bool(_shape(dims, 1)), True, True if training is None else training)


def _cost_batch_norm_backward(name: str, types: tuple, dims, concrete) -> Cost | None:
    cudnn = name != "native_batch_norm_backward"
    xi = 0 if cudnn else 1
    found = _channels_input(dims, types, xi)
    if found is None:
        return None
    x, bpe = found
    training = True if cudnn else _flag(concrete, 7)
    return _norm_bwd(_prod(x), x[1], bpe, types[xi], _fmt(x), bool(_shape(dims, 2)), True, True if training is None else training, True)


def _cost_softmax(name: str, types: tuple, dims, concrete) -> Cost | None:
    x = _shape(dims, 0)
    if not x or not types:
        return None
    bpe = BPE.get(types[0], 0)
    if not bpe:
        return None
    factor = 2 if "backward" in name else 1
    n_el = _prod(x)
    return Cost("softmax", float(3 * n_el * factor), float(2 * n_el * bpe * factor), types[0], _fmt(x))


# The norm and softmax ops by name, each with its cost model.
_NORM_COSTS = {
    "native_layer_norm": _cost_layer_or_rms_norm,
    "layer_norm": _cost_layer_or_rms_norm,
    "_fused_rms_norm": _cost_layer_or_rms_norm,
    "rms_norm": _cost_layer_or_rms_norm,
    "native_layer_norm_backward": _cost_layer_norm_backward,
    "_fused_rms_norm_backward": _cost_rms_norm_backward,
    "group_norm": _cost_group_norm,
    "native_group_norm": _cost_group_norm,
    "instance_norm": _cost_group_norm,
    "native_group_norm_backward": _cost_group_norm_backward,
    "native_batch_norm": _cost_batch_norm,
    "cudnn_batch_norm": _cost_batch_norm,
    "miopen_batch_norm": _cost_batch_norm,
    "_batch_norm_impl_index": _cost_batch_norm,
    "batch_norm": _cost_batch_norm,
    "_native_batch_norm_legit": _cost_batch_norm,
    "_native_batch_norm_legit_no_training": _cost_batch_norm,
    "native_batch_norm_backward": _cost_batch_norm_backward,
    "cudnn_batch_norm_backward": _cost_batch_norm_backward,
    "miopen_batch_norm_backward": _cost_batch_norm_backward,
    "_softmax": _cost_softmax,
    "_log_softmax": _cost_softmax,
    "_softmax_backward_data": _cost_softmax,
    "_log_softmax_backward_data": _cost_softmax,
}


def _cost_norm(name: str, types: tuple, dims, concrete) -> Cost | None:
    cost = _NORM_COSTS.get(name)
    return cost(name, types, dims, concrete) if cost is not None else None


# --- elementwise, reductions, optimizers ------------------------------------------------------
def _broadcast(a, b) -> list[int] | None:
    n = max(len(a), len(b))
    a, b = [1] * (n - len(a)) + list(a), [1] * (n - len(b)) + list(b)
    out = []
    for x, y in zip(a, b, strict=True):
        if x != y and x != 1 and y != 1:
            return None
        out.append(max(x, y))
    return out


def _cost_elementwise(name: str, types: tuple, dims, concrete=None) -> Cost | None:
    if name in UNARY_OPS:
        x = _shape(dims, 0)
        if x is None or not types:
            return None
        bpe_in = BPE.get(types[0], 0)
        out_t = types[1] if len(types) > 1 and _shape(dims, 1) else types[0]
        bpe_out = BPE.get(out_t, 0) or bpe_in
        if not bpe_in:
            return None
        n_el = _prod(x)
        if name in ("fill_", "zero_"):
            return Cost("elementwise", float(n_el), float(n_el * bpe_in), types[0], _fmt(x))
        return Cost("elementwise", float(n_el), float(n_el * (bpe_in + bpe_out)), types[0], _fmt(x))
    if name in BINARY_OPS:
        a, b = _shape(dims, 0), _shape(dims, 1)
        if a is None or len(types) < 2:
            return None
        b = b if b is not None else []
        out = _broadcast(a, b)
        bpe_a, bpe_b = BPE.get(types[0], 0), BPE.get(types[1], 0) or 4
        if out is None or not bpe_a:
            return None
        both = bool(a) and bool(b)
        bpe_out = max(bpe_a, bpe_b) if both else bpe_a
        n_out = _prod(out)
        return Cost("elementwise", float(n_out), float(_prod(a) * bpe_a + _prod(b) * bpe_b + n_out * bpe_out), types[0], f"{_fmt(a)} {_fmt(b)}")
    if name in REDUCE_OPS:
        x = _shape(dims, 0)
        if x is None or not types:
            return None
        bpe = BPE.get(types[0], 0)
        if not bpe:
            return None
        n_el = _prod(x)
        # Where the reduced dimensions are: `sum(x, dtype)` and `mean(x, dtype)` (two inputs)
        # reduce everything, their second input being the dtype; `sum(x, dim, keepdim, dtype)`,
        # `max(x, dim, keepdim)`, `var(x, dim, correction, keepdim)` name them second;
        # `norm(x, p, dim, keepdim)` third.
        at = 2 if name in REDUCE_DIM_THIRD else 1
        dim = _ints(concrete, at) if len(dims) > at + 1 else None
        kept = [d for i, d in enumerate(x) if dim and i not in {j % max(len(x), 1) for j in dim}] if dim else []
        n_out = _prod(kept) if kept or dim else 1
        return Cost("reduce", float(n_el), float(n_el * bpe + n_out * bpe), types[0], _fmt(x))
    if name in UPSAMPLE_NEAREST:
        # Each output element copies one input element: out = x[:2] + output_size.
        x = _shape(dims, 0)
        bpe = BPE.get(types[0], 0) if x is not None and types else 0
        if not bpe:
            return None
        size = _ints(concrete, 1)
        if not size:  # upsample_nearest2d.vec(x, None, scale_factors): floor(size × scale)
            scales = _floats(concrete, 2)
            size = [int(d * f) for d, f in zip(x[2:], scales, strict=True)] if scales and len(scales) == len(x) - 2 else None
        if not size or len(size) != len(x) - 2:
            return None
        n_out = _prod(x[:2]) * _prod(size)
        return Cost("elementwise", float(n_out), float((_prod(x) + n_out) * bpe), types[0], f"{_fmt(x)} → {_fmt(x[:2] + size)}")
    if name in SCAN_OPS:
        x = _shape(dims, 0)
        bpe = BPE.get(types[0], 0) if x is not None and types else 0
        if not bpe:
            return None
        n_el = _prod(x)
        return Cost("reduce", float(n_el), float(2 * n_el * bpe), types[0], _fmt(x))
    return None


def _cost_gated_silu(types: tuple, dims) -> Cost | None:
    # out = silu(gate)·up: 4 FLOPs for x·sigmoid(x), 1 for the product, per output element
    # (TraceLens's count); the input (gate and up, 2d per row) read, the output written.
    out, x = _shape(dims, 0), _shape(dims, 1)
    bpe_out, bpe_in = (BPE.get(types[0], 0), BPE.get(types[1], 0)) if len(types) > 1 else (0, 0)
    if not out or not x or not bpe_out or not bpe_in:
        return None
    n = _prod(out)
    return Cost("elementwise", 5.0 * n, float(2 * n * bpe_in + n * bpe_out), types[1], f"{_fmt(x)} → {_fmt(out)}")


def _cost_library_norm(op: str, types: tuple, dims) -> Cost | None:
    spec = LIBRARY_NORMS[op]
    if spec is None:
        return _cost_norm("group_norm", types, dims, None)
    xi, wi, add = spec
    x, w = _shape(dims, xi), _shape(dims, wi)
    bpe = BPE.get(types[xi], 0) if len(types) > xi else 0
    if not x or not w or not bpe:
        return None
    n_el, c = _prod(x), _prod(w)
    # RMS norm with a weight: 2·C+2 per row for the root mean square, 2 per element to scale;
    # x read, y written, the weight read. With the residual add fused: one more FLOP per element,
    # the residual read and the sum written.
    flops = n_el / c * (2 * c + 2) + 2 * n_el + (n_el if add else 0)
    moved = (4 if add else 2) * n_el * bpe + c * bpe
    return Cost("norm", float(flops), float(moved), types[xi], _fmt(x))


def _tensor_list(dims, i) -> list[list[int]]:
    if not isinstance(dims, list) or i >= len(dims) or not isinstance(dims[i], list):
        return []
    return [s for s in dims[i] if _is_dims(s)]


def _cost_optimizer(op: str, types: tuple, dims) -> Cost | None:
    m = FUSED_OPTIMIZER.match(op)
    if m:
        params = _tensor_list(dims, 0)
        if not params:
            return None
        n_el = sum(_prod(s) for s in params)
        dtype = types[0] if types else ""
        bpe = BPE.get(dtype, 4) if dtype in BPE else 4
        # Adam: reads param, grad, exp_avg, exp_avg_sq, writes param and both moments; SGD: reads
        # param, grad (and momentum), writes param (and momentum).
        passes, flops = (7, 12) if m.group(1).startswith("adam") else (3, 2) if m.group(1) == "sgd" else (5, 6)
        return Cost("optimizer", float(flops * n_el), float(passes * n_el * bpe), dtype, f"{len(params)} tensors, {n_el:,} elements")
    m = FOREACH.match(op)
    if m:
        lists = [t for t in (_tensor_list(dims, i) for i in range(len(dims) if isinstance(dims, list) else 0)) if t]
        if not lists:
            return None
        n_el = sum(_prod(s) for s in lists[0])
        dtype = types[0] if types else ""
        bpe = BPE.get(dtype, 4) if dtype in BPE else 4
        return Cost("optimizer", float(n_el), float((len(lists) + 1) * n_el * bpe), dtype, f"{len(lists[0])} tensors, {n_el:,} elements")
    return None


# --- compiled (Inductor) Triton kernels ----------------------------------------------------------
# Inductor names a kernel after its class and the ATen ops it fused: `triton_poi_fused_add_relu_3`
# (pointwise), `triton_per_…`/`triton_red_…` (persistent and looped reductions), `triton_tem_fused_mm_0`
# (a GEMM template). Its launch (`record_shapes=True`, PyTorch 2.4+) records the shapes of the
# tensors passed to it: its inputs and outputs, each read or written once by a pointwise or
# reduction kernel.
TRITON_KERNEL = re.compile(r"^triton_(poi|per|red|tem)_(?:fused_)?(.*?)(?:_\d+)?$")
# The name's words that are arithmetic (one FLOP per element each); views, copies and layout
# changes (view, clone, transpose, permute, expand, cat, ...) are none.
# Fused ops whose generated code reads its tensors more than once or in part (a pooling
# backward gathers each input's windows, an index or scatter reads where its indices point):
# the tensors' sizes are not their bytes, so such a kernel gets no cost rather than a wrong one.
TRITON_REREADS = re.compile(r"pool\d?d(?:_with_indices)?_backward|index|gather|scatter|embedding|upsample|grid_sampler|col2im|im2col|unfold|sort|topk")
TRITON_ARITHMETIC = {
    "add", "sub", "mul", "div", "neg", "exp", "exp2", "log", "log1p", "sqrt", "rsqrt", "pow", "abs", "reciprocal", "relu", "gelu", "silu",
    "sigmoid", "tanh", "softmax", "sum", "mean", "amax", "amin", "max", "min", "var", "norm", "where", "maximum", "minimum", "clamp",
    "lerp", "addcmul", "addcdiv", "erf", "sin", "cos", "bernoulli", "dropout", "threshold", "hardtanh", "leaky", "sign", "mse", "nll",
}


def _template_gemm(shapes: list[list[int]]) -> tuple[int, int, int, int] | None:
    """(M, N, K, batch) of a GEMM template's launch: an operand A [..., K] (its leading dims
    flattened), an operand B [K, N] (or a weight [N, K]; [batch, K, N] for bmm) and an output of
    batch·M·N elements whose last dim is N, among the tensors passed to it."""
    matrices = [i for i, d in enumerate(shapes) if len(d) >= 2]
    for i in matrices:
        a = shapes[i]
        for j in matrices:
            b = shapes[j]
            if i == j:
                continue
            for k, n in ((b[-2], b[-1]), *(((b[-1], b[-2]),) if len(b) == 2 else ())):
                if a[-1] != k or k <= 0 or n <= 0:
                    continue
                rows = _prod(a) // k
                batch = _prod(b) // (k * n) if len(b) > 2 else 1
                if batch <= 0 or rows % batch:
                    continue
                m = rows // batch
                if any(h not in (i, j) and c[-1] == n and _prod(c) == batch * m * n for h, c in enumerate(shapes) if c):
                    return m, n, k, batch
    return None


def _cost_triton(op: str, types: tuple, dims) -> Cost | None:
    """A compiled Triton kernel from its launch's tensors and its name. Pointwise and reduction
    kernels: each tensor passed read or written once (a buffer updated in place is counted once:
    a lower bound), one FLOP per element of the largest tensor per arithmetic op the name lists;
    none for a kernel that fuses a gather (TRITON_REREADS).
    GEMM templates (not convolution or flex-attention ones): the M×N×K of the two operands the
    output's shape joins."""
    found = TRITON_KERNEL.match(op)
    if not found:
        return None
    cls, fused = found.group(1), found.group(2).split("_")
    tensors = [(d, t) for d, t in zip(dims, types, strict=False) if isinstance(d, list) and is_shape(d, 1) and BPE.get(t) and t != "Scalar"]
    if not tensors:
        return None
    dtype = max(tensors, key=lambda dt: _prod(dt[0]))[1]
    if cls == "tem":
        if "convolution" in fused or "flex" in fused:
            return None  # a convolution or flex-attention template: not a GEMM
        found_gemm = _template_gemm([d for d, _ in tensors])
        if found_gemm is None:
            return None
        m, n, k, batch = found_gemm
        return _gemm(m, n, k, "addmm" in fused or "baddbmm" in fused, BPE[dtype], dtype, batch=batch)
    if TRITON_REREADS.search(found.group(2)):
        return None
    elements = max(_prod(d) for d, _ in tensors)
    arithmetic = max(sum(1 for w in fused if w in TRITON_ARITHMETIC), 1)
    moved = float(sum(_prod(d) * BPE[t] for d, t in tensors))
    kind = "elementwise" if cls == "poi" else "reduce"
    return Cost(kind, float(elements * arithmetic), moved, dtype, " ".join(_fmt(d) for d, _ in tensors[:4]))


def op_cost(op: str, types: tuple, dims, concrete, known_convs: dict | None = None) -> Cost | None:
    """The FLOPs and bytes of one call of `op` with these input types, shapes (`Input Dims`)
    and scalar arguments (`Concrete Inputs`, or None); None where there is no model for it or
    its shapes are missing. `known_convs` (conv_shapes) fills in convolution shapes a trace
    without scalar arguments leaves out."""
    if not isinstance(op, str) or not isinstance(dims, list):
        return None
    if FUSED_OPTIMIZER.match(op) or FOREACH.match(op):
        return _cost_optimizer(op, types, dims)
    if op in LINEAR_LIKE or op in LIBRARY_NORMS or op in GATED_SILU:
        try:
            if op in GATED_SILU:
                return _cost_gated_silu(types, dims)
            return _cost_gemm("linear", types, dims) if op in LINEAR_LIKE else _cost_library_norm(op, types, dims)
        except (TypeError, ValueError, IndexError, OverflowError, ZeroDivisionError):
            return None
    if op.startswith("triton_"):
        try:
            return _cost_triton(op, types, dims)
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
    if not op.startswith("aten::"):
        return None
    name = op[6:]
    try:
        return (_cost_gemm(name, types, dims) or _cost_conv(name, types, dims, concrete, known_convs) or _cost_attention(name, types, dims, concrete)
                or _cost_norm(name, types, dims, concrete) or _cost_elementwise(name, types, dims, concrete))
    except (TypeError, ValueError, IndexError, ZeroDivisionError, OverflowError):
        return None  # a damaged or unexpected shape: no figure rather than a wrong one
