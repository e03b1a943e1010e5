"""FLOPs and bytes per op: the advisor's roofline (advisor.metrics.op_cost.op_cost) against
AMD TraceLens's performance model, on the same op events of real traces.

TraceLens is not a dependency: install it in a scratch environment and name its Python:

    python3 -m venv /tmp/tl-venv && /tmp/tl-venv/bin/pip install pandas tqdm openpyxl
    git clone https://github.com/AMD-AGI/TraceLens /tmp/tracelens-src
    /tmp/tl-venv/bin/pip install --no-deps -e /tmp/tracelens-src
    .venv/bin/python benchmarks/roofline_vs_tracelens.py --tracelens-python /tmp/tl-venv/bin/python ../shared/traces/corpus/*.json.gz

Each distinct (op, shapes, types, scalar arguments) event that both model is costed by both
(TraceLens in a subprocess, reading the same events); the table gives, per op name, how many
distinct events agree within 1% on FLOPs and on bytes, and lists the ones that do not.
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import orjson

from advisor.metrics.autocast import input_type_names
from advisor.metrics.op_cost import op_cost

TRACELENS_SIDE = r"""
import json, sys, warnings
warnings.filterwarnings("ignore")
from TraceLens.PerfModel import torch_op_mapping as tm
models = tm.op_to_perf_model_class_map
events = json.load(open(sys.argv[1]))
out = []
for e in events:
    cls = models.get(e["name"])
    if cls is None:
        out.append(None); continue
    try:
        m = cls(e)
        out.append([float(m.flops()), float(m.bytes())])
    except Exception as exc:
        out.append(str(type(exc).__name__))
json.dump(out, sys.stdout)
"""


def events_of(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        doc = orjson.loads(f.read())
    seen, out = set(), []
    for e in doc.get("traceEvents", []) if isinstance(doc, dict) else doc:
        if e.get("ph") != "X" or e.get("cat") not in ("cpu_op", "Operator"):
            continue
        args = e.get("args") or {}
        if "Input Dims" not in args:
            continue
        key = (e.get("name"), orjson.dumps(args.get("Input Dims")), orjson.dumps(args.get("Input type")), orjson.dumps(args.get("Concrete Inputs")))
        if key in seen:
            continue
        seen.add(key)
        out.append({"name": e.get("name"), "args": {k: args[k] for k in ("Input Dims", "Input type", "Input Strides", "Concrete Inputs") if k in args}})
    return out


def close(a: float, b: float, tol: float = 0.01) -> bool:
    return abs(a - b) <= tol * max(abs(a), abs(b), 1.0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", nargs="+", type=Path)
    ap.add_argument("--tracelens-python", required=True, help="a Python with TraceLens installed")
    ap.add_argument("--show", type=int, default=5, help="disagreements to list per op")
    ns = ap.parse_args()
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])  # both, flops agree, bytes agree
    misses: dict[str, list[str]] = defaultdict(list)
    for path in ns.traces:
        events = events_of(path)
        mine = []
        for e in events:
            a = e["args"]
            types = input_type_names(orjson.dumps(a.get("Input type", [])).decode())
            mine.append(op_cost(e["name"], types, a.get("Input Dims"), a.get("Concrete Inputs")))
        tmp = Path("/tmp") / f"roofline_vs_tracelens_{path.name}.json"
        tmp.write_text(json.dumps(events))
        theirs = json.loads(subprocess.run([ns.tracelens_python, "-c", TRACELENS_SIDE, str(tmp)], capture_output=True, text=True, check=True).stdout)
        for e, m, t in zip(events, mine, theirs, strict=True):
            if m is None or not isinstance(t, list):
                continue
            name = e["name"]
            totals[name][0] += 1
            ok_f, ok_b = close(m.flops, t[0]), close(m.bytes, t[1])
            totals[name][1] += ok_f
            totals[name][2] += ok_b
            if not (ok_f and ok_b) and len(misses[name]) < ns.show:
                misses[name].append(f"{path.name}: {e['args'].get('Input Dims')} advisor {m.flops:.4g} FLOP {m.bytes:.4g} B; TraceLens {t[0]:.4g} FLOP {t[1]:.4g} B")
    print(f"{'op':45} {'events':>6} {'FLOPs within 1%':>16} {'bytes within 1%':>16}")
    all_n = all_f = all_b = 0
    for name, (n, f, b) in sorted(totals.items(), key=lambda kv: -kv[1][0]):
        print(f"{name:45} {n:6d} {f:16d} {b:16d}")
        all_n, all_f, all_b = all_n + n, all_f + f, all_b + b
    print(f"{'all':45} {all_n:6d} {all_f:16d} {all_b:16d}")
    for name, lines in misses.items():
        print(f"\n{name}:")
        for line in lines:
            print("  " + line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
