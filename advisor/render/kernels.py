"""`advisor report --kernels`: the slowest rank's kernels as the advisor read them.

One row per distinct kernel name, by total time: the library, family, math precision and
matrix-unit use its name says (metrics.kernel_taxonomy), the precision and unit the rules use
(the name first; the launching op's dtypes, the TF32 switches and the device where the name
says nothing), and its share of kernel time. Text, Markdown and JSON (`advisor/kernels/v1`).
Kernel names come from the trace: printed as text, never markup.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from advisor.analysis import Analysis
from advisor.metrics.kernel_taxonomy import MATRIX_FAMILIES, read_kernel
from advisor.metrics.kernels import kernel_totals
from advisor.output import to_json_text
from advisor.render.fmt import md
from advisor.terminal_text import one_line
from advisor.version import __version__

if TYPE_CHECKING:
    from rich.console import Console

KERNELS_SCHEMA = "advisor/kernels/v1"
MAX_KERNELS = 60
NAME_WIDTH = 90


def kernel_rows(a: Analysis) -> list[dict[str, Any]]:
    """The primary rank's kernels by total time, each as the advisor read it."""
    totals = kernel_totals(a.primary.kernels)
    if len(totals) == 0:
        return []
    total_ns = max(float(totals["total_ns"].sum()), 1.0)
    order = np.argsort(-totals["total_ns"].to_numpy(np.float64), kind="stable")
    rows = []
    precision = totals["precision"] if "precision" in totals else None
    for i in order.tolist():
        name = str(totals["name"].iloc[i])
        reading = read_kernel(name)
        resolved = str(precision.iloc[i]) if precision is not None and isinstance(precision.iloc[i], str) else ""
        tensor_core = bool(totals["tensor_core"].iloc[i])
        rows.append(
            {
                "name": name,
                "library": reading.library,
                "family": reading.family,
                "precision": reading.precision,
                "matrix_unit": reading.matrix_unit,
                "precision_used": resolved or None,  # what the precision rules read (op dtypes where the name says nothing)
                "tensor_core": tensor_core,
                "calls": int(totals["count"].iloc[i]),
                "total_ms": float(totals["total_ns"].iloc[i]) / 1e6,
                "share": float(totals["total_ns"].iloc[i]) / total_ns,
                "convention": reading.convention or None,
            }
        )
    return rows


def _precision_cell(row: dict[str, Any]) -> str:
    if row["precision"] != "unknown" or not row["precision_used"] or row["precision_used"] == "unknown":
        return row["precision"]
    return f"{row['precision_used']} (op)"


def _unit_cell(row: dict[str, Any]) -> str:
    if row["family"] in MATRIX_FAMILIES:
        return "yes" if row["tensor_core"] else ("no" if row["matrix_unit"] != "unknown" or row["precision_used"] else "unknown")
    return row["matrix_unit"]


def _short(name: str) -> str:
    name = one_line(name)
    return name if len(name) <= NAME_WIDTH else name[: NAME_WIDTH - 1] + "…"


def render_kernels_text(a: Analysis, console: Console, n: int = MAX_KERNELS) -> None:
    from rich.table import Table  # imported where a terminal table is drawn
    from rich.text import Text

    rows = kernel_rows(a)
    if not rows:
        console.print(Text("No kernels in this trace."))
        return
    console.print(Text(f"Kernels of rank {a.primary.rank} by total time ({len(rows)} distinct names; the first {min(n, len(rows))})."))
    t = Table(show_edge=False, pad_edge=False, header_style="bold")
    for col, justify in (("kernel", "left"), ("library", "left"), ("family", "left"), ("precision", "left"), ("matrix units", "left"),
                         ("calls", "right"), ("ms", "right"), ("share", "right")):
        t.add_column(col, justify=justify, overflow="fold")
    for row in rows[:n]:
        t.add_row(Text(_short(row["name"])), row["library"], row["family"], _precision_cell(row), _unit_cell(row), str(row["calls"]),
                  f"{row['total_ms']:.3f}", f"{100 * row['share']:.1f}%")
    console.print(t)


def to_kernels_markdown(a: Analysis, n: int = MAX_KERNELS) -> str:
    out = [f"# Kernels: {md(a.run.name)}", ""]
    rows = kernel_rows(a)
    if not rows:
        return "\n".join(out + ["No kernels in this trace.", ""])
    out += ["| kernel | library | family | precision | matrix units | calls | ms | share |", "| --- | --- | --- | --- | --- | ---: | ---: | ---: |"]
    for row in rows[:n]:
        out.append(f"| {md(_short(row['name']))} | {row['library']} | {row['family']} | {md(_precision_cell(row))} | {_unit_cell(row)} | "
                   f"{row['calls']} | {row['total_ms']:.3f} | {100 * row['share']:.1f}% |")
    return "\n".join(out) + "\n"


def kernels_document(a: Analysis) -> dict[str, Any]:
    rows = kernel_rows(a)
    for row in rows:
        row["matrix_units"] = _unit_cell(row)
    return {"schema": KERNELS_SCHEMA, "advisor_version": __version__, "source": a.source, "run": a.run.name, "rank": a.primary.rank, "kernels": rows}


def to_kernels_json(a: Analysis) -> str:
    return to_json_text(kernels_document(a))


__all__ = ["KERNELS_SCHEMA", "kernel_rows", "kernels_document", "render_kernels_text", "to_kernels_json", "to_kernels_markdown"]
