"""FLOPs and bytes per op: the advisor's roofline (advisor.metrics.op_cost.op_cost) against
AMD TraceLens's performance model, on the same op events of real traces.

TraceLens is not a dependency: install it in a scratch environment and name its Python:

    python3 -m venv /tmp/tl-venv && /tmp/tl-venv/bin/pip install pandas tqdm openpyxl
    git clone https://github.com/AMD-AGI/TraceLens /tmp/tracelens-src
    /tmp/tl-venv/bin/pip install --no-deps -e /tmp/tracelens-src
    .venv/bin/python benchmarks/roofline_vs_tracelens.py --tracelens-python /tmp/tl-venv/bin/python \\
        ../shared/traces tests/data/shared sample_runs

Each distinct (op, shapes, types, scalar arguments) event of a trace that both model is costed by
both (TraceLens in a subprocess, reading the same events). An event agrees when FLOPs and bytes
are both within 1%. One that does not either differs by a documented choice or is unexplained:
a documented choice (CHOICES, each explained with numbers in docs/reports.md) names how
TraceLens reads the event; the difference counts as that choice only when the advisor's own
model, given the event read TraceLens's way, gives TraceLens's FLOPs and bytes within 1%.
Events only one side models, and events TraceLens fails on (traces without the `Input Strides`
or `Concrete Inputs` it needs), are counted apart.
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import orjson

from advisor.metrics.autocast import input_type_names
from advisor.metrics.op_cost import BPE, REDUCE_DIM_THIRD, op_cost

TRACELENS_SIDE = r"""
import json, sys, warnings
warnings.filterwarnings("ignore")
from TraceLens.PerfModel import torch_op_mapping as tm
events = json.load(open(sys.argv[1]))
out = []
for e in events:
    cls = tm.resolve_perf_model_class(e["name"])  # its table, then its name patterns (Triton kernels)
    if cls is None:
        out.append(None); continue
    try:
        m = cls(e)
        out.append([float(m.flops()), float(m.bytes())])
    except Exception as exc:
        out.append(str(type(exc).__name__))
