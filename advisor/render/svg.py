"""Hand-written inline SVG charts for the HTML reports.

Why SVG written by hand rather than a plotting library: the report must open from disk,
offline, in any browser, and stay small. A plotting library would either be inlined (Plotly
alone is ~3.5 MB of JavaScript; Vega + Vega-Lite ~1 MB) or fetched from a CDN (a request to a
server, which the report must never make). The charts needed here are simple: stacked bars,
a lane timeline, a line chart. Inline SVG draws them with no JavaScript at all, hover
tooltips come from SVG `<title>` elements, colours from CSS classes (so dark mode and print
work), and the cost is a few hundred bytes per bar. Zooming the timeline is the only
interaction that needs code, and that is a few lines of the report's own script.

Every label and tooltip passes through `esc`: kernel and op names come from the trace.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import pandas as pd

from advisor.render.demangle import demangle
from advisor.render.fmt import esc

CATEGORY_LABELS = {
    "kernel": "kernel",
    "memcpy": "memcpy",
    "memset": "memset",
    "communication": "communication",
    "runtime": "runtime",
    "dataloader": "DataLoader",
    "cpu_exec": "CPU exec",
    "other": "other",
}
SPAN_LABELS = {**CATEGORY_LABELS, "sync": "sync", "annotation": "annotation"}


def num(x: float) -> str:
    """A coordinate with at most 2 decimals and no trailing zeros (keeps the file small)."""
    s = f"{x:.2f}".rstrip("0").rstrip(".")
    return "0" if s in ("-0", "") else s


def nice_step(span: float, target: int = 5) -> float:
    """A 1/2/5 x 10^k tick interval giving about `target` ticks over `span`."""
    if span <= 0 or not math.isfinite(span):
        return 1.0
    raw = span / max(target, 1)
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def _tick_anchor(k: int, x_pct: float) -> str:
    """The first tick's label starts at its line, one near the right edge ends at it (never cut)."""
    return "start" if k == 0 else "end" if x_pct > 94.0 else "middle"


def ticks(hi: float, target: int = 5) -> list[float]:
    step = nice_step(hi, target)
    n = int(math.floor(hi / step + 1e-9))
    return [i * step for i in range(n + 1)]


def tick_label(v: float, step: float) -> str:
    decimals = max(0, -int(math.floor(math.log10(step)))) if step < 1 else 0
    return f"{v:.{decimals}f}"


def title(text: str) -> str:
    return f"<title>{esc(text)}</title>"


# --- bars -------------------------------------------------------------------------------
@dataclass
class Segment:
    key: str  # CSS class suffix (category)
    value: float
    tooltip: str


def stacked_hbar(segments: Sequence[Segment], total: float | None = None, height: int = 34, label: str = "") -> str:
    """One horizontal bar split into segments, as wide as its container."""
    total = total if total else sum(s.value for s in segments) or 1.0
    parts = []
    x = 0.0
    for s in segments:
        if s.value <= 0:
            continue
        w = 100.0 * s.value / total
        parts.append(f'<rect class="c-{esc(s.key)}" x="{num(x)}%" y="0" width="{num(w)}%" height="{height}">{title(s.tooltip)}</rect>')
        x += w
    aria = f' aria-label="{esc(label)}"' if label else ""
    return f'<svg class="hbar" role="img"{aria} width="100%" height="{height}">{"".join(parts)}</svg>'


