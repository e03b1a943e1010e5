"""Cold `advisor report` against the floor (floor.py), per trace size, interleaved in one run.

    .venv/bin/python benchmarks/report_vs_floor.py [--sizes 34MB,87MB,1GB] [--repeat 3]
        [--tools tb,hta] [--traces corpus/mi300x_xdit_flux_infer.json.gz,...]
        [--out benchmarks/results/report_vs_floor]

Per size and repeat, one after another on the same file (so the machine's load falls on all
alike), each a whole fresh process, CPU seconds (user + sys, from wait4) and peak RSS:

- floor: benchmarks/floor.py (imports numpy, pandas, pyarrow; typed msgspec decode of the
  events into columns; nothing else).
- cold JSON / cold HTML: `advisor report TRACE -f json|html`, `ADVISOR_CACHE=off`, with the
  advisor's modules compiled to bytecode beforehand (as installed; see `compiled`).
- stages: one more cold JSON run with the pipeline's entry points timed (CPU seconds, the
  outermost call counted): imports, load (trace to frames), metrics, rules, replay (the
  rules' savings settled by replay), view (what the renderers draw, advisor.rank_view), and
  the rest (reduce, JSON, interpreter exit).
- cached HTML / whatif: the same commands with the analysis cache filled (in a scratch
  folder); CPU (and wall) seconds in process from the call to the output (imports apart),
  and the whole process's CPU.
- the TensorBoard plugin (torch-tb-profiler) and HTA where installed (see report_vs_peers.py).

Traces: 34 MB is ../shared/traces/v100_resnet50_nw0 as it is (gzip, 34 MB of JSON); the
others are scaled copies of it made by make_large_trace.py under $ADVISOR_BENCH_DIR (default
/tmp/advisor-bench). `--traces` adds held-out traces of other shapes and vendors (`--sizes
none` for those alone), each row named as given. Medians of the repeats; at 1 GB one repeat and no peers by default. The
ratio of the fastest runs is printed beside the medians' (a busy machine only ever adds time).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from load_speed import machine_info  # noqa: E402
from report_vs_peers import HTA, PY, REPO, RESULTS, SHARED, TB, decompressed_mb, measured, trace_for  # noqa: E402


FLOOR = REPO / "benchmarks" / "floor.py"

STAGES = r"""
import gc, json, os, sys, time
gc.disable()  # as `advisor report` runs (advisor.cli.program): the stages' figures without collector passes
t0 = time.process_time()
import advisor.analysis as A, advisor.engine.running as E, advisor.cli as C
spent = {}
depth = [0]
def timed(name, fn):
    def wrapper(*a, **k):
        depth[0] += 1
        t = time.process_time()
        try:
            return fn(*a, **k)
        finally:
            depth[0] -= 1
            if depth[0] == 0:
                spent[name] = spent.get(name, 0.0) + time.process_time() - t
    return wrapper
A.load_cached = timed("load", A.load_cached)
A.compute_metrics = timed("metrics", A.compute_metrics)
E.check_rank_rules = timed("rules", E.check_rank_rules)
E.settle_by_replay = timed("replay", E.settle_by_replay)
A.rank_view = timed("view", A.rank_view)
spent["imports"] = time.process_time() - t0
sys.argv = ["advisor", "report", sys.argv[1], "--format", "json", "-o", os.devnull]
try:
    C.main()
except SystemExit:
    pass
spent["process"] = time.process_time()
print("STAGES " + json.dumps(spent), file=sys.stderr)
"""

# A cached command timed in-process: from the call to the output (the imports apart).
CACHED = r"""
import os, sys, time
import advisor.cli as C
import advisor.analysis, advisor.render.html, advisor.output, advisor.cli.whatif  # imports apart
t, c = time.perf_counter(), time.process_time()
sys.argv = ["advisor", *sys.argv[1:]]
try:
    C.main()
except SystemExit:
    pass
