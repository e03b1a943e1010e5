"""Cold `advisor report` against the TensorBoard plugin's and HTA's whole analyses, per trace size.

    .venv/bin/python benchmarks/report_vs_peers.py [--sizes 34MB,51MB,87MB,1GB] [--repeat 3]
        [--out benchmarks/results/report_vs_peers]

Each measurement is a whole fresh process (imports included), run one after another and
interleaved per repeat (advisor, plugin, HTA, advisor warm, ...), so the machine's load
falls on all of them alike; medians of the repeats are reported:

- advisor cold: `python -m advisor report TRACE --format json`, `ADVISOR_CACHE=off`.
- advisor warm: the same with the cache in a scratch folder, after one cold run filled it
  (the report stored in the analysis entry, written as it is; results committed before
  reports were stored measured the analysis entry: no parse, no metrics, no rules; see
  warm_report.py for both).
- TensorBoard plugin (torch-tb-profiler, the `view` extra): `RunProfileData.parse` and
  `RunGenerator.generate_run_profile`, what the plugin does for each worker it shows.
- HTA (`pip install HolisticTraceAnalysis`, a benchmark-only install, never a dependency):
  `TraceAnalysis(trace_dir)`, then `get_temporal_breakdown`, `get_idle_time_breakdown` and
  `get_gpu_kernel_breakdown`.

CPU seconds (user + sys of the process, from wait4) are the headline: wall time on a shared
machine varies with the neighbours. Peak memory is the process's max RSS (wait4); none of
the tools starts a child process for a single trace. The advisor's replay share is measured
in a separate run of the same command with the replay's entry points timed (cpu seconds in
RankReplay's baseline, calibration and replays over the process's cpu seconds).

Traces: 34 MB is ../shared/traces/v100_resnet50_nw0 as it is (gzip); the others are scaled
copies of it made by make_large_trace.py under $ADVISOR_BENCH_DIR (default /tmp/advisor-bench).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO))

from load_speed import machine_info  # noqa: E402
from make_large_trace import parse_size  # noqa: E402


BENCH = Path(os.environ.get("ADVISOR_BENCH_DIR", "/tmp/advisor-bench"))
SHARED = REPO.parent / "shared" / "traces"
SOURCE = SHARED / "v100_resnet50_nw0"
RESULTS = REPO / "benchmarks" / "results"
PY = sys.executable

TB = r"""
import logging, sys, warnings
warnings.simplefilter("ignore")
logging.disable(logging.CRITICAL)
from torch_tb_profiler.profiler.data import RunProfileData
from torch_tb_profiler.profiler.run_generator import RunGenerator
data = RunProfileData.parse("worker0", 0, sys.argv[1], None)
profile = RunGenerator("worker0", 0, data).generate_run_profile()
assert profile is not None
"""

HTA = r"""
import logging, os, sys, warnings
warnings.simplefilter("ignore")
logging.disable(logging.CRITICAL)
from hta.trace_analysis import TraceAnalysis
a = TraceAnalysis(trace_dir=os.path.dirname(sys.argv[1]))
a.get_temporal_breakdown(visualize=False)
a.get_idle_time_breakdown(visualize=False)
a.get_gpu_kernel_breakdown(visualize=False)
"""

# The advisor's report with the replay's entry points timed: prints the replay's cpu seconds
# and the process's, after the report (which goes to /dev/null).
REPLAY_SHARE = r"""
import json, os, sys, time
import advisor.whatif.savings as S
spent = [0.0]
depth = [0]
def timed(fn):
    def wrapper(*a, **k):
        depth[0] += 1
        t = time.process_time()
        try:
            return fn(*a, **k)
        finally:
            depth[0] -= 1
            if depth[0] == 0:
                spent[0] += time.process_time() - t
    return wrapper
S.RankReplay.replayed_ms = timed(S.RankReplay.replayed_ms)
S.RankReplay.baseline_ms = property(timed(S.RankReplay.baseline_ms.fget))
S.RankReplay.summary = timed(S.RankReplay.summary)
sys.argv = ["advisor", "report", sys.argv[1], "--format", "json", "-o", os.devnull]
from advisor.cli import main
try:
    main()
