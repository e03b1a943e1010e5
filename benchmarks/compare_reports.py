"""Write every run's reports to a folder, or compare them with a folder written before.

    python benchmarks/compare_reports.py write /tmp/before
    python benchmarks/compare_reports.py compare /tmp/before
    python benchmarks/compare_reports.py compare-cached /tmp/before   # from the analysis cache

Runs: each trace file under ../shared/traces (a folder of several ranks as one run) and each
recorded run under sample_runs/. Reports: JSON (the figures), Markdown and text. A
restructuring must leave every one of them unchanged; the comparison prints what differs.
"""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "traces"


def runs() -> list[Path]:
    out: list[Path] = []
    if SHARED.is_dir():
        for d in sorted(p for p in SHARED.rglob("*") if p.is_dir()) + [SHARED]:
            traces = sorted(p for p in d.iterdir() if p.name.endswith((".json.gz", ".json")))
            if not traces:
                continue
            # a folder of ranks (rank0, rank-1, worker0...) is one run; otherwise each file is
            if len(traces) > 1 and d.name not in ("corpus", "misc", "traces"):
                out.append(d)
            else:
                out += traces
    out += sorted({p.parent for p in (ROOT / "sample_runs").rglob("*.pt.trace.json*")})
    return out


def name(p: Path) -> str:
    rel = p.relative_to(SHARED) if p.is_relative_to(SHARED) else p.relative_to(ROOT)
    return str(rel).replace("/", "__")


def reports(p: Path) -> dict[str, str]:
    from rich.console import Console

    from advisor.analysis import analyze
    from advisor.errors import InputError
    from advisor.render.html import to_html
    from advisor.render.markdown import to_markdown
    from advisor.render.text import render_text

    try:
        if CACHED:  # stored, then read back: the reports of a cached analysis must be the same
            analyze(p, cache=True, store=True)
            a = analyze(p, cache=True)
            assert a.cache_entry is not None and a.primary_view is not None, f"{p}: not read back from the cache with its view"
        else:
            a = analyze(p)
    except InputError as exc:
        return {"error.txt": exc.line() + "\n"}
    d = a.to_dict()
    out = {"report.json": json.dumps(d, indent=1, sort_keys=True, default=str) + "\n"}
    out["report.md"] = to_markdown(a)
    buf = io.StringIO()
    render_text(a, Console(file=buf, width=120, force_terminal=False, color_system=None), verbose=True)
    out["report.txt"] = buf.getvalue()
    out["report.html"] = to_html(a)
    return out


CACHED = False


def _portable(text: str) -> str:
    """A report with the checkout's and the shared data's folders named alike, so a report
    written from one clone compares with one written from another."""
    return text.replace(str(SHARED.resolve()), "<shared>").replace(str(SHARED), "<shared>").replace(str(ROOT), "<repo>")


def main() -> int:
    global CACHED
    import argparse

    ap = argparse.ArgumentParser(description="Write every run's reports to a folder, or compare them with one written before.")
    ap.add_argument("mode", choices=("write", "compare", "compare-cached"))
    ap.add_argument("folder", type=Path)
    ap.add_argument("only", nargs="*", help="compare only the runs whose names contain one of these")
    args = ap.parse_args()
    mode, folder = args.mode, args.folder
    if mode == "compare-cached":
        import tempfile

        CACHED, mode = True, "compare"
        os.environ["ADVISOR_CACHE"] = tempfile.mkdtemp(prefix="advisor-compare-")
    else:
        os.environ["ADVISOR_CACHE"] = "off"
    only = args.only
    differ = 0
    for p in runs():
        n = name(p)
        if only and not any(o in n for o in only):
            continue
        got = {kind: _portable(text) for kind, text in reports(p).items()}
        for kind, text in got.items():
            f = folder / n / kind
            if mode == "write":
                f.parent.mkdir(parents=True, exist_ok=True)
                f.write_text(text)
            else:
                old = f.read_text() if f.exists() else None
                if old != text:
                    differ += 1
                    print(f"DIFFERS {n}/{kind}", flush=True)
                    if old is not None:
                        import difflib

                        sys.stdout.writelines(list(difflib.unified_diff(old.splitlines(True), text.splitlines(True), n=0))[:20])
        print(f"{'ok' if mode == 'write' else 'checked'} {n}", flush=True)
    print(f"{differ} report(s) differ" if mode == "compare" else "written")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
