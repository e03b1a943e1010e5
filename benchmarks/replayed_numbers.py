"""Every recorded run's replayed numbers, one JSON line each: the replayed step, the top ranked
finding and its saving, the step with every fix replayed together. Run it on two versions of
the code (PYTHONPATH picks which `advisor`) and compare the two files with --compare.

    ADVISOR_CACHE=off PYTHONPATH=. .venv/bin/python benchmarks/replayed_numbers.py --out before.jsonl
    .venv/bin/python benchmarks/replayed_numbers.py --compare before.jsonl after.jsonl

The runs are tests/corpus.py's: ../shared/traces (with corpus/), this project's recordings and
the data set's ViT runs and kernel traces.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1] / "tests"


def _runs() -> list[tuple[str, Path]]:
    sys.path.insert(0, str(TESTS))
    import corpus

    out = []
    for name in [*corpus.public_traces(), *corpus.own_runs(), *corpus.data_set_runs()]:
        try:
            out.append((name, corpus.resolve(name)))
        except BaseException:  # noqa: BLE001 - pytest.skip: not here
            continue
    return out


def measure(out: Path) -> None:
    from advisor.analysis import analyze
    from advisor.config import Config

    with out.open("w") as fh:
        for name, path in _runs():
            t = time.perf_counter()
            try:
                a = analyze(path, config=Config())
            except Exception as exc:  # noqa: BLE001 - said in the row
                row = {"trace": name, "error": f"{type(exc).__name__}: {exc}"[:200]}
            else:
                head = a.headline()
                top = next((f for f in a.findings if f.saving_ms), None)
                row = {
                    "trace": name,
                    "step_ms": None if head is None else round(head.baseline_ms, 3),
                    "top": None if top is None else top.rule,
                    "top_ms": None if top is None else round(top.saving_ms, 3),
                    "all_fixes_ms": None if head is None or head.all_fixes_ms is None else round(head.all_fixes_ms, 3),
                    "findings": {f.rule: round(f.saving_ms or 0.0, 3) for f in a.findings},
                }
            row["s"] = round(time.perf_counter() - t, 1)
            fh.write(json.dumps(row) + "\n")
            fh.flush()
            print(row["trace"], row.get("step_ms"), row.get("top"), row.get("top_ms"), row.get("error", ""), flush=True)


def compare(before: Path, after: Path, every: bool = False) -> None:
    b = {r["trace"]: r for r in map(json.loads, before.read_text().splitlines())}
    a = {r["trace"]: r for r in map(json.loads, after.read_text().splitlines())}
    print(f"{'trace':<58} {'step ms':>17} {'top saving (rule: before -> after ms)':<60} {'all fixes ms':>17}")
    same = 0
    for name in sorted(b.keys() | a.keys()):
        x, y = b.get(name, {}), a.get(name, {})

        def pair(k, x=x, y=y):
            return f"{x.get(k)} -> {y.get(k)}" if x.get(k) != y.get(k) else f"{x.get(k)}"

        changed = {k for k in ("step_ms", "top", "top_ms", "all_fixes_ms", "findings", "error") if x.get(k) != y.get(k)}
        if not changed:
            same += 1
            if every:
                top = f"{x.get('top')}: {x.get('top_ms')}" if "error" not in x else x["error"][:58]
                print(f"{name:<58} {str(x.get('step_ms')):>17} {top:<60} {str(x.get('all_fixes_ms')):>17}")
            continue
        top = f"{x.get('top')}: {x.get('top_ms')}" + (f" -> {y.get('top')}: {y.get('top_ms')}" if {"top", "top_ms"} & changed else "")
        print(f"{name:<58} {pair('step_ms'):>17} {top:<60} {pair('all_fixes_ms'):>17}")
        moved = {r: (x.get("findings", {}).get(r), y.get("findings", {}).get(r)) for r in x.get("findings", {}).keys() | y.get("findings", {}).keys()}
        moved = {r: v for r, v in moved.items() if v[0] != v[1]}
        if moved:
            print(f"{'':<58}   findings moved: " + ", ".join(f"{r} {v[0]} -> {v[1]}" for r, v in sorted(moved.items())))
        if "error" in changed:
            print(f"{'':<58}   error: {x.get('error')} -> {y.get('error')}")
    print(f"unchanged: {same} of {len(b.keys() | a.keys())} runs")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--compare", type=Path, nargs=2)
    ap.add_argument("--all", action="store_true", help="with --compare: every run, not only those that moved")
    args = ap.parse_args()
    if args.compare:
        compare(*args.compare, every=args.all)
    elif args.out:
        measure(args.out)
    else:
        ap.error("--out or --compare")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
