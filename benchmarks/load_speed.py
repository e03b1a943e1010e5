"""Loader speed and memory, measured side by side in one run (issue 2).

Prints and records (benchmarks/results/load_speed.{txt,json}):

1. Parse into frames vs a bare `orjson.loads` of the same decompressed bytes, per shared
   trace (in this process, interleaved, best of N). Target: frames <= 1.5x orjson.
2. `advisor report --format json` on the largest shared trace vs `python -c` doing
   gzip + orjson.loads of it (fresh processes, interleaved, median of N; frames cache off).
   Target: <= 2.5x. Plus a check that `report` never imports torch.
3. Loading the same files with torch-tb-profiler's `RunProfileData.parse` and HTA's
   `TraceAnalysis` (each in a fresh process: wall time of the load call and peak RSS of
   the process tree), next to advisor's `load_trace`. Goal: >= 4x faster, peak RSS no higher.
   HTA lives in its own venv (default /tmp/hta-venv; `--hta-python`), never in the project's.

    python benchmarks/load_speed.py [--repeat 5] [--hta-python /tmp/hta-venv/bin/python] [--only report]

`--only parse|report|tools` runs one section and prints it, without touching the recorded results.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "traces"
RESULTS = REPO / "benchmarks" / "results"
sys.path.insert(0, str(REPO))

from advisor.load.decode import read_trace_bytes
from advisor.load.trace import frames_from_bytes


def machine_info() -> dict:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    versions = {}
    for mod in ("orjson", "msgspec", "numpy", "pandas", "pyarrow"):
        try:
            versions[mod] = __import__(mod).__version__
        except ImportError:
            versions[mod] = None
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gb": round(mem_gb, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_average_at_start": os.getloadavg(),
        "versions": versions,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def shared_traces() -> list[Path]:
    if not SHARED.is_dir():
        sys.exit(f"no traces at {SHARED}")
    return sorted((p for p in SHARED.rglob("*.json.gz") if ".advisor-cache" not in p.parts), key=lambda p: p.stat().st_size)


# --- 1. frames vs orjson.loads, in process ----------------------------------------------------
def timed(fn) -> float:
    gc.collect()
    start = time.perf_counter()
    out = fn()
    elapsed = time.perf_counter() - start
    del out
    return elapsed


def bare_orjson(data: bytes):
    """orjson.loads as the loader would use it: GC paused (it is the fastest way to call it)."""
    gc.disable()
    try:
        return orjson.loads(data)
    finally:
        gc.enable()


def parse_vs_orjson(paths: list[Path], repeat: int) -> list[dict]:
    rows = []
    for path in paths:
        data = bytes(read_trace_bytes(path))
        o_gc, o_nogc, f = [], [], []
        for _ in range(repeat):  # interleaved, so load changes hit all three alike
            o_gc.append(timed(lambda data=data: orjson.loads(data)))
            o_nogc.append(timed(lambda data=data: bare_orjson(data)))
            f.append(timed(lambda path=path, data=data: frames_from_bytes(path, data)))
        row = {
            "trace": str(path.relative_to(SHARED)),
            "mb": len(data) / 2**20,
            "orjson_s": min(o_nogc),
            "orjson_gc_on_s": min(o_gc),
            "frames_s": min(f),
        }
        row["ratio"] = row["frames_s"] / row["orjson_s"]  # vs orjson with the GC paused (stricter)
        row["ratio_bare"] = row["frames_s"] / row["orjson_gc_on_s"]  # vs a bare orjson.loads call
        row["frames_mb_s"] = row["mb"] / row["frames_s"]
        row["orjson_mb_s"] = row["mb"] / row["orjson_s"]
        rows.append(row)
    return rows


# --- 2. whole report vs python -c gzip+orjson --------------------------------------------------
def run_wall(cmd: list[str], env: dict) -> float:
    start = time.perf_counter()
    p = subprocess.run(cmd, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, text=True)
    elapsed = time.perf_counter() - start
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {p.stderr[-2000:]}")
    return elapsed


def report_vs_python(path: Path, repeat: int) -> dict:
    env = {**os.environ, "ADVISOR_CACHE": "off", "PYTHONWARNINGS": "ignore"}
    baseline = [sys.executable, "-c", "import gzip, sys, orjson; orjson.loads(gzip.decompress(open(sys.argv[1], 'rb').read()))", str(path)]
    report = [sys.executable, "-m", "advisor", "report", "--format", "json", str(path)]
    b, r = [], []
    for _ in range(repeat):
        b.append(run_wall(baseline, env))
        r.append(run_wall(report, env))
    # report never imports torch
    script = (
        "import sys; sys.argv=['advisor','report','--format','json',sys.argv[1]]\n"
        "from advisor.cli import main\n"
        "try:\n main()\nexcept SystemExit: pass\n"
        "print('TORCH' if any(m == 'torch' or m.startswith('torch.') for m in sys.modules) else 'NO-TORCH', file=sys.stderr)"
    )
    probe = subprocess.run(
        [sys.executable, "-c", script, str(path)],
        check=False, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
    )
    return {
        "trace": str(path.relative_to(SHARED)),
        "python_gzip_orjson_s": statistics.median(b),
        "advisor_report_json_s": statistics.median(r),
        "ratio": statistics.median(r) / statistics.median(b),
        "runs": repeat,
        "report_imports_torch": "NO-TORCH" not in probe.stderr,
    }


# --- 3. other tools, each in a fresh process -------------------------------------------------
PROBE = r"""
import json, os, resource, sys, threading, time
def tree_rss_kb():
    total = 0
    pids = [os.getpid()]
    seen = set()
    while pids:
        pid = pids.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            for line in open(f"/proc/{pid}/status"):
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
            for task in os.listdir(f"/proc/{pid}/task"):
                pids += [int(c) for c in open(f"/proc/{pid}/task/{task}/children").read().split()]
        except (OSError, ValueError):
            pass
    return total
