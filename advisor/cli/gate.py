"""`advisor gate` and `advisor baseline`: fail a pull request that makes training slower.

Exit codes: 0 pass (also inconclusive, unless --strict), 1 fail, 2 bad input or usage.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, List, Optional

import typer

from advisor.errors import InputError
from advisor.terminal_text import inert_console, one_line, path_text

if TYPE_CHECKING:
    from rich.console import Console

    from advisor.gate.budgets import GateSettings
    from advisor.gate.record import RunRecord
    from advisor.gate.verdict import GateResult

# The gate's own modules (numpy, pandas through the budgets' categories) are imported where
# they are used: `advisor --help` imports this module to list its commands.
DEFAULT_BASELINE = Path("perf/baseline.json")


def _stderr() -> Console:
    return inert_console(stderr=True, highlight=False, soft_wrap=True)


def _config_layer(cfg: Any) -> tuple[str, dict[str, Any]]:
    if not cfg.gate or cfg.path is None:
        return ("config", {})
    table = "[gate]" if cfg.path.name == "advisor.toml" else "[tool.advisor.gate]"
    from advisor.gate.budgets import parse_gate_table

    return (str(cfg.path), parse_gate_table(cfg.gate, cfg.path, cfg.path.parent, table))


def _share_flags(values: list[str]) -> dict[str, Any]:
    shares: dict[str, Any] = {}
    for v in values:
        cat, sep, frac = v.partition("=")
        if not sep:
            raise InputError(None, f"--max-share {v!r}: expected CATEGORY=FRACTION, e.g. dataloader=0.05")
        try:
            shares[cat.strip()] = float(frac)
        except ValueError:
            raise InputError(None, f"--max-share {v!r}: {frac!r} is not a number") from None
    return shares


def _flag_layer(flags: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    given = {k: v for k, v in flags.items() if v is not None and v != [] and v != {}}
    from advisor.gate.budgets import parse_gate_table

    return ("command line", parse_gate_table(given, None, None, "command line") if given else {})


def _check_rule_ids(settings: GateSettings, rules_dir: Optional[Path]) -> None:
    if not settings.budgets.forbid_rules:
        return
    from advisor.engine import all_rules

    known = {r.id for r in all_rules(rules_dir)}
    for rid in settings.budgets.forbid_rules:
        if rid not in known:
            raise InputError(None, f"unknown rule {rid!r} in forbid_rules; run `advisor rules` to list them")


def _input_files(path: Path, run: Optional[str], baseline: Optional[Path]) -> list[Path]:
    """What the gate reads: the candidate's trace and facts files, and the baseline file."""
    from advisor.load.discover import find_run

    found = find_run(path, run)
    files = list(found.files)
    directory = found.directory if found.directory is not None else (path if path.is_dir() else path.parent)
    files += sorted(directory.glob("advisor_facts*.json"))
    return files + ([baseline] if baseline is not None else [])


def load_baseline(path: Path, config: Any, rules_dir: Optional[Path], run: Optional[str] = None) -> tuple[RunRecord, list[str]]:
    """A baseline JSON, a report JSON, or a log dir / trace analysed now."""
    from advisor.gate.record import read_record_file, record_from_analysis

    if not path.exists():
        raise InputError(path, "baseline not found (write one with `advisor baseline PATH -o FILE`)")
    if path.is_file():
        record = read_record_file(path)
        if record is not None:
            return record, []
    from advisor.cli import analyze_with_progress

    analysis = analyze_with_progress(path, run=run, config=config, rules_dir=rules_dir, cache=True)
    record = record_from_analysis(analysis)
    return record, [f"baseline: {w}" for w in [*analysis.run.notes, *analysis.warnings]]


def evaluate_gate(
    path: Path,
    settings: GateSettings,
    config: Any,
    rules_dir: Optional[Path] = None,
    run: Optional[str] = None,
) -> GateResult:
    """Analyse the candidate, load the baseline, run every check."""
    from advisor.cli import analyze_with_progress
    from advisor.gate.evaluate import run_gate
    from advisor.gate.record import record_from_analysis

    if settings.baseline is None and not settings.budgets.any():
        raise InputError(
            None,
            f"nothing to gate on: no {DEFAULT_BASELINE} (write one with `advisor baseline PATH`); give --baseline FILE, or budgets in [tool.advisor.gate], a --budget FILE or flags such as --max-step-time-ms",
        )
    _check_rule_ids(settings, rules_dir)
    base_record, notes = (None, [])
    if settings.baseline is not None:
        base_record, notes = load_baseline(settings.baseline, config, rules_dir)
    analysis = analyze_with_progress(path, run=run, config=config, rules_dir=rules_dir, cache=True)
    candidate = record_from_analysis(analysis)
    return run_gate(candidate, base_record, settings, notes=[*notes, *analysis.run.notes, *analysis.warnings])