def stacked_columns(
    table: pd.DataFrame,
    tooltip_unit: str = "ms",
    width: int = 1000,
    height: int = 280,
    x_title: str = "step",
    y_title: str = "ms",
) -> str:
    """Vertical stacked bars: one per row of `table` (index = bar label, columns = categories, values)."""
    left, right, top, bottom = 56, 12, 12, 40
    pw, ph = width - left - right, height - top - bottom
    totals = table.sum(axis=1).to_numpy(np.float64)
    y_max = float(totals.max()) if len(totals) else 1.0
    y_max = y_max if y_max > 0 else 1.0
    tick_vals = ticks(y_max * 1.05)
    step = tick_vals[1] - tick_vals[0] if len(tick_vals) > 1 else y_max
    y_top = max(tick_vals[-1], y_max) if tick_vals else y_max
    out = [f'<svg class="chart" role="img" viewBox="0 0 {width} {height}" width="100%">']
    for v in tick_vals:
        y = top + ph - ph * v / y_top
        out.append(f'<line class="grid" x1="{left}" x2="{width - right}" y1="{num(y)}" y2="{num(y)}"/>')
        out.append(f'<text class="axis" x="{left - 6}" y="{num(y + 4)}" text-anchor="end">{tick_label(v, step)}</text>')
    out.append(f'<text class="axis" x="12" y="{num(top + ph / 2)}" transform="rotate(-90 12 {num(top + ph / 2)})" text-anchor="middle">{esc(y_title)}</text>')
    n = len(table)
    slot = pw / max(n, 1)
    bw = max(min(slot * 0.7, 60.0), 0.5)
    label_every = max(1, math.ceil(n / 30))
    cats = list(table.columns)
    values = table.to_numpy(np.float64)
    for i, (label, row, tot) in enumerate(zip(table.index, values, totals, strict=True)):
        x = left + slot * i + (slot - bw) / 2
        y = top + ph
        parts = []
        for c, v in zip(cats, row, strict=True):
            if v <= 0:
                continue
            h = ph * v / y_top
            y -= h
            share = f" ({100 * v / tot:.1f}%)" if tot > 0 else ""
            parts.append(
                f'<rect class="c-{esc(c)}" x="{num(x)}" y="{num(y)}" width="{num(bw)}" height="{num(h)}">'
                f"{title(f'{x_title} {label}: {CATEGORY_LABELS.get(c, c)} {v:.2f} {tooltip_unit}{share}')}</rect>"
            )
        out.append(f'<g class="bar">{title(f"{x_title} {label}: {tot:.2f} {tooltip_unit}")}{"".join(parts)}</g>')
        if i % label_every == 0:
            out.append(f'<text class="axis" x="{num(x + bw / 2)}" y="{top + ph + 16}" text-anchor="middle">{esc(label)}</text>')
    out.append(f'<line class="axis-line" x1="{left}" x2="{width - right}" y1="{top + ph}" y2="{top + ph}"/>')
    out.append(f'<text class="axis" x="{num(left + pw / 2)}" y="{height - 4}" text-anchor="middle">{esc(x_title)}</text>')
    out.append("</svg>")
    return "".join(out)


# --- line chart -------------------------------------------------------------------------
@dataclass
class Series:
    label: str
    key: str  # CSS class suffix
    x: np.ndarray
    y: np.ndarray


@dataclass
class HLine:
    value: float
    label: str
    key: str = "limit"


@dataclass
class Band:
    x0: float
    x1: float
    label: str


@dataclass
class LineChart:
    series: list[Series]
    x_max: float
    y_max: float
    y_format: Callable[[float], str]
    x_title: str = "ms"
    lines: list[HLine] = field(default_factory=list)
    bands: list[Band] = field(default_factory=list)
    off_scale_note: str = ""


def minmax_downsample(x: np.ndarray, y: np.ndarray, x_max: float, columns: int = 800) -> tuple[np.ndarray, np.ndarray]:
    """Keep each pixel column's first, min, max and last point: the shape survives, the size does not grow."""
    if len(x) <= columns * 4 or x_max <= 0:
        return x, y
    col = np.clip((x / x_max * columns).astype(np.int64), 0, columns - 1)
    starts = np.flatnonzero(np.r_[True, col[1:] != col[:-1]])
    ends = np.r_[starts[1:], len(x)] - 1
    idx_min = np.array([s + int(np.argmin(y[s : e + 1])) for s, e in zip(starts, ends, strict=True)], dtype=np.int64)
    idx_max = np.array([s + int(np.argmax(y[s : e + 1])) for s, e in zip(starts, ends, strict=True)], dtype=np.int64)
    keep = np.unique(np.concatenate([starts, ends, idx_min, idx_max]))
    return x[keep], y[keep]


