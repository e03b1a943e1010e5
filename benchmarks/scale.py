"""Issue 7 targets, measured side by side in one run on this machine.

1. A 1 GB (uncompressed) single-rank trace, a scaled copy made by make_large_trace.py:
   `advisor report --format json` wall time (target < 60 s) and peak RSS of the process tree
   (target < 2x the uncompressed size); load throughput in MB/s next to `orjson.loads` of
   the same bytes and next to torch-tb-profiler's and HTA's loaders (where they finish).
2. The second report of the same trace (target < 2 s): from the analysis cache (metrics and
   findings; the frames cache behind it), as JSON and as text, and `advisor gate` on it.
3. Whole jobs (issue 17): `advisor report --format json` on 16, 64 and 256 ranks (scaled
   copies of a real rank, one rank made slower: make_large_trace.py --slow-rank), on the local
   process pool and on a Dask LocalCluster started here (loopback, the same worker count):
   wall time, peak RSS of all processes (the report's process tree, plus the cluster's
   scheduler and workers) and of each group apart, whether both give the same JSON, and
   whether `straggler` names the slowed rank and its wait. The cluster's workers run without
   Dask's statistical profiler unless --cluster-profiler (see advisor/cluster.py).
   Results: benchmarks/results/scale_ranks.{txt,json} (--ranks-out), rewritten after each
   job size so that a run stopped part way keeps what it measured.

Big files go to /tmp/advisor-bench (made on first use, reused after). Results of 1-2:
benchmarks/results/scale.{txt,json}.

    python benchmarks/scale.py [--size 1GB] [--skip-tools] --skip-ranks
    python benchmarks/scale.py --skip-1gb [--jobs 16,64,256] [--rank-size 50MB] [--workers 2] [--schedulers pool,cluster]
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
    own, descendants = tree_rss_parts_mb(root)
    return own + descendants


def tree_rss_parts_mb(root: int) -> tuple[float, float]:
    """Resident memory of a process, and of all its descendants together (from /proc)."""
    own, rest, todo, seen = 0, 0, [root], set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        if pid == root:
                            own += int(line.split()[1])
                        else:
                            rest += int(line.split()[1])
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except (OSError, ValueError):
            pass
    return own / 1024, rest / 1024


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


SLOW_RANK = 5
DELAY_MS = 20.0
JOB_SOURCE = "a100_two_ranks/rank-0.json.gz"  # a real rank with NCCL collectives


def ensure_job(n: int, size: int) -> Path:
    """n ranks of ~size bytes (gzip) with rank SLOW_RANK made slower; smaller jobs reuse the
    first ranks of a larger one through links."""
    folder = BENCH / f"job{n}_{size // 2**20}MB"
    if folder.is_dir() and len(list(folder.glob("rank-*.pt.trace.json.gz"))) == n:
        return folder
    bigger = sorted((p for p in BENCH.glob(f"job*_{size // 2**20}MB") if int(p.name[3:].split("_")[0]) > n and len(list(p.glob("rank-*.pt.trace.json.gz"))) == int(p.name[3:].split("_")[0])), key=lambda p: p.name)
    shutil.rmtree(folder, ignore_errors=True)
    if bigger:
        folder.mkdir(parents=True)
        for r in range(n):
            os.link(bigger[0] / f"rank-{r}.pt.trace.json.gz", folder / f"rank-{r}.pt.trace.json.gz")
        return folder
    subprocess.run([PY, str(REPO / "benchmarks" / "make_large_trace.py"), "--source", JOB_SOURCE, "--size", f"{size // 2**20}MB", "--ranks", str(n),
                    "--slow-rank", str(SLOW_RANK), "--delay-ms", str(DELAY_MS), "--gzip", "--workers", "1", "--out", str(folder)], check=True)
    return folder


CLUSTER = """
import sys
from distributed import LocalCluster
cluster = LocalCluster(n_workers=int(sys.argv[1]), threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None)
print(cluster.scheduler_address, flush=True)
sys.stdin.read()  # until the benchmark closes our stdin
cluster.close()
"""


LOAD_PROBE = {
    "orjson": "import sys, gc, time, orjson\nfrom advisor.load.decode import read_trace_bytes\nd = bytes(read_trace_bytes(sys.argv[1]))\ngc.disable()\nt = time.perf_counter(); orjson.loads(d); print(time.perf_counter() - t)",
    "advisor": "import sys, time\nfrom advisor.load.trace import load_trace\nt = time.perf_counter(); load_trace(sys.argv[1]); print(time.perf_counter() - t)",
    "tb": "import sys, time\nfrom torch_tb_profiler.profiler.data import RunProfileData\nt = time.perf_counter(); RunProfileData.parse('worker0', 0, sys.argv[1], None); print(time.perf_counter() - t)",
    "hta": "import sys, os, time, logging\nlogging.disable(logging.CRITICAL)\nfrom hta.trace_analysis import TraceAnalysis\nt = time.perf_counter(); TraceAnalysis(trace_dir=os.path.dirname(sys.argv[1])); print(time.perf_counter() - t)",
}


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


def measure_job(cmd: list[str], env: dict, cluster: int | None = None, timeout: float = 3600) -> dict:
    """run_measured, with the cluster's processes (its scheduler, and its workers below it)
    added to every sample; also the peak of each part: the report's own process (the client),
    its pool (forkserver and workers), the scheduler, the cluster's workers."""
    peak = {"total": 0.0, "client": 0.0, "pool": 0.0, "scheduler": 0.0, "cluster_workers": 0.0}
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            now = dict(zip(("client", "pool"), tree_rss_parts_mb(proc.pid), strict=True))
            if cluster is not None:
                now.update(zip(("scheduler", "cluster_workers"), tree_rss_parts_mb(cluster), strict=True))
            for k, v in now.items():
                peak[k] = max(peak[k], v)
            peak["total"] = max(peak["total"], sum(now.values()))
            time.sleep(0.05)

    threading.Thread(target=sample, daemon=True).start()
    try:
        out, err = proc.communicate(timeout=timeout)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        code = "timeout"
    done.set()
    parts = {k: round(v, 1) for k, v in peak.items() if k != "total" and (cluster is not None or k in ("client", "pool"))}
    return {"wall_s": time.perf_counter() - start, "peak_rss_mb": peak["total"], "peak_rss_mb_by_part": parts, "rc": code, "stdout": out, "stderr": err[-1500:]}


