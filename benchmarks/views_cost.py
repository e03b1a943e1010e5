"""What the views computed on request cost beside the plain report: wall seconds of each
command, every trace parsed (ADVISOR_CACHE=off), each in its own process.

    .venv/bin/python benchmarks/views_cost.py ../shared/traces/v100_resnet50_nw0 ../shared/traces/corpus/v100_dlrm_8rank

The plain report computes none of the views (tests/test_collectives_report.py checks that it
does not import their code). `--collectives` reads each rank's trace and nothing else;
`--ops -f csv` and `--launches` analyse the run as the report does, then read the slowest
rank's trace once more.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMMANDS = {
    "report -f json": ["report", "{run}", "-f", "json"],
    "report --collectives -f json": ["report", "{run}", "--collectives", "-f", "json"],
    "report --ops -f csv": ["report", "{run}", "--ops", "-f", "csv"],
    "report --launches -f json": ["report", "{run}", "--launches", "-f", "json"],
}


def seconds(args: list[str]) -> float:
    env = {**os.environ, "ADVISOR_CACHE": "off", "PYTHONPATH": str(REPO)}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "advisor", *args], capture_output=True, env=env, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"advisor {' '.join(args)}: exit {done.returncode}: {done.stderr.decode()[-300:]}")
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--repeat", type=int, default=1, help="runs of each command (the least is printed)")
    args = ap.parse_args()
    print(f"{'run':26} {'command':32} {'seconds':>8}")
    for run in args.runs:
        for name, cmd in COMMANDS.items():
            best = min(seconds([c.format(run=run) for c in cmd]) for _ in range(args.repeat))
            print(f"{run.name:26} {name:32} {best:8.2f}")


if __name__ == "__main__":
    main()
