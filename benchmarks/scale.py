"""Issue 7 targets, measured side by side in one run on this machine.

1. A 1 GB (uncompressed) single-rank trace, a scaled copy made by make_large_trace.py:
   `advisor report --format json` wall time (target < 60 s) and peak RSS of the process tree
   (target < 2x the uncompressed size); load throughput in MB/s next to `orjson.loads` of
   the same bytes and next to torch-tb-profiler's and HTA's loaders (where they finish).
2. The second report of the same trace (target < 2 s): from the analysis cache (metrics and
   findings; the frames cache behind it), as JSON and as text, and `advisor gate` on it.
3. 64 ranks of ~50 MB: per-rank summaries with 1 and 2 worker processes (speed-up), and peak
   RSS with 16 and 64 ranks (bounded by the worker count, not the rank count).

Big files go to /tmp/advisor-bench (made on first use, reused after). Results:
benchmarks/results/scale.{txt,json}.

    python benchmarks/scale.py [--size 1GB] [--ranks 64] [--rank-size 50MB] [--skip-tools]
                               [--skip-1gb | --skip-ranks]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO))

from load_speed import machine_info
from make_large_trace import parse_size

BENCH = Path(os.environ.get("ADVISOR_BENCH_DIR", "/tmp/advisor-bench"))
RESULTS = REPO / "benchmarks" / "results"
PY = sys.executable


def tree_rss_mb(root: int) -> float:
    """Resident memory of a process and all its descendants (from /proc)."""
    total, todo, seen = 0, [root], set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except (OSError, ValueError):
            pass
    return total / 1024


def run_measured(cmd: list[str], env: dict | None = None, timeout: float = 1800) -> dict:
    """Wall time, exit code and peak RSS of the whole process tree (sampled every 20 ms)."""
    peak = [0.0]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], tree_rss_mb(proc.pid))
            time.sleep(0.02)

    threading.Thread(target=sample, daemon=True).start()
    try:
        out, err = proc.communicate(timeout=timeout)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        code = "timeout"
    done.set()
    return {"wall_s": time.perf_counter() - start, "peak_rss_mb": peak[0], "rc": code, "stdout": out, "stderr": err[-1500:]}


def ensure_trace(size: int) -> Path:
    path = BENCH / f"scaled_{size // 2**20}MB.pt.trace.json"
    if not path.exists():
        subprocess.run([PY, str(REPO / "benchmarks" / "make_large_trace.py"), "--size", f"{size // 2**20}MB", "--out", str(path)], check=True)
    return path


def ensure_ranks(n: int, size: int) -> Path:
    folder = BENCH / f"ranks{n}_{size // 2**20}MB"
    if not folder.is_dir() or len(list(folder.glob("rank-*.pt.trace.json.gz"))) != n:
        shutil.rmtree(folder, ignore_errors=True)
        subprocess.run([PY, str(REPO / "benchmarks" / "make_large_trace.py"), "--source", "misc/a100_80gb_train.json.gz",
                        "--size", f"{size // 2**20}MB", "--ranks", str(n), "--gzip", "--out", str(folder)], check=True)
    return folder


LOAD_PROBE = {
    "orjson": "import sys, gc, time, orjson\nfrom advisor.load.decode import read_trace_bytes\nd = bytes(read_trace_bytes(sys.argv[1]))\ngc.disable()\nt = time.perf_counter(); orjson.loads(d); print(time.perf_counter() - t)",
    "advisor": "import sys, time\nfrom advisor.load.trace import load_trace\nt = time.perf_counter(); load_trace(sys.argv[1]); print(time.perf_counter() - t)",
    "tb": "import sys, time\nfrom torch_tb_profiler.profiler.data import RunProfileData\nt = time.perf_counter(); RunProfileData.parse('worker0', 0, sys.argv[1], None); print(time.perf_counter() - t)",
    "hta": "import sys, os, time, logging\nlogging.disable(logging.CRITICAL)\nfrom hta.trace_analysis import TraceAnalysis\nt = time.perf_counter(); TraceAnalysis(trace_dir=os.path.dirname(sys.argv[1])); print(time.perf_counter() - t)",
}

SUMMARY_PROBE = """
import os, sys, time, json
from pathlib import Path
from advisor.load.parallel import map_ranks, rank_summary
paths = sorted(Path(sys.argv[1]).glob("rank-*.pt.trace.json.gz"), key=lambda p: int(p.name.split("-")[1].split(".")[0]))[: int(sys.argv[3])]
t = time.perf_counter()
out = [s for _, s in map_ranks(rank_summary, paths, workers=int(sys.argv[2]))]
print(json.dumps({"s": time.perf_counter() - t, "ranks": len(out), "errors": sum(1 for s in out if s.error), "steps": sum(s.steps for s in out)}))
"""


def one_gb(size: int, tools: bool, tool_timeout: float) -> tuple[list[str], dict]:
    trace = ensure_trace(size)
    mb = trace.stat().st_size / 2**20
    lines = [f"\n1. single-rank trace {trace.name}: {mb:.0f} MB uncompressed (scaled copy of a real trace)"]
    data: dict = {"trace": str(trace), "mb": mb}
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    # report: first (parses, writes both caches), second (reads the analysis cache)
    shutil.rmtree(trace.parent / ".advisor-cache", ignore_errors=True)
    report = [PY, "-m", "advisor", "report", "--format", "json", str(trace)]
    first = run_measured(report, env)
    second = run_measured(report, env)
    second_text = run_measured([PY, "-m", "advisor", "report", str(trace)], {**env, "COLUMNS": "120"})
    gate = run_measured([PY, "-m", "advisor", "gate", str(trace), "--max-step-time-ms", "1e9"], env)
    nocache = run_measured(report, {**env, "ADVISOR_CACHE": "off"})
    runs = (("first report (parse + write cache)", first), ("second report (from cache)", second), ("second report, text", second_text),
            ("gate (from cache)", gate), ("report with cache off", nocache))
    for label, r in runs:
        if r["rc"] != 0:
            lines.append(f"{label}: FAILED rc={r['rc']} {r['stderr'][-300:]}")
    if second["stdout"] != nocache["stdout"] or first["stdout"] != nocache["stdout"]:
        lines.append("report from the cache differs from the report with cache off: FAIL")
    data["second_report_identical"] = second["stdout"] == nocache["stdout"]
    for key, r in (("report_first", first), ("report_second", second), ("report_second_text", second_text), ("gate_second", gate), ("report_cache_off", nocache)):
        data[key] = {k: r[k] for k in ("wall_s", "peak_rss_mb", "rc")}
    lines.append(f"report, cache off:              {nocache['wall_s']:6.1f} s  peak RSS {nocache['peak_rss_mb']:6.0f} MB ({nocache['peak_rss_mb'] / mb:.2f}x the trace)")
    lines.append(f"report, first (writes cache):   {first['wall_s']:6.1f} s  peak RSS {first['peak_rss_mb']:6.0f} MB ({first['peak_rss_mb'] / mb:.2f}x)"
                 f"  target < 60 s and < 2x -> {'PASS' if first['wall_s'] < 60 and first['peak_rss_mb'] < 2 * mb else 'FAIL'}")
    lines.append(f"report, second (from cache):    {second['wall_s']:6.1f} s  peak RSS {second['peak_rss_mb']:6.0f} MB"
                 f"  target < 2 s -> {'PASS' if second['wall_s'] < 2 else 'FAIL'}"
                 f"  (same bytes as cache off: {'yes' if data['second_report_identical'] else 'NO'})")
    lines.append(f"report, second, text:           {second_text['wall_s']:6.1f} s  peak RSS {second_text['peak_rss_mb']:6.0f} MB")
    lines.append(f"gate, second (from cache):      {gate['wall_s']:6.1f} s  peak RSS {gate['peak_rss_mb']:6.0f} MB")
    # loaders alone, same bytes
    lines.append("load alone (fresh process each; time of the load call, peak RSS of the process tree):")
    data["loaders"] = {}
    for tool in ("orjson", "advisor", "tb", "hta"):
        if tool in ("tb", "hta") and not tools:
            continue
        python = "/tmp/hta-venv/bin/python" if tool == "hta" else PY
        if not Path(python).exists():
            lines.append(f"  {tool:8s} not installed")
            continue
        target = trace
        tmp = None
        if tool == "hta":  # HTA reads every trace in a folder: give it one holding only this file
            tmp = BENCH / "hta_single"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            target = tmp / trace.name
            os.link(trace, target)
        r = run_measured([python, "-c", LOAD_PROBE[tool], str(target)], {**env, "PYTHONPATH": str(REPO)}, timeout=tool_timeout)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if r["rc"] == 0:
            secs = float(r["stdout"].strip().splitlines()[-1])
            data["loaders"][tool] = {"s": secs, "mb_s": mb / secs, "peak_rss_mb": r["peak_rss_mb"]}
            lines.append(f"  {tool:8s} {secs:7.1f} s  {mb / secs:6.0f} MB/s  peak RSS {r['peak_rss_mb']:6.0f} MB")
        else:
            why = f"did not finish in {tool_timeout:.0f} s" if r["rc"] == "timeout" else (r["stderr"].strip().splitlines() or ["failed"])[-1][:120]
            data["loaders"][tool] = {"error": why, "peak_rss_mb": r["peak_rss_mb"]}
            lines.append(f"  {tool:8s} {why} (peak RSS {r['peak_rss_mb']:.0f} MB)")
    return lines, data


def many_ranks(n: int, size: int) -> tuple[list[str], dict]:
    folder = ensure_ranks(n, size)
    files = sorted(folder.glob("rank-*.pt.trace.json.gz"))
    raw_mb = json.loads(subprocess.run([PY, "-c", "import sys, json\nfrom advisor.load.decode import read_trace_bytes\nprint(len(read_trace_bytes(sys.argv[1])) / 2**20)", str(files[0])],
                                       check=False, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}).stdout)
    lines = [f"\n3. {n} ranks of {raw_mb:.0f} MB each (gzip, scaled copies of a real trace): per-rank summaries via map_ranks"]
    env = {**os.environ, "ADVISOR_CACHE": "off", "PYTHONWARNINGS": "ignore", "PYTHONPATH": str(REPO)}
    data: dict = {"ranks": n, "rank_mb": raw_mb, "runs": []}
    for ranks, workers in ((n, 1), (n, 2), (max(2, n // 4), 2)):
        r = run_measured([PY, "-c", SUMMARY_PROBE, str(folder), str(workers), str(ranks)], env)
        if r["rc"] != 0:
            lines.append(f"  {ranks} ranks, {workers} workers: FAILED {r['stderr'][-300:]}")
            continue
        out = json.loads(r["stdout"].strip().splitlines()[-1])
        run = {"ranks": ranks, "workers": workers, "wall_s": r["wall_s"], "map_s": out["s"], "peak_rss_mb": r["peak_rss_mb"], "errors": out["errors"]}
        data["runs"].append(run)
        lines.append(f"  {ranks:3d} ranks, {workers} worker(s): {out['s']:6.1f} s ({ranks * raw_mb / out['s']:5.0f} MB/s)  peak RSS of all processes {r['peak_rss_mb']:6.0f} MB  errors {out['errors']}")
    one = next((x for x in data["runs"] if x["ranks"] == n and x["workers"] == 1), None)
    two = next((x for x in data["runs"] if x["ranks"] == n and x["workers"] == 2), None)
    few = next((x for x in data["runs"] if x["ranks"] != n), None)
    if one and two:
        data["speedup_1_to_2"] = one["map_s"] / two["map_s"]
        lines.append(f"  speed-up from 1 to 2 processes: {data['speedup_1_to_2']:.2f}x (2 cores)")
    if two and few:
        data["rss_ratio_all_vs_quarter"] = two["peak_rss_mb"] / few["peak_rss_mb"]
        lines.append(f"  peak RSS with {n} ranks vs {few['ranks']} ranks (2 workers): {two['peak_rss_mb']:.0f} vs {few['peak_rss_mb']:.0f} MB"
                     f" -> bounded by workers: {'PASS' if data['rss_ratio_all_vs_quarter'] < 1.25 else 'FAIL'}")
    return lines, data


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=parse_size, default=parse_size("1GB"))
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--rank-size", type=parse_size, default=parse_size("50MB"))
    ap.add_argument("--skip-tools", action="store_true", help="do not run torch-tb-profiler and HTA on the big trace")
    ap.add_argument("--skip-1gb", action="store_true", help="skip sections 1-2 (the single-rank trace)")
    ap.add_argument("--skip-ranks", action="store_true", help="skip section 3 (many ranks); with --skip-tools, only the reports and loaders of 1-2 run")
    ap.add_argument("--tool-timeout", type=float, default=900)
    ap.add_argument("--out", type=Path, default=RESULTS / "scale")
    args = ap.parse_args()
    BENCH.mkdir(parents=True, exist_ok=True)
    info = machine_info()
    lines = [f"machine: {info['cpu']}, {info['cores']} cores, {info['memory_gb']} GB, Python {info['python']}, load avg {info['load_average_at_start']}"]
    result: dict = {"machine": info}
    if not args.skip_1gb:
        more, result["single_rank"] = one_gb(args.size, not args.skip_tools, args.tool_timeout)
        lines += more
    if not args.skip_ranks:
        more, result["many_ranks"] = many_ranks(args.ranks, args.rank_size)
        lines += more
    text = "\n".join(lines)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".txt").write_text(text + "\n")
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