json.dump(out, sys.stdout)
"""


# --- the documented choices: how TraceLens reads an event where the advisor reads it otherwise ---
# Each takes (name, types, dims, concrete) and returns the event as TraceLens reads it, or None
# where the choice does not concern the event.
def _set(seq, i, value):
    out = list(seq) if isinstance(seq, list | tuple) else []
    out += [""] * (i + 1 - len(out))
    out[i] = value
    return out


def _mask(concrete, i):
    text = concrete[i] if isinstance(concrete, list) and i < len(concrete) and isinstance(concrete[i], str) else ""
    parts = [p.strip().lower() == "true" for p in text.strip("[] ").split(",") if p.strip()]
    return parts if len(parts) == 3 else None


# TraceLens's reduce model (aten_reduce) looks for `dim` among Concrete Inputs as Python ints
# and lists; a trace holds them as strings ("[1]"), so it reads every reduction as reducing all
# dimensions to one output element.
TL_REDUCE_OPS = {"sum", "mean", "max", "min", "norm", "linalg_norm", "std", "var", "logsumexp", "amin", "amax"}


def reduce_dim_read_as_absent(name, types, dims, concrete):
    op = name.removeprefix("aten::")
    at = 2 if op in REDUCE_DIM_THIRD else 1
    if op not in TL_REDUCE_OPS or not isinstance(dims, list) or len(dims) <= at + 1:
        return None
    if not isinstance(concrete, list) or at >= len(concrete) or concrete[at].strip("[] ") == "":
        return None
    return name, types, dims, _set(concrete, at, "")


# TraceLens's convolution_backward model (aten_conv_bwd) computes the input and the weight
# gradient whatever the output mask (argument 10) asks for.
def conv_bwd_output_mask_ignored(name, types, dims, concrete):
    mask = _mask(concrete, 10)
    if name != "aten::convolution_backward" or mask is None or (mask[0] and mask[1]):
        return None
    return name, types, dims, _set(concrete, 10, f"[True, True, {mask[2]}]")


# TraceLens's attention models count every tensor at 2 bytes an element (`bytes_per_element=2`,
# marked TODO in its source), whatever the dtype.
def attention_two_bytes(name, types, dims, concrete):
    if "attention" not in name or not types or BPE.get(types[0], 2) == 2:
        return None
    return name, tuple("c10::BFloat16" if t == types[0] else t for t in types), dims, concrete


# TraceLens's norm models take a weight (and bias) to be there when Input Dims holds anything at
# its place (`is not None`); a missing one is recorded as [], so a norm without weight is read
# as reading and scaling by one. Slots: op -> (weight, bias or None, where the normalized shape is).
NORM_WEIGHT_SLOTS = {
    "aten::layer_norm": (2, 3, 1), "aten::native_layer_norm": (2, 3, 1),
    "aten::_fused_rms_norm": (2, None, 1), "aten::_fused_rms_norm_backward": (4, None, 2),
}


def norm_weight_assumed(name, types, dims, concrete):
    slots = NORM_WEIGHT_SLOTS.get(name)
    if slots is None or not isinstance(dims, list) or not isinstance(concrete, list):
        return None
    w, b, shape_at = slots
    missing = [i for i in (w, b) if i is not None and (i >= len(dims) or not dims[i])]
    if not missing or shape_at >= len(concrete):
        return None
    shape = orjson.loads(concrete[shape_at]) if concrete[shape_at].startswith("[") else None
    if not shape:
        return None
    for i in missing:
        dims = _set(dims, i, shape)
    return name, types, dims, concrete


# TraceLens's batch-norm backward model (BatchNormBwd) takes cuDNN's and MIOpen's batch-norm
# backward to be an inference backward (`is_training = False  # by assertion`).
def batch_norm_backward_as_inference(name, types, dims, concrete):
    if name not in ("aten::cudnn_batch_norm_backward", "aten::miopen_batch_norm_backward") or not isinstance(dims, list) or len(dims) < 7:
        return None
    # cudnn/miopen: (input, grad_output, weight, running_mean, running_var, save_mean, save_var, ...)
    # native: (grad_out, input, weight, running_mean, running_var, save_mean, save_invstd, train, eps, output_mask)
    d = [dims[1], dims[0]] + list(dims[2:7]) + [[], [], []]
    t = tuple([types[1], types[0]] + list(types[2:7]) + ["Scalar", "Scalar", "ScalarList"]) if len(types) >= 7 else types
    return "aten::native_batch_norm_backward", t, d, ["", "", "", "", "", "", "", "False", "", "[True, True, True]"]


CHOICES = {
    "reduction over a dim": reduce_dim_read_as_absent,
    "convolution backward: output mask": conv_bwd_output_mask_ignored,
    "attention bytes: the tensors' dtype": attention_two_bytes,
    "norm without weight": norm_weight_assumed,
    "cuDNN/MIOpen batch-norm backward: training": batch_norm_backward_as_inference,
}


def close(a: float, b: float, tol: float = 0.01) -> bool:
    return abs(a - b) <= tol * max(abs(a), abs(b), 1.0)


def explain(name, types, dims, concrete, theirs) -> list[str] | None:
    """The documented choices that, applied together, turn the advisor's figures into
    TraceLens's; None where they do not."""
    used, event = [], (name, types, dims, concrete)
    for label, read in CHOICES.items():
        other = read(*event)
        if other is not None:
            used.append(label)
            event = other
    if not used:
        return None
    c = op_cost(*event)
    return used if c is not None and close(c.flops, theirs[0]) and close(c.bytes, theirs[1]) else None


# --- the traces ------------------------------------------------------------------------------------
def trace_files(paths: list[Path]) -> list[Path]:
    out = []
    for p in paths:
        if p.is_dir():
            out += sorted(f for f in p.rglob("*") if f.name.endswith((".json", ".json.gz")) and f.name != "advisor_facts.json")
        else:
            out.append(p)
    return out


