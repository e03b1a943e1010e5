"""`advisor report --launches`: the slowest rank's launch delays, queue lengths and idle time
by cause per stream (advisor.metrics.launches), as text, Markdown or JSON (`advisor/launches/v1`)."""

from __future__ import annotations

import math
from typing import Any

from advisor.output import to_json_text
from advisor.render.fmt import md
from advisor.version import __version__

LAUNCHES_SCHEMA = "advisor/launches/v1"
HEADER = ["stream", "ops", "delay p50 µs", "delay p90 µs", "delay max µs", "queue mean", "queue max"]
IDLE_HEADER = ["stream", "gaps", "idle ms", "host wait ms", "kernel wait ms", "other ms"]


def _idle_cells(r: Any) -> list[str]:
    return ["all" if r.stream == -1 else str(r.stream), str(r.gaps), f"{r.idle_ms:,.3f}", f"{r.host_wait_ms:,.3f}", f"{r.kernel_wait_ms:,.3f}", f"{r.other_ms:,.3f}"]


IDLE_NOTE = ("Idle time between a stream's consecutive ops, by cause: host wait (the next op's launch call started after the previous op ended), "
             "kernel wait (a gap of 30 ns or less), other (launched in time, started later: a sync, an event, another stream).")


def _aligned(header: list[str], rows: list[list[str]], empty: str) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    out = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip()]
    return out + (["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows] or [empty])


def _cells(r: Any) -> list[str]:
    return ["all" if r.stream == -1 else str(r.stream), str(r.ops), f"{r.delay_p50_us:,.1f}", f"{r.delay_p90_us:,.1f}", f"{r.delay_max_us:,.1f}",
            f"{r.queue_mean:.1f}", str(r.queue_max)]


def heading(run_name: str, rank: int) -> list[str]:
    return [f"Launches of {run_name}, rank {rank}: from each launch call's start to its op's start on the device (delay), "
            "and the stream's ops launched and not finished at each launch (queue)."]


def to_launches_text(run_name: str, rank: int, table: Any, idle: Any) -> str:
    out = heading(run_name, rank) + [""] + _aligned(HEADER, [_cells(r) for r in table.itertuples(index=False)], "(no launch the trace links to device work)")
    out += ["", IDLE_NOTE] + _aligned(IDLE_HEADER, [_idle_cells(r) for r in idle.itertuples(index=False)], "(no device work)")
    return "\n".join(out) + "\n"


def to_launches_markdown(run_name: str, rank: int, table: Any, idle: Any) -> str:
    out = [f"# Launches: {md(run_name)}", ""] + [md(line) for line in heading(run_name, rank)]
    out += ["", "| " + " | ".join(HEADER) + " |", "| --- |" + " ---: |" * (len(HEADER) - 1)]
    out += ["| " + " | ".join(_cells(r)) + " |" for r in table.itertuples(index=False)]
    out += ["", md(IDLE_NOTE), "", "| " + " | ".join(IDLE_HEADER) + " |", "| --- |" + " ---: |" * (len(IDLE_HEADER) - 1)]
    out += ["| " + " | ".join(_idle_cells(r)) + " |" for r in idle.itertuples(index=False)]
    return "\n".join(out) + "\n"


def to_launches_json(source: str, run_name: str, rank: int, table: Any, idle: Any) -> str:
    def rows(df: Any) -> list[dict[str, Any]]:
        return [{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in r.items()} for r in df.to_dict("records")]

    return to_json_text({"schema": LAUNCHES_SCHEMA, "advisor_version": __version__, "source": source, "run": run_name, "rank": rank,
                         "streams": rows(table), "idle": rows(idle)})
