"""How often the advisor's kernel table reads a kernel right, by share of kernel time, against
`tests/data/kernel_truth.tsv` (library, family, math precision and matrix-unit use of every
distinct kernel name in ../shared/traces and the repository's recordings, labelled from the names).

Each trace is loaded and its kernel table built as `advisor report` builds it
(metrics.kernels.kernel_table); a kernel is right when its family, precision and matrix-unit use
all equal the truth's (`all`), and each column is scored alone too. Shares are of the trace's
kernel time; a generation's figure is the mean over its traces; `pooled` sums every trace's
kernel time first (large traces weigh more). The generation comes from the trace's
deviceProperties (name, compute capability), else from the trace's file name.

A kernel table from before the taxonomy (no `kind` column) is scored from its older columns:
family gemm/conv/attention/rnn or none (other), precision fp32-fma as fp32, Tensor Cores as yes/no.

    .venv/bin/python benchmarks/kernel_taxonomy.py [TRACE_OR_DIR ...]
"""

from __future__ import annotations

import csv
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from advisor.load.trace import load_trace  # noqa: E402
from advisor.metrics.breakdown import communication_kernels  # noqa: E402
from advisor.metrics.kernels import kernel_table  # noqa: E402

TRUTH = REPO / "tests" / "data" / "kernel_truth.tsv"
SHARED = REPO.parent / "shared" / "traces"
OWN = (REPO / "sample_runs", REPO / "tests" / "data")
COLUMNS = ("family", "precision", "matrix_unit")
SCORES = (*COLUMNS, "all", "matrix", "communication")

# Generations by compute capability, then by the device or file name.
GENERATION_OF_MAJOR = {7: "Volta", 8: "Ampere", 9: "Hopper", 10: "Blackwell", 12: "Blackwell"}
GENERATION_OF_NAME = (
    (r"(?i)\bmi\d{3}|instinct|gfx9|amd", "AMD CDNA"),
    (r"(?i)b200|b300|gb200|blackwell|rtx 50|(?:^|_)b\d00", "Blackwell"),
    (r"(?i)h100|h200|h800|h20\b|gh200|hopper", "Hopper"),
    (r"(?i)rtx ?40|4090|l4\b|l40|ada", "Ada"),
    (r"(?i)t4\b|rtx ?20|gtx ?16|turing|quadro rtx", "Turing"),
    (r"(?i)a100|a10\b|a30|a40|a4000|a6000|rtx ?30|pg509|ampere", "Ampere"),
    (r"(?i)v100|volta|titan v", "Volta"),
    (r"(?i)artemis|mtia", "MTIA"),
    (r"(?i)(?:^|/)cpu", "CPU"),
)


@dataclass(frozen=True)
class TraceScore:
    path: str
    generation: str
    vendor: str
    kernel_ns: float
    right: dict[str, float]  # column (or "all") -> share of kernel time read right
    unlabelled: int  # distinct kernel names the truth does not have


def read_truth(path: Path = TRUTH) -> pd.DataFrame:
    csv.field_size_limit(1 << 30)
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    return pd.DataFrame(rows[1:], columns=rows[0]).set_index("name")


def trace_files(roots: list[Path]) -> list[Path]:
    out = []
    for root in roots:
        if root.is_file():
            out.append(root)
            continue
        for p in sorted(root.rglob("*")):
            if p.is_file() and (p.name.endswith(".json") or p.name.endswith(".json.gz")) and p.name != "advisor_facts.json":
                out.append(p)
    return out


def generation_of(props: pd.DataFrame, path: Path) -> str:
    names = " ".join(str(n) for n in props["name"]) if "name" in props and len(props) else ""
    for pattern, gen in GENERATION_OF_NAME:
        if names and re.search(pattern, names):
            return gen
    caps = [c for c in props["compute_capability"] if c] if "compute_capability" in props and len(props) else []
    if caps:
        major, minor = (int(x) for x in str(caps[0]).split("."))
        if (major, minor) == (7, 5):
            return "Turing"
        if (major, minor) == (8, 9):
            return "Ada"
        return GENERATION_OF_MAJOR.get(major, "unknown")
    for part in reversed(path.parts):
        for pattern, gen in GENERATION_OF_NAME:
            if re.search(pattern, part):
                return gen
    return "unknown"


def kernel_columns(k: pd.DataFrame) -> pd.DataFrame:
    """family, precision, matrix_unit of each kernel row in the truth's words."""
    if "kind" in k:
        return pd.DataFrame({"family": k["kind"].astype(object), "precision": k["name_precision"].astype(object), "matrix_unit": k["matrix_unit"].astype(object)}, index=k.index)
    family = k["family"].astype(object).replace({"rnn": "gemm", "": "other"}).fillna("other")
    precision = k["precision"].astype(object).replace({"fp32-fma": "fp32", "": "unknown", "fp8": "fp8_e4m3"}).fillna("unknown")
    unit = np.where(k["tensor_core"].astype(bool), "yes", "no")
    return pd.DataFrame({"family": family, "precision": precision, "matrix_unit": unit}, index=k.index)


