"""dataloader-stall's promise against what its fix measures, on the CPU sample, with cores counted.

    .venv/bin/python benchmarks/dataloader_cores.py                       # 3 repeats, torch's threads and 1 thread
    .venv/bin/python benchmarks/dataloader_cores.py --repeats 5 --out benchmarks/results/dataloader_cores.txt

The sample script (sample_runs/resnet18_cifar/train.py, its CPU variant) loads its batches in
the training process (`--workers 0`). Each repeat profiles it twice with `advisor profile
--full`, as a user would: as it is, and with the fix dataloader-stall asks for (`--workers N`,
N read from the finding's evidence). The promise is the finding's saving on the first run;
the measured gain is the difference of the two runs' unprofiled medians (the steps after the
profiled window, from the facts file), so neither side carries the profiler's cost.

Two thread settings: torch's own (on a 2-core machine: 2 intra-op threads, the quick start's
setting, where a loader worker can only take a core from the model) and OMP_NUM_THREADS=1
(one core left idle for a worker). The after run applies the whole fix the finding gives:
where it says `torch.set_num_threads(k)` (a compute thread handed to the worker), the after
run gets k threads (OMP_NUM_THREADS=k). The acceptance: the promise is within ±50% of the measured
gain, or the finding promises no gain where the measurement shows none is there.

Timings are wall-clock medians of a small, possibly shared machine: every pair is repeated
and the table gives the spread (min-max of the measured gains).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import math
import os
import re
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("follow_the_advice", ROOT / "benchmarks" / "follow_the_advice.py")
bench = importlib.util.module_from_spec(_spec)
sys.modules["follow_the_advice"] = bench
_spec.loader.exec_module(bench)  # type: ignore[union-attr]


def stall_of(r) -> dict | None:
    """The dataloader-stall finding of a round, ranked or considered."""
    report = r.report or {}
    for f in [*(report.get("findings") or []), *(report.get("considered") or [])]:
        if f.get("rule") == "dataloader-stall":
            return f
    return None


def promise_of(f: dict | None) -> float:
    if f is None:
        return 0.0
    alone = f.get("saving_alone_ms")
    return float(alone if alone is not None else (f.get("saving_ms") or 0.0))


def threads_of(f: dict | None) -> int | None:
    """The compute threads the fix leaves the model (`torch.set_num_threads(k)` in its text), if any."""
    m = re.search(r"set_num_threads\((\d+)\)", ((f or {}).get("fix") or {}).get("text") or "")
    return int(m.group(1)) if m else None


def workers_of(f: dict | None, cpu_count: int) -> int:
    cores = ((f or {}).get("evidence") or {}).get("cores") or {}
    n = cores.get("workers_after")
    return int(n) if isinstance(n, int) and n > 0 else max(cpu_count - 1, 1)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", default="0,1", help="comma-separated OMP threads per setting (0 = torch's own)")
    p.add_argument("--after-steps", type=int, default=25)
    p.add_argument("--out", type=Path, default=None, help="also write the table to this file")
    a = p.parse_args(argv)
    cpus = os.cpu_count() or 1
    lines = [
        f"dataloader-stall on the CPU sample: promise (before run) vs measured (unprofiled medians), {cpus} cores, "
        f"load average at start {os.getloadavg()[0]:.2f}",
        "",
        f"{'threads':>8} {'rep':>3} {'workers':>7} {'after threads':>13} {'before ms':>9} {'after ms':>9} {'measured':>9} {'promise':>8}  finding",
    ]
    print("\n".join(lines), flush=True)
    verdicts = []
    for t in [int(x) for x in a.threads.split(",")]:
        settings = bench.Settings(device="cpu", cpu_variant=True, wait=1, warmup=2, active=5, after_steps=a.after_steps,
                                  threads=t or None, timeout_s=900)
        gains, promises, befores = [], [], []
        for rep in range(a.repeats):
            with tempfile.TemporaryDirectory(prefix="advisor-cores-") as tmp:
                before = bench.profile_round(bench.Switches(), settings, Path(tmp) / "before")
                f = stall_of(before)
                n = workers_of(f, cpus)
                # the whole fix: where it hands a compute thread to the worker, the after run
                # gets that many threads (OMP_NUM_THREADS sets torch.get_num_threads())
                k = threads_of(f)
                after_settings = dataclasses.replace(settings, threads=k) if k else settings
                after = bench.profile_round(bench.Switches(workers=n), after_settings, Path(tmp) / "after")
            b, af = before.after_window_ms(settings.window), after.after_window_ms(settings.window)
            gain, promise = b - af, promise_of(f)
            gains.append(gain)
            befores.append(b)
            promises.append(promise)
            how = "none" if f is None else ("considered: " + (f.get("no_gain") or "")[:70] if f.get("no_gain") else "ranked")
            line = f"{t or 'torch':>8} {rep + 1:>3} {n:>7} {k or t or 'torch':>13} {b:>9.1f} {af:>9.1f} {gain:>+9.1f} {promise:>8.1f}  {how}"
            if not (before.ok and after.ok):
                line += f"  (failed: {before.error or after.error})"
            lines.append(line)
            print(line, flush=True)
        ok = [g for g in gains if not math.isnan(g)]
        if not ok:
            continue
        med_gain, med_promise = statistics.median(ok), statistics.median(promises)
        if med_promise < 0.5:
            # no gain promised: kept when the fix measured no gain beyond 5% of the step
            verdict = "kept (no gain promised, none measured)" if med_gain <= 0.05 * statistics.median(befores) else "missed (a gain was there)"
        else:
            ratio = med_gain / med_promise
            verdict = f"measured/promise {ratio:.2f}: " + ("kept (within ±50%)" if 0.5 <= ratio <= 1.5 else "missed")
        verdicts.append(
            f"threads {t or 'torch'}: measured gain median {med_gain:+.1f} ms (spread {min(ok):+.1f} .. {max(ok):+.1f}), "
            f"promise median {med_promise:.1f} ms -> {verdict}"
        )
    lines += ["", *verdicts]
    print("\n" + "\n".join(verdicts))
    if a.out is not None:
        a.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
