"""Does torch.compile pay on a small CPU inference model? Measured before a CPU compile rule is written.

    .venv/bin/python benchmarks/cpu_compile.py --out benchmarks/results/cpu_compile.txt

The 8-block MLP of tests/data/cpu_inference_grad (LayerNorm, Linear, GELU, residual add; the
elementwise chains a compiler fuses) under `torch.inference_mode()` on one thread, eager
against `torch.compile(model)` (Inductor, default mode), at batch 8 and 256: the compile time,
then per batch size the medians of the forward pass's CPU time (`time.process_time_ns`, all
threads of the process) and wall time, the two alternating. No rule advises compiling a CPU-only run while this shows no gain.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    import torch

    sys.path.insert(0, str(ROOT / "tests" / "data" / "cpu_inference_grad"))
    import infer

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(infer.Block() for _ in range(infer.BLOCKS)), torch.nn.Linear(infer.WIDTH, 10)).eval()
    compiled = torch.compile(model)
    lines = [f"torch {torch.__version__}, one thread, load average at start {os.getloadavg()[0]:.2f}; CPU and wall time, medians"]
    for batch in (8, 256):
        x = torch.randn(batch, infer.WIDTH)
        t0 = time.time()
        with torch.inference_mode():
            compiled(x)
        lines.append(f"batch {batch}: compile (first call) {time.time() - t0:.1f} s wall")

        def run(f, n=300, x=x):
            cpu, wall = [], []
            with torch.inference_mode():
                for _ in range(n):
                    t, w = time.process_time_ns(), time.perf_counter_ns()
                    f(x)
                    cpu.append(time.process_time_ns() - t)
                    wall.append(time.perf_counter_ns() - w)
            return statistics.median(cpu) / 1e6, statistics.median(wall) / 1e6

        eager, comp = [], []
        for _ in range(3):
            eager.append(run(model))
            comp.append(run(compiled))
        (e, ew), (c, cw) = (tuple(statistics.median(v[i] for v in runs) for i in (0, 1)) for runs in (eager, comp))
        lines.append(f"batch {batch}: CPU time eager {e:.3f} ms, compiled {c:.3f} ms ({c / e:.2f}); wall eager {ew:.3f} ms, compiled {cw:.3f} ms ({cw / ew:.2f})")
        print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out:
        args.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
