"""`advisor report --ops`: the slowest rank's ops by device time, on the device's roofline.

Reads only the analysis (`Metrics.roofline`, computed once with the metrics): text, Markdown
and JSON (`advisor/ops/v1`). Shapes and op names come from the trace: printed as text, never
markup.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from advisor.analysis import Analysis
from advisor.render.fmt import md
from advisor.output import to_json_text
from advisor.terminal_text import one_line
from advisor.version import __version__

if TYPE_CHECKING:
    from rich.console import Console

OPS_SCHEMA = "advisor/ops/v1"
MAX_OPS = 40


def _roofline(a: Analysis):
    return getattr(a.primary, "roofline", None)


def _num(v: Any, digits: int = 1, unit: str = "") -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    v = float(v)
    if abs(v) >= 1e4:
        return f"{v:,.0f}{unit}"
    return f"{v:.{digits}f}{unit}"


def _si(v: Any) -> str:
    """FLOPs and bytes with an SI prefix (1.2 G)."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    v = float(v)
    for div, p in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= div:
            return f"{v / div:.3g} {p}"
    return f"{v:.3g}"


def _share(v: Any) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    return f"{100 * float(v):.0f}%"


def heading(a: Analysis) -> list[str]:
    """What the table is about: the device and its ceilings, or why there is no table."""
    r = _roofline(a)
    if r is None:
        return ["The roofline was not measured for this analysis (an older cache entry): run the report again."]
    lines = []
    rank = f" (rank {a.primary.rank}, the slowest)" if len(a.ranks) > 1 else ""
    if r.device is not None:
        c = r.device
        peaks = ", ".join(f"{p} {v:g}" for p, v in (("fp32", c.fp32), ("tf32", c.tf32), ("fp16", c.fp16), ("bf16", c.bf16), ("fp8", c.fp8), ("int8", c.int8)) if v)
        lines.append(f"Device{rank}: {one_line(r.device_name or '')} as {c.name}: peak TFLOP/s {peaks}; memory {c.memory_tbps:g} TB/s ({c.source}).")
    elif r.device_name:
        lines.append(f"Device{rank}: {one_line(r.device_name)}: not in the device table, no ceiling (achieved rates only).")
    if r.bandwidth_tbps:
        lines.append(f"The run's own elementwise kernels streamed at up to {r.bandwidth_tbps:.2f} TB/s.")
    if r.kernel_ms > 0 and r.available:
        lines.append(f"Ops with a cost model: {r.modelled_ms:.2f} of {r.kernel_ms:.2f} ms/step of kernel time ({100 * r.modelled_ms / r.kernel_ms:.0f}%).")
    lines += [one_line(n) for n in r.notes]
    return lines


def render_ops_text(a: Analysis, console: Console, n: int = MAX_OPS) -> None:
    from rich.table import Table  # imported where a terminal table is drawn: the HTML report draws none
    from rich.text import Text

    for line in heading(a):
        console.print(Text(line), soft_wrap=True)
    r = _roofline(a)
    if r is None or not r.available:
        return
    t = Table(show_edge=False, pad_edge=False, header_style="bold")
    for col, justify in (("op", "left"), ("shape", "left"), ("dtype", "left"), ("calls/step", "right"), ("ms/step", "right"),
                         ("FLOP", "right"), ("bytes", "right"), ("FLOP/B", "right"), ("TFLOP/s", "right"), ("TB/s", "right"),
                         ("bound", "left"), ("of ceiling", "right")):
        t.add_column(col, justify=justify, overflow="fold")
    for row in r.ops.head(n).itertuples(index=False):
        t.add_row(Text(one_line(row.op)), Text(one_line(row.shape)), Text(one_line(row.precision or row.dtype)), _num(row.calls, 1),
                  _num(row.time_ms, 3), _si(row.flops), _si(row.bytes), _num(row.intensity, 1), _num(row.tflops, 2), _num(row.tbps, 3),
                  row.bound or "–", _share(row.ceiling_share))
    console.print(t)


def to_ops_markdown(a: Analysis, n: int = MAX_OPS) -> str:
    out = [f"# Ops on the roofline: {md(a.run.name)}", ""]
    out += [md(line) + "  " for line in heading(a)]
    r = _roofline(a)
    if r is not None and r.available:
        out += ["", "| op | shape | dtype | calls/step | ms/step | FLOP | bytes | FLOP/B | TFLOP/s | TB/s | bound | of ceiling |",
                "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |"]
        for row in r.ops.head(n).itertuples(index=False):
            out.append(f"| {md(row.op)} | {md(row.shape)} | {md(row.precision or row.dtype)} | {_num(row.calls, 1)} | {_num(row.time_ms, 3)} | "
                       f"{_si(row.flops)} | {_si(row.bytes)} | {_num(row.intensity, 1)} | {_num(row.tflops, 2)} | {_num(row.tbps, 3)} | "
                       f"{row.bound or '–'} | {_share(row.ceiling_share)} |")
    return "\n".join(out) + "\n"


