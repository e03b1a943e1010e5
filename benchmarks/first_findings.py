"""The first three findings of every shared trace, one line each: what a user reads first.

    .venv/bin/python benchmarks/first_findings.py                 # print the table
    .venv/bin/python benchmarks/first_findings.py -o benchmarks/results/first_findings_after.txt

Each shared trace (every file under ../shared/traces/misc, every other run folder there, the
misc folder as a whole, the ViT compiled run), every recorded run under sample_runs/ and the
autograd-profiler recording in tests/data is analysed as `advisor report PATH` would,
with the analysis cache off. Per run: the device line, the mean step time, then the first
three findings (rule, saving per step, rank, and the message's first sentence). Comparing
the file written before a change with the one written after shows what the change did to
the advice a user gets.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"


def shared_runs() -> list[Path]:
    traces = SHARED / "traces"
    runs = [p for p in sorted(traces.iterdir()) if p.is_dir() and p.name != "misc"]
    runs += sorted((traces / "misc").iterdir())
    runs.append(traces / "misc")
    runs.append(SHARED / "whatif" / "h100_vit" / "compile")
    # The project's own recordings: every run of every sample, and the autograd-profiler recording.
    samples = ROOT / "sample_runs"
    runs += sorted(p for p in samples.glob("*/runs/*") if p.is_dir())
    runs.append(ROOT / "tests" / "data" / "autograd_profiler_cpu" / "resnet18_cpu_autograd.json.gz")
    return [r for r in runs if r.exists()]


def first_sentence(text: str, limit: int = 150) -> str:
    text = " ".join(text.split())
    cut = text.find(". ")
    text = text[: cut + 1] if 0 < cut < limit else text
    return text if len(text) <= limit else text[: limit - 1] + "…"


def describe(path: Path) -> list[str]:
    from advisor.analysis import analyze
    from advisor.errors import InputError

    # shared runs as ../shared names them, the repository's own from its root (whatever the checkout is called)
    label = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.relative_to(ROOT.parent) if path.is_relative_to(ROOT.parent) else path
    try:
        a = analyze(path)
    except InputError as exc:
        return [f"{label}: refused: {exc.line()}"]
    s = a.summary()
    step = s.get("step_time_ms") or {}
    mean = step.get("mean")
    device = a.primary.device.name or ("device not named in the trace" if a.primary.has_device else "CPU only")
    head = f"{label}  [{device}; {s.get('steps', 0)} steps; mean {mean:.1f} ms]" if mean else f"{label}  [{device}; no steps]"
    lines = [head]
    for i, f in enumerate(a.findings[:3], 1):
        saving = f"{f.saving_ms:.1f} ms" if f.saving_ms is not None else "risk"
        rank = f" rank {f.rank}" if len(a.ranks) > 1 else ""
        lines.append(f"  {i}. {f.rule} ({saving}{rank}): {first_sentence(f.message)}")
    if not a.findings:
        lines.append("  (no findings)")
    for w in a.warnings + a.notes():
        lines.append(f"  note: {first_sentence(w, 200)}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", type=Path, help="also write the table to this file")
    args = parser.parse_args()
    os.environ["ADVISOR_CACHE"] = "off"
    sys.path.insert(0, str(ROOT))
    out = []
    for run in shared_runs():
        out += describe(run)
    text = "\n".join(out) + "\n"
    print(text, end="")
    if args.output:
        args.output.write_text(text)


if __name__ == "__main__":
    main()