def gate(
    path: Path = typer.Argument(..., help="The run to judge: a torch.profiler log dir or trace file."),
    baseline: Optional[Path] = typer.Option(
        None, "--baseline", "-b", help="Baseline JSON from `advisor baseline`, a report JSON, or a log dir / trace to compare with (default: perf/baseline.json when it exists)."
    ),
    budget: Optional[Path] = typer.Option(None, "--budget", help="TOML or JSON file of budgets; overrides [tool.advisor.gate]."),
    tolerance: Optional[float] = typer.Option(None, "--tolerance", help="Step-time slowdown allowed against the baseline (0.05 = 5%, the default)."),
    strict: Optional[bool] = typer.Option(None, "--strict/--no-strict", help="Count an inconclusive result as a failure."),
    min_steps: Optional[int] = typer.Option(None, "--min-steps", help="Fewest steps per run to judge step time (default 5)."),
    max_step_time_ms: Optional[float] = typer.Option(None, "--max-step-time-ms", help="Budget: mean step time in ms."),
    min_gpu_utilization: Optional[float] = typer.Option(None, "--min-gpu-utilization", help="Budget: GPU busy share of the step (0.6 = 60%)."),
    max_share: List[str] = typer.Option([], "--max-share", metavar="CATEGORY=FRACTION", help="Budget: CATEGORY=FRACTION of the step time, e.g. dataloader=0.05 (repeatable)."),
    max_peak_memory: Optional[str] = typer.Option(None, "--max-peak-memory", metavar="SIZE", help="Budget: peak device memory, e.g. '20 GiB' or bytes."),
    max_severity: Optional[str] = typer.Option(None, "--max-severity", metavar="LEVEL", help="Budget: worst finding severity allowed (none, low, medium, high)."),
    forbid: List[str] = typer.Option([], "--forbid", metavar="RULE", help="Budget: a rule that must not fire (repeatable, or comma-separated: a,b)."),
    min_samples_per_s: Optional[float] = typer.Option(None, "--min-samples-per-s", help="Budget: throughput; needs the batch size."),
    max_ms_per_sample: Optional[float] = typer.Option(None, "--max-ms-per-sample", help="Budget: mean step time per sample in ms (1 / throughput); needs the batch size."),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", help="Batch size per rank, when no facts file records it (used for a run that does not record its own)."),
    fail_on_new_findings: Optional[bool] = typer.Option(
        None, "--fail-on-new-findings/--no-fail-on-new-findings", help="Fail when a rule fires that did not fire on the baseline."
    ),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Also write the result as JSON (schema advisor/gate/v1)."),
    junit: Optional[Path] = typer.Option(None, "--junit", help="Also write JUnit XML: one test case per check."),
    run: Optional[str] = typer.Option(None, "--run", help="Which run of a log dir holding several."),
    rules_dir: Optional[Path] = typer.Option(None, "--rules", help="Also run the rule files in this folder: every *.py there is imported, i.e. executed as Python with your permissions (use only folders you trust)."),
    config: Optional[Path] = typer.Option(None, "--config", help="advisor.toml or pyproject.toml to use."),
) -> None:
    """Fail when a run is slower than its baseline or breaks a budget (exit 0 pass, 1 fail, 2 bad input)."""
    from advisor.cli import rule_ids
    from advisor.config import load_config
    from rich.text import Text

    from advisor.errors import set_status_if_output_closes
    from advisor.gate.budgets import build_settings, read_budget_file
    from advisor.gate.outputs import emit_github, render_terminal, to_json, to_junit, write_file
    from advisor.render.console import output_console

    cfg = load_config(config)
    layers = [_config_layer(cfg)]
    if budget is not None:
        layers.append((str(budget), read_budget_file(budget)))
    flags = {
        "baseline": str(baseline) if baseline is not None else None,
        "tolerance": tolerance,
        "strict": strict,
        "min_steps": min_steps,
        "max_step_time_ms": max_step_time_ms,
        "min_gpu_utilization": min_gpu_utilization,
        "max_share": _share_flags(max_share),
        "max_peak_memory": max_peak_memory,
        "max_severity": max_severity,
        "forbid_rules": rule_ids(forbid),
        "min_samples_per_s": min_samples_per_s,
        "max_ms_per_sample": max_ms_per_sample,
        "batch_size": batch_size,
        "fail_on_new_findings": fail_on_new_findings,
    }
    layers.append(_flag_layer(flags))
    settings = build_settings(layers)
    if settings.baseline is None and DEFAULT_BASELINE.is_file():
        # where `advisor baseline` writes by default: a plain `advisor gate PATH` compares with it
        settings.baseline = DEFAULT_BASELINE
        settings.sources.append(f"{DEFAULT_BASELINE} (default baseline)")
        _stderr().print(Text(f"advisor gate: comparing with {DEFAULT_BASELINE}, the baseline `advisor baseline` wrote"))
    result = evaluate_gate(path, settings, cfg, rules_dir=rules_dir, run=run)

    # Files first: CI reads them whatever the verdict. Never over a file read: the candidate's
    # traces and facts (in the chosen run), the baseline, the config, a budget file.
    inputs = _input_files(path, run, settings.baseline)
    if json_out is not None:
        write_file(json_out, to_json(result), inputs)
    if junit is not None:
        write_file(junit, to_junit(result), inputs)
    set_status_if_output_closes(result.exit_code)  # a closed stdout keeps the verdict
    render_terminal(result, output_console())
    emit_github(result, sys.stdout)
    sys.stdout.flush()
    if result.exit_code:
        raise SystemExit(result.exit_code)


