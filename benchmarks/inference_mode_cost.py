"""inference-mode's cost per graph node, and its promise against what its fix measures.

    .venv/bin/python benchmarks/inference_mode_cost.py                 # 3 repeats
    .venv/bin/python benchmarks/inference_mode_cost.py --repeats 5 --out benchmarks/results/inference_mode_cost.txt

Part 1, the rule's `node_us`: the forward passes of small eval-mode models on one thread, timed
with grad mode on and under `torch.inference_mode()`, alternating, each the median of many
passes (CPU time of the process, `time.process_time_ns`). The difference per pass, divided by
the graph nodes one grad-mode pass creates (counted by walking the output's graph), is the
host time autograd's bookkeeping costs per node: creating it, saving its tensors, freeing the
graph with the output. The rule's default is the median over the models other than the
recorded script's (that one is part 2's test).

Part 2, the promise: the inference script of tests/data/cpu_inference_grad (an 8-block MLP,
batch 8, one thread) profiled with `advisor profile --full` as it is (grad mode on) and with
the fix (`--inference-mode`), each repeat a fresh pair, and the committed recordings of that
script. The promise is inference-mode's saving alone on the first run; the measured gain is
the difference of the two runs' unprofiled medians (the steps after the profiled window, from
the facts file), so neither side carries the profiler's cost. The acceptance: the promise is
within ±50% of the measured gain.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "data" / "cpu_inference_grad" / "infer.py"
RECORDED = ROOT / "tests" / "data" / "cpu_inference_grad" / "runs"
RULE = "inference-mode"


def graph_nodes(out) -> int:
    """Nodes of the graph behind `out`, leaf accumulators aside."""
    seen, todo = set(), [out.grad_fn]
    while todo:
        fn = todo.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        todo.extend(f for f, _ in fn.next_functions)
    return sum(1 for fn in seen if type(fn).__name__ != "AccumulateGrad")


def models():
    import torch
    import torch.nn as nn

    sys.path.insert(0, str(SCRIPT.parent))
    import infer

    torch.manual_seed(0)
    mlp = nn.Sequential(*(infer.Block() for _ in range(infer.BLOCKS)), nn.Linear(infer.WIDTH, 10)).eval()
    yield "MLP 8x256, batch 8 (the recorded script)", mlp, torch.randn(8, infer.WIDTH)
    narrow = nn.Sequential(*(m for _ in range(6) for m in (nn.Linear(64, 64), nn.ReLU())), nn.Linear(64, 10)).eval()
    yield "MLP 6x64, batch 1", narrow, torch.randn(1, 64)

    def block(i, o):
        return [nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU()]

    cnn = nn.Sequential(*block(3, 16), *block(16, 16), nn.MaxPool2d(2), *block(16, 32), *block(32, 32),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10)).eval()
    yield "CNN 4 conv-bn-relu, 2x3x32x32", cnn, torch.randn(2, 3, 32, 32)
    wide = nn.Sequential(*(m for _ in range(4) for m in (nn.Linear(512, 512), nn.GELU())), nn.Linear(512, 10)).eval()
    yield "MLP 4x512, batch 32", wide, torch.randn(32, 512)

    class Attention(nn.Module):  # a hand-written pre-norm attention block: no fused path to take
        def __init__(self, d=128, heads=4):
            super().__init__()
            self.heads, self.norm, self.qkv, self.proj = heads, nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.mlp = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = self.qkv(self.norm(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
            a = torch.softmax(q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5, dim=-1) @ v
            x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
            return x + self.mlp(x)

    yield "attention blocks x2, d128, 1x32 tokens", nn.Sequential(Attention(), Attention()).eval(), torch.randn(1, 32, 128)


def node_costs(passes: int, rounds: int) -> list[tuple[str, int, float, float, float]]:
    import torch

    torch.set_num_threads(1)
    out = []
    for name, model, x in models():
        nodes = graph_nodes(model(x))

        def timed(mode, model=model, x=x) -> float:
            times = []
            with mode():
                for _ in range(passes):
                    t = time.process_time_ns()
                    model(x)
                    times.append(time.process_time_ns() - t)
            return statistics.median(times) / 1e3

        grad, inference = [], []
        for _ in range(rounds):
            grad.append(timed(contextlib.nullcontext))
            inference.append(timed(torch.inference_mode))
        g, i = statistics.median(grad), statistics.median(inference)
        out.append((name, nodes, g, i, (g - i) / max(nodes, 1)))
    return out


def unprofiled_median(run: Path) -> float:
    import orjson

    facts = orjson.loads((run / "advisor_facts.json").read_bytes())
    last = max(facts["profiled_steps"])
    return statistics.median(t for k, t in enumerate(facts["step_times_ms"]) if k > last)


def promise(run: Path) -> float | None:
    from advisor.analysis import analyze

    a = analyze(run)
    f = next((f for f in [*a.findings, *a.considered] if f.rule == RULE), None)
    if f is None:
        print(f"  {run.name}: {RULE} silent; findings {[x.rule for x in a.findings]}, warnings {a.warnings}", flush=True)
    return None if f is None else f.saving_alone_ms


def profile(out: Path, *args: str) -> Path:
    cmd = [str(ROOT / ".venv" / "bin" / "advisor"), "profile", "--full", "--out", str(out), str(SCRIPT), "--", "--threads", "1", *args]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=SCRIPT.parent)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    lines = []

    def say(line: str = "") -> None:
        print(line, flush=True)
        lines.append(line)

    say(f"load average at start: {os.getloadavg()[0]:.2f}")
    say("== Part 1: autograd's host time per graph node (grad mode on against inference_mode, 1 thread, CPU time) ==")
    say(f"{'model':42} {'nodes':>5} {'grad us':>9} {'inf. us':>9} {'us/node':>8}")
    costs = node_costs(passes=400, rounds=5)
    for name, nodes, g, i, per in costs:
        say(f"{name:42} {nodes:5d} {g:9.1f} {i:9.1f} {per:8.2f}")
    # The recorded script's model is the promise's test: the rule's figure comes from the others.
    say(f"median per node, the recorded script's model aside: {statistics.median(c[4] for c in costs[1:]):.2f} us (the rule's node_us)")
    say()
    say("== Part 2: the promise (saving alone, replayed) against before - after, unprofiled medians (wall clock) ==")
    say(f"{'run':18} {'before ms':>9} {'after ms':>9} {'measured':>9} {'promise':>8} {'promise/measured':>16}")
    ratios = []

    def row(label: str, before: Path, after: Path) -> None:
        b, a, pr = unprofiled_median(before), unprofiled_median(after), promise(before)
        measured = b - a
        ratio = (pr / measured) if pr is not None and measured > 0 else float("nan")
        ratios.append(ratio)
        shown = "silent" if pr is None else f"{pr:8.3f}"
        say(f"{label:18} {b:9.3f} {a:9.3f} {measured:+9.3f} {shown:>8} {ratio:16.2f}")

    row("recorded", RECORDED / "grad", RECORDED / "inference_mode")
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.repeats):
            before = profile(Path(tmp) / f"grad{k}", "--steps", str(args.steps))
            after = profile(Path(tmp) / f"im{k}", "--steps", str(args.steps), "--inference-mode")
            row(f"repeat {k + 1}", before, after)
    ok = [r for r in ratios if r == r]
    med = statistics.median(ok) if ok else float("nan")
    verdict = "within ±50%" if 0.5 <= med <= 1.5 else "OUTSIDE ±50%"
    say(f"promise/measured median {med:.2f} (range {min(ok):.2f} .. {max(ok):.2f}): {verdict}")
    if args.out:
        args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