except SystemExit:
    pass
print(json.dumps({"replay_cpu_s": spent[0], "process_cpu_s": time.process_time()}), file=sys.stderr)
"""


def measured(cmd: list[str], env: dict[str, str], capture: bool = False) -> dict:
    """Wall, cpu (user + sys) and peak RSS of one process, from wait4; with `capture`, what
    it wrote to stdout too (`out`, bytes: through a file, so neither pipe can fill)."""
    with tempfile.TemporaryFile() as out:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out if capture else subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
        assert proc.stderr is not None
        err = proc.stderr.read()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - start
        result = {
            "wall_s": wall,
            "cpu_s": usage.ru_utime + usage.ru_stime,
            "peak_rss_mb": usage.ru_maxrss / 1024,
            "rc": proc.returncode,
            "stderr": err.decode(errors="replace")[-600:],
        }
        if capture:
            out.seek(0)
            result["out"] = out.read()
    return result


def decompressed_mb(trace: Path) -> float:
    """The trace's JSON size, read in a child process: a child reports the peak RSS of the
    process it was forked from as its own floor (Linux keeps the high-water mark across fork
    and exec), so the benchmark itself never holds a trace's bytes."""
    code = "import sys; from pathlib import Path; from advisor.load.decode import read_trace_bytes; print(len(read_trace_bytes(Path(sys.argv[1]))))"
    return int(subprocess.run([PY, "-c", code, str(trace)], check=True, capture_output=True, text=True).stdout) / 2**20


def trace_for(size: str) -> Path:
    if size.upper() == "34MB":
        return next(SOURCE.glob("*.pt.trace.json.gz"))
    path = BENCH / f"scaled_{size}.pt.trace.json"
    if not path.exists():
        BENCH.mkdir(parents=True, exist_ok=True)
        subprocess.run([PY, str(REPO / "benchmarks" / "make_large_trace.py"), "--size", size, "--out", str(path)], check=True)
    return path


def median_of(runs: list[dict]) -> dict:
    ok = [r for r in runs if r["rc"] == 0]
    if not ok:
        return {"error": runs[0]["stderr"].strip().splitlines()[-1:] if runs else "not run"}
    return {k: statistics.median(r[k] for r in ok) for k in ("wall_s", "cpu_s", "peak_rss_mb")} | {"runs": len(ok)}


def bench(size: str, repeat: int, tools: list[str]) -> dict:
    trace = trace_for(size)
    mb = decompressed_mb(trace)
    base_env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    cold_env = {**base_env, "ADVISOR_CACHE": "off"}
    with tempfile.TemporaryDirectory(prefix="advisor-peers-") as tmp:
        # HTA reads a folder of traces: a folder holding only this one
        single = Path(tmp) / "trace" / trace.name
        single.parent.mkdir()
        os.link(trace, single) if trace.stat().st_dev == single.parent.stat().st_dev else shutil.copyfile(trace, single)
        warm_env = {**base_env, "ADVISOR_CACHE": str(Path(tmp) / "cache"), "XDG_CACHE_HOME": str(Path(tmp) / "xdg")}
        report = [PY, "-m", "advisor", "report", str(single), "--format", "json"]
        first = measured(report, warm_env)  # fills the cache
        assert first["rc"] == 0, first["stderr"]
        runs: dict[str, list[dict]] = {t: [] for t in ["advisor", *tools, "advisor_warm"]}
        for _ in range(repeat):
            runs["advisor"].append(measured(report, cold_env))
            if "tb" in tools:
                runs["tb"].append(measured([PY, "-c", TB, str(single)], base_env))
            if "hta" in tools:
                runs["hta"].append(measured([PY, "-c", HTA, str(single)], base_env))
            runs["advisor_warm"].append(measured(report, warm_env))
        share = subprocess.run([PY, "-c", REPLAY_SHARE, str(single)], env=cold_env, capture_output=True, text=True, check=True)
        replay = json.loads(share.stderr.strip().splitlines()[-1])
    row = {"size": size, "trace": str(trace), "decompressed_mb": round(mb, 1), "repeat": repeat}
    row.update({t: median_of(r) for t, r in runs.items()})
    row["replay_share"] = replay["replay_cpu_s"] / replay["process_cpu_s"]
    row["replay_cpu_s"] = replay["replay_cpu_s"]
    for t in tools:
        if "cpu_s" in row[t] and "cpu_s" in row["advisor"]:
            row[f"x_{t}_cpu"] = row[t]["cpu_s"] / row["advisor"]["cpu_s"]
            row[f"rss_vs_{t}"] = row["advisor"]["peak_rss_mb"] / row[t]["peak_rss_mb"]
    row["rss_over_decompressed"] = row["advisor"]["peak_rss_mb"] / mb if "peak_rss_mb" in row["advisor"] else None
    return row