def whole_jobs(sizes: list[int], size: int, workers: int, cluster_profiler: bool = False, schedulers: tuple[str, ...] = ("pool", "cluster"),
               progress_out: Path | None = None, header: tuple[list[str], dict] = ([], {})) -> tuple[list[str], dict]:
    """Section 3; with `progress_out`, the results so far are written after each job size."""
    header, header_data = header
    env = {**os.environ, "ADVISOR_CACHE": "off", "ADVISOR_WORKERS": str(workers), "PYTHONWARNINGS": "ignore", "PYTHONPATH": str(REPO)}
    folders = {n: ensure_job(n, size) for n in sorted(sizes, reverse=True)}
    first = next(iter(folders.values())) / "rank-0.pt.trace.json.gz"
    raw_mb = json.loads(subprocess.run([PY, "-c", "import sys\nfrom advisor.load.decode import read_trace_bytes\nprint(len(read_trace_bytes(sys.argv[1])) / 2**20)", str(first)],
                                       check=False, capture_output=True, text=True, env=env).stdout)
    gz_mb = first.stat().st_size / 2**20
    lines = [f"\n3. whole jobs: advisor report --format json, {workers} workers, ranks of {raw_mb:.1f} MB of JSON ({gz_mb:.1f} MB gzip),"
             f" scaled copies of {JOB_SOURCE} with rank {SLOW_RANK} {DELAY_MS:.0f} ms slower per step"]
    # Dask's statistical profiler keeps one profile per second on each worker, up to
    # distributed.admin.low-level-log-length (1000) of them: worker memory then grows with the
    # job's duration (see docs/design.md). The cluster runs as docs/design.md advises, without it,
    # unless --cluster-profiler.
    lines.append(f"   Dask workers' statistical profiler: {'on (Dask default)' if cluster_profiler else 'off (DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED=False)'}")
    cluster_env = {**env, "DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED": str(cluster_profiler)}
    data: dict = {"rank_mb": raw_mb, "rank_gzip_mb": gz_mb, "workers": workers, "slow_rank": SLOW_RANK, "delay_ms": DELAY_MS, "cluster_profiler": cluster_profiler, "schedulers": list(schedulers), "runs": []}
    nice = ["nice", "-n", "5"]
    for n in sorted(sizes):
        report = [*nice, PY, "-m", "advisor", "report", str(folders[n]), "--format", "json"]
        measured: dict[str, dict] = {}
        if "pool" in schedulers:
            measured["pool"] = measure_job(report, env)
        if "cluster" in schedulers:
            cluster = subprocess.Popen([*nice, PY, "-c", CLUSTER, str(workers)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=cluster_env)
            address = cluster.stdout.readline().strip()
            if not address.startswith("tcp://"):  # the cluster did not start (no `distributed`?)
                cluster.kill()
                raise SystemExit("scale.py: the Dask LocalCluster did not start (pip install 'torch-advisor[cluster]'), or pass --schedulers pool")
            measured["cluster"] = measure_job([*report, "--scheduler", address], env, cluster.pid)
            cluster.stdin.close()
            cluster.wait(timeout=120)
        keep = ("wall_s", "peak_rss_mb", "peak_rss_mb_by_part", "rc")
        run = {"ranks": n, **{kind: {k: r[k] for k in keep} for kind, r in measured.items()}}
        if len(measured) == 2:
            run["identical_json"] = measured["pool"]["rc"] == 0 and measured["pool"]["stdout"] == measured["cluster"]["stdout"]
        straggler = None
        first_ok = next((r for r in measured.values() if r["rc"] == 0), None)
        if first_ok is not None:
            report_json = json.loads(first_ok["stdout"])
            straggler = next((f for f in report_json["findings"] if f["rule"] == "straggler"), None)
            run["ranks_reported"] = len(report_json["ranks"])
        run["straggler"] = None if straggler is None else {"rank": straggler["rank"], "saving_ms": straggler["saving_ms"]}
        data["runs"].append(run)
        for kind, r in measured.items():
            label = {"pool": "local pool", "cluster": "Dask cluster"}[kind]
            if r["rc"] != 0:
                lines.append(f"  {n:3d} ranks, {label}: FAILED rc={r['rc']} {r['stderr'][-300:]}")
            else:
                parts = ", ".join(f"{k.replace('_', ' ')} {v:.0f}" for k, v in r["peak_rss_mb_by_part"].items())
                lines.append(f"  {n:3d} ranks, {label:12s}: {r['wall_s']:6.1f} s ({n * raw_mb / r['wall_s']:5.1f} MB/s)  peak RSS of all processes {r['peak_rss_mb']:6.0f} MB ({parts})")
        found = run["straggler"]
        named = "none" if found is None else f"rank {found['rank']}, {found['saving_ms']:.2f} ms/step"
        same = f"same JSON from both: {'yes' if run['identical_json'] else 'NO'}; " if "identical_json" in run else ""
        lines.append(f"       {same}straggler: {named} (made: rank {SLOW_RANK}, {DELAY_MS:.2f} ms/step)")
        if progress_out is not None:  # a long measurement keeps what it has if it is stopped
            write_results(progress_out, [*header, *lines], {**header_data, "whole_jobs": data}, echo=False)
    runs = sorted(data["runs"], key=lambda r: r["ranks"])
    for kind in schedulers:
        done = [r for r in runs if kind in r and r[kind]["rc"] == 0]
        if len(done) < 2:
            continue
        small, large = done[0], done[-1]
        a, b = small[kind]["peak_rss_mb"], large[kind]["peak_rss_mb"]
        data[f"rss_{large['ranks']}_vs_{small['ranks']}_{kind}"] = b / a if a else None
        lines.append(f"  peak RSS, {large['ranks']} vs {small['ranks']} ranks ({kind}): {b:.0f} vs {a:.0f} MB = {b / a:.3f}x -> within 10%: {'PASS' if a and abs(b / a - 1) <= 0.10 else 'FAIL'}")
    return lines, data


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=parse_size, default=parse_size("1GB"))
    ap.add_argument("--jobs", default="16,64,256", help="rank counts of section 3")
    ap.add_argument("--rank-size", type=parse_size, default=parse_size("50MB"))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--skip-tools", action="store_true", help="do not run torch-tb-profiler and HTA on the big trace")
    ap.add_argument("--skip-1gb", action="store_true", help="skip sections 1-2 (the single-rank trace)")
    ap.add_argument("--skip-ranks", action="store_true", help="skip section 3 (whole jobs); with --skip-tools, only the reports and loaders of 1-2 run")
    ap.add_argument("--tool-timeout", type=float, default=900)
    ap.add_argument("--out", type=Path, default=RESULTS / "scale")
    ap.add_argument("--cluster-profiler", action="store_true", help="section 3: leave the Dask workers' statistical profiler on (Dask's default)")
    ap.add_argument("--schedulers", default="pool,cluster", help="section 3: pool, cluster or both (the JSON is compared only with both)")
    ap.add_argument("--ranks-out", type=Path, default=RESULTS / "scale_ranks", help="where section 3 writes its .txt and .json")
    args = ap.parse_args()
    BENCH.mkdir(parents=True, exist_ok=True)
    info = machine_info()
    lines = [f"machine: {info['cpu']}, {info['cores']} cores, {info['memory_gb']} GB, Python {info['python']}, load avg {info['load_average_at_start']}"]
    result: dict = {"machine": info}
    if not args.skip_1gb:
        more, result["single_rank"] = one_gb(args.size, not args.skip_tools, args.tool_timeout)
        lines += more
    if not args.skip_1gb:
        write_results(args.out, lines, result)
    if not args.skip_ranks:
        schedulers = tuple(k for k in ("pool", "cluster") if k in args.schedulers.split(","))
        more, jobs = whole_jobs([int(x) for x in args.jobs.split(",")], args.rank_size, args.workers, args.cluster_profiler, schedulers,
                                progress_out=args.ranks_out, header=([lines[0]], {"machine": info}))
        write_results(args.ranks_out, [lines[0], *more], {"machine": info, "whole_jobs": jobs})


def write_results(out: Path, lines: list[str], result: dict, echo: bool = True) -> None:
    text = "\n".join(lines)
    if echo:
        print(text)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".txt").write_text(text + "\n")
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
