"""The fixes AdvisorBench does not score: what an unseeded finding's fix, or the fix a report
wrote where it differs from the manifest's twin, measures on its workload.

    python benchmarks/advisorbench/unseeded.py [--alternations 9] [--out FILE]

Each variant is its workload script with one textual change (below), written to a temporary
folder and run like the bench's pairs: defect and variant alternately, fresh processes,
unprofiled, the median of each run's steps, the median of the paired differences. The
manifest and the bench's scores are not touched: these measurements say whether a finding the
bench counts as a false positive (or a fix it did not measure) holds, for the reader of
docs/accuracy.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKLOADS = HERE / "workloads"
AUTOCAST = ("        logits = model(images)\n",
            "        with torch.autocast(\"cpu\", dtype=torch.bfloat16):\n            logits = model(images)\n")
# (workload, finding whose fix the variant applies, what it changes, (old text, new text))
VARIANTS = [
    ("cnn_inference", "cpu-autocast", "the forward pass under bf16 autocast", AUTOCAST),
    ("inference_threads", "cpu-autocast", "the forward pass under bf16 autocast", AUTOCAST),
    ("inference_clean", "cpu-autocast", "the forward pass under bf16 autocast",
     ("            scores.append(model(tokens)[:, 0].softmax(-1))\n",
      "            with torch.autocast(\"cpu\", dtype=torch.bfloat16):\n                scores.append(model(tokens)[:, 0].softmax(-1))\n")),
    ("cnn_clean", "unfused-elementwise", "the model compiled (torch.compile, the C++ backend)",
     ("    optimizer = torch.optim.SGD(model.parameters()",
      "    model = torch.compile(model)\n    optimizer = torch.optim.SGD(model.parameters()")),
    ("tabular_loader", "dataloader-stall", "the report's fix: one persistent worker and torch.set_num_threads(1)",
     ("shuffle=True, num_workers=0)", "shuffle=True, num_workers=1, persistent_workers=True)\n    torch.set_num_threads(1)")),
]


def step_median(script: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(WORKLOADS)}
    done = subprocess.run([sys.executable, str(script)], cwd=WORKLOADS, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"{script.name} failed: {done.stderr.strip().splitlines()[-1:]}")
    return statistics.median(json.loads(done.stdout.strip().splitlines()[-1])["step_ms"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--alternations", type=int, default=9)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--only", action="append", default=[], help="only this workload's variant (repeatable)")
    args = parser.parse_args(argv)
    lines = [f"unscored fixes on AdvisorBench's CPU workloads, {args.alternations} alternations each"]
    with tempfile.TemporaryDirectory(prefix="advisorbench-unseeded-") as tmp:
        for name, rule, what, (old, new) in VARIANTS:
            if args.only and name not in args.only:
                continue
            source = (WORKLOADS / f"{name}.py").read_text()
            if source.count(old) != 1:
                raise SystemExit(f"unseeded.py: {name}.py no longer has the line the variant changes: {old!r}")
            variant = Path(tmp) / f"{name}_variant.py"
            variant.write_text(source.replace(old, new))
            defect, fixed, loads = [], [], []
            for i in range(args.alternations):
                for script in ([WORKLOADS / f"{name}.py", variant] if i % 2 == 0 else [variant, WORKLOADS / f"{name}.py"]):
                    loads.append(os.getloadavg()[0])
                    (defect if script != variant else fixed).append(step_median(script))
            paired = [d - f for d, f in zip(defect, fixed, strict=True)]
            base = statistics.median(defect)
            lines.append(
                f"{name} ({rule}: {what}): {base:.3f} -> {statistics.median(fixed):.3f} ms, paired saving "
                f"{statistics.median(paired):.3f} ms ({100 * statistics.median(paired) / base:.1f}%, paired runs "
                f"{100 * min(paired) / base:.1f}% to {100 * max(paired) / base:.1f}%), load average median "
                f"{statistics.median(loads):.2f} (max {max(loads):.2f})"
            )
            print(lines[-1], flush=True)
    if args.out is not None:
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