def line_chart(c: LineChart, width: int = 1000, height: int = 300) -> str:
    left, right, top, bottom = 72, 16, 18, 40
    pw, ph = width - left - right, height - top - bottom
    y_top = c.y_max if c.y_max > 0 else 1.0
    x_max = c.x_max if c.x_max > 0 else 1.0

    def px(v: np.ndarray | float):
        return left + pw * np.asarray(v, dtype=np.float64) / x_max

    def py(v: np.ndarray | float):
        return top + ph - ph * np.asarray(v, dtype=np.float64) / y_top

    out = [f'<svg class="chart" role="img" viewBox="0 0 {width} {height}" width="100%">']
    for i, b in enumerate(c.bands):
        x0, x1 = float(px(b.x0)), float(px(b.x1))
        cls = "band" if i % 2 == 0 else "band band-alt"
        out.append(f'<rect class="{cls}" x="{num(x0)}" y="{top}" width="{num(max(x1 - x0, 0.5))}" height="{ph}">{title(b.label)}</rect>')
        if len(c.bands) <= 40:
            out.append(f'<text class="axis band-label" x="{num((x0 + x1) / 2)}" y="{top + ph - 5}" text-anchor="middle">{esc(b.label.split(":")[0])}</text>')
    y_ticks = ticks(y_top, 5)
    y_step = y_ticks[1] - y_ticks[0] if len(y_ticks) > 1 else y_top
    for v in y_ticks:
        y = float(py(v))
        out.append(f'<line class="grid" x1="{left}" x2="{width - right}" y1="{num(y)}" y2="{num(y)}"/>')
        out.append(f'<text class="axis" x="{left - 6}" y="{num(y + 4)}" text-anchor="end">{esc(c.y_format(float(tick_label(v, y_step))))}</text>')
    xs = ticks(x_max, 8)
    xstep = xs[1] - xs[0] if len(xs) > 1 else x_max
    for v in xs:
        x = float(px(v))
        out.append(f'<text class="axis" x="{num(x)}" y="{top + ph + 16}" text-anchor="middle">{tick_label(v, xstep)}</text>')
    out.append(f'<text class="axis" x="{num(left + pw / 2)}" y="{height - 4}" text-anchor="middle">{esc(c.x_title)}</text>')
    for s in c.series:
        if len(s.x) == 0:
            continue
        pts = " ".join(f"{num(a)},{num(b)}" for a, b in zip(px(s.x), py(s.y), strict=True))
        out.append(f'<polyline class="line c-{esc(s.key)}" points="{pts}">{title(s.label)}</polyline>')
    for h in c.lines:
        y = float(py(h.value))
        out.append(f'<line class="hline c-{esc(h.key)}" x1="{left}" x2="{width - right}" y1="{num(y)}" y2="{num(y)}">{title(h.label)}</line>')
        out.append(f'<text class="axis hline-label" x="{left + 6}" y="{num(y - 5)}" text-anchor="start">{esc(h.label)}</text>')
    if c.off_scale_note:
        out.append(f'<text class="axis hline-label" x="{width - right - 4}" y="{top + 12}" text-anchor="end">{esc(c.off_scale_note)}</text>')
    out.append(f'<line class="axis-line" x1="{left}" x2="{width - right}" y1="{top + ph}" y2="{top + ph}"/>')
    out.append("</svg>")
    return "".join(out)


# --- timeline ---------------------------------------------------------------------------
LANE_H = 18
LANE_GAP = 4
AXIS_H = 22
ZOOMS = (1, 4, 16, 64)


@functools.lru_cache(maxsize=8192)
def _shown_name(name: str) -> str:
    """A span's name as its tooltip shows it, escaped: a lane repeats a few names many times."""
    return esc(demangle(name))


