"""The terminal report: the step-time picture first, then the ranked fixes.

rich handles terminal width, NO_COLOR and pipes (no colour codes when not a terminal).
Every string from a trace or a facts file is printed as text, never as console markup, and
through `one_line` (`multi_line` for code): no escape sequence, control character, line break
or bidirectional control of theirs reaches the terminal.
"""

from __future__ import annotations

from rich.console import Console, Group
from rich.markup import escape
from rich.padding import Padding
from rich.panel import Panel
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from advisor.analysis import Analysis
from advisor.metrics.breakdown import CATEGORIES
from advisor.metrics.kernels import top_kernels
from advisor.metrics.summary import device_idle, device_ran_no_kernel
from advisor.render.console import is_unwrapped
from advisor.render.demangle import demangle
from advisor.render.fmt import batch_size, finding_rank, fmt_bytes, order_note, pct, ranks_line, rate, saving_note, short_value, step_time_text, throughput
from advisor.terminal_text import multi_line, one_line

COLOURS = {
    "kernel": "green",
    "memcpy": "magenta",
    "memset": "bright_magenta",
    "communication": "cyan",
    "runtime": "yellow",
    "dataloader": "red",
    "cpu_exec": "blue",
    "other": "bright_black",
}
SEVERITY_STYLE = {"high": "bold red", "medium": "yellow", "low": "bright_black"}


def breakdown_bar(breakdown: dict[str, float], width: int) -> Text:
    total = sum(breakdown.values()) or 1.0
    bar = Text()
    used = 0
    cats = [c for c in CATEGORIES if breakdown.get(c, 0) > 0]
    for i, c in enumerate(cats):
        n = round(width * breakdown[c] / total) if i < len(cats) - 1 else width - used
        n = max(n, 0)
        bar.append("█" * n, style=COLOURS[c])
        used += n
    return bar


def projection_text(projected: dict) -> str:
    """The projection beside the measured headline, named as one."""
    busy = f", device busy {pct(projected['gpu_utilization'])}" if projected["gpu_utilization"] is not None else ""
    return (
        f"{projected['step_time_ms']['mean']:.2f} ms mean step without the one-time work (see the note){busy}: a projection, "
        "not a measurement; the replay and the findings' savings (ms per step) are figured on it, their shares are of the measured step"
    )


def _peak_memory_text(s: dict) -> str | None:
    """The summary's peak memory as a sentence: allocated (of the device's memory), reserved;
    either alone where the other is not recorded."""
    allocated, reserved, total = s["peak_memory_bytes"], s["peak_reserved_bytes"], s["device_memory_bytes"]
    if allocated is None and reserved is None:
        return None
    first = allocated if allocated is not None else reserved
    share = f" of {fmt_bytes(total)} ({pct(first / total)})" if total else ""
    if allocated is None:
        return f"{fmt_bytes(reserved)} reserved{share}"
    return f"{fmt_bytes(allocated)} allocated{share}" + (f", {fmt_bytes(reserved)} reserved" if reserved is not None else "")