def score_trace(path: Path, truth: pd.DataFrame) -> TraceScore | None:
    frames = load_trace(path, hash_content=False)
    k = kernel_table(frames)
    if len(k) == 0:
        return None
    got = kernel_columns(k)
    names = k["name"].astype(str)
    dur = k["dur"].to_numpy(np.float64)
    total = float(dur.sum())
    if total <= 0:
        return None
    known = names.isin(truth.index).to_numpy()
    expected = truth.reindex(names.to_numpy())
    right = {}
    ok_all = known.copy()
    for col in COLUMNS:
        ok = known & (got[col].to_numpy() == expected[col].to_numpy())
        right[col] = float(dur[ok].sum() / total)
        ok_all &= ok
    right["all"] = float(dur[ok_all].sum() / total)
    # Matrix work (the truth's GEMM, grouped GEMM, convolution and attention kernels): precision and
    # unit right; communication (the truth's): counted as communication where the rules read it.
    truth_family = expected["family"].fillna("").to_numpy()
    matrix = np.isin(truth_family, ("gemm", "grouped_gemm", "conv", "attention"))
    matrix_ok = known & matrix & (got["precision"].to_numpy() == expected["precision"].to_numpy()) & (got["matrix_unit"].to_numpy() == expected["matrix_unit"].to_numpy())
    right["matrix"] = float(dur[matrix_ok].sum() / dur[matrix].sum()) if dur[matrix].sum() > 0 else float("nan")
    comm_rows = pd.Series(communication_kernels(frames), index=frames.device.index).loc[k.index].to_numpy()
    truth_comm = np.char.startswith(truth_family.astype(str), "communication")
    right["communication"] = float(dur[truth_comm & comm_rows].sum() / dur[truth_comm].sum()) if dur[truth_comm].sum() > 0 else float("nan")
    gen = generation_of(frames.device_properties, path)
    vendor = {"AMD CDNA": "AMD", "MTIA": "Meta", "CPU": "CPU", "unknown": "unknown"}.get(gen, "NVIDIA")
    return TraceScore(str(path), gen, vendor, total, right, int(names[~known].nunique()))


def _means(scores: list[TraceScore]) -> dict[str, float]:
    """Each score's mean over the traces that have it (a trace without matrix work or
    communication has no such score)."""
    out: dict[str, float] = {"traces": len(scores)}
    for c in SCORES:
        values = [s.right[c] for s in scores if not np.isnan(s.right[c])]
        out[c] = float(np.mean(values)) if values else float("nan")
    return out


def summarise(scores: list[TraceScore]) -> dict[str, dict[str, float]]:
    """Mean over traces per generation, per vendor, overall; and pooled over all kernel time."""
    out: dict[str, dict[str, float]] = {}
    for key, group in [("generation", lambda s: s.generation), ("vendor", lambda s: s.vendor)]:
        for value in sorted({group(s) for s in scores}):
            mine = [s for s in scores if group(s) == value]
            out[f"{key}:{value}"] = _means(mine)
    out["mean"] = _means(scores)
    total = sum(s.kernel_ns for s in scores)
    out["pooled"] = {c: float(sum(s.right[c] * s.kernel_ns for s in scores) / total) for c in (*COLUMNS, "all")} | {"traces": len(scores)}
    return out


def _display(path: str) -> str:
    """A trace's path from the data set's or the repository's folder on (shared/traces/..., sample_runs/...)."""
    for marker in ("/shared/traces/", "/sample_runs/", "/tests/data/"):
        at = path.find(marker)
        if at >= 0:
            return path[at + 1:]
    return path


def main(argv: list[str]) -> int:
    roots = [Path(a) for a in argv] or [r for r in (SHARED, *OWN) if r.exists()]
    truth = read_truth()
    scores = []
    for path in trace_files(roots):
        try:
            s = score_trace(path, truth)
        except Exception as exc:  # a file the loader refuses is not a kernel trace
            print(f"skipped {path}: {type(exc).__name__}", file=sys.stderr)
            continue
        if s is not None:
            scores.append(s)
    print(f"{'trace':<70} {'generation':<10} {'family':>7} {'prec':>7} {'unit':>7} {'all':>7} {'matrix':>7} {'comm':>7}  unlabelled")
    for s in scores:
        short = _display(s.path)[-70:]
        print(f"{short:<70} {s.generation:<10} " + " ".join(f"{100 * s.right[c]:6.1f}%" for c in SCORES) + f"  {s.unlabelled}")
    print()
    for key, row in summarise(scores).items():
        print(f"{key:<24} traces {row['traces']:>3}  " + " ".join(f"{c} {100 * row[c]:6.2f}%" for c in SCORES if c in row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