print("INPROCESS %.4f %.4f" % (time.process_time() - c, time.perf_counter() - t), file=sys.stderr)
"""


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _median(runs: list[dict], keys=("cpu_s", "wall_s", "peak_rss_mb")) -> dict:
    ok = [r for r in runs if r.get("rc") == 0]
    if not ok:
        return {"error": (runs[0]["stderr"].strip().splitlines() or ["failed"])[-1] if runs else "not run"}
    out = {k: statistics.median(r[k] for r in ok if k in r) for k in keys if any(k in r for r in ok)} | {"runs": len(ok)}
    if any("cpu_s" in r for r in ok):
        out["fastest_cpu_s"] = min(r["cpu_s"] for r in ok if "cpu_s" in r)  # a shared machine only ever adds time
    return out


def _tag(stderr: str, tag: str) -> str | None:
    line = next((l for l in stderr.splitlines() if l.startswith(tag)), None)
    return line[len(tag) + 1 :] if line else None


def compiled() -> None:
    """The advisor's modules compiled to bytecode first, as an installed package has them: with
    PYTHONDONTWRITEBYTECODE set, every cold run would otherwise compile them from source (about
    0.1-0.2 s of CPU here) and count it as the report's."""
    import compileall

    for folder in ("advisor", "rules"):
        compileall.compile_dir(str(REPO / folder), quiet=1)


def held_out(name: str) -> Path:
    """A trace of ../shared/traces by its path there (corpus/mi300x_xdit_flux_infer.json.gz), or any path."""
    path = Path(name)
    return path if path.exists() else SHARED / name


def bench(size: str, repeat: int, tools: list[str], trace: Path | None = None) -> dict:
    trace = trace or trace_for(size)
    compiled()
    mb = decompressed_mb(trace)
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "ADVISOR_CACHE": "off"}
    runs: dict[str, list[dict]] = {k: [] for k in ("floor", "json", "html", *tools)}
    stages: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="advisor-floor-") as tmp:
        single = Path(tmp) / "trace" / trace.name  # HTA reads a folder holding only this trace
        single.parent.mkdir()
        os.symlink(trace, single)
        html = Path(tmp) / "report.html"
        for i in range(repeat):
            runs["floor"].append(measured([PY, str(FLOOR), str(trace)], env))
            runs["json"].append(measured([PY, "-m", "advisor", "report", str(trace), "-f", "json", "-o", os.devnull], env))
            runs["html"].append(measured([PY, "-m", "advisor", "report", str(trace), "-o", str(html)], env))
            if "tb" in tools:
                runs["tb"].append(measured([PY, "-c", TB, str(trace)], env))
            if "hta" in tools:
                runs["hta"].append(measured([PY, "-c", HTA, str(single)], env))
            s = measured([PY, "-c", STAGES, str(trace)], env)
            got = _tag(s["stderr"], "STAGES")
            if got:
                stages.append(json.loads(got))
            print(f"  {size} repeat {i + 1}: floor {runs['floor'][-1]['cpu_s']:.2f} s, json {runs['json'][-1]['cpu_s']:.2f} s", flush=True)
        # Cached: the cache filled once (a cold report stores its analysis), then HTML and whatif.
        warm = {**env, "ADVISOR_CACHE": str(Path(tmp) / "cache")}
        measured([PY, "-m", "advisor", "report", str(trace), "-f", "json", "-o", os.devnull], warm)
        cached: dict[str, list[dict]] = {"html": [], "whatif": []}
        for _ in range(repeat):
            for name, args in (("html", ["report", str(trace), "-o", str(html)]), ("whatif", ["whatif", str(trace)])):
                r = measured([PY, "-c", CACHED, *args], warm)
                got = _tag(r["stderr"], "INPROCESS")
                if got:
                    r["inprocess_cpu_s"], r["inprocess_wall_s"] = (float(x) for x in got.split())
                cached[name].append(r)
    row: dict = {"size": size, "trace": str(trace), "decompressed_mb": mb}
    for k, v in runs.items():
        row[k] = _median(v)
    if stages:
        row["stages"] = {k: statistics.median(s.get(k, 0.0) for s in stages) for k in stages[0]}
    row["cached"] = {k: _median(v, ("cpu_s", "wall_s", "inprocess_cpu_s", "inprocess_wall_s")) for k, v in cached.items()}
    f, j, h = row["floor"], row["json"], row["html"]
    if "cpu_s" in f and "cpu_s" in j:
        row["json_over_floor"] = j["cpu_s"] / f["cpu_s"]
        row["fastest_json_over_fastest_floor"] = j["fastest_cpu_s"] / f["fastest_cpu_s"]
    if "cpu_s" in j and "cpu_s" in h:
        row["html_over_json"] = h["cpu_s"] / j["cpu_s"]
    if "peak_rss_mb" in j:
        row["json_peak_over_decompressed"] = j["peak_rss_mb"] / mb
    return row