def cell(d: dict, key: str, fmt: str) -> str:
    return format(d[key], fmt) if key in d else "—"


def table(rows: list[dict]) -> list[str]:
    out = [
        "size     MB(json) | advisor cold cpu s  wall s  peak MB | warm cpu s  wall s | TB plugin cpu s  wall s  peak MB | HTA cpu s  wall s  peak MB | x TB  x HTA (cpu) | replay share | peak/size",
    ]
    for r in rows:
        a, w, tb, hta = r["advisor"], r["advisor_warm"], r.get("tb", {}), r.get("hta", {})
        out.append(
            f"{r['size']:8s} {r['decompressed_mb']:8.1f} | {cell(a, 'cpu_s', '18.2f')} {cell(a, 'wall_s', '7.2f')} {cell(a, 'peak_rss_mb', '8.0f')} | "
            f"{cell(w, 'cpu_s', '10.2f')} {cell(w, 'wall_s', '7.2f')} | {cell(tb, 'cpu_s', '15.2f')} {cell(tb, 'wall_s', '7.2f')} {cell(tb, 'peak_rss_mb', '8.0f')} | "
            f"{cell(hta, 'cpu_s', '9.2f')} {cell(hta, 'wall_s', '7.2f')} {cell(hta, 'peak_rss_mb', '8.0f')} | "
            f"{r.get('x_tb_cpu', float('nan')):4.1f} {r.get('x_hta_cpu', float('nan')):6.1f}       | {100 * r['replay_share']:11.1f}% | {r['rss_over_decompressed'] or float('nan'):9.2f}"
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="34MB,51MB,87MB,1GB")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--tools", default="tb,hta", help="peers to run (tb, hta); empty: the advisor alone")
    ap.add_argument("--out", default=str(RESULTS / "report_vs_peers"))
    ap.add_argument("--table-only", action="store_true", help="rewrite the .txt from the .json, measuring nothing")
    args = ap.parse_args()
    if args.table_only:
        out = Path(args.out)
        doc = json.loads(out.with_suffix(".json").read_text())
        out.with_suffix(".txt").write_text("\n".join([__doc__.splitlines()[0], f"machine: {json.dumps(doc['machine'])}", *table(doc["rows"])]) + "\n")
        return
    tools = [t for t in args.tools.split(",") if t]
    for s in args.sizes.split(","):
        parse_size(s) if s.upper() != "34MB" else None
    out = Path(args.out)
    done: list[dict] = json.loads(out.with_suffix(".json").read_text())["rows"] if out.with_suffix(".json").exists() else []
    done = [r for r in done if r["size"] not in args.sizes.split(",")]
    for size in args.sizes.split(","):
        row = bench(size, args.repeat, tools)
        done.append(row)
        order = {s: i for i, s in enumerate(["34MB", "51MB", "87MB", "1GB"])}
        done.sort(key=lambda r: order.get(r["size"], 99))
        out.with_suffix(".json").write_text(json.dumps({"machine": machine_info(), "rows": done}, indent=1) + "\n")
        lines = [__doc__.splitlines()[0], f"machine: {json.dumps(machine_info())}", *table(done)]
        out.with_suffix(".txt").write_text("\n".join(lines) + "\n")
        print("\n".join(table([row])), flush=True)


if __name__ == "__main__":
    main()
