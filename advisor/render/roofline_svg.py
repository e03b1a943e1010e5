"""The roofline chart of the HTML report: ops as points (arithmetic intensity, achieved
TFLOP/s; area by time), the device's memory roof and its compute ceilings per precision, the
biggest time sinks labelled. Log-log axes. Every string from the trace is escaped."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from advisor.render.fmt import esc
from advisor.render.svg import num, title

WIDTH, HEIGHT = 900, 440
LEFT, RIGHT, TOP, BOTTOM = 64, 150, 16, 44
LABELLED = 6
KIND_COLOUR = {"gemm": "#1f77b4", "conv": "#9467bd", "attention": "#d62728", "norm": "#2ca02c", "softmax": "#8c564b",
               "elementwise": "#ff7f0e", "reduce": "#e377c2", "optimizer": "#7f7f7f"}


def _decades(lo: float, hi: float) -> tuple[int, int]:
    return math.floor(math.log10(lo)), math.ceil(math.log10(hi))


def roofline_chart(ops: pd.DataFrame, memory_tbps: float | None, peaks: dict[str, float], label: str = "roofline") -> tuple[str, list]:
    """SVG of the ops (columns intensity, tflops, time_ms, kind, op, shape, precision) under the
    ceilings: `memory_tbps` (None: unknown device) and `peaks` (precision -> TFLOP/s); and the
    index labels of the ops numbered on it, biggest time first."""
    ok = ops[(ops["intensity"].astype(float) > 0) & (ops["tflops"].astype(float) > 0)]
    ok = ok[np.isfinite(ok["intensity"].astype(float)) & np.isfinite(ok["tflops"].astype(float))]
    if len(ok) == 0:
        return "", []
    x = ok["intensity"].to_numpy(np.float64)
    y = ok["tflops"].to_numpy(np.float64)
    top = max([y.max()] + list(peaks.values()))
    x0, x1 = _decades(min(x.min(), 0.1), max(x.max(), 1000.0))
    y0, y1 = _decades(max(min(y.min(), top / 1e4), 1e-6), top * 1.5)
    pw, ph = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def px(v):
        return LEFT + pw * (np.log10(v) - x0) / (x1 - x0)

    def py(v):
        return TOP + ph * (1 - (np.log10(v) - y0) / (y1 - y0))

    parts = [f'<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#ccc"/>']
    for d in range(x0, x1 + 1):
        X = px(10.0**d)
        parts.append(f'<line x1="{num(X)}" y1="{TOP}" x2="{num(X)}" y2="{TOP + ph}" stroke="#eee"/>'
                     f'<text x="{num(X)}" y="{TOP + ph + 16}" font-size="11" text-anchor="middle">{10.0**d:g}</text>')
    for d in range(y0, y1 + 1):
        Y = py(10.0**d)
        parts.append(f'<line x1="{LEFT}" y1="{num(Y)}" x2="{LEFT + pw}" y2="{num(Y)}" stroke="#eee"/>'
                     f'<text x="{LEFT - 6}" y="{num(Y + 4)}" font-size="11" text-anchor="end">{10.0**d:g}</text>')
    parts.append(f'<text x="{LEFT + pw / 2}" y="{HEIGHT - 6}" font-size="12" text-anchor="middle">arithmetic intensity (FLOP per byte)</text>'
                 f'<text x="14" y="{TOP + ph / 2}" font-size="12" text-anchor="middle" transform="rotate(-90 14 {TOP + ph / 2})">TFLOP/s</text>')
    xmin, xmax = 10.0**x0, 10.0**x1
    if memory_tbps:
        for prec, peak in sorted(peaks.items(), key=lambda kv: kv[1]):
            ridge = peak / memory_tbps
            a = xmin
            b = min(max(ridge, xmin), xmax)
            parts.append(f'<line class="roof" x1="{num(px(a))}" y1="{num(py(max(memory_tbps * a, 10.0**y0)))}" x2="{num(px(b))}" y2="{num(py(memory_tbps * b))}" stroke="#444" stroke-width="1.5"/>')
            parts.append(f'<line class="roof" x1="{num(px(b))}" y1="{num(py(peak))}" x2="{num(px(xmax))}" y2="{num(py(peak))}" stroke="#444" stroke-dasharray="4 3"/>'
                         f'<text x="{num(px(xmax) + 4)}" y="{num(py(peak) + 4)}" font-size="11">{esc(prec)} {peak:g}</text>')
        parts.append(f'<text x="{num(px(xmin) + 4)}" y="{num(py(max(memory_tbps * xmin, 10.0**y0)) - 6)}" font-size="11">{memory_tbps:g} TB/s</text>')
    time_ms = ok["time_ms"].to_numpy(np.float64)
    r = 3 + 12 * np.sqrt(time_ms / max(time_ms.max(), 1e-12))
    order = np.argsort(-time_ms)
    # the columns a tooltip reads, as Python values (a row at a time through pandas is slow)
    op_, shape_, precision_, dtype_, share_, kind_ = (ok[c].tolist() for c in ("op", "shape", "precision", "dtype", "ceiling_share", "kind"))
    for i in order[::-1]:  # the biggest drawn last, on top
        tip = (f"{op_[i]} {shape_[i]} ({precision_[i] or dtype_[i]}): {time_ms[i]:.3f} ms/step, {y[i]:.3g} TFLOP/s, "
               f"{x[i]:.3g} FLOP/B" + (f", {100 * float(share_[i]):.0f}% of the ceiling" if pd.notna(share_[i]) else ""))
        colour = KIND_COLOUR.get(str(kind_[i]), "#333")
        parts.append(f'<circle class="op" cx="{num(px(x[i]))}" cy="{num(py(y[i]))}" r="{num(r[i])}" fill="{colour}" fill-opacity="0.55" stroke="{colour}">{title(tip)}</circle>')
    placed: list[tuple[float, float]] = []
    labelled = []
    for rank, i in enumerate(order[:LABELLED]):
        lx, ly = float(px(x[i]) + r[i] + 2), float(py(y[i]) - 2)
        while any(abs(lx - a) < 24 and abs(ly - b) < 12 for a, b in placed):
            ly += 12  # numbers of points that sit together stack downwards instead of overprinting
        placed.append((lx, ly))
        labelled.append(ok.index[i])
        parts.append(f'<text class="op-label" x="{num(lx)}" y="{num(ly)}" font-size="11" font-weight="bold">{rank + 1}</text>')
    legend = "".join(
        f'<circle cx="{WIDTH - RIGHT + 20}" cy="{TOP + ph - 12 - 16 * j}" r="5" fill="{c}" fill-opacity="0.55"/>'
        f'<text x="{WIDTH - RIGHT + 30}" y="{TOP + ph - 8 - 16 * j}" font-size="11">{esc(k)}</text>'
        for j, (k, c) in enumerate((k, c) for k, c in KIND_COLOUR.items() if (ok["kind"] == k).any())
    )
    svg = f'<svg class="roofline" role="img" aria-label="{esc(label)}" viewBox="0 0 {WIDTH} {HEIGHT}" width="100%">{"".join(parts)}{legend}</svg>'
    return svg, labelled


__all__ = ["roofline_chart"]