peak = [0]
stop = threading.Event()
def sample():
    while not stop.is_set():
        peak[0] = max(peak[0], tree_rss_kb())
        time.sleep(0.01)
tool, target = sys.argv[1], sys.argv[2]
t0 = time.perf_counter()
if tool == "advisor":
    from advisor.load.trace import load_trace
    load = lambda: load_trace(target)
elif tool == "tb":
    from torch_tb_profiler.profiler.data import RunProfileData
    load = lambda: RunProfileData.parse("worker0", 0, target, None)
elif tool == "hta":
    import logging
    logging.disable(logging.CRITICAL)
    from hta.trace_analysis import TraceAnalysis
    load = lambda: TraceAnalysis(trace_dir=os.path.dirname(target))
imported = time.perf_counter() - t0
threading.Thread(target=sample, daemon=True).start()
t1 = time.perf_counter()
out = load()
elapsed = time.perf_counter() - t1
stop.set()
peak[0] = max(peak[0], tree_rss_kb())
# VmHWM, not ru_maxrss: on Linux ru_maxrss survives exec, so it would report the parent's peak
self_hwm = int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM:")).split()[1])
print(json.dumps({"load_s": elapsed, "import_s": imported, "peak_rss_mb": max(peak[0], self_hwm) / 1024}))
"""


def probe(python: str, tool: str, trace: Path, env: dict | None = None) -> dict | None:
    p = subprocess.run([python, "-c", PROBE, tool, str(trace)], check=False, capture_output=True, text=True, env=env, timeout=1800)
    if p.returncode != 0:
        return {"error": (p.stderr.strip().splitlines() or ["failed"])[-1][:300]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def other_tools(traces: list[Path], hta_python: str | None, repeat: int) -> list[dict]:
    rows = []
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    for trace in traces:
        # HTA reads a folder of traces: give it a folder holding only this one
        with tempfile.TemporaryDirectory(prefix="advisor-bench-") as tmp:
            single = Path(tmp) / trace.name
            shutil.copyfile(trace, single)
            row = {"trace": str(trace.relative_to(SHARED)), "mb": len(read_trace_bytes(trace)) / 2**20}
            for tool, python in (("advisor", sys.executable), ("tb", sys.executable), ("hta", hta_python)):
                if python is None:
                    row[tool] = {"error": "not installed"}
                    continue
                runs = [probe(python, tool, single, env) for _ in range(repeat)]
                ok = [r for r in runs if "error" not in r]
                row[tool] = {
                    "load_s": min(r["load_s"] for r in ok),
                    "peak_rss_mb": max(r["peak_rss_mb"] for r in ok),
                } if ok else runs[0]
            for tool in ("tb", "hta"):
                if "load_s" in row[tool] and "load_s" in row["advisor"]:
                    row[f"speedup_vs_{tool}"] = row[tool]["load_s"] / row["advisor"]["load_s"]
                    row[f"rss_vs_{tool}"] = row["advisor"]["peak_rss_mb"] / row[tool]["peak_rss_mb"]
            rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--hta-python", default="/tmp/hta-venv/bin/python")
    ap.add_argument("--out", type=Path, default=RESULTS / "load_speed")
    ap.add_argument("--only", choices=("parse", "report", "tools"), help="run one section; the recorded results are left as they are")
    args = ap.parse_args()
    hta = args.hta_python if Path(args.hta_python).exists() else None

    info = machine_info()
    traces = shared_traces()
    largest = max(traces, key=lambda p: len(read_trace_bytes(p)))  # by uncompressed size
    lines = [f"machine: {info['cpu']}, {info['cores']} cores, {info['memory_gb']} GB, Python {info['python']}, load avg {info['load_average_at_start']}"]
    if args.only:
        section = {"parse": lambda: parse_vs_orjson(traces, args.repeat), "report": lambda: report_vs_python(largest, args.repeat),
                   "tools": lambda: other_tools([t for t in traces if t.stat().st_size > 500_000], hta, max(1, args.repeat // 2))}[args.only]
        print(lines[0])
        print(json.dumps(section(), indent=2))
        return

    parse_rows = parse_vs_orjson(traces, args.repeat)
    lines.append(f"\n1. parse into frames vs orjson.loads of the same decompressed bytes (in process, interleaved, best of {args.repeat})")
    lines.append("   bare = orjson.loads(data) as called (GC on); paused = orjson.loads with the cyclic GC paused, as the loader runs")
    lines.append(f"{'trace':58s} {'MB':>6s} {'bare s':>7s} {'paused s':>8s} {'frames s':>8s} {'x bare':>6s} {'x paused':>8s} {'frames MB/s':>11s}")
    for r in parse_rows:
        lines.append(
            f"{r['trace']:58s} {r['mb']:6.1f} {r['orjson_gc_on_s']:7.3f} {r['orjson_s']:8.3f} {r['frames_s']:8.3f} "
            f"{r['ratio_bare']:6.2f} {r['ratio']:8.2f} {r['frames_mb_s']:11.0f}"
        )
    big = [r for r in parse_rows if r["mb"] >= 5]
    worst = max(big, key=lambda r: r["ratio_bare"])
    strict = max(big, key=lambda r: r["ratio"])
    lines.append(f"target <= 1.5x a bare orjson.loads, traces >= 5 MB: worst {worst['ratio_bare']:.2f}x ({worst['trace']}) -> {'PASS' if worst['ratio_bare'] <= 1.5 else 'FAIL'}")
    lines.append(f"stricter, vs orjson with the GC paused: worst {strict['ratio']:.2f}x ({strict['trace']}), largest trace {max(parse_rows, key=lambda r: r['mb'])['ratio']:.2f}x")

    rep = report_vs_python(largest, args.repeat)
    lines.append(f"\n2. `advisor report --format json` vs `python -c gzip+orjson.loads` on {rep['trace']} (median of {rep['runs']}, fresh processes, cache off)")
    lines.append(f"python -c: {rep['python_gzip_orjson_s']:.2f} s   advisor report: {rep['advisor_report_json_s']:.2f} s   ratio {rep['ratio']:.2f} (target <= 2.5) -> {'PASS' if rep['ratio'] <= 2.5 else 'FAIL'}")
    lines.append(f"report imports torch: {rep['report_imports_torch']}")

    tool_traces = [t for t in traces if t.stat().st_size > 500_000]
    tool_rows = other_tools(tool_traces, hta, max(1, args.repeat // 2))
    lines.append("\n3. load time and peak RSS (process tree) per tool, fresh process each (best time / worst RSS)")
    lines.append(f"{'trace':45s} {'MB':>6s} | {'advisor s':>9s} {'MB':>5s} | {'tb-plugin s':>11s} {'MB':>5s} | {'HTA s':>7s} {'MB':>5s} | {'x tb':>5s} {'x HTA':>6s}")

    def cell(d: dict, w: int) -> str:
        return f"{d['load_s']:{w}.2f} {d['peak_rss_mb']:5.0f}" if "load_s" in d else f"{'n/a':>{w}s} {'':5s}"

    for r in tool_rows:
        lines.append(
            f"{r['trace']:45s} {r['mb']:6.1f} | {cell(r['advisor'], 9)} | {cell(r['tb'], 11)} | {cell(r['hta'], 7)} | "
            f"{r.get('speedup_vs_tb', float('nan')):5.1f} {r.get('speedup_vs_hta', float('nan')):6.1f}"
        )
    for tool in ("tb", "hta"):
        ok = [r for r in tool_rows if f"speedup_vs_{tool}" in r]
        if ok:
            slow = min(ok, key=lambda r: r[f"speedup_vs_{tool}"])
            heavy = max(ok, key=lambda r: r[f"rss_vs_{tool}"])
            lines.append(
                f"vs {tool}: at least {slow[f'speedup_vs_{tool}']:.1f}x faster (goal 4x) -> {'PASS' if slow[f'speedup_vs_{tool}'] >= 4 else 'FAIL'}; "
                f"peak RSS at most {heavy[f'rss_vs_{tool}']:.2f}x theirs (goal <= 1) -> {'PASS' if heavy[f'rss_vs_{tool}'] <= 1 else 'FAIL'}"
            )
        else:
            lines.append(f"vs {tool}: not measured ({tool_rows[0][tool].get('error') if tool_rows else 'no traces'})")

    text = "\n".join(lines)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".txt").write_text(text + "\n")
    args.out.with_suffix(".json").write_text(json.dumps({"machine": info, "parse_vs_orjson": parse_rows, "report_vs_python": rep, "tools": tool_rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