def _overview(a: Analysis, console: Console) -> Group:
    m = a.primary
    s = a.summary()
    st = s["step_time_ms"]
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    head.add_row("Run", Text(f"{one_line(a.run.name)}  ({len(a.run.files)} trace file{'s' if len(a.run.files) != 1 else ''})"))
    for note in a.run.notes:  # which files of the folder the report reads: said before any figure
        head.add_row("", Text(one_line(note), style="yellow"))
    dev = m.device
    if dev.name:
        cc = f", compute capability {dev.compute_capability}" if dev.compute_capability else ""
        cc += " (MTIA accelerator)" if dev.vendor == "mtia" else ""
        mem = f", {fmt_bytes(dev.total_memory_bytes)}" if dev.total_memory_bytes else ""
        idle = " (listed; ran nothing: read as a CPU run)" if device_idle(m) else device_ran_no_kernel(m)
        head.add_row("Device", Text(one_line(f"{dev.name}{cc}{mem}{idle}")))
    elif not m.has_device:
        head.add_row("Device", Text("CPU only (no device activity in the trace)"))
    if len(a.ranks) > 1:
        head.add_row("Ranks", Text(ranks_line(a)))
    noisy = a.noisy_caveat()
    if st["mean"] is not None:
        head.add_row("Step time", Text(step_time_text(st, s["steps"]) + (f"; {noisy}" if noisy else "")))
    projected = s.get("projected")
    if projected is not None and projected["step_time_ms"]["mean"] is not None:
        head.add_row("Projected", Text(projection_text(projected)))
    replayed = a.headline()
    if replayed is not None:
        head.add_row("Replayed step", Text(replayed.headline(projected=projected is not None, noisy=noisy is not None)))
    tp = throughput(a)
    if tp:
        bs = batch_size(a)
        per = f"batch {bs} / {st['mean']:.2f} ms mean step" if bs else f"1 / {st['mean']:.2f} ms mean step"
        head.add_row("Throughput", Text(f"{rate(tp[0])} {tp[1]} ({per})"))
    peak_memory = _peak_memory_text(s)
    if m.has_device:
        head.add_row(f"{dev.short_kind} utilisation", Text(f"{pct(s['gpu_utilization'])} of step time with device activity"))
        if dev.matrix_units and s["tensor_core_kernel_share"] is not None:
            head.add_row(
                dev.matrix_units,
                Text(f"{pct(s['tensor_core_kernel_share'])} of kernel time on {dev.matrix_units}; {pct(s['tensor_core_eligible_share'])} launched by eligible ops"),
            )
            if s.get("kernel_time_by_precision_ms"):
                by = ", ".join(f"{p} {v:.2f} ms" for p, v in s["kernel_time_by_precision_ms"].items())
                head.add_row("Precision", Text(f"matrix kernels per step: {by}"))
    if peak_memory:  # the JSON's peak, on every run that recorded memory (device records or not)
        head.add_row("Peak memory", Text(peak_memory))
    if m.has_device:
        h = s["h2d"]
        if h["count"]:
            head.add_row(
                "Host→device",
                Text(
                    f"{h['count']} copies, {fmt_bytes(h['bytes'])}, {h['time_ms']:.2f} ms in the window"
                    f" ({h['pageable_count']} from pageable memory)"
                    + (f", {h['bandwidth_gbps']:.1f} GB/s" if h["bandwidth_gbps"] else "")
                ),
            )

    bd = s["breakdown_ms"]
    width = max(20, min(console.width - 4, 100))
    legend = Table.grid(padding=(0, 2))
    for _ in range(4):
        legend.add_column()
    cells = []
    total = sum(bd.values()) or 1.0
    for c in CATEGORIES:
        if bd[c] <= 0:
            continue
        cells.append(Text.assemble(("■ ", COLOURS[c]), f"{c} {bd[c]:.2f} ms ({100 * bd[c] / total:.1f}%)"))
    for i in range(0, len(cells), 4):
        legend.add_row(*cells[i : i + 4])
    return Group(head, Text(""), Text("Step-time breakdown (mean per step)", style="bold"), breakdown_bar(bd, width), legend)


