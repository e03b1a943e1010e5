"""The Python API: `advisor.analyze(path)` for notebooks and scripts.

    import advisor

    run = advisor.analyze("sample_runs/resnet18_cifar/runs/gpu_baseline")
    run.findings        # DataFrame: rule, severity, saving_ms, ... ranked by saving
    run.breakdown       # DataFrame: each category's ms per step and share of the step
    run.steps           # DataFrame: each step's start, end and duration (ms)
    run.kernels         # DataFrame: device kernels by total time
    run.ops             # DataFrame: host operators by total time
    run                 # in Jupyter: the findings and the breakdown as HTML tables

The figures are those of `advisor report` (the same analysis, the same rules): for a job of
several ranks, `steps` holds each rank's steps (a `rank` column) and the others are the
slowest rank's. `run.analysis` is the underlying `advisor.analysis.Analysis`, and
`run.to_dict()` the JSON report. Nothing here imports torch.
"""

from __future__ import annotations

import html
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd

from advisor.analysis import Analysis
from advisor.analysis import analyze as _analyze
from advisor.metrics.breakdown import CATEGORIES

NS_PER_MS = 1e6


class RunAnalysis:
    """One run's analysis, as DataFrames."""

    def __init__(self, analysis: Analysis):
        self.analysis = analysis

    # --- figures ---------------------------------------------------------------------------
    @property
    def source(self) -> str:
        return self.analysis.source

    @property
    def summary(self) -> dict[str, Any]:
        """The report's summary: step time statistics, breakdown, utilisation, memory, copies."""
        return self.analysis.summary()

    @cached_property
    def steps(self) -> pd.DataFrame:
        """One row per step and rank: rank, step, start_ms, end_ms (from the trace's origin), duration_ms."""
        frames = []
        for m in self.analysis.ranks:
            s = m.steps
            frames.append(
                pd.DataFrame(
                    {
                        "rank": m.rank,
                        "step": s["step"].to_numpy(),
                        "start_ms": s["start"].to_numpy(dtype="float64") / NS_PER_MS,
                        "end_ms": s["end"].to_numpy(dtype="float64") / NS_PER_MS,
                        "duration_ms": s["duration"].to_numpy(dtype="float64") / NS_PER_MS,
                    }
                )
            )
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["rank", "step", "start_ms", "end_ms", "duration_ms"])

    @cached_property
    def breakdown(self) -> pd.DataFrame:
        """The step-time breakdown of the slowest rank: ms per step (mean) and share, by category."""
        ms = self.analysis.primary.breakdown_mean_ms
        total = sum(ms.values()) or 1.0
        df = pd.DataFrame({"category": list(CATEGORIES), "ms_per_step": [float(ms.get(c, 0.0)) for c in CATEGORIES]})
        df["share"] = df["ms_per_step"] / total
        return df

    @cached_property
    def kernels(self) -> pd.DataFrame:
        """Device kernels of the slowest rank by total time: name, count, total_ms, mean_us, share, tensor_core, precision."""
        from advisor.metrics.kernels import top_kernels

        k = top_kernels(self.analysis.primary.kernels, n=1_000_000)
        return pd.DataFrame(
            {
                "name": k["name"].astype(str).to_numpy(),
                "count": k["count"].to_numpy(),
                "total_ms": k["total_ns"].to_numpy(dtype="float64") / NS_PER_MS,
                "mean_us": k["mean_ns"].to_numpy(dtype="float64") / 1e3,
                "share": k["share"].to_numpy(dtype="float64"),
                "tensor_core": k["tensor_core"].to_numpy(dtype=bool),
                "precision": k["precision"].astype(str).to_numpy(),
            }
        )

    @cached_property
    def ops(self) -> pd.DataFrame:
        """Host operators of the slowest rank by total time: name, count, total_ms, mean_us."""
        o = self.analysis.view.ops
        return pd.DataFrame(
            {
                "name": o["name"].astype(str).to_numpy(),
                "count": o["count"].to_numpy(),
                "total_ms": o["total_ns"].to_numpy(dtype="float64") / NS_PER_MS,
                "mean_us": o["mean_ns"].to_numpy(dtype="float64") / 1e3,
            }
        )

    @cached_property
    def findings(self) -> pd.DataFrame:
        """The findings, ranked by the time their fix saves per step: rule, severity, title,
        saving_ms, saving_share (a fraction of the step), confidence, rank, message, fix."""
        rows = [
            {
                "rule": f.rule,
                "severity": f.severity,
                "title": f.title,
                "saving_ms": f.saving_ms,
                "saving_share": f.saving_pct,
                "confidence": f.confidence,
                "rank": f.rank,
                "message": f.message,
                "fix": f.fix.text,
            }
            for f in self.analysis.findings
        ]
        columns = ["rule", "severity", "title", "saving_ms", "saving_share", "confidence", "rank", "message", "fix"]
        return pd.DataFrame(rows, columns=columns)

    def to_dict(self) -> dict[str, Any]:
        """The JSON report (schema advisor/report/v1) as a dict."""
        return self.analysis.to_dict()

    def to_html(self) -> str:
        """The self-contained HTML report `advisor report --format html` writes."""
        from advisor.render.html import to_html

        return to_html(self.analysis)

    # --- display ---------------------------------------------------------------------------
    def __repr__(self) -> str:
        st = self.summary["step_time_ms"]
        step = f"{st['mean']:.2f} ms mean step" if st.get("mean") is not None else "no steps"
        return f"<advisor analysis of {self.analysis.run.name!r}: {step}, {len(self.analysis.findings)} finding(s)>"

    def _repr_html_(self) -> str:
        """Jupyter's view: the headline, the findings and the breakdown (every trace string escaped)."""
        st = self.summary["step_time_ms"]
        head = f"{st['mean']:.2f} ms mean step (median {st['median']:.2f}) over {self.summary['steps']} steps" if st.get("mean") is not None else "no steps"
        findings = self.findings[["rule", "severity", "saving_ms", "saving_share", "message"]]
        breakdown = self.breakdown[self.breakdown["ms_per_step"] > 0]
        return (
            '<div class="advisor-analysis">'
            f"<p><b>advisor: {html.escape(self.analysis.run.name)}</b> &middot; {html.escape(head)}</p>"
            "<p><b>Findings</b>, ranked by time saved per step</p>"
            + (findings.to_html(index=False, escape=True, float_format=lambda v: f"{v:.3g}") if len(findings) else "<p>nothing to fix: no rule fired on this run</p>")
            + "<p><b>Step-time breakdown</b> (mean per step)</p>"
            + breakdown.to_html(index=False, escape=True, float_format=lambda v: f"{v:.3g}")
            + "</div>"
        )


def analyze(
    path: str | Path,
    *,
    run: str | None = None,
    select: str | list[str] | None = None,
    ignore: str | list[str] | None = None,
    rules_dir: str | Path | None = None,
    config: str | Path | None = None,
    cache: bool = True,
) -> RunAnalysis:
    """Analyse a torch.profiler log dir or trace file, as `advisor report PATH` does.

    `select` / `ignore` take rule ids, groups and prefixes as the command line does (a string
    or a list, each a comma-separated list: `select="input,optimizer"`);
    `config` an advisor.toml or pyproject.toml (else the nearest one is used). Bad input
    raises `advisor.errors.InputError`, whose message names the file and the problem.
    """
    from advisor.config import load_config

    analysis = _analyze(Path(path), run=run, config=load_config(config), rules_dir=rules_dir, select=select, ignore=ignore, cache=cache)
    return RunAnalysis(analysis)
