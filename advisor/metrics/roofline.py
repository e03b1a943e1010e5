"""Roofline per operation: FLOPs and bytes from an op's shapes, against the device's ceilings.

For every op with a cost model (GEMMs, convolutions forward and backward, attention, the
norms, softmax, common elementwise ops and reductions, the optimizers' multi-tensor ops,
Inductor's compiled Triton kernels),
from its input shapes, dtypes and scalar arguments (`record_shapes=True`): the FLOPs it does
and the bytes it must move at least (each input read once, each output written once), the
time its kernels took on the device, and so the achieved TFLOP/s and TB/s, its arithmetic
intensity (FLOP per byte), and the share of the device's ceiling it reached: the attainable
rate at that intensity, min(peak for its precision, intensity × memory bandwidth)
(`advisor.metrics.devices` holds the peaks, from vendors' datasheets).

Each op's FLOPs and bytes come from `advisor.metrics.op_cost` (its docstring gives the
formulas and what they are checked against).

Ops are grouped by (op, input types, shapes, scalar arguments) and each distinct group is
costed once: a run repeats the same few hundred shapes every step. Only kernels inside the
steps count, and time is per step. Kernels are charged to the op that launched them (the
innermost one, e.g. `aten::mm` under `aten::linear`, `aten::_flash_attention_forward` under
`aten::scaled_dot_product_attention`).

What each op costs (FLOPs, bytes, the GEMM dimensions) is advisor.metrics.op_cost; this module
groups the ops, charges them their kernels' time and sets them against the device's ceilings.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from advisor.metrics.autocast import input_type_names
from advisor.metrics.breakdown import name_matches, row_groups, text_of
from advisor.metrics.devices import DeviceCeiling, device_ceiling
from advisor.metrics.op_cost import MATRIX_KINDS, PRECISION_OF_DTYPE, Cost, op_cost
from advisor.metrics.steps import step_of


# --- the table ---------------------------------------------------------------------------------
ROOFLINE_COLUMNS = [
    "op", "kind", "shape", "dtype", "precision", "calls", "time_ms", "flops", "bytes", "tflops", "tbps", "intensity",
    "peak_tflops", "peak_tbps", "attainable_tflops", "ceiling_share", "bound", "m", "n", "k", "batch",
]
# Ops kept in the stored table: the ones that hold the time (a long tail of tiny shapes is summed in `other_ms`).
MAX_ROWS = 300


@dataclass
class Roofline:
    """The run's ops on the device's roofline, per step (see the module's docstring).

    `ops`: one row per distinct (op, types, shapes, scalar arguments), by time; `device`: the
    ceiling (None: a device the table does not know); `shapes_recorded`: whether the trace
    has input shapes at all (record_shapes=True); `modelled_ms` and `kernel_ms`: per step,
    kernel time of ops with a cost model and of all kernels in the steps.
    """

    ops: pd.DataFrame
    device: DeviceCeiling | None
    device_name: str | None
    shapes_recorded: bool
    modelled_ms: float = 0.0
    kernel_ms: float = 0.0
    bandwidth_tbps: float | None = None  # the run's own best streaming rate (elementwise probes)
    sm_count: int | None = None  # the device's multiprocessors (deviceProperties), where recorded
    notes: list[str] = field(default_factory=list)

    @property
    def available(self) -> bool:
        return len(self.ops) > 0

    def to_dict(self, n: int | None = None) -> dict[str, Any]:
        ops = self.ops if n is None else self.ops.head(n)
        rows = []
        for r in ops.itertuples(index=False):
            row = {c: getattr(r, c) for c in ROOFLINE_COLUMNS}
            rows.append({c: (None if isinstance(v, float) and not math.isfinite(v) else (int(v) if isinstance(v, (np.integer,)) else (float(v) if isinstance(v, np.floating) else v))) for c, v in row.items()})
        return {
            "device": self.device_name,
            "ceiling": self.device.to_dict() if self.device else None,
            "shapes_recorded": self.shapes_recorded,
            "modelled_ms_per_step": self.modelled_ms,
            "kernel_ms_per_step": self.kernel_ms,
            "ops": rows,
            "notes": list(self.notes),
        }


SHAPES_NOTE = "the roofline needs input shapes: record the trace with record_shapes=True (advisor profile records them)"
UNKNOWN_DEVICE_NOTE = "no ceiling for {name}: not in the device table (advisor.metrics.devices); achieved rates shown without a share of peak"


COMPILED_NOTE = ("Triton kernels without a cost ({n} distinct, {ms:.2f} ms/step): their names are not Inductor's pointwise, "
                 "reduction or GEMM-template kernels (triton_poi/per/red/tem_…), so the shapes of the tensors passed to them "
                 "do not give their computation")
COMPILED_NO_SHAPES_NOTE = ("compiled Triton kernels have no cost ({n} distinct, {ms:.2f} ms/step): the trace records no shapes "
                           "for their launches (PyTorch before 2.4, or kernels replayed from a CUDA graph)")


TRITON_NAME = re.compile(r"^triton_")

# A group whose shapes give a rate no device reaches is left out (its shapes are damaged or
# forged: a 10⁶×10⁶ `mm` in 2 µs), with a note, and never sets a reference rate. The bounds
# leave room for what real runs show: a fast convolution algorithm does fewer FLOPs than the
# direct count (an fp32 convolution on a V100 at 1.7× the fp32 peak), and a tensor in the L2
# cache moves faster than memory (small elementwise ops at 1.5× the V100's bandwidth).
# FLOP/s: above twice the device's fastest dense peak of any precision (2:4 sparsity's
# datasheet figure); bytes/s: above CACHE_SLACK × its memory bandwidth. With no ceiling known,
# the fastest device in the table, and MAX_COPY_GBPS (no link or memory moves more).
CACHE_SLACK = 4.0
BEYOND_CEILING_NOTE = ("left out {n} op shape(s) whose recorded time gives a rate no {device} reaches "
                       "(up to {tflops:,.0f} TFLOP/s, {tbps:,.1f} TB/s against {peak:,.0f} TFLOP/s and {bw:,.2f} TB/s): "
                       "their Input Dims are not what ran ({ops})")


def _impossible_bounds(ceiling: DeviceCeiling | None) -> tuple[float, float]:
    """(TFLOP/s, TB/s) past which an op's rate is not a measurement (see CACHE_SLACK)."""
    from advisor.load.categories import MAX_COPY_GBPS
    from advisor.metrics.devices import PRECISIONS, known_devices

    devices = [ceiling] if ceiling is not None else known_devices()
    fastest = max((c.peak_tflops(p) or 0.0) for c in devices for p in PRECISIONS)
    bandwidth = CACHE_SLACK * ceiling.memory_tbps if ceiling is not None else MAX_COPY_GBPS / 1e3
    return 2.0 * fastest, bandwidth


def compiled_notes(k: pd.DataFrame, inside: np.ndarray, costed: np.ndarray, n_steps: int) -> list[str]:
    """What the roofline says of the torch.compile (Inductor) Triton kernels it leaves out: how
    many distinct kernels, their time per step, and why they have no cost."""
    if len(k) == 0 or "name" not in k:
        return []
    names = k["name"]
    if "op" in k:  # each distinct op tested once
        codes, distinct = pd.factorize(k["op"].astype(object).fillna("").to_numpy())
        triton_op = np.fromiter((str(o).startswith("triton_") for o in distinct), dtype=bool, count=len(distinct))[codes] if len(k) else np.zeros(0, dtype=bool)
    else:
        triton_op = np.zeros(len(k), dtype=bool)
    triton = (name_matches(names, TRITON_NAME) | triton_op) & inside & ~costed
    if not triton.any():
        return []
    # Launched by a Triton launch op that recorded its tensors' shapes (looked at on those kernels only).
    shaped = triton & triton_op
    if "op_input_dims" in k and shaped.any():
        at = np.nonzero(shaped)[0]
        dims = k["op_input_dims"].to_numpy(dtype=object)[at]
        shaped[at] = [isinstance(d, list) and len(d) > 0 for d in dims]
    else:
        shaped[:] = False
    dur = k["dur"].to_numpy(np.float64)
    out = []
    for mask, text in ((triton & shaped, COMPILED_NOTE), (triton & ~shaped, COMPILED_NO_SHAPES_NOTE)):
        if mask.any():
            out.append(text.format(n=len(set(map(str, text_of(names)[mask]))), ms=float(dur[mask].sum()) / n_steps / 1e6))
    return out


def _precision(kind: str, dtype: str, kernel_precision: str) -> str:
    if kind not in MATRIX_KINDS:
        return "fp32"  # vector work: the fp32 units' peak (memory bound in practice)
    if dtype == "float" and kernel_precision == "tf32":
        return "tf32"
    return PRECISION_OF_DTYPE.get(dtype, "")


def group_codes(k: pd.DataFrame) -> np.ndarray:
    """One code per kernel for its launching op's (name, types, shapes, scalar arguments):
    equal shapes are one object (the loader decodes each distinct value once), so identities
    group them without hashing nested lists."""
    if len(k) == 0:
        return np.zeros(0, dtype=np.int64)
    cols = []
    for c in ("op", "op_input_types"):
        cols.append(pd.factorize(k[c].astype(object).to_numpy(), use_na_sentinel=True)[0] if c in k else np.zeros(len(k), np.int64))
    for c in ("op_input_dims", "op_concrete_inputs"):
        if c in k:
            ids = np.fromiter(map(id, k[c].to_numpy(dtype=object)), dtype=np.int64, count=len(k))
            cols.append(pd.factorize(ids)[0])
        else:
            cols.append(np.zeros(len(k), np.int64))
    return row_groups(cols)


def roofline(k: pd.DataFrame, steps: pd.DataFrame, device_name: str | None, shapes_recorded: bool, bandwidth_bpns: float | None = None,
             sm_count: int | None = None, known_convs: dict | None = None) -> tuple[Roofline, np.ndarray, pd.DataFrame]:
    """The run's roofline from its kernel table (`metrics.kernels.kernel_table`), and for the
    rules, each kernel's row in the full table of groups (-1: not costed) and that table."""
    ceiling = device_ceiling(device_name)
    n_steps = max(len(steps), 1)
    notes: list[str] = []
    empty = pd.DataFrame({c: pd.Series(dtype=object) for c in ROOFLINE_COLUMNS})
    if len(k) == 0:
        return Roofline(empty, ceiling, device_name, shapes_recorded, notes=notes), np.full(0, -1), empty
    if len(steps):
        inside = step_of(steps["start"].to_numpy(np.int64), steps["end"].to_numpy(np.int64), k["ts"].to_numpy(np.int64)) >= 0
    else:
        inside = np.ones(len(k), dtype=bool)
    kernel_ms = float(k["dur"].to_numpy(np.float64)[inside].sum()) / n_steps / 1e6
    if not shapes_recorded or "op_input_dims" not in k:
        notes.append(SHAPES_NOTE)
        return Roofline(empty, ceiling, device_name, False, 0.0, kernel_ms, notes=notes), np.full(len(k), -1), empty
    codes = group_codes(k)
    codes = np.where(inside, codes, -1)
    live = codes >= 0
    if not live.any():
        return Roofline(empty, ceiling, device_name, True, 0.0, kernel_ms, notes=notes), np.full(len(k), -1), empty
    # One representative kernel per group, and the group's kernel time and calls.
    idx = np.nonzero(live)[0]
    g = pd.DataFrame({"code": codes[idx], "pos": idx, "dur": k["dur"].to_numpy(np.float64)[idx],
                      "ext": k["external_id"].to_numpy(np.int64)[idx] if "external_id" in k else np.full(len(idx), -1)})
    first = g.drop_duplicates("code")
    prec_all = text_of(k["precision"])[idx] if "precision" in k else np.full(len(idx), "", dtype=object)
    g["tf32"] = prec_all == "tf32"  # an fp32 op any of whose kernels ran TF32 (cuDNN's default for convolutions)
    # per group, in order of first appearance: kernel time (whole ns: summed exactly), kernels, any TF32
    order = first["code"].to_numpy()
    code_of, n_codes = g["code"].to_numpy(), int(codes.max()) + 1
    agg = pd.DataFrame(
        {
            "dur": np.bincount(code_of, weights=g["dur"].to_numpy(), minlength=n_codes)[order],
            "kernels": np.bincount(code_of, minlength=n_codes)[order],
            "tf32": np.bincount(code_of, weights=g["tf32"].to_numpy(np.float64), minlength=n_codes)[order] > 0,
        },
        index=pd.Index(order, name="code"),
    )
    with_ext = g[g["ext"] >= 0].groupby("code", sort=False)["ext"].nunique()
    calls = agg["kernels"].astype(np.float64).copy()
    calls.loc[with_ext.index] = with_ext.astype(np.float64)
    op_col, types_col = k["op"].to_numpy(dtype=object), k["op_input_types"].to_numpy(dtype=object)
    dims_col = k["op_input_dims"].to_numpy(dtype=object)
    conc_col = k["op_concrete_inputs"].to_numpy(dtype=object) if "op_concrete_inputs" in k else np.full(len(k), None, dtype=object)
    tf32_of = agg["tf32"].to_dict()
    rows = []
    for code, pos in zip(first["code"].to_numpy(), first["pos"].to_numpy(), strict=True):
        types = input_type_names(types_col[pos]) if isinstance(types_col[pos], str) else ()
        conc = conc_col[pos] if isinstance(conc_col[pos], list) else None
        cost = op_cost(op_col[pos], types, dims_col[pos], conc, known_convs)
        if cost is None or cost.flops <= 0 and cost.bytes <= 0:
            continue
        rows.append((code, op_col[pos], cost, "tf32" if tf32_of[code] else ""))
    if not rows:
        notes += compiled_notes(k, inside, np.zeros(len(k), dtype=bool), n_steps)
        return Roofline(empty, ceiling, device_name, True, 0.0, kernel_ms, notes=notes), np.full(len(k), -1), empty
    codes_kept = np.array([r[0] for r in rows], dtype=np.int64)
    dur = agg.loc[codes_kept, "dur"].to_numpy(np.float64)
    ncalls = calls.loc[codes_kept].to_numpy(np.float64)
    flops = np.array([r[2].flops for r in rows], dtype=np.float64)
    moved = np.array([r[2].bytes for r in rows], dtype=np.float64)
    kind = np.array([r[2].kind for r in rows], dtype=object)
    precision = np.array([_precision(r[2].kind, r[2].dtype, r[3]) for r in rows], dtype=object)
    with np.errstate(divide="ignore", invalid="ignore"):
        tflops = np.where(dur > 0, flops * ncalls / dur / 1e3, np.nan)  # FLOP/ns = GFLOP/s; /1e3: TFLOP/s
        tbps = np.where(dur > 0, moved * ncalls / dur / 1e3, np.nan)  # bytes/ns = GB/s; /1e3: TB/s
    max_tflops, max_tbps = _impossible_bounds(ceiling)
    impossible = (tflops > max_tflops) | (tbps > max_tbps)
    if impossible.any():
        shown = sorted({r[1] for r, bad in zip(rows, impossible, strict=True) if bad})
        notes.append(BEYOND_CEILING_NOTE.format(
            n=int(impossible.sum()), device=ceiling.name if ceiling is not None else "device", tflops=float(np.nanmax(tflops[impossible])),
            tbps=float(np.nanmax(tbps[impossible])), peak=max_tflops / 2, bw=max_tbps / CACHE_SLACK if ceiling is not None else max_tbps,
            ops=", ".join(shown[:5]) + (", ..." if len(shown) > 5 else ""),
        ))
        keep = ~impossible
        rows = [r for r, k_ in zip(rows, keep, strict=True) if k_]
        if not rows:
            notes += compiled_notes(k, inside, np.zeros(len(k), dtype=bool), n_steps)
            return Roofline(empty, ceiling, device_name, True, 0.0, kernel_ms, notes=notes), np.full(len(k), -1), empty
        codes_kept, dur, ncalls, flops, moved = codes_kept[keep], dur[keep], ncalls[keep], flops[keep], moved[keep]
        kind, precision, tflops, tbps = kind[keep], precision[keep], tflops[keep], tbps[keep]
    with np.errstate(divide="ignore", invalid="ignore"):
        intensity = np.where(moved > 0, flops / moved, np.nan)
    if ceiling is not None:
        peak = np.array([ceiling.peak_tflops(p) or np.nan for p in precision], dtype=np.float64)
        bw = np.full(len(rows), ceiling.memory_tbps)
    else:
        peak = np.full(len(rows), np.nan)
        bw = np.full(len(rows), np.nan)
    with np.errstate(invalid="ignore"):
        attainable = np.fmin(peak, intensity * bw) if ceiling is not None else np.full(len(rows), np.nan)
        attainable = np.where(np.isnan(peak), intensity * bw, attainable)
        share = tflops / attainable
        # Where the op's FLOPs are nothing to speak of (copies), its bandwidth share.
        share = np.where((flops <= 0) & (bw > 0), tbps / bw, share)
        bound = np.where(intensity * bw < peak, "memory", np.where(np.isnan(peak) | np.isnan(bw), "", "compute"))
    table = pd.DataFrame({
        "code": codes_kept,
        "op": [r[1] for r in rows],
        "kind": kind,
        "shape": [r[2].shape for r in rows],
        "dtype": [r[2].dtype for r in rows],
        "precision": precision,
        "calls": ncalls / n_steps,
        "time_ms": dur / n_steps / 1e6,
        "flops": flops,
        "bytes": moved,
        "tflops": tflops,
        "tbps": tbps,
        "intensity": intensity,
        "peak_tflops": peak,
        "peak_tbps": bw,
        "attainable_tflops": attainable,
        "ceiling_share": share,
        "bound": bound,
        "m": [r[2].m for r in rows],
        "n": [r[2].n for r in rows],
        "k": [r[2].k for r in rows],
        "batch": [r[2].batch for r in rows],
    }).sort_values("time_ms", ascending=False, kind="stable").reset_index(drop=True)
    if ceiling is None and device_name:
        notes.append(UNKNOWN_DEVICE_NOTE.format(name=device_name))
    elif ceiling is None:
        notes.append("no ceiling: the trace does not name its device")
    modelled = float(table["time_ms"].sum())
    row_of_code = pd.Series(np.arange(len(table)), index=table["code"].to_numpy())
    kernel_row = np.full(len(k), -1, dtype=np.int64)
    kernel_row[live] = pd.Series(codes[live]).map(row_of_code).fillna(-1).to_numpy(np.int64)
    notes += compiled_notes(k, inside, kernel_row >= 0, n_steps)
    stored = table.drop(columns=["code"]).head(MAX_ROWS).reset_index(drop=True)
    out = Roofline(stored, ceiling, device_name, True, modelled, kernel_ms,
                   bandwidth_tbps=bandwidth_bpns / 1e3 if bandwidth_bpns else None, sm_count=sm_count, notes=notes)
    return out, kernel_row, table.drop(columns=["code"])


def shapes_recorded(frames) -> bool:
    """Whether the trace's ops carry input shapes (record_shapes=True)."""
    host = frames.host
    if "input_dims" not in host or len(host) == 0:
        return False
    return bool(pd.notna(host["input_dims"].to_numpy(dtype=object)).any())


# --- what the roofline's findings read --------------------------------------------------------
# The multiple of every GEMM dimension the Tensor Cores' tiles need (NVIDIA's "Matrix
# Multiplication Background" guide: 16 bytes, i.e. 8 fp16/bf16, 4 tf32, 16 int8/fp8 elements).
TILE_MULTIPLE = {"fp16": 8, "bf16": 8, "tf32": 4, "fp8": 16, "int8": 16}
# The output tile a GEMM kernel gives one SM (cuBLAS's common 128×128); fewer tiles than SMs leaves SMs idle.
OUTPUT_TILE = 128


def full_table(m) -> pd.DataFrame:
    """Every costed (op, shapes) group of a rank with frames (the stored table keeps the top ones)."""
    table = m.derived.get("roofline.table")
    return table if isinstance(table, pd.DataFrame) else pd.DataFrame(columns=ROOFLINE_COLUMNS)


def kernel_rows(m) -> np.ndarray:
    """Each kernel of `m.kernels`: its row of `full_table(m)`, -1 where not costed."""
    rows = m.derived.get("roofline.kernel_row")
    return rows if isinstance(rows, np.ndarray) and len(rows) == len(m.kernels) else np.full(len(m.kernels), -1)


def padded(dims: np.ndarray, multiple: np.ndarray) -> np.ndarray:
    return np.ceil(dims / multiple) * multiple


def misaligned_gemms(table: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(mask over the table: GEMMs on Tensor Core precisions with a dimension that is not a
    multiple of the tile's, the multiple for each row; 0 where it has none)."""
    multiple = table["precision"].map(TILE_MULTIPLE).fillna(0).to_numpy(np.float64) if len(table) else np.zeros(0)
    is_gemm = (table["kind"] == "gemm").to_numpy() & (multiple > 0)
    mnk = table[["m", "n", "k"]].to_numpy(np.float64) if len(table) else np.zeros((0, 3))
    with np.errstate(invalid="ignore", divide="ignore"):
        off = (np.mod(mnk, np.where(multiple > 0, multiple, 1)[:, None]) != 0).any(axis=1)
    return is_gemm & off & (mnk > 0).all(axis=1), multiple


def aligned_rate(table: pd.DataFrame, precision: str, flops: float, exclude: np.ndarray) -> float | None:
    """TFLOP/s the run's own aligned GEMMs of this precision reached, weighted by time: those
    within 4× of `flops` per call, else all of them; None where it has none."""
    bad, _ = misaligned_gemms(table)
    ok = (table["kind"] == "gemm").to_numpy() & ~bad & ~exclude & (table["precision"] == precision).to_numpy() & (table["time_ms"].to_numpy(np.float64) > 0)
    if not ok.any():
        return None
    f = table["flops"].to_numpy(np.float64)
    near = ok & (f >= flops / 4) & (f <= flops * 4)
    use = near if near.any() else ok
    t = table["time_ms"].to_numpy(np.float64)[use]
    done = (table["flops"].to_numpy(np.float64) * table["calls"].to_numpy(np.float64))[use]
    return float(done.sum() / t.sum() / 1e9) if t.sum() > 0 else None  # FLOP per ms per step / 1e9 = TFLOP/s


def output_tiles(table: pd.DataFrame) -> np.ndarray:
    """Output tiles a GEMM gives the SMs: ceil(M/128)·ceil(N/128)·batch."""
    m = table["m"].to_numpy(np.float64)
    n = table["n"].to_numpy(np.float64)
    return np.ceil(m / OUTPUT_TILE) * np.ceil(n / OUTPUT_TILE) * table["batch"].to_numpy(np.float64)


__all__ = ["Cost", "Roofline", "TILE_MULTIPLE", "aligned_rate", "full_table", "kernel_rows", "misaligned_gemms", "output_tiles", "padded", "ROOFLINE_COLUMNS", "SHAPES_NOTE", "COMPILED_NOTE", "COMPILED_NO_SHAPES_NOTE", "compiled_notes", "group_codes", "op_cost", "roofline", "shapes_recorded"]
