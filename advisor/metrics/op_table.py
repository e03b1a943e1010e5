"""Every op's device time, per op, input shapes, input dtypes and scalar arguments, as a distribution over its
calls (`advisor report --ops -f csv`, `advisor diff --ops`).

The roofline (advisor.metrics.roofline) keeps only the ops it has a cost model for and a
per-step mean; this table keeps every kernel the steps ran, grouped by the op that launched
it, with the count, total, mean, p50, p90 and max of a call's device time. A call is one
launching op (its external id), or one kernel where the trace links none, as the roofline
counts calls; kernels are those that start inside a step, as the roofline's kernel time.
`step_sd_ms` is the standard deviation over the steps of a row's device time per step: what
`op_diff` weighs a change against.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from advisor.metrics.steps import step_of

OP_TABLE_COLUMNS = ["op", "input_shapes", "input_dtypes", "scalar_inputs", "kernels", "count", "total_ms", "ms_per_step", "step_sd_ms", "mean_ms", "p50_ms", "p90_ms", "max_ms"]
NO_OP = "(no launching op)"
# What tells two rows apart: ops that differ in input shapes, input dtypes or scalar arguments
# (stride, padding) are different work.
KEY = ["op", "input_shapes", "input_dtypes", "scalar_inputs"]


def _text(v) -> str:
    """A shapes or dtypes value as compact JSON text ("" where not recorded)."""
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return ""
    if isinstance(v, str):
        return v
    try:
        return json.dumps(v, separators=(",", ":"))
    except (TypeError, ValueError):
        return str(v)


def op_time_table(kernels: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """One row per (op, input shapes, input dtypes), by total device time, from a rank's kernel
    table (`metrics.kernels`) and its steps; times in ms."""
    if len(kernels) == 0:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in OP_TABLE_COLUMNS})
    ts = kernels["ts"].to_numpy(np.int64)
    step = step_of(steps["start"].to_numpy(np.int64), steps["end"].to_numpy(np.int64), ts) if len(steps) else np.zeros(len(kernels), np.int64)
    inside = step >= 0
    k = kernels.loc[inside]
    step = step[inside]
    n_steps = max(len(steps), 1)
    op = k["op"].astype(object).where(k["op"].notna(), NO_OP).astype(str).to_numpy(dtype=object)
    dims = k["op_input_dims"].to_numpy(dtype=object) if "op_input_dims" in k else np.full(len(k), None, dtype=object)
    types = k["op_input_types"].to_numpy(dtype=object) if "op_input_types" in k else np.full(len(k), None, dtype=object)
    # Each distinct value once: equal shapes are one object (the loader decodes each value once).
    dims_text = _texts(dims)
    types_text = _texts(types)
    conc = k["op_concrete_inputs"].to_numpy(dtype=object) if "op_concrete_inputs" in k else np.full(len(k), None, dtype=object)
    conc_text = _texts(conc)
    ext = k["external_id"].to_numpy(np.int64) if "external_id" in k else np.full(len(k), -1, np.int64)
    call = np.where(ext >= 0, ext, -1 - np.arange(len(k)))
    per_call = pd.DataFrame({"op": op, "input_shapes": dims_text, "input_dtypes": types_text, "scalar_inputs": conc_text, "call": call, "dur": k["dur"].to_numpy(np.int64)})
    # Each row's device time in each step: its spread is the row's own step-to-step noise.
    group = per_call.groupby(KEY, sort=False, observed=True).ngroup().to_numpy()
    per_step = np.zeros((group.max() + 1, n_steps))
    np.add.at(per_step, (group, step), k["dur"].to_numpy(np.float64))
    spread = pd.DataFrame(per_call[KEY].drop_duplicates().to_numpy(), columns=KEY)
    spread["step_sd_ms"] = per_step.std(axis=1, ddof=1) / 1e6 if n_steps > 1 else np.nan
    per_call = per_call.groupby(KEY + ["call"], sort=False, observed=True)["dur"].sum().reset_index()
    g = per_call.groupby(KEY, sort=False, observed=True)["dur"]
    table = pd.DataFrame({
        "count": g.size(), "total_ms": g.sum() / 1e6, "mean_ms": g.mean() / 1e6,
        "p50_ms": g.quantile(0.5) / 1e6, "p90_ms": g.quantile(0.9) / 1e6, "max_ms": g.max() / 1e6,
    }).reset_index()
    table["ms_per_step"] = table["total_ms"] / n_steps
    table["count"] = table["count"].astype(np.int64)
    table = table.merge(spread, on=KEY, how="left")
    # The kernels each row ran (distinct names, sorted): a row whose kernels differ between two
    # runs ran other code (cuDNN chose another algorithm), not the same code slower.
    names = pd.DataFrame({"g": group, "name": k["name"].astype(str).to_numpy(dtype=object)}).drop_duplicates()
    kernels = names.sort_values("name", kind="stable").groupby("g", sort=True)["name"].agg("; ".join)
    spread_key = per_call[KEY].drop_duplicates().reset_index(drop=True).assign(kernels=kernels.reindex(range(len(spread))).to_numpy())
    table = table.merge(spread_key, on=KEY, how="left")
    table.attrs["steps"] = n_steps
    return table[OP_TABLE_COLUMNS].sort_values(["total_ms", "op"], ascending=[False, True], kind="stable").reset_index(drop=True)


def _texts(values: np.ndarray) -> np.ndarray:
    """_text of each value, computed once per distinct object."""
    cache: dict[int, str] = {}
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        key = id(v)
        t = cache.get(key)
        if t is None:
            t = cache[key] = _text(v)
        out[i] = t
    return out


DIFF_KEY_COLUMNS = KEY
# How many standard errors of the difference a change must exceed to be told apart from the
# steps' own spread (about 95% for normal step times).
NOISE_SE = 2.0


def op_diff(before: pd.DataFrame, after: pd.DataFrame) -> pd.DataFrame:
    """Two runs' op tables lined up by (op, input shapes, input dtypes, scalar inputs), ranked
    by the size of the change in device time per step. noise_ms: NOISE_SE standard errors of
    the difference of the two means per step, from each row's step-to-step spread (a row
    present in one run only has the other's spread as 0 and its mean as 0)."""
    n_b, n_a = max(before.attrs.get("steps", 1), 1), max(after.attrs.get("steps", 1), 1)
    cols = [*KEY, "ms_per_step", "step_sd_ms", "count", "kernels"]
    m = before[cols].merge(after[cols], on=KEY, how="outer", suffixes=("_before", "_after"))
    for side in ("before", "after"):
        m[f"ms_per_step_{side}"] = m[f"ms_per_step_{side}"].fillna(0.0)
        m[f"step_sd_ms_{side}"] = m[f"step_sd_ms_{side}"].fillna(0.0)
        m[f"count_{side}"] = m[f"count_{side}"].fillna(0).astype(np.int64)
    m["change_ms"] = m["ms_per_step_after"] - m["ms_per_step_before"]
    m["noise_ms"] = NOISE_SE * np.sqrt(m["step_sd_ms_before"] ** 2 / n_b + m["step_sd_ms_after"] ** 2 / n_a)
    m["beyond_noise"] = m["change_ms"].abs() > m["noise_ms"]
    m["status"] = np.where(m["count_before"] == 0, "new", np.where(m["count_after"] == 0, "gone", "both"))
    m["kernels_changed"] = (m["status"] == "both") & (m["kernels_before"] != m["kernels_after"])
    order = m["change_ms"].abs().sort_values(ascending=False, kind="stable").index
    return m.loc[order].reset_index(drop=True)
