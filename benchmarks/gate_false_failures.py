"""How often does `advisor gate` fail a run that did not get slower? (and how often it catches one that did)

Records N profiled runs of the same training script on this machine's CPU (the project's
sample, `sample_runs/resnet18_cifar/train.py --cpu-variant`, unmodified, each run in a fresh
process, the profiler stepping after every optimizer step), then gates every run against
every other with the default settings (tolerance 5%, 95% confidence, at least 5 steps). Every
ordered pair compares identical code, so every failure is a false failure: the rate printed
is the false-failure rate of the step-time check. The noise is what a runner dedicated to
the job sees: step-to-step jitter within a run, and drift between runs (start-up, caches,
memory layout, clocks). The runs ask for the CPU first (priority -10 for their own session,
as root), and a run whose training thread still waited for a CPU more than 5% of its time
(the kernel's per-thread scheduler statistics) is recorded again: on a machine shared with
other busy jobs, runs of the same code differ by 2-4x, which no tolerance short of that can
pass and no statistics can tell from a regression (`--nice 0 --max-wait-share 1` records
as it comes, to see it).

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
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "sample_runs" / "resnet18_cifar" / "train.py"
WAIT, WARMUP = 1, 3


def record_one(out_dir: Path, steps: int, threads: int | None, nice: int | None) -> None:
    """Run the sample's main() under torch.profiler, one profiler step per optimizer step."""
    import runpy

    if nice is not None:
        # A CI runner runs one job: on a shared machine, ask for the CPU first. With the
        # scheduler's autogroups a process's nice value only counts inside its own session,
        # so this process has a session of its own (see record_runs) and sets the session's.
        try:
            Path("/proc/self/autogroup").write_text(str(nice))
        except OSError:
            pass
        try:
            os.setpriority(os.PRIO_PROCESS, 0, nice)
        except OSError:
            print(f"cannot set priority {nice}: recording at the default priority", file=sys.stderr)

    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook
    from torch.profiler import (
        ProfilerActivity,
        profile,
        schedule,
        tensorboard_trace_handler,
    )

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
    wait0, t0 = runqueue_wait_ns(), time.monotonic_ns()
    with prof:
        runpy.run_path(str(SAMPLE), run_name="__main__")
    wait1, t1 = runqueue_wait_ns(), time.monotonic_ns()
    if wait0 is not None and wait1 is not None:
        print(f"runqueue-wait-share {(wait1 - wait0) / max(t1 - t0, 1):.4f}", file=sys.stderr)


def runqueue_wait_ns() -> int | None:
    """Nanoseconds this thread spent runnable but waiting for a CPU (/proc schedstat)."""
    try:
        return int(Path("/proc/thread-self/schedstat").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return None


def record_runs(root: Path, runs: int, steps: int, threads: int | None, nice: int | None, max_wait_share: float, max_attempts: int) -> tuple[list[Path], list[dict]]:
    """Record `runs` runs, each in a fresh process (and session).

    A run whose training thread waited for a CPU (runnable, but other processes had the
    cores) more than `max_wait_share` of its time is recorded again: the benchmark measures
    the statistics on the noise of a runner dedicated to the job, not the slowdown of a
    machine shared with other jobs.
    """
    if not SAMPLE.is_file():
        raise SystemExit(f"the sample script is missing: {SAMPLE}")
    dirs: list[Path] = []
    log: list[dict] = []
    while len(dirs) < runs:
        d = root / f"run{len(dirs):02d}"
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
        cmd = [sys.executable, __file__, "--record-one", str(d), "--steps", str(steps), "--threads", str(threads or 0)]
        if nice is not None:
            cmd += ["--nice", str(nice)]
        t0 = time.monotonic()
        done = subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO, start_new_session=True)
        wall = time.monotonic() - t0
        wait_share = None
        for line in done.stderr.splitlines():
            if line.startswith("cannot set priority"):
                print(line, file=sys.stderr)
            elif line.startswith("runqueue-wait-share "):
                wait_share = float(line.split()[1])
        out_of_attempts = len(log) + 1 >= max_attempts
        kept = wait_share is None or wait_share <= max_wait_share or out_of_attempts
        log.append({"wall_s": round(wall, 1), "runqueue_wait_share": wait_share, "kept": kept})
        what = f"waited for a CPU {wait_share:.0%} of the time" if wait_share is not None else "no scheduler statistics"
        print(f"{'recorded' if kept else 'discarded'} {d.name} in {wall:.1f} s ({what})", file=sys.stderr)
        if kept:
            dirs.append(d)
    return dirs, log


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
    p.add_argument("--threads", type=int, default=1, help="torch threads per run (0: torch's default, one per core)")
    p.add_argument(
        "--nice",
        type=int,
        default=-10,
        help="scheduling priority of the recorded runs (default -10, as root: a dedicated runner; "
        "pass 0 to measure a runner shared with other jobs)",
    )
    p.add_argument("--tolerance", type=float, default=0.05)
    p.add_argument("--max-wait-share", type=float, default=0.05, help="record again a run that waited for a CPU more than this share of its time")
    p.add_argument("--max-attempts", type=int, default=40, help="recordings in all before keeping runs as they come")
    p.add_argument("--keep", type=Path, help="record into this folder and keep it")
    p.add_argument("--use", type=Path, help="judge the runs already recorded in this folder (one sub-folder each)")
    p.add_argument("--json", type=Path, help="write the figures here")
    p.add_argument("--record-one", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()

    if args.record_one:
        record_one(args.record_one, args.steps, args.threads, None if args.nice == 0 else args.nice)
        return 0

    sys.path.insert(0, str(REPO))
    with tempfile.TemporaryDirectory(prefix="advisor-noise-") as tmp:
        log: list[dict] = []
        if args.use:
            dirs = sorted(d for d in args.use.iterdir() if d.is_dir())
        else:
            nice = None if args.nice == 0 else args.nice
            dirs, log = record_runs(args.keep or Path(tmp), args.runs, args.steps, args.threads, nice, args.max_wait_share, args.max_attempts)
        full = judge(dirs, args.tolerance, None)
        short = judge(dirs, args.tolerance, 6)
        power10 = judge(dirs, args.tolerance, None, scale=1.10)
        power26 = judge(dirs, args.tolerance, None, scale=1.26)
        power26_short = judge(dirs, args.tolerance, 6, scale=1.26)

    print(f"{len(dirs)} runs of the same script on {os.cpu_count()} CPU cores; steps per run: {full['steps_per_run']}")
    if log:
        kept = [e for e in log if e["kept"]]
        worst = max((e["runqueue_wait_share"] or 0.0) for e in kept)
        print(
            f"recorded with {args.threads or 'default'} torch thread(s), priority {args.nice}; "
            f"{len(log) - len(kept)} run(s) recorded again for CPU contention; the kept runs waited for a CPU at most {worst:.1%} of their time"
        )
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
    result = {"conditions": {"threads": args.threads, "nice": args.nice, "cpu_count": os.cpu_count(), "recordings": log}, "full": full, "first_6_steps": short, "power_plus_10": power10, "power_plus_26": power26, "power_plus_26_first_6": power26_short}
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    ok = full["fail_rate"] < 0.05 and short["fail_rate"] < 0.05
    print(("OK" if ok else "TOO MANY FALSE FAILURES") + f": false-failure rate {full['fail_rate']:.1%} (all steps), {short['fail_rate']:.1%} (6 steps); limit 5%")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
