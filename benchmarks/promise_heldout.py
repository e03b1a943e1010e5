"""Promises on the H200 runs (recorded to be held out, since used to tune unfused-elementwise: see tests/data/labels/README.md): two models, each fix alone.

    .venv/bin/python benchmarks/promise_heldout.py [--out benchmarks/results/promise_heldout_h200.txt]

The pairs (sample_runs/heldout_h200/README.md says how each was recorded):
- the sample script's ResNet-18 at 224x224 (benchmarks/record_resnet_pairs.sh), from a fed
  baseline (8 workers, pinned memory, batch 128: the device holds the step) and a starved one
  (the script's defaults: the input pipeline is the step), once with the host's step clock only
  and once more, for the fed baseline, with the device clock (advisor.capture.device_clock);
- the ViT of the shared what-if set (the same script and switches as the H100 set) on the H200;
- `hooks_fixed/`: the baselines and their `--compile` runs again, recorded after the capture's
  module hooks stopped breaking compiled graphs. Before that fix every compiled run of the
  first sets ran with a graph break at each submodule (13 compiled frames for ResNet-18, where
  one is right), so those compile pairs measured the advisor's own damage, not the fix: they
  are listed, not counted.

The promise is the replayed saving of the fix's rules on the baseline's report, as in
promise_accuracy.py. The measured gain is the drop of the median unprofiled step (per the
baseline's samples for a bigger batch), the device clock's steps where the run has them. Beside
it, the drop of the lower quartile: the run's quiet steps, away from the stalls that the
DataLoader's workers and the host's other threads put into some steps of every run (the same
run's median moved by up to 4 ms between two recordings). Right: within ±25% of the measured
gain, or, for a gain under 1 ms, a promise under 2 ms; a gain the median and the quartile
disagree on by more than 1 ms and 25% is marked as noise and not counted.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from promise_accuracy import AUTOCAST_ALONE, VIT_FIXES, Before, right  # noqa: E402

from advisor.facts import read_facts, typed_facts  # noqa: E402
from advisor.metrics.unprofiled import unprofiled_steps  # noqa: E402

HELD_OUT = ROOT / "sample_runs" / "heldout_h200"
# (baseline whose report makes the promise, baseline run measured, fix run, rules, batch multiple,
#  why the pair is not counted or "")
BROKEN = "compiled with a graph break at every submodule (the capture's old hooks)"
PAIRS = [
    ("resnet18_device_clock/fed", "resnet18_device_clock/fed", "resnet18_device_clock/fed_amp", ["tensor-cores-unused"], 1, ""),
    ("resnet18_device_clock/fed", "hooks_fixed/fed", "hooks_fixed/fed_compile", ["unfused-elementwise"], 1, ""),
    ("resnet18_device_clock/fed", "resnet18_device_clock/fed", "resnet18_device_clock/fed_set_to_none", ["zero-grad-memset"], 1, ""),
    ("resnet18_host_clock/fed", "resnet18_host_clock/fed", "resnet18_host_clock/fed_uint8", ["h2d-copy-volume"], 1, ""),
    ("resnet18_host_clock/fed", "resnet18_host_clock/fed", "resnet18_host_clock/fed_batch512", ["spare-gpu-memory"], 4, ""),
    ("resnet18_host_clock/starved", "resnet18_host_clock/starved", "resnet18_host_clock/starved_workers", ["dataloader-stall"], 1, ""),
    ("resnet18_host_clock/starved", "resnet18_host_clock/starved", "resnet18_host_clock/starved_pin", ["h2d-pageable-copy"], 1, ""),
    ("resnet18_host_clock/starved", "resnet18_host_clock/starved", "resnet18_host_clock/starved_batch128", ["spare-gpu-memory"], 4, ""),
    *[("vit/baseline", "vit/baseline", f"vit/{fix}", rules, 4 if fix == "batch256" else 1, "") for fix, rules in VIT_FIXES.items() if fix != "compile"],
    ("vit/baseline", "hooks_fixed/vit_baseline", "hooks_fixed/vit_compile", ["unfused-elementwise"], 1, ""),
    ("resnet18_device_clock/fed", "resnet18_device_clock/fed", "resnet18_device_clock/fed_compile", ["unfused-elementwise"], 1, BROKEN),
    ("resnet18_device_clock/fed", "resnet18_device_clock/fed", "resnet18_device_clock/fed_reduce_overhead",
     ["launch-bound", "unfused-elementwise", "zero-grad-memset"], 1, BROKEN),
    ("vit/baseline", "vit/baseline", "vit/compile", ["unfused-elementwise"], 1, BROKEN),
]


def step_stats(run: Path) -> tuple[float, float, bool]:
    """Median and lower quartile of the unprofiled steps (ms), and whether the device clock timed them."""
    facts = read_facts(run / "advisor_facts.json")
    after = unprofiled_steps(typed_facts(facts))
    assert after is not None, f"{run}: no unprofiled steps"
    device = bool(facts.get("device_step_times_ms"))
    return float(np.median(after.step_ms)), float(np.percentile(after.step_ms, 25)), device


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    lines = [
        "held-out promises: NVIDIA H200 (torch 2.11), each fix alone; promise = replayed saving on the baseline's report,",
        "measured = drop of the unprofiled step (ms per baseline step; median, and lower quartile = quiet steps)",
        f"{'pair':<44} {'rules':<28} {'promised':>8} {'median':>7} {'quiet':>7} {'ratio':>6}  clock   right",
    ]
    befores: dict[Path, Before] = {}
    counted = ok = 0
    for promise_dir, base, fix, rules, k, why_not in PAIRS:
        before = befores.setdefault(promise_dir, Before(HELD_OUT / promise_dir))
        b_med, b_q, b_dev = step_stats(HELD_OUT / base)
        a_med, a_q, a_dev = step_stats(HELD_OUT / fix)
        measured, quiet = b_med - a_med / k, b_q - a_q / k
        promised = before.promise(rules, autocast_alone=fix.startswith("vit/") and fix[4:] in AUTOCAST_ALONE)
        noise = abs(measured - quiet) > max(1.0, 0.25 * max(abs(measured), abs(quiet)))
        if why_not:
            verdict = "not counted: " + why_not
        elif noise:
            verdict = "noise"
        else:
            good = right(promised, measured)
            counted += 1
            ok += good
            verdict = "yes" if good else "no"
        ratio = promised / measured if abs(measured) > 1e-9 else float("nan")
        clock = "device" if b_dev and a_dev else "host"
        name = f"{promise_dir.split('_')[0].split('/')[0]} {base.split('/')[-1]} -> {fix.split('/')[-1]}"
        lines.append(f"{name:<44} {','.join(rules)[:28]:<28} {promised:>8.2f} {measured:>7.2f} {quiet:>7.2f} {ratio:>6.2f}  {clock:<7} {verdict}")
    listed = sum(1 for p in PAIRS if p[5])
    lines.append(f"right: {ok} of {counted} counted ({100 * ok / max(counted, 1):.0f}%); {len(PAIRS) - counted - listed} pairs within their runs' noise, "
                 f"{listed} listed but not counted")
    print("\n".join(lines))
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
