"""`advisor report --collectives`: the job's collectives by kind and message size, their bus
bandwidth against the link's peak, each rank's lateness and wait, and each rank's overlap of
communication with compute. Text, Markdown and JSON (`advisor/collectives/v1`) of one
`JobCollectives` (advisor.metrics.collectives); names from the trace are printed as text.
"""

from __future__ import annotations

import math
from typing import Any

from advisor.output import to_json_text
from advisor.render.fmt import md
from advisor.version import __version__

COLLECTIVES_SCHEMA = "advisor/collectives/v1"


def _f(v: Any, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    return f"{float(v):,.{digits}f}"


def _pct(v: Any) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    return f"{100 * float(v):.1f}%"


def _bytes(v: Any) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    v = float(v)
    for div, unit in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if v >= div:
            return f"{v / div:.2f} {unit}"
    return f"{v:.0f} B"


def tables(job) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, rows) of each table the report shows, as text cells."""
    peak = f"of {job.link.name} peak" if job.link.name else "of link peak"
    by_kind = [[r.group or "–", "–" if r.group_size is None or r.group_size != r.group_size else str(int(r.group_size)),
                r.kind, r.bucket, r.algorithm, str(r.count), _f(r.time_ms), _bytes(r.bytes), _f(r.algbw_gbps, 2), _f(r.busbw_gbps, 2), _pct(r.peak_share)]
               for r in job.table.itertuples(index=False)]
    ranks = [[str(r.rank), str(r.collectives), _f(r.time_ms), str(r.matched), _f(r.mean_lag_ms), _f(r.max_lag_ms), _f(r.wait_ms)]
             for r in job.ranks.itertuples(index=False)]
    overlap = [[str(r.rank), _f(r.compute_ms), _f(r.communication_ms), _f(r.overlapped_ms), _f(r.exposed_ms), _pct(r.overlap_share)]
               for r in job.overlap.itertuples(index=False)]
    return [
        ("Collectives by kind and message size (all ranks)",
         ["group", "n", "kind", "size", "algorithm", "count", "time ms", "moved", "algbw GB/s", "busbw GB/s", peak], by_kind),
        ("Ranks: start behind the earliest rank, and time waited for the last",
         ["rank", "collectives", "time ms", "matched", "mean lag ms", "max lag ms", "waited ms"], ranks),
        ("Communication and compute per rank (kernel time, merged)",
         ["rank", "compute ms", "communication ms", "overlapped ms", "exposed ms", "overlapped share"], overlap),
    ]


def heading(run_name: str, job) -> list[str]:
    sizes = sorted({int(v) for v in job.table["group_size"] if v is not None and v == v}) if len(job.table) else []
    if len(sizes) > 1:
        n = "process groups of " + ", ".join(map(str, sizes)) + " ranks (each collective's bandwidth uses its own group's size)"
    else:
        n = f"{sizes[0] if sizes else job.group_size} ranks per collective" if (sizes or job.group_size) else "group size not recorded"
    lines = [f"Collectives of {run_name}: {n}; {job.link.why}."]
    if len(job.table) == 0:
        lines.append("No collective kernel (NCCL, RCCL, Gloo, or one a c10d op launched) in this run.")
    if job.skew_p50_ms is not None:
        lines.append(f"Start skew across ranks (clocks aligned on the collectives' ends): median {job.skew_p50_ms:.3f} ms, max {job.skew_max_ms:.3f} ms.")
    lines.append("Bus bandwidth by NCCL's definitions (n: the ranks of the collective's process group): algbw = size / time "
                 "(an all-gather's size is its gathered output); busbw = algbw × 2(n-1)/n (all-reduce), "
                 "(n-1)/n (all-gather, reduce-scatter, all-to-all), 1 (broadcast, reduce, send/recv).")
    return lines + list(job.notes)


def to_collectives_text(run_name: str, job) -> str:
    out = heading(run_name, job)
    for title, header, rows in tables(job):
        widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
        out += ["", title, "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip()]
        out += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows] or ["(none)"]
    return "\n".join(out) + "\n"


def to_collectives_markdown(run_name: str, job) -> str:
    out = [f"# Collectives: {md(run_name)}", ""] + [md(line) + "  " for line in heading(run_name, job)]
    for title, header, rows in tables(job):
        out += ["", f"## {title}", "", "| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
        out += ["| " + " | ".join(md(c) for c in r) + " |" for r in rows]
    return "\n".join(out) + "\n"


def to_collectives_json(source: str, run_name: str, job) -> str:
    return to_json_text({"schema": COLLECTIVES_SCHEMA, "advisor_version": __version__, "source": source, "run": run_name, **job.to_dict()})


__all__ = ["COLLECTIVES_SCHEMA", "to_collectives_json", "to_collectives_markdown", "to_collectives_text"]