def ops_document(a: Analysis) -> dict[str, Any]:
    r = _roofline(a)
    body = r.to_dict() if r is not None else {"device": None, "ceiling": None, "shapes_recorded": False, "modelled_ms_per_step": 0.0,
                                              "kernel_ms_per_step": 0.0, "ops": [], "notes": heading(a)}
    return {"schema": OPS_SCHEMA, "advisor_version": __version__, "source": a.source, "run": a.run.name, "rank": a.primary.rank, **body}


def to_ops_json(a: Analysis) -> str:
    return to_json_text(ops_document(a))


__all__ = ["OPS_SCHEMA", "OP_DIFF_SCHEMA", "heading", "ops_document", "render_ops_text", "to_op_diff_json", "to_op_diff_markdown", "to_op_diff_text", "to_ops_json", "to_ops_markdown"]


# --- `advisor diff --ops`: the ops of two runs lined up, by the size of the change -----------
OP_DIFF_SCHEMA = "advisor/op-diff/v1"
OP_DIFF_ROWS = 30


def _verdict(row: Any) -> str:
    if row.status != "both":
        return "only after" if row.status == "new" else "only before"
    if not row.beyond_noise:
        return "within noise"
    return "beyond noise, other kernels" if row.kernels_changed else "beyond noise"


def op_diff_heading(before: str, after: str, diff: Any) -> list[str]:
    beyond = diff[diff["beyond_noise"]]
    return [
        f"Ops of {one_line(before)} → {one_line(after)}: device time per step by (op, input shapes, input dtypes, scalar inputs), "
        f"largest change first; {len(diff)} rows, {len(beyond)} beyond the steps' noise "
        f"({int(beyond['kernels_changed'].sum())} of them ran other kernels).",
        "Noise: two standard errors of the difference of the two runs' mean per step, from each row's own step-to-step spread. "
        "Separate runs also differ by what one run's steps do not show (GPU clocks, cuDNN's choice of algorithm).",
    ]


def _diff_cells(row: Any) -> list[str]:
    return [one_line(row.op), one_line(row.input_shapes), one_line(row.input_dtypes), _num(row.ms_per_step_before, 3),
            _num(row.ms_per_step_after, 3), f"{row.change_ms:+.3f}", _num(row.noise_ms, 3), _verdict(row)]


DIFF_HEADER = ["op", "input shapes", "input dtypes", "before ms/step", "after ms/step", "change ms", "noise ms", ""]


def to_op_diff_text(before: str, after: str, diff: Any, n: int = OP_DIFF_ROWS) -> str:
    rows = [_diff_cells(r) for r in diff.head(n).itertuples(index=False)]
    widths = [min(60, max(len(h), *(len(r[i]) for r in rows))) if rows else len(h) for i, h in enumerate(DIFF_HEADER)]
    out = op_diff_heading(before, after, diff) + [""]
    out.append("  ".join(h.ljust(w) for h, w in zip(DIFF_HEADER, widths, strict=True)).rstrip())
    for r in rows:
        out.append("  ".join((c if len(c) <= w else c[: w - 1] + "…").ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    return "\n".join(out) + "\n"


def to_op_diff_markdown(before: str, after: str, diff: Any, n: int = OP_DIFF_ROWS) -> str:
    out = [f"# Ops: {md(before)} → {md(after)}", ""] + [md(line) + "  " for line in op_diff_heading(before, after, diff)]
    out += ["", "| " + " | ".join(DIFF_HEADER[:-1]) + " | verdict |", "| --- | --- | --- | ---: | ---: | ---: | ---: | --- |"]
    out += ["| " + " | ".join(md(c) for c in _diff_cells(r)) + " |" for r in diff.head(n).itertuples(index=False)]
    return "\n".join(out) + "\n"


def to_op_diff_json(before: str, after: str, diff: Any) -> str:
    rows = []
    for r in diff.itertuples(index=False):
        d = r._asdict()
        rows.append({k: (None if isinstance(v, float) and not math.isfinite(v) else (v.item() if hasattr(v, "item") else v)) for k, v in d.items()} | {"verdict": _verdict(r)})
    return to_json_text({"schema": OP_DIFF_SCHEMA, "advisor_version": __version__, "before": before, "after": after, "ops": rows})
