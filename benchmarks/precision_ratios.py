"""How much faster each kernel family runs in TF32, bf16 and fp16 than in fp32, measured on the
H100 kernel corpus, against the table the advisor uses (metrics.precision.MEASURED_RATIOS).

The corpus (`../shared/kernels/h100/`) runs the same cases (`case:linear`, `case:conv_nchw`,
`case:sdpa`, `case:lstm`, ...) once per mode: fp32 (TF32 off), tf32, bf16 and fp16 autocast.
A case's kernel time is the sum of the durations of every kernel launched inside its
`case:*` annotation (casts and layout changes included); a family's ratio is the family's
summed kernel time in one mode over the other.

    .venv/bin/python benchmarks/precision_ratios.py [CORPUS_DIR]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from advisor.load.trace import load_trace  # noqa: E402
from advisor.metrics.precision import MEASURED_RATIOS  # noqa: E402

MODES = ("fp32", "tf32", "bf16", "fp16")
FAMILY_OF_CASE = {
    "linear": "gemm",
    "linear_odd": "gemm",
    "bmm": "gemm",
    "conv_nchw": "conv",
    "conv_channels_last": "conv",
    "sdpa": "attention",
    "lstm": "rnn",
}
# (from mode, to mode) -> the precisions the table names them by
PAIRS = {
    ("fp32", "tf32"): ("fp32-fma", "tf32"),
    ("tf32", "bf16"): ("tf32", "bf16"),
    ("tf32", "fp16"): ("tf32", "fp16"),
    ("fp32", "bf16"): ("fp32-fma", "bf16"),
    ("fp32", "fp16"): ("fp32-fma", "fp16"),
}


def case_kernel_ns(trace: Path) -> pd.Series:
    """Kernel time (ns) launched inside each `case:*` annotation of one corpus trace, summed over repetitions."""
    frames = load_trace(trace)
    host = frames.host
    cases = host[host["name"].astype(str).str.startswith("case:")]
    rt = frames.runtime[frames.runtime["correlation"] >= 0].drop_duplicates("correlation")
    kernels = frames.device[frames.device["kind"] == "kernel"]
    launch = kernels["correlation"].map(pd.Series(rt["ts"].to_numpy(), index=rt["correlation"].to_numpy())).to_numpy(np.float64)
    dur = kernels["dur"].to_numpy(np.float64)
    out: dict[str, float] = {}
    for name, ts, end in zip(cases["name"].astype(str), cases["ts"], cases["end"], strict=True):
        inside = (launch >= ts) & (launch < end)
        out[name.removeprefix("case:")] = out.get(name.removeprefix("case:"), 0.0) + float(dur[inside].sum())
    return pd.Series(out, dtype=np.float64)


def measure(corpus: Path) -> tuple[pd.DataFrame, dict[tuple[str, str, str], float]]:
    """(kernel ms per case and mode, {(family, from precision, to precision): ratio})."""
    per_case = pd.DataFrame({mode: case_kernel_ns(corpus / f"{mode}.pt.trace.json.gz") for mode in MODES}) / 1e6
    per_family = per_case.groupby(per_case.index.map(FAMILY_OF_CASE)).sum()
    ratios = {}
    for (a, b), (source, target) in PAIRS.items():
        for family, row in per_family.iterrows():
            ratios[(family, source, target)] = float(row[a] / row[b])
    return per_case, ratios


def main() -> int:
    corpus = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO.parent / "shared" / "kernels" / "h100"
    per_case, ratios = measure(corpus)
    print("kernel ms per case (both repetitions):")
    print(per_case.round(3).to_string())
    table = MEASURED_RATIOS[9.0]
    print("\nfamily     from      to     measured  in the table")
    worst = 0.0
    for (family, source, target), value in sorted(ratios.items()):
        used = table.get((family, source, target))
        shown = f"{used:.2f}" if used is not None else "(conservative row)"
        print(f"{family:10s} {source:9s} {target:6s} {value:8.2f}  {shown}")
        if used is not None:
            worst = max(worst, abs(used - value))
    print(f"\nlargest difference between the table and the measurement: {worst:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