def _lane_rects(spans: pd.DataFrame, duration_ns: float, y: int, unit_name: str) -> list[str]:
    """One rectangle per span, its tooltip escaped: the figures and the words around them are
    the report's own text, the names and classes the trace's (`esc`, once per distinct name)."""
    if len(spans) == 0:
        return []
    d = float(duration_ns)
    s = spans["start"].to_numpy(np.float64)
    e = spans["end"].to_numpy(np.float64)
    covered = spans["total"].to_numpy(np.float64) if "total" in spans else e - s
    xs = 100.0 * s / d
    ws = 100.0 * (e - s) / d
    out = []
    for x, w, a, b, busy, name, cls, count in zip(xs, ws, s, e, covered, spans["name"].tolist(), spans["cls"].tolist(), spans["count"].tolist(), strict=True):
        where = f"at {a / 1e6:.3f} ms"
        if count > 1:
            tip = f"{count} {esc(unit_name)}: {busy / 1e6:.3f} ms within {(b - a) / 1e6:.3f} ms {where}; longest: {_shown_name(str(name))}"
        elif cls == "idle":
            tip = f"device idle {(b - a) / 1e6:.3f} ms (from {a / 1e6:.3f} to {b / 1e6:.3f} ms)"
        else:
            tip = f"{_shown_name(str(name))}\n{_shown_class(SPAN_LABELS.get(cls, cls))}, {(b - a) / 1e6:.3f} ms {where}"
        out.append(f'<rect class="ev c-{_shown_class(cls)}" x="{x:.4f}%" y="{y}" width="{max(w, 0):.4f}%" height="{LANE_H}"><title>{tip}</title></rect>')
    return out


@functools.lru_cache(maxsize=256)
def _shown_class(cls: str) -> str:
    return esc(cls)


def timeline(lanes: Sequence, idle: pd.DataFrame, duration_ns: int, step_label: str, uid: str = "tl") -> str:
    """A lane chart of one step. x positions are percentages, so the report's zoom only
    widens the SVG: rectangles stay sharp and labels keep their size."""
    n = len(lanes) + (1 if len(idle) or any(l.group == "device" for l in lanes) else 0)
    height = AXIS_H + n * (LANE_H + LANE_GAP) + 4
    labels = ['<svg class="tl-labels" width="168" height="%d">' % height]
    body = [
        f'<svg class="tl-body" width="100%" height="{height}"><defs><pattern id="{esc(uid)}-hatch" width="6" height="6" '
        f'patternUnits="userSpaceOnUse" patternTransform="rotate(45)"><rect class="hatch" width="2.5" height="6"/></pattern></defs>'
    ]
    # Ticks for each zoom level; the page shows only the current level's.
    dur_ms = duration_ns / 1e6
    for z in ZOOMS:
        step = nice_step(dur_ms, 8 * z)
        k = 0
        while k * step <= dur_ms + 1e-9:
            v = k * step
            x = 100.0 * v / dur_ms if dur_ms > 0 else 0
            body.append(
                f'<g class="tick z{z}"><line class="grid" x1="{x:.4f}%" x2="{x:.4f}%" y1="{AXIS_H - 4}" y2="{height}"/>'
                f'<text class="axis" x="{x:.4f}%" y="{AXIS_H - 8}" text-anchor="{_tick_anchor(k, x)}">{tick_label(v, step)} ms</text></g>'
            )
            k += 1
    y = AXIS_H
    device_top = None
    for lane in lanes:
        if lane.group == "device" and device_top is None:
            device_top = y
        shown = lane.label if len(lane.label) <= 26 else lane.label[:25] + "…"
        labels.append(
            f'<text class="lane-label lane-{esc(lane.group)}" x="164" y="{y + LANE_H - 5}" text-anchor="end">{title(lane.label)}{esc(shown)}</text>'
        )
        body.append(f'<rect class="lane-bg" x="0" y="{y}" width="100%" height="{LANE_H}"/>')
        unit = "kernels/copies" if lane.group == "device" else "spans"
        body.extend(_lane_rects(lane.spans, duration_ns, y, unit))
        y += LANE_H + LANE_GAP
    if device_top is not None or len(idle):
        top = device_top if device_top is not None else y
        labels.append(f'<text class="lane-label lane-idle" x="164" y="{y + LANE_H - 5}" text-anchor="end">device idle</text>')
        d = float(duration_ns) or 1.0
        # A faint band over the device lanes marks the gaps wide enough to see.
        wide = idle[(idle["end"] - idle["start"]) >= d / 1000] if len(idle) else idle
        for a, b in zip(wide["start"].to_numpy(np.float64), wide["end"].to_numpy(np.float64), strict=True):
            body.append(f'<rect class="idle-band" x="{100.0 * a / d:.4f}%" y="{top}" width="{100.0 * (b - a) / d:.4f}%" height="{y - top}"/>')
        for r in _lane_rects(idle, d, y, "idle gaps"):
            body.append(r.replace('<rect class="ev c-idle"', f'<rect class="ev idle" fill="url(#{esc(uid)}-hatch)"', 1))
        y += LANE_H + LANE_GAP
    labels.append("</svg>")
    body.append("</svg>")
    pressed = {z: "true" if z == 1 else "false" for z in ZOOMS}
    buttons = "".join(f'<button type="button" data-zoom="{z}" aria-pressed="{pressed[z]}">{z}×</button>' for z in ZOOMS)
    return (
        f'<div class="tl zoom-1" role="figure" aria-label="{esc(step_label)}">'
        f'<div class="tl-tools">zoom {buttons}</div>'
        f'<div class="tl-grid">{"".join(labels)}<div class="tl-scroll">{"".join(body)}</div></div></div>'
    )


