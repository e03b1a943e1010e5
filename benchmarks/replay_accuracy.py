"""Does the replay of the unmodified step graph reproduce the measured steps?

    .venv/bin/python benchmarks/replay_accuracy.py [--out benchmarks/results/replay_accuracy.txt]

For every trace under ../shared/traces, ../shared/whatif/h100_vit/* and
sample_runs/*/runs/*: load each rank, build its step graph, replay it with no change and
compare the median replayed step with the median measured step (target: within 3%). Where
the run's facts hold unprofiled step times (`advisor profile --full`), it also prints how
the replay takes the profiler's own cost out (advisor.whatif.savings.RankReplay.base): the
host scale, the DataLoader's scale to the unprofiled wait, and the time per step the trace does not explain (`h`: replayed as untimed host time after the step's longest wait; otherwise a fixed remainder).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from advisor.analysis import _read_facts  # noqa: E402
from advisor.cache import load_cached  # noqa: E402
from advisor.facts import typed_facts  # noqa: E402
from advisor.load.discover import find_run  # noqa: E402
from advisor.metrics.summary import compute_metrics  # noqa: E402
from advisor.metrics.unprofiled import unprofiled_steps  # noqa: E402
from advisor.whatif.graph import build_graph  # noqa: E402
from advisor.whatif.replay import replay_graph  # noqa: E402
from advisor.whatif.savings import RankReplay  # noqa: E402


def runs() -> list[Path]:
    shared = ROOT.parent / "shared"
    out = []
    traces = shared / "traces"
    if traces.is_dir():
        out += sorted(p for p in traces.iterdir() if p.is_dir() and p.name != "misc")
        out += sorted((traces / "misc").glob("*.json*"))
    out += sorted(p for p in (shared / "whatif" / "h100_vit").glob("*") if p.is_dir() and p.name != "logs")
    out += sorted(p for p in (ROOT / "sample_runs").glob("*/runs/*") if p.is_dir())
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    lines = [
        "replay of the unmodified step graph against the measured steps (median step, ms)",
        f"{'run':<44} {'rank':>4} {'steps':>5} {'measured':>9} {'replayed':>9} {'error':>7} {'build s':>7} {'replay s':>8} {'unprof.':>8} {'host x':>6} {'loader x':>8} {'rest ms':>7}",
    ]
    worst = 0.0
    for path in runs():
        warnings: list[str] = []
        run = find_run(path, None)
        facts = _read_facts(run.directory, warnings)
        for rank, frames in enumerate(load_cached(p) for p in run.files):
            m = compute_metrics(frames, rank)
            if len(m.steps) == 0:
                continue
            t0 = time.perf_counter()
            g = build_graph(frames, m.steps)
            t1 = time.perf_counter()
            r = replay_graph(g)
            t2 = time.perf_counter()
            measured = float(np.median(m.steps["duration"])) / 1e6
            err = (r.median_ms - measured) / measured if measured else 0.0
            worst = max(worst, abs(err))
            f = facts.get(rank) or facts.get(-1)
            after = unprofiled_steps(typed_facts(f))
            unprof, scale, loader, rest = "", "", "", ""
            if after is not None:
                rr = RankReplay(m, f)
                rr._graph = g
                _ = rr.base  # calibrates
                unprof = f"{rr._unprofiled:.2f}"
                scale, loader, rest = f"{rr.host_scale:.2f}", f"{rr.loader_scale:.2f}", f"{rr.remainder_ms + rr.step_host_ms:.2f}{'h' if rr.step_host_ms else ''}"
            name = str(path.relative_to(ROOT.parent) if path.is_relative_to(ROOT.parent) else path)
            lines.append(
                f"{name[-44:]:<44} {rank:>4} {len(m.steps):>5} {measured:>9.2f} {r.median_ms:>9.2f} {err:>+7.2%} {t1 - t0:>7.3f} {t2 - t1:>8.3f} {unprof:>8} {scale:>6} {loader:>8} {rest:>7}"
            )
            print(lines[-1], flush=True)
    lines.append(f"worst error: {worst:.2%} (target: within 3%)")
    print(lines[-1])
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