def baseline(
    path: Path = typer.Argument(..., help="The reference run: a torch.profiler log dir or trace file."),
    output: Optional[Path] = typer.Option(
        None, "--output", "-o", help="Where to write it (default: `baseline` of [tool.advisor.gate], else perf/baseline.json)."
    ),
    run: Optional[str] = typer.Option(None, "--run", help="Which run of a log dir holding several."),
    rules_dir: Optional[Path] = typer.Option(None, "--rules", help="Also run the rule files in this folder: every *.py there is imported, i.e. executed as Python with your permissions (use only folders you trust)."),
    config: Optional[Path] = typer.Option(None, "--config", help="advisor.toml or pyproject.toml to use."),
    force: bool = typer.Option(False, "--force", help="Replace the file the config names (or perf/baseline.json) even when it is not a baseline the advisor wrote."),
) -> None:
    """Record a run as the baseline a later `advisor gate` compares with (schema advisor/baseline/v1)."""
    import os

    from rich.text import Text

    from advisor.gate.budgets import build_settings
    from advisor.gate.outputs import write_file
    from advisor.gate.record import record_from_analysis
    from advisor.output import run_input_files

    from advisor.cli import analyze_with_progress
    from advisor.config import load_config
    from advisor.gate.record import is_advisor_baseline

    cfg = load_config(config)
    settings = build_settings([_config_layer(cfg)])
    target = output or settings.baseline or DEFAULT_BASELINE
    if output is None and not force and os.path.lexists(target) and not is_advisor_baseline(target):
        # A path from a config (perhaps one found in a cloned repository) never replaces a file
        # the advisor did not write: only -o or --force, typed by the user, do.
        raise InputError(target, "exists and is not a baseline `advisor baseline` wrote: not replaced (name it with -o, or pass --force)")
    analysis = analyze_with_progress(path, run=run, config=cfg, rules_dir=rules_dir, cache=True)
    record = record_from_analysis(analysis)
    import orjson

    write_file(target, orjson.dumps(record.to_baseline(), option=orjson.OPT_INDENT_2).decode() + "\n", run_input_files(analysis))
    err = _stderr()
    env = record.environment
    mean = record.mean_step_ms
    where = f" on {env.device_name}" if env.device_name else ""
    findings = ", ".join(f.rule for f in record.findings) or "none"
    shown = path_text(target)
    err.print(Text(one_line(f"wrote {shown}: {record.steps} steps, mean step {mean:.2f} ms{where}; findings: {findings}") if mean else f"wrote {shown}"))
    for w in analysis.warnings:
        err.print(Text(one_line(f"warning: {w}"), style="yellow"))
    if record.steps < settings.min_steps:
        err.print(
            Text(
                f"warning: only {record.steps} step(s): a gate needs at least {settings.min_steps} per run to judge step time "
                "(profile a longer active window)",
                style="yellow",
            )
        )