class _NamedTable:
    """A top-N table whose first column is a name (kernel or op) and the rest figures. The
    figures are never cut: each column is as wide as its widest figure or header, and the name
    gets what is left of the width; in a terminal it is cut with "…"; in a pipe or a file (no
    width to fit) names are whole, so they can be searched for."""

    def __init__(self, title: str, name: str, figures: list[tuple[str, str]], width: int, whole_names: bool):
        self.title, self.name, self.figures, self.width, self.whole_names = title, name, figures, width, whole_names
        self.rows: list[tuple[str, tuple[str, ...]]] = []

    def add(self, name: str, *figures: str) -> None:
        self.rows.append((one_line(name), figures))

    @property
    def table(self) -> Table:
        widths = [max([len(h), *(len(r[1][i]) for r in self.rows)]) for i, (h, _) in enumerate(self.figures)]
        # each column's padding (1 each side) and the rule between columns
        name_width = 1_000_000 if self.whole_names else max(12, min(70, self.width - sum(widths) - 3 * len(widths) - 3))
        table = Table(title=self.title, title_justify="left", expand=False, show_edge=False)
        table.add_column(self.name, overflow="ellipsis", no_wrap=True, max_width=None if self.whole_names else name_width)
        for (header, justify), w in zip(self.figures, widths, strict=True):
            table.add_column(header, justify=justify, no_wrap=True, min_width=w)
        for name, figures in self.rows:
            if len(name) > name_width:
                name = name[: name_width - 1] + "…"
            table.add_row(Text(name), *figures)
        return table


def _kernels_table(a: Analysis, n: int = 8, width: int = 120, whole_names: bool = False) -> Table | None:
    k = top_kernels(a.primary.kernels, n)
    if len(k) == 0:
        return None
    figures = [("calls", "right"), ("total ms", "right"), ("share", "right"), ("TC", "center"), ("precision", "left")]
    t = _NamedTable("Top kernels", "kernel", figures, width, whole_names)
    for r in k.itertuples():
        # display only: _ZN... symbols as C++
        t.add(demangle(str(r.name)), str(r.count), f"{r.total_ns / 1e6:.2f}", f"{100 * r.share:.1f}%", "✓" if r.tensor_core else "", r.precision or "")
    return t.table


def _cpu_ops_table(a: Analysis, n: int = 8, width: int = 120, whole_names: bool = False) -> Table | None:
    """A CPU-only run's top host ops by self time per step (the kernels table of a GPU run)."""
    if a.primary.has_device:
        return None
    ops = a.view.cpu_ops.head(n)  # made with the analysis (advisor.rank_view)
    if len(ops) == 0:
        return None
    figures = [("calls", "right"), ("self ms", "right"), ("total ms", "right"), ("share", "right")]
    t = _NamedTable("Top CPU ops (self time per step)", "op", figures, width, whole_names)
    for r in ops.itertuples():
        t.add(str(r.name), f"{r.count:g}", f"{r.self_ms:.2f}", f"{r.total_ms:.2f}", f"{100 * r.share:.1f}%")
    return t.table


def _considered(a: Analysis) -> list:
    """The findings whose fix gains nothing on this run: not ranked, each with its reason."""
    if not a.considered:
        return []
    out: list = [Text("Considered, not ranked", style="bold")]
    for f in a.considered:
        # a hanging indent: a line wrapped at the console's width goes on under the rule's name
        entry = Table.grid()
        entry.add_column(no_wrap=True)
        entry.add_column()
        entry.add_row("  - ", Text.assemble((one_line(f.rule), "bold"), "  ", one_line(f.no_gain or "")))
        out.append(entry)
    return out


