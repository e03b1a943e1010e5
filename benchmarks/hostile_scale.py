"""Two hostile shapes that were slow (issue 24, item 9), timed in fresh `advisor report` processes.

1. N one-event rank files (default 300): each a real trace's header (a100_alexnet) with one
   kernel event and its own `distributedInfo` rank. They were analysed one after the other
   in one process (all of them together were "small"); now more than 16 ranks go to the
   process pool.
2. A recorded run's facts file with its DataLoader entry repeated 100,000 times: checked
   field by field and item by item before; a value that fits whole is now one msgspec call.

Wall time, and the CPU time (user+sys) of the process and of the children it waited for
(getrusage), median of --repeat runs; ADVISOR_CACHE=off. Run on a quiet machine: wall time
on a shared one says little, the CPU time of case 2 a lot. Pass --python and --pythonpath to
time another checkout of the code side by side.

    python benchmarks/hostile_scale.py [--ranks 300] [--repeat 3] [--pythonpath DIR]
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parent.parent
ALEXNET = REPO.parent / "shared" / "traces" / "misc" / "a100_alexnet.json.gz"
RUN = REPO / "sample_runs" / "resnet18_cifar" / "runs" / "cpu_baseline"

PROBE = (
    "import resource, subprocess, sys, time\n"
    "t = time.perf_counter()\n"
    "p = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
    "wall = time.perf_counter() - t\n"
    "r = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
    "print(p.returncode, wall, r.ru_utime + r.ru_stime, r.ru_maxrss)\n"
)


def one_event_ranks(folder: Path, n: int) -> Path:
    doc = orjson.loads(gzip.decompress(ALEXNET.read_bytes()))
    event = next(e for e in doc["traceEvents"] if e.get("cat") == "kernel")
    head = {k: v for k, v in doc.items() if k != "traceEvents"}
    folder.mkdir(parents=True)
    for r in range(n):
        (folder / f"rank{r}.json").write_bytes(orjson.dumps({**head, "traceEvents": [event], "distributedInfo": {"rank": r, "world_size": n}}))
    return folder


def many_dataloaders(folder: Path, n: int = 100_000) -> Path:
    shutil.copytree(RUN, folder)
    facts = orjson.loads((folder / "advisor_facts.json").read_bytes())
    facts["dataloaders"] = facts["dataloaders"] * n
    (folder / "advisor_facts.json").write_bytes(orjson.dumps(facts))
    return folder


def timed(python: str, pythonpath: str | None, path: Path, repeat: int) -> tuple[float, float, float]:
    env = {**os.environ, "ADVISOR_CACHE": "off", **({"PYTHONPATH": pythonpath} if pythonpath else {})}
    runs = []
    for _ in range(repeat):
        # cwd: not the repository (`python -m` puts the working folder before PYTHONPATH)
        out = subprocess.run([sys.executable, "-c", PROBE, python, "-m", "advisor", "report", str(path)], env=env, cwd=path.parent, capture_output=True, text=True, check=True).stdout.split()
        assert out[0] == "0", out
        runs.append((float(out[1]), float(out[2]), int(out[3]) / 1024))
    return tuple(statistics.median(r[i] for r in runs) for i in range(3))  # type: ignore[return-value]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=300)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--pythonpath", default=None)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="advisor-hostile-scale-"))
    try:
        cases = {f"{a.ranks} one-event rank files": one_event_ranks(work / "ranks", a.ranks), "facts with 100,000 DataLoader entries": many_dataloaders(work / "facts")}
        for name, path in cases.items():
            wall, cpu, rss = timed(a.python, a.pythonpath, path, a.repeat)
            print(f"{name}: wall {wall:.1f} s, CPU (waited-for processes) {cpu:.1f} s, peak RSS {rss:.0f} MiB")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
