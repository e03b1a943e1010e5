"""What grows inside a Dask worker while it analyses rank after rank (issue 17).

Starts a LocalCluster (loopback, 2 workers of one thread), runs `analyze_rank` on 64, then
64 more, then 128 more ranks of a job, and after each batch (every future released) reads
on each worker: its RSS, the live Python objects (after `gc.collect()`), what `malloc_trim`
gives back, and how many profiles Dask's statistical profiler holds. Once with the workers'
profiler on (Dask's default), once off. Results: benchmarks/results/dask_worker_memory.txt.

    python benchmarks/dask_worker_memory.py /tmp/advisor-bench/job256_2MB
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import os
import sys
import time
from concurrent.futures import as_completed
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from advisor.analysis import RankTask, analyze_rank  # noqa: E402

BATCHES = (64, 64, 128)


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS:"))


def worker_state(dask_worker: object) -> dict:
    """Run on each worker: its memory before and after giving back what is free."""
    before = rss_mb()
    gc.collect()
    objects = len(gc.get_objects())
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    return {"rss_mb": before, "objects": objects, "rss_after_trim_mb": rss_mb(), "profiles": len(getattr(dask_worker, "profile_history", ()))}


def measure(files: list[Path], profiler: bool, batches: tuple[int, ...] = BATCHES) -> list[str]:
    import dask
    from distributed import Client, LocalCluster

    lines = [f"workers' statistical profiler {'on (Dask default)' if profiler else 'off'}:"]
    with dask.config.set({"distributed.worker.profile.enabled": profiler}):
        with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None) as cluster, Client(cluster) as client:
            executor = client.get_executor(pure=False)
            done, start = 0, time.perf_counter()
            for batch in batches:
                futures = [executor.submit(analyze_rank, RankTask(path=p, index=i, world_size=len(files))) for i, p in enumerate(files[done:done + batch], done)]
                for fut in as_completed(futures):
                    fut.result()
                del futures, fut
                done += batch
                time.sleep(1)
                states = client.run(worker_state)
                each = "; ".join(f"RSS {s['rss_mb']:.0f} MB, {s['objects']:,} objects, {s['rss_after_trim_mb']:.0f} MB after gc+trim, {s['profiles']} profiles"
                                 for s in states.values())
                lines.append(f"  after {done:3d} ranks ({time.perf_counter() - start:5.0f} s): {each}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("job", type=Path, help="a folder of at least 256 rank files (benchmarks/scale.py makes them)")
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)), help="ranks per batch (a quick look: 2,2,4)")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "dask_worker_memory.txt")
    args = ap.parse_args()
    os.environ["ADVISOR_CACHE"] = "off"  # every rank parsed; the workers inherit it
    batches = tuple(int(b) for b in args.batches.split(","))
    files = sorted(args.job.glob("rank-*"), key=lambda p: int(p.name.split("-")[1].split(".")[0]))[: sum(batches)]
    if len(files) < sum(batches):
        sys.exit(f"{args.job}: needs {sum(batches)} rank files, has {len(files)}")
    lines = [f"{len(files)} ranks of {args.job}, 2 Dask workers of one thread each, frames and analysis caches off"]
    for profiler in (True, False):
        lines += measure(files, profiler, batches)
    text = "\n".join(lines)
    print(text)
    args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
