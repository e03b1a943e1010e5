"""What the roofline costs a cold report: CPU time (user + system) of `advisor report` with the
cache off, this tree against a copy of the tree before the roofline (loader, metrics, rules).

    git archive BASE advisor rules | tar -x -C /tmp/base && mv /tmp/base/rules /tmp/base/advisor/rules
    .venv/bin/python benchmarks/roofline_cost.py --base /tmp/base TRACE...

Each trace is reported by both trees `--repeat` times (alternating, fastest kept: the machine
is shared); the roofline's share is (this − base) / base.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
from pathlib import Path


def cpu_seconds(argv: list[str], env: dict[str, str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", nargs="+", type=Path)
    ap.add_argument("--base", required=True, type=Path, help="the tree before the roofline (advisor/ with its rules inside)")
    ap.add_argument("--repeat", type=int, default=3)
    ns = ap.parse_args()
    env = {**os.environ, "ADVISOR_CACHE": "off"}
    base_env = {**env, "PYTHONPATH": str(ns.base)}
    argv = [sys.executable, "-m", "advisor", "report"]
    total_now = total_base = 0.0
    print(f"{'trace':55} {'base s':>8} {'now s':>8} {'share':>7}")
    for t in ns.traces:
        now, base = [], []
        for _ in range(ns.repeat):
            base.append(cpu_seconds(argv + [str(t)], base_env))
            now.append(cpu_seconds(argv + [str(t)], env))
        b, n = min(base), min(now)
        total_now, total_base = total_now + n, total_base + b
        print(f"{t.name[:55]:55} {b:8.2f} {n:8.2f} {100 * (n - b) / b:6.1f}%")
    print(f"{'all':55} {total_base:8.2f} {total_now:8.2f} {100 * (total_now - total_base) / total_base:6.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
