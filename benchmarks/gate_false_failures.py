"""How often does `advisor gate` fail a run that did not get slower? (and how often it catches one that did)

Records N profiled runs of the same training script on this machine's CPU (the project's
sample, `sample_runs/resnet18_cifar/train.py --cpu-variant`, unmodified, each run in a fresh
process, the profiler stepping after every optimizer step), then gates every run against
every other with the default settings (tolerance 5%, 95% confidence, at least 5 steps). Every
ordered pair compares identical code, so every failure is a false failure: the rate printed
is the false-failure rate of the step-time check. The noise is what a CI runner sees: step
to step jitter within a run, and drift between runs (other processes, caches, clocks).

It also reports the same on short windows (the first 6 steps of each run, as short as the
V100 sample traces), and the power of the check: the share of pairs that fail when the
candidate's step times are scaled by +10% and +26%.

    python benchmarks/gate_false_failures.py                 # record 10 runs of 25 steps, then judge
    python benchmarks/gate_false_failures.py --runs 6 --steps 15
    python benchmarks/gate_false_failures.py --keep log/noise      # keep the recorded runs
    python benchmarks/gate_false_failures.py --use log/noise       # judge runs recorded before
    python benchmarks/gate_false_failures.py --json noise.json     # also write the figures

Exit code 1 when the false-failure rate at the default settings is 5% or more.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "sample_runs" / "resnet18_cifar" / "train.py"
WAIT, WARMUP = 1, 3


def record_one(out_dir: Path, steps: int, threads: int | None) -> None:
    """Run the sample's main() under torch.profiler, one profiler step per optimizer step."""
    import runpy

    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    if threads:
        torch.set_num_threads(threads)
    total = WAIT + WARMUP + steps + 1
    prof = profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=WAIT, warmup=WARMUP, active=steps, repeat=1),
        on_trace_ready=tensorboard_trace_handler(str(out_dir)),
        record_shapes=True,
    )
    register_optimizer_step_post_hook(lambda *_: prof.step())
    sys.argv = [str(SAMPLE), "--cpu-variant", "--device", "cpu", "--steps", str(total)]
    with prof:
        runpy.run_path(str(SAMPLE), run_name="__main__")


def record_runs(root: Path, runs: int, steps: int, threads: int | None) -> list[Path]:
    if not SAMPLE.is_file():
        raise SystemExit(f"the sample script is missing: {SAMPLE}")
    dirs = []
    for i in range(runs):
        d = root / f"run{i:02d}"
        d.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, __file__, "--record-one", str(d), "--steps", str(steps)]
        if threads:
            cmd += ["--threads", str(threads)]
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO)
        load = os.getloadavg()[0]
        print(f"recorded {d.name} in {time.perf_counter() - t0:.1f} s (load average {load:.1f} on {os.cpu_count()} cores)", file=sys.stderr)
        dirs.append(d)
    return dirs


def judge(dirs: list[Path], tolerance: float, window: int | None, scale: float = 1.0) -> dict:
    """Gate every ordered pair of runs; counts of step-time verdicts."""
    from advisor.analysis import analyze
    from advisor.gate.budgets import GateSettings
    from advisor.gate.evaluate import step_time_check
    from advisor.gate.record import record_from_analysis

    records = [record_from_analysis(analyze(d)) for d in dirs]
    if window:
        for r in records:
            r.step_times_ms = r.step_times_ms[:window]
    settings = GateSettings(tolerance=tolerance)
    counts = {"pass": 0, "inconclusive": 0, "fail": 0}
    ratios = []
    for b, c in itertools.permutations(range(len(records)), 2):
        cand = records[c]
        if scale != 1.0:
            cand = _scaled(cand, scale)
        check = step_time_check(records[b], cand, settings)
        counts[check.status] += 1
        ratios.append(check.details.get("ratio"))
    pairs = sum(counts.values())
    return {
        "pairs": pairs,
        "counts": counts,
        "fail_rate": counts["fail"] / pairs if pairs else None,
        "strict_fail_rate": (counts["fail"] + counts["inconclusive"]) / pairs if pairs else None,
        "median_ratio_spread": [float(np.min(ratios)), float(np.max(ratios))] if ratios else None,
        "run_medians_ms": [float(np.median(r.step_times_ms)) for r in records],
        "steps_per_run": [len(r.step_times_ms) for r in records],
    }


def _scaled(record, scale: float):
    from dataclasses import replace

    return replace(record, step_times_ms=[x * scale for x in record.step_times_ms])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--steps", type=int, default=25, help="active (recorded) steps per run")
    p.add_argument("--threads", type=int, default=None, help="torch threads per run (default: torch's)")
    p.add_argument("--tolerance", type=float, default=0.05)
    p.add_argument("--keep", type=Path, help="record into this folder and keep it")
    p.add_argument("--use", type=Path, help="judge the runs already recorded in this folder (one sub-folder each)")
    p.add_argument("--json", type=Path, help="write the figures here")
    p.add_argument("--record-one", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()

    if args.record_one:
        record_one(args.record_one, args.steps, args.threads)
        return 0

    sys.path.insert(0, str(REPO))
    with tempfile.TemporaryDirectory(prefix="advisor-noise-") as tmp:
        if args.use:
            dirs = sorted(d for d in args.use.iterdir() if d.is_dir())
        else:
            dirs = record_runs(args.keep or Path(tmp), args.runs, args.steps, args.threads)
        full = judge(dirs, args.tolerance, None)
        short = judge(dirs, args.tolerance, 6)
        power10 = judge(dirs, args.tolerance, None, scale=1.10)
        power26 = judge(dirs, args.tolerance, None, scale=1.26)
        power26_short = judge(dirs, args.tolerance, 6, scale=1.26)

    print(f"{len(dirs)} runs of the same script on {os.cpu_count()} CPU cores; steps per run: {full['steps_per_run']}")
    print("run medians (ms): " + ", ".join(f"{m:.1f}" for m in full["run_medians_ms"]))
    spread = full["median_ratio_spread"]
    print(f"median ratio between runs: {spread[0]:.3f} .. {spread[1]:.3f}")
    print(f"{'case':<44}{'pairs':>6}{'pass':>6}{'inconc.':>9}{'fail':>6}{'fail rate':>11}{'strict':>8}")
    for name, r in (
        (f"same code, all steps (tolerance {args.tolerance:.0%})", full),
        ("same code, first 6 steps", short),
        ("candidate +10%, all steps (power)", power10),
        ("candidate +26%, all steps (power)", power26),
        ("candidate +26%, first 6 steps (power)", power26_short),
    ):
        c = r["counts"]
        print(f"{name:<44}{r['pairs']:>6}{c['pass']:>6}{c['inconclusive']:>9}{c['fail']:>6}{r['fail_rate']:>10.1%}{r['strict_fail_rate']:>8.1%}")
    result = {"full": full, "first_6_steps": short, "power_plus_10": power10, "power_plus_26": power26, "power_plus_26_first_6": power26_short}
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    ok = full["fail_rate"] < 0.05 and short["fail_rate"] < 0.05
    print(("OK" if ok else "TOO MANY FALSE FAILURES") + f": false-failure rate {full['fail_rate']:.1%} (all steps), {short['fail_rate']:.1%} (6 steps); limit 5%")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