def table(rows: list[dict]) -> list[str]:
    out = []
    for r in rows:
        f, j, h = r["floor"], r["json"], r["html"]
        out.append(f"{r['size']} ({r['decompressed_mb']:.0f} MB of JSON, {r['json'].get('runs', 0)} run(s) each, CPU s of the whole process, medians)")
        out.append(f"  floor            {f.get('cpu_s', float('nan')):7.2f} s  peak {f.get('peak_rss_mb', float('nan')):6.0f} MB")
        out.append(
            f"  cold JSON report {j.get('cpu_s', float('nan')):7.2f} s  peak {j.get('peak_rss_mb', float('nan')):6.0f} MB  "
            f"= {r.get('json_over_floor', float('nan')):.2f}x the floor (fastest runs: {r.get('fastest_json_over_fastest_floor', float('nan')):.2f}x), "
            f"peak {r.get('json_peak_over_decompressed', float('nan')):.2f}x the JSON's size"
        )
        out.append(f"  cold HTML report {h.get('cpu_s', float('nan')):7.2f} s  peak {h.get('peak_rss_mb', float('nan')):6.0f} MB  = {r.get('html_over_json', float('nan')):.2f}x the cold JSON")
        st = r.get("stages")
        if st:
            total = st.get("process") or 1.0
            named = ["imports", "load", "metrics", "rules", "replay", "view"]
            rest = total - sum(st.get(k, 0.0) for k in named)
            out.append("  stages (CPU s, share): " + ", ".join(f"{k} {st.get(k, 0.0):.2f} ({100 * st.get(k, 0.0) / total:.0f}%)" for k in named) + f", rest {rest:.2f} ({100 * rest / total:.0f}%)")
        for k, c in r["cached"].items():
            out.append(
                f"  cached {k:6s}    {c.get('inprocess_cpu_s', float('nan')):7.2f} s CPU in process, from the call to the output "
                f"({c.get('inprocess_wall_s', float('nan')):.2f} s wall; {c.get('cpu_s', float('nan')):.2f} s CPU with interpreter start and imports)"
            )
        for t, label in (("tb", "TensorBoard plugin"), ("hta", "HTA")):
            if t in r:
                p = r[t]
                out.append(f"  {label:16s} {p.get('cpu_s', float('nan')):7.2f} s  peak {p.get('peak_rss_mb', float('nan')):6.0f} MB" if "cpu_s" in p else f"  {label}: {p.get('error')}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="34MB,87MB,1GB")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--tools", default="tb,hta", help="peers to run where installed (tb, hta); empty or none: no peer")
    ap.add_argument("--traces", default="", help="also these traces, comma-separated: paths under ../shared/traces (corpus/NAME.json.gz) or any path")
    ap.add_argument("--out", default=str(RESULTS / "report_vs_floor"))
    args = ap.parse_args()
    extra = [t for t in args.traces.split(",") if t]
    missing = [t for t in extra if not held_out(t).exists()]
    if missing:
        ap.error(f"--traces: no such trace {missing[0]!r} (here or under {SHARED})")
    wanted = [t for t in args.tools.split(",") if t and t != "none"]
    unknown = [t for t in wanted if t not in ("tb", "hta")]
    if unknown:
        ap.error(f"--tools: unknown peer {unknown[0]!r} (tb, hta, or none)")
    tools = [t for t in wanted if installed({"tb": "torch_tb_profiler", "hta": "hta"}[t])]
    out = Path(args.out)
    done: list[dict] = json.loads(out.with_suffix(".json").read_text())["rows"] if out.with_suffix(".json").exists() else []
    sizes = [s for s in args.sizes.split(",") if s and s != "none"]
    labels = [*sizes, *extra]
    done = [r for r in done if r["size"] not in labels]
    for size, trace in [*((s, None) for s in sizes), *((t, held_out(t)) for t in extra)]:
        big = size.upper().endswith("GB")
        row = bench(size, 1 if big else args.repeat, [] if big else tools, trace)
        done.append(row)
        order = {s: i for i, s in enumerate(["34MB", "51MB", "87MB", "1GB"])}
        done.sort(key=lambda r: order.get(r["size"], 99))
        doc = {"machine": machine_info(), "not_installed": [t for t in wanted if t not in tools], "rows": done}
        out.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
        lines = [__doc__.splitlines()[0], f"machine: {json.dumps(machine_info())}", f"not installed: {', '.join(doc['not_installed']) or 'none'}", *table(done)]
        out.with_suffix(".txt").write_text("\n".join(lines) + "\n")
        print("\n".join(table([row])), flush=True)


if __name__ == "__main__":
    main()
