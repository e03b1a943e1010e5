"""The HTML report: one self-contained file that opens from disk, offline, in any browser.

Charts are inline SVG written here (see `advisor.render.svg` for why no plotting library),
the stylesheet and the small script come from `assets/` and are inlined, and a
Content-Security-Policy allows nothing but that one stylesheet and that one script (by hash):
no request leaves the page, and even a string that escaped escaping could not run. Every
string from a trace goes through `esc`.

It stays one module of about 750 lines: one page, one short function per section (header,
verdict, findings, breakdown, timeline, memory, copy bandwidth, kernels, ops, roofline, ranks
and their collectives) over the same
few helpers (`page`, `tile`, `sortable_table`, `esc`); the charts are `advisor.render.svg`.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from importlib import resources

import numpy as np
import pandas as pd

from advisor.version import __version__
from advisor.analysis import Analysis
from advisor.engine import Finding
from advisor.metrics.breakdown import CATEGORIES, sorted_text_codes
from advisor.metrics.summary import Metrics, device_idle, device_ran_no_kernel
from advisor.render import svg
from advisor.render.demangle import demangle
from advisor.render.fmt import esc, finding_rank, fmt_bytes, ms, order_note, pct, rate, saved_text, saving_note, short_value, throughput
from advisor.whatif.timeline import StepTimeline

TOP_KERNELS = 40
TOP_OPS = 30


# --- page -------------------------------------------------------------------------------
def asset(name: str) -> str:
    return resources.files("advisor.render").joinpath("assets", name).read_text(encoding="utf-8")


def _sha256(text: str) -> str:
    return base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode()


def page(title: str, body: str) -> str:
    """A complete document: inlined CSS and JS, and a CSP that permits only those two."""
    css, js = asset("report.css"), asset("report.js")
    csp = f"default-src 'none'; style-src 'sha256-{_sha256(css)}'; script-src 'sha256-{_sha256(js)}'; base-uri 'none'; form-action 'none'"
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{csp}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<meta name="referrer" content="no-referrer">'
        f"<title>{esc(title)}</title><style>{css}</style></head>"
        f"<body><main>{body}</main><script>{js}</script></body></html>\n"
    )


def tile(key: str, value: str, detail: str = "", cls: str = "") -> str:
    d = f'<div class="d">{esc(detail)}</div>' if detail else ""
    return f'<div class="tile {esc(cls)}"><div class="k">{esc(key)}</div><div class="v">{esc(value)}</div>{d}</div>'


@dataclass
class Column:
    title: str
    numeric: bool = False
    name: bool = False  # a long trace name: monospace, clamped to two lines until hovered
    nowrap: bool = False


def sortable_table(columns: list[Column], rows: list[list[tuple[str, float | str | None]]], cls: str = "") -> str:
    """rows: cells as (shown text, sort value or None to sort by the text)."""
    numeric = ' class="n" data-type="num"'
    head = "".join(f'<th scope="col"{numeric if c.numeric else ""}>{esc(c.title)}</th>' for c in columns)
    body = []
    for row in rows:
        cells = []
        for c, (shown, key) in zip(columns, row, strict=True):
            attr = f' data-v="{esc(key)}"' if key is not None else ""
            if c.numeric:
                cells.append(f'<td class="n"{attr}>{esc(shown)}</td>')
            elif c.name:
                cells.append(f'<td class="name"{attr}><div class="clamp">{esc(shown)}</div></td>')
            else:
                klass = ' class="nw"' if c.nowrap else ""
                cells.append(f"<td{klass}{attr}>{esc(shown)}</td>")
        body.append(f"<tr>{''.join(cells)}</tr>")
    # in a box that scrolls sideways when a narrow window cannot hold every column
    return f'<div class="tablewrap"><table class="sortable {esc(cls)}"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table></div>'


# --- sections ---------------------------------------------------------------------------
def _header(a: Analysis) -> str:
    m = a.primary
    s = a.summary()
    st = s["step_time_ms"]
    dev = m.device
    files = len(a.run.files)
    if dev.name:
        device = f"{dev.name}" + (f", compute capability {dev.compute_capability}" if dev.compute_capability else "")
        device += f", {fmt_bytes(dev.total_memory_bytes)}" if dev.total_memory_bytes else ""
        device += " (listed; ran nothing: read as a CPU run)" if device_idle(m) else device_ran_no_kernel(m)
    elif not m.has_device:
        device = "CPU only (no device activity in the trace)"
    else:
        device = "device not named in the trace"
    ranks = f" · {len(a.ranks)} ranks (figures of rank {m.rank}, the slowest; each finding names its rank)" if len(a.ranks) > 1 else ""
    out = [
        # <bdi>: a name in a right-to-left script stays inside its own box and cannot reorder the header
        f"<h1>Why is <bdi class=\"mono\">{esc(a.run.name)}</bdi> slow?</h1>",
        f'<p class="sub"><bdi>{esc(device)}</bdi>{esc(ranks)} · {files} trace file{"s" if files != 1 else ""} · <bdi>{esc(a.source)}</bdi></p>',
    ]
    tiles = []
    if st["mean"] is not None:
        tiles.append(tile("Step time (mean)", ms(st["mean"]), f"median {st['median']:.2f} · p90 {st['p90']:.2f} · {s['steps']} step{'s' if s['steps'] != 1 else ''}"))
    tp = throughput(a)
    if tp:
        tiles.append(tile("Throughput", f"{rate(tp[0])} {tp[1]}", "from the mean step time"))
    if m.has_device:
        tiles.append(tile(f"{dev.short_kind} utilisation", pct(s["gpu_utilization"]), "of step time with device activity"))
        if dev.matrix_units and s["tensor_core_kernel_share"] is not None:
            tiles.append(tile(dev.matrix_units, pct(s["tensor_core_kernel_share"]), f"of kernel time; eligible ops launch {pct(s['tensor_core_eligible_share'])}"))
        if s["peak_memory_bytes"] is not None:
            tot = s["device_memory_bytes"]
            tiles.append(tile("Peak memory", fmt_bytes(s["peak_memory_bytes"]), f"allocated, {pct(s['peak_memory_bytes'] / tot)} of the device" if tot else "allocated"))
        h = s["h2d"]
        if h["count"]:
            bw = f", {h['bandwidth_gbps']:.1f} GB/s" if h["bandwidth_gbps"] else ""
            tiles.append(tile("Host→device copies", fmt_bytes(h["bytes"]), f"{h['count']} copies, {h['pageable_count']} from pageable memory{bw}"))
    out.append(_verdict(a))
    # n<count>: the stylesheet lays out that many tiles in full rows (none alone on the last)
    out.append(f'<div class="tiles n{min(len(tiles), 8)}">{"".join(tiles)}</div>')
    links = [("findings", "Findings"), ("breakdown", "Step-time breakdown"), ("timeline", "Timeline"), ("memory", "Memory")]
    if m.has_device:
        links.append(("kernels", "Top kernels"))
    links.append(("ops", "Top ops"))
    if len(a.ranks) > 1:
        links.append(("ranks", "Ranks"))
    out.append('<nav class="toc">' + "".join(f'<a href="#{k}">{v}</a>' for k, v in links) + "</nav>")
    return "".join(out)


BOUND_BY = {
    "kernel": "device kernels (compute)",
    "memcpy": "memory copies",
    "memset": "memsets",
    "communication": "communication between ranks",
    "runtime": "runtime calls (kernel launches, syncs)",
    "dataloader": "the input pipeline (waiting for the DataLoader)",
    "cpu_exec": "host (CPU) work",
    "other": "time no category covers",
}
TOP_FIXES = 3


def _verdict(a: Analysis) -> str:
    """The first screen's answer: the step, what bounds it, the top fixes with their savings,
    and the caveats that change how far to trust those figures."""
    s = a.summary()
    st = s["step_time_ms"]
    if st["mean"] is None:
        return '<section class="verdict" id="verdict"><p class="answer">No complete step in this trace: nothing to measure.</p></section>'
    bd = s["breakdown_ms"]
    total = sum(bd.values()) or 1.0
    top = max(CATEGORIES, key=lambda c: bd.get(c, 0.0))
    noisy = a.noisy_caveat()
    noisy_html = f'; <span class="noisy">{esc(noisy)}</span>' if noisy else ""
    answer = (
        f"<b>{st['mean']:.2f} ms per step</b> (mean of {s['steps']}{noisy_html}), "
        f"bound by <b>{esc(BOUND_BY.get(top, top))}</b>: {bd[top]:.2f} ms of it ({pct(bd[top] / total)})."
    )
    projected = s.get("projected")
    if projected is not None and projected["step_time_ms"]["mean"] is not None:
        answer += (
            f" Without the one-time work (see the notes): {projected['step_time_ms']['mean']:.2f} ms per step, a projection, "
            "not a measurement; the replay and the savings (ms per step) are figured on it, their shares are of the measured step."
        )
    replayed = a.headline()
    if replayed is not None and replayed.all_fixes_ms is not None and replayed.fixes:
        # the replay against the replay: the same statistic on both sides (never the mean step above)
        saved = replayed.all_fixes_saving_ms or 0.0
        n = len(replayed.fixes)
        answer += (
            f" The replayed {esc(replayed.statistic)} step is {replayed.baseline_ms:.2f} ms. With the {n} replayed fix{'es' if n != 1 else ''} "
            f"together: <b>{replayed.all_fixes_ms:.2f} ms</b> ({esc(saved_text(saved, replayed.baseline_ms, 1))})."
        )
    out = ['<section class="verdict" id="verdict">', f'<p class="answer">{answer}</p>']
    fixes = [(i, f) for i, f in enumerate(a.findings, 1) if f.saving_ms][:TOP_FIXES]
    if fixes:
        items = "".join(
            f'<li><a href="#finding-{i}"><code>{esc(f.rule)}</code></a> <b>saves {f.saving_ms:.2f} ms/step</b>'
            f"{f' ({pct(f.saving_pct)})' if f.saving_pct is not None else ''}: {esc(f.title)}</li>"
            for i, f in fixes
        )
        out.append(f'<ol class="topfixes">{items}</ol>')
    elif not a.findings:
        out.append("<p>Nothing to fix: no rule fired on this run.</p>")
    caveats = []
    overhead = a.profiler_overhead()
    note = overhead.note((a.run_facts() or {}).get("profiler", {}).get("with_stack", True)) if overhead else None
    if note:
        caveats.append(note)
    caveats += a.warnings[:2]
    more = len(a.warnings) - 2
    for c in caveats:
        out.append(f'<p class="caveat">{esc(c)}</p>')
    if more > 0:
        out.append(f'<p class="muted">{more} more warning{"s" if more != 1 else ""} under <a href="#notes">Notes</a>.</p>')
    out.append("</section>")
    return "".join(out)


def _docs_urls() -> dict[str, str]:
    try:
        from advisor.engine import builtin_rules

        return {r.id: r.docs_url for r in builtin_rules() if r.docs_url.startswith("https://")}
    except Exception:  # a rule that fails to import must not cost the user the report
        return {}


def finding_card(i: int, f: Finding, docs: dict[str, str], where: str = "", order: str = "") -> str:
    saving = "risk" if f.saving_ms is None else f"{f.saving_ms:.2f} ms/step{saving_note(f)}"
    share = f" <small>({pct(f.saving_pct)})</small>" if f.saving_pct is not None else ""
    parts = [
        f'<article class="card sev-{esc(f.severity)}" id="finding-{i}">',
        f'<header><span class="rank">#{i}</span><span class="rule"><code>{esc(f.rule)}</code></span><span>{esc(f.title)}</span>'
        f'<span class="badge sev-{esc(f.severity)}">{esc(f.severity)}</span><span class="badge">confidence {esc(f.confidence)}</span>'
        + (f'<span class="badge">{esc(where)}</span>' if where else "")
        + f'<span class="saving">{esc(saving)}{share}</span>'
        + (f'<span class="order">{esc(order)}</span>' if order else "")
        + "</header>",
        f'<p class="msg">{esc(f.message)}</p>',
    ]
    if f.causes:
        parts.append(f'<p class="muted">Explained in part by: {esc(", ".join(f.causes))}</p>')
    if f.fix.text:
        parts.append(f"<p><strong>Fix:</strong> {esc(f.fix.text)}</p>")
    if f.fix.snippet:
        parts.append(f'<pre><code class="language-python">{esc(f.fix.snippet.strip(chr(10)))}</code></pre>')
    if f.evidence:
        rows = []
        for k, v in f.evidence.items():
            if isinstance(v, list) and v and all(isinstance(x, str) for x in v) and k == "source":
                shown = "<br>".join(esc(x) for x in v[:8])
            else:
                shown = esc(short_value(v))
            rows.append(f"<dt>{esc(k)}</dt><dd>{shown}</dd>")
        parts.append(f'<details><summary>Evidence</summary><dl class="ev">{"".join(rows)}</dl></details>')
    more = f"<code>advisor explain {esc(f.rule)}</code> gives the method"
    if f.rule in docs:
        more += f' · <a href="{esc(docs[f.rule])}" rel="noreferrer noopener">PyTorch documentation</a>'
    parts.append(f'<p class="muted">{more}</p></article>')
    return "".join(parts)


def _findings(a: Analysis) -> str:
    out = ['<h2 id="findings">Findings, ranked by time saved per step</h2><p class="muted">Each saving is on top of the fixes above it; a fix\'s saving alone is in brackets where it differs, and its rule\'s estimate where the replay departs from it.</p>']
    if not a.findings:
        out.append("<p>Nothing to fix: no rule fired on this run.</p>" if not a.considered else "<p>Nothing to fix: no fix gains time on this run.</p>")
        out.append(_considered(a))
        return "".join(out)
    docs = _docs_urls()
    out.append('<div class="cards">' + "".join(finding_card(i, f, docs, finding_rank(a, f), order_note(a.findings, i - 1)) for i, f in enumerate(a.findings, 1)) + "</div>")
    out.append(_considered(a))
    return "".join(out)


def _considered(a: Analysis) -> str:
    """The findings whose fix gains nothing on this run: not ranked, each with its reason."""
    if not a.considered:
        return ""
    items = "".join(f"<li><code>{esc(f.rule)}</code> {esc(f.no_gain or '')}</li>" for f in a.considered)
    return f'<h3 id="considered">Considered, not ranked</h3><ul class="considered">{items}</ul>'


def breakdown_segments(bd_ms: dict[str, float]) -> list[svg.Segment]:
    total = sum(bd_ms.values()) or 1.0
    return [
        svg.Segment(c, v, f"{svg.CATEGORY_LABELS[c]}: {v:.2f} ms ({100 * v / total:.1f}%)")
        for c, v in bd_ms.items()
        if v > 0
    ]


def _breakdown(a: Analysis) -> str:
    m = a.primary
    bd = m.breakdown_mean_ms
    total = sum(bd.values())
    out = ['<h2 id="breakdown">Step-time breakdown</h2>']
    if len(m.steps) == 0:
        return out[0] + "<p>No steps found in the trace.</p>"
    rank = f" (rank {m.rank})" if len(a.ranks) > 1 else ""
    out.append(f"<h3>The average step{rank}: {total:.2f} ms</h3>")
    out.append(svg.stacked_hbar(breakdown_segments(bd), label="mean step-time breakdown"))
    used = [c for c in CATEGORIES if bd[c] > 0]
    out.append(svg.legend(used, {c: f"{bd[c]:.2f} ms ({100 * bd[c] / (total or 1):.1f}%)" for c in used}))
    out.append(
        '<p class="muted">Each instant of a step is counted once, in priority order kernel &gt; memcpy &gt; memset &gt; '
        "communication &gt; runtime &gt; DataLoader &gt; CPU exec; what nothing covers is “other”.</p>"
    )
    per_step = (m.breakdown / 1e6).loc[:, used]
    out.append(f"<h3>Per step{rank}</h3>")
    out.append(f"<figure>{svg.stacked_columns(per_step)}<figcaption>Bars: steps of the profiled window (ProfilerStep numbers); hover for values.</figcaption></figure>")
    return "".join(out)


def _timeline(a: Analysis) -> str:
    m = a.primary
    out = ['<h2 id="timeline">One step in time</h2>']
    tl = a.view.timeline
    if tl is None:
        return out[0] + "<p>No steps found in the trace.</p>"
    # The replayed step draws runtime calls and device work: a CPU-only run has neither.
    replayed = _replayed_steps(a) if tl.has_device else []
    # One time scale for the measured and the replayed steps, so a shorter step looks shorter.
    scale = max([tl.duration_ns] + [r.duration_ns for _, r, _ in replayed])
    rank = f" on rank {m.rank}" if len(a.ranks) > 1 else ""
    gaps = int(tl.idle["count"].sum()) if len(tl.idle) else 0
    busy = f"; the device is busy {pct(tl.device_busy_ns / tl.duration_ns)} of it, idle in {gaps:,} gaps" if tl.has_device and tl.duration_ns else ""
    label = f"Step {tl.step} ({tl.duration_ns / 1e6:.2f} ms, {tl.reason}){rank}"
    out.append(f"<p>{esc(label)}{esc(busy)}. Host lanes on top, device streams below; red marks where no kernel, copy or memset runs. Hover for names and times; zoom to see single kernels.</p>")
    out.append(svg.timeline(tl.lanes, tl.idle, scale, label))
    keys = sorted({c for l in tl.lanes for c in l.spans["cls"].unique()}, key=lambda c: list(svg.SPAN_LABELS).index(c) if c in svg.SPAN_LABELS else 99)
    if tl.has_device:
        keys.append("idle")
    out.append(svg.legend(keys))
    if not tl.has_device:
        out.append('<p class="muted">This trace has no device activity (a CPU-only run): only host lanes are shown.</p>')
    for i, (title, r, note) in enumerate(replayed):
        out.append(f'<h3 id="timeline-replayed-{i}">{esc(title)}</h3><p>{esc(note)}</p>')
        out.append(svg.timeline(r.lanes, r.idle, scale, title, uid=f"tl-replayed-{i}"))
    if replayed:
        out.append(
            '<p class="muted">Replayed steps are drawn from the step graph (advisor.whatif): the host\'s runtime calls and the '
            "device's work at the times the replay gives them; the host's own work between calls is not drawn. All three charts share one time scale.</p>"
        )
    return "".join(out)


def _replayed_steps(a: Analysis) -> list[tuple[str, StepTimeline, str]]:
    """The replayed median step of the slowest rank, as measured (the replay's baseline) and
    with every fix of the headline: (heading, lanes, note) each, made with the analysis
    (advisor.rank_view). Empty where nothing replays."""
    return a.view.replayed


@dataclass
class MemoryCurves:
    series: list[svg.Series]
    peak: float  # the highest point of any curve (allocated or reserved): the chart's scale
    peak_allocated: float
    note: str
    device_total: float | None
    running_sum: bool = False  # no allocator totals in the trace: the curve is a lower bound


def memory_curves(m: Metrics, mem: pd.DataFrame | None = None) -> MemoryCurves | None:
    """Allocated (and reserved) bytes over the window; device memory first, else the host's.

    Old traces (2021 schema) record only each allocation's size, not the running total: the
    curve is then the running sum, shifted so that its lowest point is zero, and says so.
    """
    mem = m.frames.memory if mem is None else mem
    if len(mem) == 0:
        return None
    device = mem[mem["device_type"] > 0]
    host_only = len(device) == 0
    use = mem[mem["device_type"] == 0] if host_only else device
    if len(use) == 0:
        return None
    series: list[svg.Series] = []
    note = ""
    multi = use["device_id"].nunique() > 1
    peak = peak_allocated = 0.0
    for dev_id, g in use.groupby("device_id", sort=True):
        g = g.sort_values("ts", kind="stable")
        x = g["ts"].to_numpy(np.float64) / 1e6
        who = "host" if host_only else (f"GPU{dev_id}" if multi else "device")
        alloc = g["total_allocated"].to_numpy(np.float64)
        if np.isfinite(alloc).any():
            ok = np.isfinite(alloc)
            series.append(svg.Series(f"{who} allocated", "allocated", x[ok], alloc[ok]))
            peak_allocated = max(peak_allocated, float(alloc[ok].max()))
            res = g["total_reserved"].to_numpy(np.float64)
            okr = np.isfinite(res)
            if okr.any():
                series.append(svg.Series(f"{who} reserved", "reserved", x[okr], res[okr]))
                peak = max(peak, float(res[okr].max()))
        else:
            run = np.cumsum(np.nan_to_num(g["bytes"].to_numpy(np.float64)))
            run = run - min(float(run.min()), 0.0)
            series.append(svg.Series(f"{who} allocated (running sum of allocations)", "allocated", x, run))
            peak_allocated = max(peak_allocated, float(run.max()))
            note = (
                "This trace records each allocation's size but not the allocator's total: the curve is the running "
                "sum of allocations and frees in the window, with its lowest point as zero (memory held before the "
                "window is not included)."
            )
    total = None if host_only else m.device.total_memory_bytes
    if host_only:
        note = (note + " " if note else "") + "No device memory events: this is the host (CPU) allocator."
    peak = max(peak, peak_allocated)
    return MemoryCurves(series, peak, peak_allocated, note.strip(), total, running_sum=any("running sum" in s.label for s in series))


def _memory(a: Analysis) -> str:
    m = a.primary
    out = ['<h2 id="memory">Memory over the window</h2>']
    curves = memory_curves(m, a.view.memory)
    if curves is None:
        out.append("<p>No memory events in this trace: record them with <code>profile_memory=True</code> (<code>advisor profile</code> does).</p>")
        return "".join(out)
    x_max = float(max(a.view.window_end_ns, 1)) / 1e6
    lines: list[svg.HLine] = []
    off_scale = ""
    y_max = curves.peak * 1.15 or 1.0
    total = curves.device_total
    if total:
        if curves.peak >= total / 1.5:
            y_max = max(total * 1.05, curves.peak * 1.05)
            lines.append(svg.HLine(total, f"device total {fmt_bytes(total)}"))
        else:
            at_least = "at least " if curves.running_sum else ""
            off_scale = f"device total {fmt_bytes(total)} is above this scale: the peak allocation uses {at_least}{pct(curves.peak_allocated / total)} of it"
    # Axis in one binary unit, so its ticks are round numbers of that unit (0, 10, 20 GiB).
    power = max(0, min(4, int(np.log2(max(y_max, 1.0)) // 10)))
    unit, scale = ("B", "KiB", "MiB", "GiB", "TiB")[power], 1024.0**power
    for s in curves.series:
        s.x, s.y = svg.minmax_downsample(s.x, s.y, x_max)
        s.y = s.y / scale
    for h in lines:
        h.value /= scale
    bands = [
        svg.Band(float(r.start) / 1e6, float(r.end) / 1e6, f"#{int(r.step)}: {float(r.duration) / 1e6:.2f} ms")
        for r in m.steps.itertuples()
    ]
    chart = svg.LineChart(
        curves.series, x_max, y_max / scale, lambda v: f"{v:g} {unit}", x_title="ms since the trace start", lines=lines, bands=bands
    )
    rank = f" (rank {m.rank})" if len(a.ranks) > 1 else ""
    share = f" ({pct(curves.peak_allocated / total)} of the device)" if total and not off_scale else ""
    caption = f"Peak allocated {fmt_bytes(curves.peak_allocated)}{share}{rank}. " + (f"The {off_scale}. " if off_scale else "") + "Shaded columns are steps."
    out.append(f"<figure>{svg.line_chart(chart)}<figcaption>{esc(caption)}</figcaption></figure>")
    keys = []
    for s in curves.series:
        if s.key not in keys:
            keys.append(s.key)
    labels = {"allocated": "allocated", "reserved": "reserved (caching allocator)"}
    out.append('<ul class="legend">' + "".join(f'<li><span class="sw c-{k}"></span>{labels[k]}</li>' for k in keys) + ('<li><span class="sw c-limit"></span>device total</li>' if lines else "") + "</ul>")
    if curves.note:
        out.append(f'<p class="muted">{esc(curves.note)}</p>')
    return "".join(out)


BANDWIDTH_KEYS = {"H2D": "bw-h2d", "D2H": "bw-d2h", "D2D": "bw-d2d", "P2P": "bw-p2p", "H2H": "bw-h2h", "memset": "bw-memset"}


def _copy_bandwidth(a: Analysis) -> str:
    """The slowest rank's bytes copied and set per time bucket and kind over its steps
    (Metrics.copy_bandwidth, made once in the analysis): HTA's memory bandwidth timeline."""
    m = a.primary
    bw = m.copy_bandwidth
    if bw is None:
        return ""
    start = np.asarray(bw.start_ms, dtype=np.float64)
    end = start + bw.bucket_ms
    x = np.column_stack([start, end]).ravel()  # each bucket's value held over it
    series = [svg.Series(f"{k}: peak {bw.peak_gbps[k]:.2f} GB/s", BANDWIDTH_KEYS.get(k, "bw-other"), x, np.repeat(np.asarray(v, dtype=np.float64), 2))
              for k, v in bw.gbps.items()]
    y_max = max(bw.peak_gbps.values()) * 1.1 or 1.0
    chart = svg.LineChart(series, float(end[-1]) if len(end) else 1.0, y_max, lambda v: f"{v:g} GB/s", x_title="ms since the first step's start")
    rank = f" of rank {m.rank}" if len(a.ranks) > 1 else ""
    caption = (f"Bytes copied (memcpy) and set (memset) in each {bw.bucket_ms:.3f} ms of the steps{rank}, over that time: "
               "each copy's bytes spread over its duration. " + "; ".join(f"{k} {fmt_bytes(b)} in all" for k, b in bw.bytes.items()) + ".")
    legend = '<ul class="legend">' + "".join(f'<li><span class="sw c-{BANDWIDTH_KEYS.get(k, "bw-other")}"></span>{esc(k)}</li>' for k in bw.gbps) + "</ul>"
    return f'<h3>Memory bandwidth over time</h3><figure>{svg.line_chart(chart, height=220)}<figcaption>{esc(caption)}</figcaption></figure>{legend}'


def kernel_summary(kernels: pd.DataFrame, n: int = TOP_KERNELS) -> pd.DataFrame:
    """Kernels by total time with the op that launches each most often (of ops launching it
    equally often, the first by name), worked out over codes: a kernel table holds a row per
    launch, hundreds of thousands in a long run."""
    if len(kernels) == 0:
        return pd.DataFrame(columns=["name", "count", "total_ns", "mean_ns", "share", "tensor_core", "op"])
    name, names = sorted_text_codes(kernels["name"])  # a kernel without a name is left out, as groupby leaves it
    op, ops = sorted_text_codes(kernels["op"], missing="")
    dur = kernels["dur"].to_numpy()
    keep = name >= 0
    name, op, kept_dur = name[keep], op[keep], dur[keep]
    count = np.bincount(name, minlength=len(names))
    total = np.zeros(len(names), dtype=kept_dur.dtype)
    np.add.at(total, name, kept_dur)
    tensor_core = np.bincount(name, weights=kernels["tensor_core"].to_numpy(dtype=bool)[keep], minlength=len(names)) > 0
    by_op = np.bincount(name * len(ops) + op, minlength=len(names) * len(ops)).reshape(len(names), len(ops))
    g = pd.DataFrame(
        {"count": count, "total_ns": total, "mean_ns": total / np.maximum(count, 1), "tensor_core": tensor_core},
        index=pd.Index(names, dtype=object, name="name"),
    )
    g["share"] = g["total_ns"] / max(int(dur.sum()), 1)
    g["op"] = ops[by_op.argmax(axis=1)] if len(ops) else ""
    return g.sort_values("total_ns", ascending=False).head(n).reset_index()


def _kernels(a: Analysis) -> str:
    m = a.primary
    out = ['<h2 id="kernels">Top kernels</h2>']
    if not m.has_device:
        return ""  # a CPU-only run has no kernels: no empty table
    kernels = a.view.kernels  # every kernel, not the per-name totals the analysis keeps
    k = kernel_summary(kernels)
    if len(k) == 0:
        return out[0] + "<p>No kernels in this trace.</p>"
    total_ms = kernels["dur"].sum() / 1e6
    out.append(f'<p class="muted">The {len(k)} kernels with the most device time in the trace window ({total_ms:.2f} ms of kernels in all{", rank " + str(m.rank) if len(a.ranks) > 1 else ""}). Click a column to sort.</p>')
    cols = [Column("kernel", name=True), Column("launched by", name=True), Column("calls", True), Column("total ms", True), Column("mean µs", True), Column("share", True), Column("Tensor Cores")]
    rows = [
        [
            (demangle(r.name), None),  # display only: _ZN... symbols as C++
            (r.op or "—", None),
            (f"{r.count:,}", r.count),
            (f"{r.total_ns / 1e6:.2f}", r.total_ns),
            (f"{r.mean_ns / 1e3:.1f}", r.mean_ns),
            (f"{100 * r.share:.1f}%", r.share),
            ("yes" if r.tensor_core else "no", None),
        ]
        for r in k.itertuples()
    ]
    out.append(sortable_table(cols, rows, "kernels"))
    return "".join(out)


def _ops(a: Analysis) -> str:
    out = ['<h2 id="ops">Top ops</h2>']
    ops = a.view.ops.head(TOP_OPS)
    if len(ops) == 0:
        return out[0] + "<p>No host ops in this trace.</p>"
    out.append('<p class="muted">Host ops by total time, children included (an op that calls others counts their time too). Click a column to sort.</p>')
    cols = [Column("op", name=True), Column("calls", True), Column("total ms", True), Column("mean µs", True)]
    rows = [
        [(str(r.name), None), (f"{r.count:,}", r.count), (f"{r.total_ns / 1e6:.2f}", r.total_ns), (f"{r.mean_ns / 1e3:.1f}", r.mean_ns)]
        for r in ops.itertuples()
    ]
    out.append(sortable_table(cols, rows, "ops"))
    return "".join(out)


def _roofline(a: Analysis) -> str:
    """The slowest rank's ops on the device's roofline (metrics.roofline, stored with the
    analysis): the chart and the table of the biggest time sinks."""
    from advisor.render.ops import heading
    from advisor.render.roofline_svg import roofline_chart

    m = a.primary
    r = getattr(m, "roofline", None)
    if not m.has_device or r is None:
        return ""
    out = ['<h2 id="roofline">Roofline</h2>']
    out += [f'<p class="muted">{esc(line)}</p>' for line in heading(a)]
    if not r.available:
        return "".join(out)
    ops = r.ops
    peaks = {}
    if r.device is not None:
        for p in ops["precision"].dropna().unique():
            v = r.device.peak_tflops(str(p))
            if v:
                peaks[str(p)] = v
    chart, labelled = roofline_chart(ops, r.device.memory_tbps if r.device else None, peaks, label="ops on the device's roofline")
    if chart:
        key = "".join(
            f"<li>{esc(ops.at[i, 'op'])} {esc(ops.at[i, 'shape'])}: {ops.at[i, 'time_ms']:.3f} ms/step, {ops.at[i, 'tflops']:.3g} TFLOP/s</li>" for i in labelled
        )
        caption = ("Each point: one op with one set of shapes (area: its time per step; hover for figures). Lines: the memory roof and the "
                   "compute ceiling of each precision the ops use (datasheet figures). Numbered: the biggest time sinks.")
        out.append(f'<figure>{chart}<figcaption>{esc(caption)}<ol class="roofline-key">{key}</ol></figcaption></figure>')
    cols = [Column("op", name=True), Column("shape", name=True), Column("precision"), Column("ms/step", True), Column("TFLOP/s", True), Column("TB/s", True), Column("FLOP/B", True), Column("bound"), Column("of ceiling", True)]

    def cell(v, fmt):
        return (fmt.format(v), float(v)) if v is not None and pd.notna(v) and np.isfinite(v) else ("—", None)

    rows = [
        [(str(o.op), None), (str(o.shape), None), (str(o.precision or o.dtype), None), cell(o.time_ms, "{:.3f}"), cell(o.tflops, "{:.2f}"),
         cell(o.tbps, "{:.3f}"), cell(o.intensity, "{:.1f}"), (str(o.bound or "—"), None), cell(None if pd.isna(o.ceiling_share) else 100 * o.ceiling_share, "{:.0f}%")]
        for o in ops.head(TOP_OPS).itertuples()
    ]
    out.append(sortable_table(cols, rows, "roofline"))
    return "".join(out)


def _ranks(a: Analysis) -> str:
    if len(a.ranks) < 2:
        return ""
    out = ['<h2 id="ranks">Ranks</h2>', '<p class="muted">A job is as fast as its slowest rank. Bars share one scale: the mean step of each rank.</p>']
    longest = max(sum(m.breakdown_mean_ms.values()) for m in a.ranks) or 1.0
    bars = []
    for m in a.ranks:
        bd = m.breakdown_mean_ms
        bars.append(f'<div class="rank-bar"><div class="muted">rank {m.rank}: {sum(bd.values()):.2f} ms</div>{svg.stacked_hbar(breakdown_segments(bd), total=longest, height=22, label=f"rank {m.rank}")}</div>')
    out.append("".join(bars))
    used = [c for c in CATEGORIES if any(m.breakdown_mean_ms[c] > 0 for m in a.ranks)]
    out.append(svg.legend(used))
    cols = [Column("rank", True), Column("steps", True), Column("mean ms", True), Column("median ms", True), Column("GPU util", True), Column("DataLoader ms", True), Column("communication ms", True), Column("peak memory", True), Column("file", name=True)]
    rows = []
    for m in a.ranks:
        s = m.summary()
        st = s["step_time_ms"]
        peak = s["peak_memory_bytes"]
        rows.append(
            [
                (str(m.rank), m.rank),
                (str(s["steps"]), s["steps"]),
                (ms(st["mean"]).replace(" ms", ""), st["mean"]),
                (ms(st["median"]).replace(" ms", ""), st["median"]),
                (pct(s["gpu_utilization"]), s["gpu_utilization"]),
                (f"{s['breakdown_ms']['dataloader']:.2f}", s["breakdown_ms"]["dataloader"]),
                (f"{s['breakdown_ms']['communication']:.2f}", s["breakdown_ms"]["communication"]),
                (fmt_bytes(peak), peak),
                (m.frames.path.name, None),
            ]
        )
    out.append(sortable_table(cols, rows))
    out.append(_collectives_table(a))
    out.append(_collective_lanes(a))
    out.append(_rank_heatmap(a))
    return "".join(out)


def _collectives_table(a: Analysis) -> str:
    """Per rank: collective time, the share compute overlaps, the wait for later ranks and the
    wait it causes the others (ms per step)."""
    comms = [(m.rank, a.communication(m)) for m in a.ranks]
    if not any(c for _, c in comms):
        return ""

    def cell(v: float | None, shown: str) -> tuple[str, float | None]:
        return ("—", None) if v is None else (shown, v)

    cols = [Column("rank", True), Column("collectives ms", True), Column("overlapped by compute", True), Column("waits ms", True), Column("makes others wait ms", True)]
    rows = []
    for rank, c in comms:
        col, ov, wait, caused = (None,) * 4 if c is None else (c.collective_ms_per_step, c.overlap_share, c.wait_ms_per_step, c.caused_wait_ms_per_step)
        rows.append(
            [
                (str(rank), rank),
                cell(col, f"{col:.2f}" if col is not None else ""),
                cell(ov, pct(ov)),
                cell(wait, f"{wait:.2f}" if wait is not None else ""),
                cell(caused, f"{caused:.2f}" if caused is not None else ""),
            ]
        )
    return "<h3>Collectives per step</h3>" + sortable_table(cols, rows, "collectives")


def _collective_lanes(a: Analysis) -> str:
    """Ranks x time: each rank's collectives over the first steps all ranks recorded (drawn
    from Analysis.collective_lanes, made once in the analysis)."""
    from advisor.whatif.timeline import Lane, coalesce

    lanes_of = a.collective_lanes
    if lanes_of is None:
        return ""
    d = lanes_of.duration_ns
    steps = pd.DataFrame({"start": lanes_of.slot_start, "end": lanes_of.slot_start + lanes_of.slot, "name": [f"step {s}" for s in lanes_of.steps],
                          "cls": "annotation", "count": 1, "total": lanes_of.slot})
    lanes = [Lane("steps", "steps", steps)]
    for rank, spans in zip(lanes_of.ranks, lanes_of.spans, strict=True):
        t = pd.DataFrame({"start": spans[:, 0], "end": spans[:, 1], "name": "collective", "cls": "communication", "count": 1,
                          "total": spans[:, 1] - spans[:, 0]})
        total = float((spans[:, 1] - spans[:, 0]).sum()) / 1e6
        lanes.append(Lane(f"rank {rank}: {total:.2f} ms", "rank", coalesce(t, d)))
    chart = svg.timeline(lanes, pd.DataFrame(columns=["start", "end", "name", "cls", "count", "total"]), d, "ranks by time: collectives", uid="tl-collectives")
    caption = (
        f"Each rank's collective kernels (NCCL, RCCL, Gloo, ...) in {'step' if len(lanes_of.steps) == 1 else 'steps'} {', '.join(str(s) for s in lanes_of.steps)}, "
        "the first every rank recorded. "
        "The ranks' clocks are not aligned, so each step starts at the same place on every rank and is as wide as the longest rank's; "
        "a rank whose bars are long waits in its collectives for a later rank. `advisor report --collectives` gives the figures."
    )
    return f"<h3>Ranks × time in collectives</h3><figure>{chart}<figcaption>{esc(caption)}</figcaption></figure>"


def _rank_heatmap(a: Analysis) -> str:
    """Ranks x steps: each rank's wait in its collectives per step (or, without collectives,
    its step time). The rank the others wait for is the pale row, marked."""
    w = a.waits
    stragglers = next((f.evidence.get("straggler_ranks", []) for f in a.findings if f.rule == "straggler"), [])
    if w is not None:
        ranks, steps = w.ranks, w.steps
        values = w.wait / 1e6
        collective = w.collective / 1e6
        caused = w.caused / 1e6
        what = "wait in collectives"

        def tip(i: int, j: int) -> str:
            return (
                f"rank {ranks[i]}, step {steps[j]}: waits {values[i, j]:.2f} ms of {collective[i, j]:.2f} ms in collectives"
                + (f"; the others wait {caused[i, j]:.2f} ms for it" if caused[i, j] > 0 else "")
            )

        caption = (
            "Each cell: how long the rank waits inside its collectives in that step for a later rank (darker: longer). "
            "The rank that arrives last waits least: its row is pale."
            + (f" Marked: the straggler ({', '.join(f'rank {r}' for r in stragglers)})." if stragglers else "")
        )
    else:
        common = sorted(set.intersection(*(set(m.steps["step"].tolist()) for m in a.ranks)))
        if not common:
            return ""
        ranks, steps = [m.rank for m in a.ranks], np.asarray(common)
        values = np.vstack([m.steps.set_index("step").loc[common, "duration"].to_numpy(np.float64) / 1e6 for m in a.ranks])
        what = "step time"

        def tip(i: int, j: int) -> str:
            return f"rank {ranks[i]}, step {steps[j]}: {values[i, j]:.2f} ms"

        caption = "Each cell: the rank's step time (darker: slower). No collectives in these traces, so waits cannot be told apart."
    marked = [i for i, r in enumerate(ranks) if r in stragglers]
    chart = svg.heatmap([f"rank {r}" for r in ranks], [str(s) for s in steps], values, tip, marked, label=f"ranks by steps: {what}")
    return f'<h3>Ranks × steps: {esc(what)}</h3><figure>{chart}<figcaption>{esc(caption)}</figcaption></figure>'


def _notes(a: Analysis) -> str:
    notes, warnings = a.notes(), a.warnings
    if not notes and not warnings:
        return ""
    out = ['<h2 id="notes">Notes</h2>']
    out += [f'<p class="note">{esc(n)}</p>' for n in notes]
    out += [f'<p class="warn">warning: {esc(w)}</p>' for w in warnings]
    return "".join(out)


def to_html(analysis: Analysis) -> str:
    body = "".join(
        [
            _header(analysis),
            _findings(analysis),
            _breakdown(analysis),
            _timeline(analysis),
            _memory(analysis),
            _copy_bandwidth(analysis),
            _kernels(analysis),
            _roofline(analysis),
            _ops(analysis),
            _ranks(analysis),
            _notes(analysis),
            f'<footer>advisor {esc(__version__)} · report schema advisor/report/v1 · <code>advisor report --format json</code> gives these numbers as data.</footer>',
        ]
    )
    return page(f"advisor: {analysis.run.name}", body)