def events_of(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            doc = orjson.loads(f.read())
    except (OSError, orjson.JSONDecodeError, EOFError):
        return []
    seen, out = set(), []
    for e in doc.get("traceEvents", []) if isinstance(doc, dict) else doc if isinstance(doc, list) else []:
        if not isinstance(e, dict) or e.get("ph") != "X" or e.get("cat") not in ("cpu_op", "Operator"):
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", nargs="+", type=Path, help="trace files, or folders to search for them")
    ap.add_argument("--tracelens-python", required=True, help="a Python with TraceLens installed")
    ap.add_argument("--show", type=int, default=3, help="examples to list per op and per choice")
    ns = ap.parse_args()
    # per op: both model, FLOPs within 1%, bytes within 1%, agree, documented choice, unexplained
    totals: dict[str, list[int]] = defaultdict(lambda: [0] * 6)
    by_choice: Counter = Counter()
    shown: dict[str, list[str]] = defaultdict(list)
    unexplained: list[str] = []
    only_tl, only_us, tl_failed = Counter(), Counter(), Counter()
    triton_zero = 0  # compiled kernels TraceLens costs at 0 bytes
    files = trace_files(ns.traces)
    read = 0
    for path in files:
        events = events_of(path)
        if not events:
            continue
        mine = []
        for e in events:
            a = e["args"]
            types = input_type_names(orjson.dumps(a.get("Input type", [])).decode())
            mine.append((types, op_cost(e["name"], types, a.get("Input Dims"), a.get("Concrete Inputs"))))
        tmp = Path("/tmp") / f"roofline_vs_tracelens_{path.name}.json"
        tmp.write_text(json.dumps(events))
        theirs = json.loads(subprocess.run([ns.tracelens_python, "-c", TRACELENS_SIDE, str(tmp)], capture_output=True, text=True, check=True).stdout)
        tmp.unlink()
        both_here = 0
        for e, (types, m), t in zip(events, mine, theirs, strict=True):
            name = e["name"]
            triton = name.startswith("triton_")
            triton_zero += triton and isinstance(t, list) and t[1] == 0
            if m is None:
                if isinstance(t, list):
                    only_tl["Triton kernels (triton_*)" if triton else name] += 1
                continue
            if t is None:
                only_us[name] += 1
                continue
            if not isinstance(t, list):
                tl_failed[name] += 1
                continue
            both_here += 1
            row = totals[name]
            ok_f, ok_b = close(m.flops, t[0]), close(m.bytes, t[1])
            row[0] += 1
            row[1] += ok_f
            row[2] += ok_b
            a = e["args"]
            line = f"{path.name}: {name} {a.get('Input Dims')} {list(types)} {a.get('Concrete Inputs')}: advisor {m.flops:.6g} FLOP {m.bytes:.6g} B; TraceLens {t[0]:.6g} FLOP {t[1]:.6g} B"
            if ok_f and ok_b:
                row[3] += 1
                continue
            why = explain(name, types, a.get("Input Dims"), a.get("Concrete Inputs"), t)
            if why is None:
                row[5] += 1
                unexplained.append(line)
                continue
            row[4] += 1
            label = " + ".join(why)
            by_choice[label] += 1
            if len(shown[label]) < ns.show:
                shown[label].append(line)
        read += both_here > 0
    print(f"{len(files)} trace files given, {read} with ops both model\n")
    print(f"{'op':50} {'events':>6} {'FLOPs 1%':>8} {'bytes 1%':>8} {'agree':>6} {'choice':>6} {'unexpl.':>7}")
    all_ = [0] * 6
    for name, row in sorted(totals.items(), key=lambda kv: (-kv[1][0], kv[0])):
        print(f"{name:50} {row[0]:6d} {row[1]:8d} {row[2]:8d} {row[3]:6d} {row[4]:6d} {row[5]:7d}")
        all_ = [x + y for x, y in zip(all_, row, strict=True)]
    print(f"{'all':50} {all_[0]:6d} {all_[1]:8d} {all_[2]:8d} {all_[3]:6d} {all_[4]:6d} {all_[5]:7d}")
    print(f"\nagree (FLOPs and bytes within 1%): {all_[3]}")
    print(f"differ by a documented choice: {all_[4]}")
    print(f"differ unexplained: {all_[5]}")
    print("\nDocumented choices (docs/reports.md), events and examples:")
    for label, n in by_choice.most_common():
        print(f"  {label}: {n}")
        for line in shown[label]:
            print(f"    {line}")
    if unexplained:
        print("\nUnexplained:")
        for line in unexplained:
            print(f"  {line}")
    print(f"\nOnly TraceLens models ({sum(only_tl.values())} events): " + ", ".join(f"{k} {v}" for k, v in only_tl.most_common()))
    print(f"  of the Triton kernels, TraceLens gives 0 bytes to {triton_zero} (its dtype table has no `float`: fp32 tensors count nothing)")
    print(f"Only the advisor models ({sum(only_us.values())} events): " + ", ".join(f"{k} {v}" for k, v in only_us.most_common()))
    print(f"TraceLens raises on ({sum(tl_failed.values())} events; mostly traces without the Input Strides or Concrete Inputs it reads): "
          + ", ".join(f"{k} {v}" for k, v in tl_failed.most_common()))
    return 1 if all_[5] else 0


if __name__ == "__main__":
    sys.exit(main())
