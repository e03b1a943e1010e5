"""Host time per kernel of compiled code: where `changes.COMPILED_HOST_NS_PER_KERNEL` comes from.

    .venv/bin/python benchmarks/compiled_host_cost.py [--out benchmarks/results/compiled_host_cost.txt]

A compiled region's kernels are launched by Inductor's generated Python wrapper, not by
eager dispatch; the replay of `torch.compile` (rules/unfused_elementwise.py) charges each
kernel the compiled region keeps this much host time. The figure is read from a recorded run
that no promise is scored against: the sample's `gpu_compiled` (ResNet-18, `--compile`, on an
H100), whose unprofiled steps were no faster than its window, so its window's host figures are
not inflated by the profiler (its calibrated host scale is 1.0). For each run this prints the
host time per step inside the compiled regions (Dynamo's `Torch-Compiled Region` and the
compiled backward, merged), the kernel launches inside them, and their ratio: in the window,
and times the run's calibrated host scale (the unprofiled figure, where the host bounds the
step; on a device-bound run the scale is only an upper bound and the figure is not used).
The ViT runs of ../shared/whatif are the cross-check, not the source.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from advisor.analysis import analyze  # noqa: E402
from advisor.config import Config  # noqa: E402
from advisor.metrics.breakdown import name_matches  # noqa: E402
from advisor.metrics.host_device import LAUNCH_CALL  # noqa: E402
from advisor.metrics.intervals import covers, merge  # noqa: E402
from advisor.whatif.changes import COMPILED_HOST_NS_PER_KERNEL  # noqa: E402
from advisor.whatif.savings import rank_replay  # noqa: E402
from advisor.metrics.elementwise import COMPILED_REGION  # noqa: E402

SOURCE = ROOT / "sample_runs" / "resnet18_cifar" / "runs" / "gpu_compiled"
CROSS_CHECKS = {"h100_vit/compile": "whatif/h100_vit/compile", "h100_vit/all": "whatif/h100_vit/all"}


def compiled_host_per_kernel(run: Path) -> dict:
    """Compiled-region host time and kernel launches per step of a recorded run (window
    figures), and the run's calibrated host scale."""
    a = analyze(run, config=Config()).with_primary_frames()
    m = a.primary
    frames = m.frames
    host = frames.host
    regions = host[name_matches(host["name"], COMPILED_REGION)]
    s, e = merge(regions["ts"].to_numpy(np.int64), regions["end"].to_numpy(np.int64))
    rt = frames.runtime
    launches = rt[name_matches(rt["name"], LAUNCH_CALL)]
    inside = covers(s, e, launches["ts"].to_numpy(np.int64)) if len(s) else np.zeros(len(launches), dtype=bool)
    n_steps = max(len(m.steps), 1)
    host_ns = float((e - s).sum()) / n_steps
    kernels = float(np.count_nonzero(inside)) / n_steps
    scale = rank_replay(m, a.run_facts()).host_scale
    return {"host_ms_per_step": host_ns / 1e6, "kernels_per_step": kernels, "window_us_per_kernel": host_ns / max(kernels, 1) / 1e3, "host_scale": scale}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    rows = [("sample gpu_compiled (source)", SOURCE)]
    shared = ROOT.parent / "shared"
    vendored = ROOT / "tests" / "data" / "shared"
    for name, rel in CROSS_CHECKS.items():
        found = next((root / rel for root in (vendored, shared) if (root / rel).is_dir()), None)
        if found is not None:
            rows.append((f"{name} (cross-check)", found))
    lines = ["host time of compiled code per kernel launched (compiled regions: Torch-Compiled Region and the compiled backward)"]
    lines.append(f"{'run':<32} {'host ms/step':>12} {'kernels/step':>12} {'window µs/kernel':>17} {'host scale':>10} {'unprofiled µs/kernel':>21}")
    for name, run in rows:
        r = compiled_host_per_kernel(run)
        lines.append(
            f"{name:<32} {r['host_ms_per_step']:>12.2f} {r['kernels_per_step']:>12.1f} {r['window_us_per_kernel']:>17.1f} "
            f"{r['host_scale']:>10.3f} {r['window_us_per_kernel'] * r['host_scale']:>21.1f}"
        )
    lines.append(f"changes.COMPILED_HOST_NS_PER_KERNEL: {COMPILED_HOST_NS_PER_KERNEL / 1e3:.1f} µs")
    print("\n".join(lines))
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
