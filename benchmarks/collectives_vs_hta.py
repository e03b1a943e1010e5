"""The per-rank overlap of communication and compute (`advisor report --collectives`) against
HTA's `get_comm_comp_overlap` on the same traces, and what each costs.

HTA is not a dependency: install it in a scratch environment and name its Python:

    python3 -m venv /tmp/hta_venv
    /tmp/hta_venv/bin/pip install HolisticTraceAnalysis 'pandas<3'
    .venv/bin/python benchmarks/collectives_vs_hta.py --hta-python /tmp/hta_venv/bin/python \\
        ../shared/traces/corpus/rtx4090_nccl_2rank ../shared/traces/corpus/rtx4090_llama_tp2 ../shared/traces/a100_two_ranks

Without a Python that imports `hta` the script says so and exits 0 (nothing to compare).
HTA reports, per rank, the share of communication kernel time during which compute kernels
ran, over the first iteration (ProfilerStep) of the trace; the advisor's `overlapped_ms /
communication_ms` is the same share over the whole trace (results/collectives_vs_hta.txt:
equal where the trace has one step, HTA's figure over the first step where it has more). Both are printed side by side,
with each side's wall time (HTA's includes its parse of the traces). Then rank 0's idle time
by cause per stream (`report --launches`) beside HTA's `get_idle_time_breakdown`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HTA_SIDE = r"""
import json, sys, time, warnings, logging
warnings.filterwarnings("ignore")
logging.disable(logging.CRITICAL)
t0 = time.perf_counter()
from hta.trace_analysis import TraceAnalysis
try:
    analyzer = TraceAnalysis(trace_dir=sys.argv[1])
    df = analyzer.get_comm_comp_overlap(visualize=False)
    rows = {int(r["rank"]): float(r["comp_comm_overlap_pctg"]) for _, r in df.iterrows()}
    json.dump({"overlap_pct": rows, "seconds": time.perf_counter() - t0}, sys.stdout)
except Exception as exc:
    json.dump({"error": f"{type(exc).__name__}: {exc}"[:300], "seconds": time.perf_counter() - t0}, sys.stdout)
"""


HTA_IDLE_SIDE = r"""
import json, sys, warnings, logging
warnings.filterwarnings("ignore")
logging.disable(logging.CRITICAL)
from hta.trace_analysis import TraceAnalysis
rank = int(sys.argv[2])
try:
    r = TraceAnalysis(trace_dir=sys.argv[1]).get_idle_time_breakdown(ranks=[rank], visualize=False, show_idle_interval_stats=False)
    df = r[0] if isinstance(r, tuple) else r
    out = {}
    for _, row in df.iterrows():
        out.setdefault(str(int(row["stream"])), {})[row["idle_category"]] = float(row["idle_time"]) / 1e3  # the trace's µs -> ms
    json.dump(out, sys.stdout)
except Exception as exc:
    json.dump({"error": f"{type(exc).__name__}: {exc}"[:300]}, sys.stdout)
"""


def idle_rows(folder: Path, python: str) -> list[str]:
    """Rank 0's idle time by cause per stream: the advisor's (report --launches) and HTA's
    get_idle_time_breakdown. HTA compares each op with the one before it only (an overlap
    counts as negative idle) and applies its 30 (documented: ns) threshold to the trace's
    µs, so its kernel wait is gaps under 30 µs; the advisor's is gaps of 30 ns or less after
    the latest end so far."""
    import gzip

    from advisor.load.trace import load_trace
    from advisor.metrics.launches import idle_table

    path = next(p for p in sorted(folder.iterdir()) if json.loads(gzip.open(p).read())["distributedInfo"]["rank"] == 0)
    ours = idle_table(load_trace(path))
    done = subprocess.run([python, "-c", HTA_IDLE_SIDE, str(folder), "0"], capture_output=True, text=True, timeout=600)
    try:
        theirs = json.loads(done.stdout)
    except ValueError:
        theirs = {"error": (done.stderr.strip().splitlines() or ["no output"])[-1][:300]}
    lines = []
    for r in ours.itertuples(index=False):
        if r.stream < 0:
            continue
        h = theirs.get(str(r.stream), {})
        lines.append(f"{folder.name:28} {r.stream:6d} {r.host_wait_ms:10.3f} {h.get('host_wait', float('nan')):10.3f} {r.kernel_wait_ms:10.3f} "
                     f"{h.get('kernel_wait', float('nan')):10.3f} {r.other_ms:10.3f} {h.get('other', float('nan')):10.3f}")
    if "error" in theirs:
        lines.append(f"  HTA failed on {folder.name}: {theirs['error']}")
    return lines


def hta_available(python: str) -> bool:
    try:
        return subprocess.run([python, "-c", "import hta"], capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def advisor_side(folder: Path) -> tuple[dict[int, dict], float]:
    from advisor.analysis import collectives_of_run

    t0 = time.perf_counter()
    _, job = collectives_of_run(folder)
    seconds = time.perf_counter() - t0
    return {int(r["rank"]): r for r in job.overlap.to_dict("records")}, seconds


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folders", nargs="+", type=Path, help="folders of one job's rank traces")
    p.add_argument("--hta-python", default="/tmp/hta_venv/bin/python", help="a Python that imports hta")
    args = p.parse_args()
    if not hta_available(args.hta_python):
        print(f"HTA is not importable from {args.hta_python}: nothing to compare (install it as the docstring says)")
        return 0
    print(f"{'job':28} {'rank':>4} {'comm ms':>10} {'overlapped ms':>14} {'advisor %':>10} {'HTA %':>8} {'advisor s':>10} {'HTA s':>8}")
    for folder in args.folders:
        ours, our_s = advisor_side(folder)
        done = subprocess.run([args.hta_python, "-c", HTA_SIDE, str(folder)], capture_output=True, text=True, timeout=600)
        try:
            theirs = json.loads(done.stdout)
        except ValueError:
            theirs = {"error": (done.stderr.strip().splitlines() or ["no output"])[-1][:300], "seconds": float("nan")}
        for rank, r in sorted(ours.items()):
            share = 100 * r["overlapped_ms"] / r["communication_ms"] if r["communication_ms"] else float("nan")
            hta = theirs.get("overlap_pct", {}).get(str(rank), theirs.get("overlap_pct", {}).get(rank))
            hta_text = f"{hta:8.2f}" if isinstance(hta, float) else f"{'–':>8}"
            print(f"{folder.name:28} {rank:4d} {r['communication_ms']:10.3f} {r['overlapped_ms']:14.3f} {share:10.2f} {hta_text} {our_s:10.2f} {theirs['seconds']:8.2f}")
        if "error" in theirs:
            print(f"  HTA failed on {folder.name}: {theirs['error']}")
    print()
    print("Idle time by cause, rank 0, ms (advisor report --launches | HTA get_idle_time_breakdown)")
    print(f"{'job':28} {'stream':>6} {'host ours':>10} {'host HTA':>10} {'kern ours':>10} {'kern HTA':>10} {'other ours':>10} {'other HTA':>10}")
    for folder in args.folders:
        for line in idle_rows(folder, args.hta_python):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
