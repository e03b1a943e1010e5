"""cpu-autocast's speed-up table: fp32 against bf16 autocast, per matrix op, on this CPU.

    .venv/bin/python benchmarks/cpu_bf16_speedup.py
    .venv/bin/python benchmarks/cpu_bf16_speedup.py --out benchmarks/results/cpu_bf16_speedup.txt

Linear layers and convolutions of a range of sizes, in eval mode under `torch.inference_mode()`
on one thread, timed fp32 and under `torch.autocast("cpu", dtype=torch.bfloat16)` (the casts of
the weight and the input to bf16 included, as autocast pays them on every call). Each figure
is the median CPU time (`time.process_time_ns`) of many calls, the two precisions alternating.
The table gives the ratio autocast/fp32 against the fp32 time of one call: the rule
interpolates it (in log time) for each fp32 matrix op of a run's forward pass. The last
columns time the same op with its inputs and weights already bf16 (no casts): the products
of a backward pass under autocast, whose inputs (the saved activations, the gradients) are
bf16 already. Small ops lose (the casts and
the bf16 kernel's fixed cost outweigh the faster arithmetic); large ones gain about 2×.
The CPU's flags are printed first: the figures hold for a CPU with native bf16 (avx512_bf16
or amx_bf16) only.

Part 2, the promise: the inference script of tests/data/cpu_inference_grad at batch 256 (an
8-block MLP of 256-wide linear layers, under inference_mode, one thread) profiled with
`advisor profile --full` as it is and with the fix (`--bf16`: the forward under autocast),
each repeat a fresh pair, and the committed recordings (runs/batch256, runs/batch256_bf16).
Then the same for a training run: the CPU transformer sample (sample_runs/cpu_transformer/
train.py, one thread, `--bf16` around its forward pass and loss), against the committed
recording tests/data/cpu_transformer_train/runs/fp32 and fresh pairs. The promise is
cpu-autocast's saving alone on the first run; the measured gain is the
difference of the two runs' unprofiled medians (facts file), wall clock. The acceptance: the
promise within ±50% of the measured gain.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def timed(fn, calls: int) -> float:
    times = []
    for _ in range(calls):
        t = time.process_time_ns()
        fn()
        times.append(time.process_time_ns() - t)
    return statistics.median(times) / 1e3


def cases():
    import torch
    import torch.nn as nn

    for m, k, n in [(8, 256, 256), (32, 256, 256), (64, 256, 256), (128, 256, 256), (256, 256, 256), (512, 256, 256),
                    (1024, 128, 384), (1024, 128, 512), (1024, 512, 128), (256, 512, 512), (2048, 256, 256), (1024, 1024, 1024)]:
        yield f"linear {m}x{k} -> {n}", nn.Linear(k, n).eval(), torch.randn(m, k)
    for b, c, hw in [(1, 16, 32), (4, 32, 32), (8, 64, 32), (4, 128, 16)]:
        yield f"conv3x3 {b}x{c}x{hw}x{hw}", nn.Conv2d(c, c, 3, padding=1).eval(), torch.randn(b, c, hw, hw)


def measure(rounds: int = 5) -> list[tuple[str, float, float, float]]:
    import torch

    torch.set_num_threads(1)
    out = []
    with torch.inference_mode():
        for name, module, x in cases():
            module(x)
            calls = 20 if x.numel() * module.weight.numel() > 2**26 else 200
            half = copy.deepcopy(module).bfloat16()
            xh = x.bfloat16()
            fp32, bf16, native = [], [], []
            for _ in range(rounds):
                fp32.append(timed(lambda module=module, x=x: module(x), calls))
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    bf16.append(timed(lambda module=module, x=x: module(x), calls))
                native.append(timed(lambda half=half, xh=xh: half(xh), calls))
            out.append((name, statistics.median(fp32), statistics.median(bf16), statistics.median(native)))
    return out


def main() -> None:
    import torch

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--train-repeats", type=int, default=3)
    p.add_argument("--skip-table", action="store_true", help="part 2 only")
    args = p.parse_args()
    from advisor.capture.facts import cpu_flags

    lines = [
        f"torch {torch.__version__}, capability {torch.backends.cpu.get_cpu_capability()}, flags {cpu_flags()}",
        f"load average at start: {os.getloadavg()[0]:.2f}; one thread, CPU time, medians",
        f"{'op':30} {'fp32 us':>9} {'autocast us':>11} {'autocast/fp32':>13} {'bf16 us':>9} {'bf16/fp32':>9}",
    ]
    for name, f, b, h in ([] if args.skip_table else sorted(measure(), key=lambda r: r[1])):
        lines.append(f"{name:30} {f:9.1f} {b:11.1f} {b / f:13.2f} {h:9.1f} {h / f:9.2f}")
    lines += ["", "== Part 2: the promise (saving alone, replayed) against before - after, unprofiled medians (wall clock) =="]
    lines.append(f"{'run':18} {'before ms':>9} {'after ms':>9} {'measured':>9} {'promise':>8} {'promise/measured':>16}")
    spec = importlib.util.spec_from_file_location("inference_mode_cost", Path(__file__).with_name("inference_mode_cost.py"))
    bench = importlib.util.module_from_spec(spec)
    sys.modules["inference_mode_cost"] = bench
    spec.loader.exec_module(bench)
    bench.RULE = "cpu-autocast"
    ratios = []

    def row(label: str, before: Path, after: Path) -> None:
        b, a, pr = bench.unprofiled_median(before), bench.unprofiled_median(after), bench.promise(before)
        ratio = pr / (b - a) if pr is not None and b > a else float("nan")
        ratios.append(ratio)
        shown = "silent" if pr is None else f"{pr:8.3f}"
        lines.append(f"{label:18} {b:9.3f} {a:9.3f} {b - a:+9.3f} {shown:>8} {ratio:16.2f}")
        print(lines[-1], flush=True)

    row("recorded", bench.RECORDED / "batch256", bench.RECORDED / "batch256_bf16")
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.repeats):
            common = ("--steps", "300", "--inference-mode", "--batch", "256")
            row(f"repeat {k + 1}", bench.profile(Path(tmp) / f"fp32{k}", *common), bench.profile(Path(tmp) / f"bf16{k}", *common, "--bf16"))
    def verdict(label: str) -> None:
        ok = [r for r in ratios if r == r]
        med = statistics.median(ok) if ok else float("nan")
        lines.append(f"{label}: promise/measured median {med:.2f} (range {min(ok):.2f} .. {max(ok):.2f}): "
                     f"{'within ±50%' if 0.5 <= med <= 1.5 else 'OUTSIDE ±50%'}")
        print(lines[-1], flush=True)
        ratios.clear()

    verdict("inference, batch 256")
    sample = ROOT / "sample_runs" / "cpu_transformer" / "train.py"

    def train(out: Path, *extra: str) -> Path:
        cmd = [str(ROOT / ".venv" / "bin" / "advisor"), "profile", "--full", "--out", str(out), str(sample), "--", "--threads", "1", "--steps", "40", *extra]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=sample.parent)
        return out

    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.train_repeats):
            before, after = train(Path(tmp) / f"fp32{k}"), train(Path(tmp) / f"bf16{k}", "--bf16")
            row(f"train {k + 1}", before, after)
            if k == 0:
                row("train, recorded", ROOT / "tests" / "data" / "cpu_transformer_train" / "runs" / "fp32", after)
    verdict("training, the CPU transformer")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out:
        args.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