def _findings(a: Analysis, verbose: bool, plain: bool = False) -> list:
    out: list = [Text("Findings, ranked by time saved per step (each on top of the fixes above it)", style="bold")]
    if not a.findings:
        out.append(Text("  nothing to fix: no rule fired on this run" if not a.considered else "  nothing to fix: no fix gains time on this run"))
        out.extend(_considered(a))
        return out
    for i, f in enumerate(a.findings, 1):
        saving = "risk, no time cost yet" if f.saving_ms is None else f"{f.saving_ms:.2f} ms/step ({pct(f.saving_pct)}){saving_note(f)}"
        out.append(
            Text.assemble(
                (f"{i:>2}. ", "bold"),
                (one_line(f.rule), SEVERITY_STYLE.get(f.severity, "")),
                "  ",
                (saving, "bold"),
                (f"  {f.severity}", SEVERITY_STYLE.get(f.severity, "")),
                (f"  {where}" if (where := finding_rank(a, f)) else "", "bold"),
                (f"  ({order})" if (order := order_note(a.findings, i - 1)) else "", "italic"),
            )
        )
        out.append(Padding(Text(one_line(f.message)), (0, 0, 0, 4), expand=False))
    out.extend(_considered(a))
    if verbose:
        for i, f in enumerate(a.findings, 1):
            body: list = [Text(one_line(f.message))]
            if f.causes:
                body.append(Text(one_line(f"explained by: {', '.join(f.causes)}"), style="italic"))
            ev = {k: v for k, v in f.evidence.items()}
            if ev:
                body.append(Text("evidence:", style="bold"))
                for k, v in ev.items():
                    body.append(Text(one_line(f"  {k}: {short_value(v, whole=plain)}")))
            if f.fix.text:
                body.append(Text("fix: ", style="bold") + Text(one_line(f.fix.text)))
            if f.fix.snippet:
                code = multi_line(f.fix.snippet).strip("\n")
                if plain:
                    body.append(Text("\n".join("    " + line for line in code.splitlines())))
                else:
                    body.append(Syntax(code, "python", theme="ansi_dark", background_color="default"))
            body.append(Text(one_line(f"confidence: {f.confidence}; the method: advisor explain {f.rule}"), style="bright_black"))
            where = finding_rank(a, f)
            title = f"{i}. {f.rule} — {f.title}" + (f" ({where})" if where else "")
            if plain:
                # a pipe or a file: a heading line and the body indented, no frame (a frame
                # would pad every line to the longest one)
                out.append(Text(""))
                out.append(Text(one_line(title), style="bold"))
                out.append(Padding(Group(*body), (0, 0, 0, 3), expand=False))
            else:
                # sized to its content: a wide (unwrapped) console must not stretch the frame
                out.append(Panel(Group(*body), title=escape(one_line(title)), title_align="left", expand=False))
    else:
        # two short lines: each fits an 80-column terminal, so neither breaks mid-phrase
        out.append(Text("  -v: the evidence and the code to change", style="bright_black"))
        out.append(Text("  advisor explain RULE: how a rule decides and estimates its saving", style="bright_black"))
    return out


def render_text(a: Analysis, console: Console, verbose: bool = False, notes: Console | None = None) -> None:
    """The report on CONSOLE; its notes and warnings after it on NOTES (the command line's
    stderr, so that stdout holds the report alone), else on CONSOLE."""
    plain = is_unwrapped(console)
    console.print(_overview(a, console))
    kt = _kernels_table(a, width=console.width, whole_names=plain) or _cpu_ops_table(a, width=console.width, whole_names=plain)
    if kt is not None:
        console.print()
        console.print(kt)
    if len(a.ranks) > 1:
        console.print()
        rt = Table(title="Ranks", title_justify="left", show_edge=False)
        for c in ("rank", "steps", "mean ms", "median ms", "GPU util", "dataloader ms"):
            rt.add_column(c, justify="right")
        for m in a.ranks:
            s = m.summary()
            st = s["step_time_ms"]
            rt.add_row(
                str(m.rank), str(s["steps"]), f"{st['mean']:.2f}" if st["mean"] is not None else "n/a",
                f"{st['median']:.2f}" if st["median"] is not None else "n/a", pct(s["gpu_utilization"]),
                f"{s['breakdown_ms']['dataloader']:.2f}",
            )
        console.print(rt)
    console.print()
    for part in _findings(a, verbose, plain):
        console.print(part)
    said = [n for n in a.notes() if n not in a.run.notes]  # the run's own are in the header
    if said or a.warnings:
        if notes is None:
            console.print()
        for n in said:
            (notes or console).print(Text(one_line(f"note: {n}"), style="bright_black"))
        for w in a.warnings:
            (notes or console).print(Text(one_line(f"warning: {w}"), style="yellow"))
