"""Attention that runs unfused, found in the ops: SDPA's math fallback and eager softmax(QKᵀ)V.

`F.scaled_dot_product_attention` runs one fused kernel (flash, memory-efficient, cuDNN, the
flash CPU kernel) where one supports the device, dtype and arguments, else its math fallback
`aten::_scaled_dot_product_attention_math`: a matmul, a softmax and a matmul, with the whole
L×S score matrix written and read back. Attention written out by hand (`softmax(q @ k.T) @ v`)
runs the same three ops eagerly. Both are found here from the host ops alone (names, nesting
and input shapes), so the same reading serves CPU and GPU runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from advisor.metrics.breakdown import name_matches, text_of
from advisor.metrics.intervals import merge
from advisor.metrics.precision import op_dtype
from advisor.metrics.shapes import is_shape

MATMUL_OP = re.compile(r"^aten::(?:matmul|bmm|baddbmm)$")
SOFTMAX_OP = re.compile(r"^aten::(?:softmax|_softmax|_safe_softmax)$")
SDPA_MATH_OP = re.compile(r"^aten::_scaled_dot_product_attention_math(?:_for_mps)?$")
# PyTorch's own fused encoder path (`nn.TransformerEncoderLayer` and `nn.MultiheadAttention`
# in eval without grad): its bmm, softmax, bmm are inside the op, not code the user wrote and
# could replace with F.scaled_dot_product_attention.
NATIVE_MHA_OP = re.compile(r"^aten::(?:_native_multi_head_attention|_transformer_encoder_layer_fwd)$")
# The ops that draw a dropout mask: they run only where dropout is on (training, p > 0); an
# `aten::dropout` in eval returns its input and draws nothing.
DROPOUT_MASK_OP = re.compile(r"^aten::(?:native_dropout|bernoulli_|_fused_dropout)$")


@dataclass(frozen=True)
class UnfusedAttention:
    """The unfused attention calls of a trace and the matrix products inside them.

    `calls`: one row per call, `path` ("sdpa_math" or "eager"), `ts`/`end` (the span from its
    first product's start to its last one's end), `flops` (its two products: 2·B·L·S·(D + Dv);
    NaN without recorded shapes), `dtype` (of the products' inputs: fp32, bf16, fp16, fp64;
    None when not recorded), `shape` (text), `dropout` (a dropout mask was drawn inside the
    call on its thread: dropout on the attention probabilities, in training). `matmul_starts`/`matmul_ends`: the products' spans,
    merged."""

    calls: pd.DataFrame
    matmul_starts: np.ndarray
    matmul_ends: np.ndarray


def _dims(value) -> list | None:
    return value if isinstance(value, (list, tuple)) else None


def _sized(d) -> bool:
    return is_shape(d, 2)


def _eager_flops(first, softmax, second) -> float | None:
    """FLOPs of scores = A @ B and out = P @ V around a softmax of P's shape, or None where the
    shapes are not those of attention (the products must make and consume the softmax's scores)."""
    a, b = (first + [None, None])[:2] if first else (None, None)
    p = softmax[0] if softmax else None
    p2, v = (second + [None, None])[:2] if second else (None, None)
    if not all(_sized(x) for x in (a, b, p, p2, v)) or len(p) < 3:
        return None
    length, keys = p[-2], p[-1]
    if a[-2] != length or b[-1] != keys or p2[-2:] != p[-2:] or v[-2] != keys:
        return None
    batch = float(np.prod(p[:-2]))
    return 2.0 * batch * length * keys * (a[-1] + v[-1])


def _math_flops(inputs) -> float | None:
    q, k, v = (inputs + [None] * 3)[:3] if inputs else (None, None, None)
    if not all(_sized(x) for x in (q, k, v)):
        return None
    return 2.0 * float(np.prod(q[:-1])) * k[-2] * (q[-1] + v[-1])


def _shape_text(dims) -> str:
    return " × ".join(str(list(d)) for d in dims[:2]) if dims else ""


def _dropout_inside(host: pd.DataFrame, calls: pd.DataFrame) -> np.ndarray:
    """Whether a dropout mask (DROPOUT_MASK_OP) was drawn inside each call's span on its thread:
    between the softmax and the second product of eager attention, inside SDPA's math fallback."""
    out = np.zeros(len(calls), dtype=bool)
    drop = host[name_matches(host["name"], DROPOUT_MASK_OP)]
    if len(drop) == 0 or len(calls) == 0:
        return out
    tids = np.asarray(text_of(drop["tid"]) if isinstance(drop["tid"].dtype, pd.CategoricalDtype) else drop["tid"].to_numpy())
    for tid, ts in pd.Series(drop["ts"].to_numpy(np.int64)).groupby(tids):
        ts = np.sort(ts.to_numpy())
        mine = (calls["tid"] == tid).to_numpy()
        first = np.searchsorted(ts, calls["ts"].to_numpy(np.int64)[mine], side="left")
        last = np.searchsorted(ts, calls["end"].to_numpy(np.int64)[mine], side="right")
        out[mine] = last > first
    return out


def _inside_native_mha(host: pd.DataFrame, calls: pd.DataFrame) -> np.ndarray:
    """Whether each eager call lies inside one of PyTorch's own fused encoder ops on its thread."""
    out = np.zeros(len(calls), dtype=bool)
    native = host[name_matches(host["name"], NATIVE_MHA_OP)]
    if len(native) == 0 or len(calls) == 0:
        return out
    tids = np.asarray(text_of(native["tid"]) if isinstance(native["tid"].dtype, pd.CategoricalDtype) else native["tid"].to_numpy())
    eager = (calls["path"] == "eager").to_numpy()
    for tid in np.unique(tids):
        mine = tids == tid
        s, e = merge(native["ts"].to_numpy(np.int64)[mine], native["end"].to_numpy(np.int64)[mine])
        rows = eager & (calls["tid"] == tid).to_numpy()
        ts = calls["ts"].to_numpy(np.int64)[rows]
        j = np.searchsorted(s, ts, side="right") - 1
        out[rows] = (j >= 0) & (calls["end"].to_numpy(np.int64)[rows] <= e[np.maximum(j, 0)])
    return out


def unfused_attention(host: pd.DataFrame) -> UnfusedAttention:
    """The SDPA math fallbacks and the eager softmax(QKᵀ)V sequences among the host ops.

    Eager attention is a softmax over a ≥3-D input between two matrix products on the same
    thread, with no other product between them (scaling, masking, dropout and casts may stand
    between), whose shapes make the softmax's input and take its output. Only the outermost of
    nested ops count (`aten::matmul` holds `aten::bmm`, `aten::softmax` holds `aten::_softmax`)."""
    empty = UnfusedAttention(pd.DataFrame({"path": [], "ts": [], "end": [], "flops": [], "dtype": [], "shape": [], "tid": [], "dropout": []}), np.zeros(0, np.int64), np.zeros(0, np.int64))
    if len(host) == 0:
        return empty
    is_mm = name_matches(host["name"], MATMUL_OP)
    is_sm = name_matches(host["name"], SOFTMAX_OP)
    is_math = name_matches(host["name"], SDPA_MATH_OP)
    picked = is_mm | is_sm | is_math
    if not (is_sm.any() or is_math.any()):
        return empty
    sel = host.loc[picked, ["name", "tid", "ts", "end", "input_dims", "input_types"]].copy()
    sel["mm"], sel["sm"], sel["math"] = is_mm[picked], is_sm[picked], is_math[picked]
    sel["tid"] = text_of(sel["tid"]) if isinstance(sel["tid"].dtype, pd.CategoricalDtype) else sel["tid"]
    sel = sel.sort_values(["tid", "ts"], kind="stable")
    before = sel.groupby("tid", sort=False)["end"].cummax().groupby(sel["tid"], sort=False).shift(1)
    outer = sel[before.isna().to_numpy() | (sel["ts"].to_numpy() >= before.to_numpy(np.float64, na_value=-np.inf))]
    tid = outer["tid"].to_numpy()
    mm, sm, math = outer["mm"].to_numpy(bool), outer["sm"].to_numpy(bool), outer["math"].to_numpy(bool)
    n = len(outer)
    middle = np.zeros(n, dtype=bool)
    if n >= 3:
        middle[1:-1] = sm[1:-1] & mm[:-2] & mm[2:] & (tid[:-2] == tid[1:-1]) & (tid[2:] == tid[1:-1])
    ts, end = outer["ts"].to_numpy(np.int64), outer["end"].to_numpy(np.int64)
    dims, types = outer["input_dims"].to_numpy(object), outer["input_types"].to_numpy(object)
    rows, mm_s, mm_e = [], [], []
    for i in np.nonzero(middle)[0]:  # a few calls per step: shapes are read per call
        flops = _eager_flops(_dims(dims[i - 1]), _dims(dims[i]), _dims(dims[i + 1]))
        if flops is None:
            continue
        rows.append(("eager", ts[i - 1], end[i + 1], flops, op_dtype(types[i - 1]), _shape_text(_dims(dims[i - 1])), tid[i]))
        mm_s += [ts[i - 1], ts[i + 1]]
        mm_e += [end[i - 1], end[i + 1]]
    for i in np.nonzero(math)[0]:
        flops = _math_flops(_dims(dims[i]))
        rows.append(("sdpa_math", ts[i], end[i], np.nan if flops is None else flops, op_dtype(types[i]), _shape_text(_dims(dims[i])), tid[i]))
    if not rows:
        return empty
    calls = pd.DataFrame(rows, columns=["path", "ts", "end", "flops", "dtype", "shape", "tid"]).sort_values("ts", kind="stable", ignore_index=True)
    calls["dropout"] = _dropout_inside(host, calls)
    calls = calls[~_inside_native_mha(host, calls)].reset_index(drop=True)
    if len(calls) == 0:
        return empty
    if math.any():  # the products inside the math fallback's spans
        ms, me = merge(ts[math], end[math])
        inner = sel[sel["mm"].to_numpy(bool)]
        its = inner["ts"].to_numpy(np.int64)
        j = np.searchsorted(ms, its, side="right") - 1
        inside = (j >= 0) & (its < me[np.maximum(j, 0)])
        mm_s += list(its[inside])
        mm_e += list(inner["end"].to_numpy(np.int64)[inside])
    s, e = merge(np.asarray(mm_s, np.int64), np.asarray(mm_e, np.int64))
    return UnfusedAttention(calls, s, e)