def legend(keys: Sequence[str], values: dict[str, str] | None = None) -> str:
    items = []
    for k in keys:
        v = f" <span class=\"lv\">{esc(values[k])}</span>" if values and k in values else ""
        items.append(f'<li><span class="sw c-{esc(k)}"></span>{esc(SPAN_LABELS.get(k, k))}{v}</li>')
    return f'<ul class="legend">{"".join(items)}</ul>'


# --- heat map ---------------------------------------------------------------------------
def heatmap(
    row_labels: Sequence[str],
    col_labels: Sequence[str],
    values: np.ndarray,
    tooltips: Callable[[int, int], str],
    marked: Sequence[int] = (),
    label: str = "",
    width: int = 1000,
) -> str:
    """A rows x columns grid of cells whose opacity follows the value (darker: larger); rows in
    `marked` get a marker. Scales to hundreds of rows: rows shrink to 3 px, labels thin out."""
    n_rows, n_cols = values.shape
    if n_rows == 0 or n_cols == 0:
        return ""
    left, right, top, bottom = 84, 12, 8, 30
    row_h = max(3.0, min(18.0, 560.0 / n_rows))
    pw = width - left - right
    cell_w = pw / n_cols
    height = int(top + row_h * n_rows + bottom)
    finite = values[np.isfinite(values)]
    hi = float(finite.max()) if len(finite) else 0.0
    out = [f'<svg class="chart heat" role="img" aria-label="{esc(label)}" viewBox="0 0 {width} {height}" width="100%">']
    label_every = max(1, math.ceil(12 / row_h))  # labels at least 12 px apart
    marked_set = set(marked)
    for i in range(n_rows):
        y = top + i * row_h
        if i % label_every == 0 or i in marked_set:
            cls = "axis marked" if i in marked_set else "axis"
            text = row_labels[i] + (" ◀" if i in marked_set else "")
            out.append(f'<text class="{cls}" x="{left - 6}" y="{num(y + row_h / 2 + 4)}" text-anchor="end">{esc(text)}</text>')
        cells = []
        for j in range(n_cols):
            v = values[i, j]
            opacity = 0.06 + 0.94 * (v / hi) if hi > 0 and np.isfinite(v) else 0.06
            cells.append(
                f'<rect class="cell" x="{num(left + j * cell_w)}" y="{num(y)}" width="{num(max(cell_w - 0.5, 0.5))}" height="{num(max(row_h - 0.5, 0.5))}"'
                f' fill-opacity="{num(opacity)}">{title(tooltips(i, j))}</rect>'
            )
        out.append(f'<g class="heat-row">{"".join(cells)}</g>')
    col_every = max(1, math.ceil(n_cols / 20))
    for j in range(0, n_cols, col_every):
        out.append(f'<text class="axis" x="{num(left + (j + 0.5) * cell_w)}" y="{height - bottom + 16}" text-anchor="middle">{esc(col_labels[j])}</text>')
    out.append("</svg>")
    return "".join(out)
