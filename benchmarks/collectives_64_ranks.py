"""`report --collectives` on a 64-rank job through a local Dask cluster: the workers' memory
against the per-rank analysis of the same ranks, and whether the skew added is found.

The job is the 8 ranks of ../shared/traces/corpus/v100_dlrm_8rank replicated 8 times: rank r
is rank r % 8 recorded on a host whose clock is r x 1234.5 µs ahead, and every rank
r = 8k + 3 (k >= 1) arrives k x D late at every collective (its NCCL kernels start later and
end as recorded; D is half the shortest NCCL kernel of rank 3; a kernel shorter than its delay
starts 1 µs before its end, so the mean delay is printed). Two Dask workers of one
thread each, caches off; after each pass every worker's peak RSS (ru_maxrss) is read.

    python benchmarks/collectives_64_ranks.py /tmp/collectives64
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time
from concurrent.futures import as_completed
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from advisor.analysis import RankTask, analyze_rank, collectives_of_run  # noqa: E402

SOURCE = REPO.parent / "shared" / "traces" / "corpus" / "v100_dlrm_8rank"
RANKS = 64
CLOCK_STEP_US = 1234.5


def make_job(out: Path) -> dict[int, float]:
    """Write the job; the mean delay (µs) added to each late rank's collectives (a kernel
    shorter than the delay starts 1 µs before its end)."""
    originals = {}
    for f in sorted(SOURCE.iterdir()):
        t = json.loads(gzip.open(f).read())
        originals[t["distributedInfo"]["rank"]] = t
    d_us = 0.5 * min(e["dur"] for e in originals[3]["traceEvents"] if e.get("cat") == "kernel" and "nccl" in e["name"].lower())
    out.mkdir(parents=True, exist_ok=True)
    late = {}
    for r in range(RANKS):
        t = json.loads(json.dumps(originals[r % 8]))
        t["distributedInfo"].update(rank=r, world_size=RANKS)
        delay = (r // 8) * d_us if r % 8 == 3 else 0.0
        shifts = []
        for e in t["traceEvents"]:
            if "ts" in e:
                e["ts"] = e["ts"] + r * CLOCK_STEP_US
            if delay and e.get("cat") == "kernel" and "nccl" in e["name"].lower():
                shift = min(delay, e["dur"] - 1)
                e["ts"] += shift
                e["dur"] -= shift
                shifts.append(shift)
        if shifts:
            late[r] = sum(shifts) / len(shifts)
        (out / f"rank{r}.json.gz").write_bytes(gzip.compress(json.dumps(t).encode()))
    return late


def peak_rss_mb(dask_worker: object = None) -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("job", type=Path, help="where to write the 64 rank files")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "collectives_64_ranks.txt")
    args = ap.parse_args()
    os.environ["ADVISOR_CACHE"] = "off"
    late = make_job(args.job)
    files = sorted(args.job.glob("rank*.json.gz"), key=lambda p: int(p.name[4:].split(".")[0]))
    from distributed import Client, LocalCluster

    lines = [f"{len(files)} ranks in {args.job} (v100_dlrm_8rank x 8, clock offsets, {len(late)} late ranks); 2 Dask workers of one thread, caches off"]
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None) as cluster, Client(cluster) as client:
        executor = client.get_executor(pure=False)
        start = time.perf_counter()
        _, job = collectives_of_run(args.job, executor=executor)
        t_coll = time.perf_counter() - start
        after_coll = client.run(peak_rss_mb)
        start = time.perf_counter()
        futures = [executor.submit(analyze_rank, RankTask(path=p, index=i, world_size=len(files))) for i, p in enumerate(files)]
        for fut in as_completed(futures):
            fut.result()
        del futures
        t_rank = time.perf_counter() - start
        after_rank = client.run(peak_rss_mb)
    lines.append(f"  --collectives: {t_coll:.1f} s; workers' peak RSS {', '.join(f'{v:.0f}' for v in after_coll.values())} MB")
    lines.append(f"  then the per-rank analysis (analyze_rank) of the same ranks: {t_rank:.1f} s; workers' peak RSS {', '.join(f'{v:.0f}' for v in after_rank.values())} MB")
    lag = dict(zip(job.ranks["rank"], job.ranks["mean_lag_ms"], strict=True))
    base = lag[3]
    for r, delay in sorted(late.items()):
        lines.append(f"  rank {r:2d}: {delay / 1e3:.3f} ms mean delay added, mean lag {lag[r]:.3f} ms = rank 3's {base:.3f} + {lag[r] - base:.3f}")
    lines.append(f"  skew: median {job.skew_p50_ms:.3f} ms, max {job.skew_max_ms:.3f} ms; link: {job.link.why}")
    text = "\n".join(lines)
    print(text)
    args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
