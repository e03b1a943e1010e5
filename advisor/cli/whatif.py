"""`advisor whatif PATH --apply RULE[,RULE]`: the replayed step for any set of fixes.

Each finding of the run declares what its fix changes in the step; this command replays the
slowest rank's step graph with the chosen fixes applied together (all of them by default)
and prints the measured step, the replayed baseline and the replayed step with the fixes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from advisor.errors import InputError


def whatif(
    path: Path = typer.Argument(..., help="A torch.profiler log dir or trace file (.json, .json.gz)."),
    apply: Optional[str] = typer.Option(None, "--apply", help="Comma-separated rule ids whose fixes to replay together (default: every finding's)."),
    run: Optional[str] = typer.Option(None, "--run", help="Which run of a log dir holding several."),
    config: Optional[Path] = typer.Option(None, "--config", help="advisor.toml or pyproject.toml to use."),
) -> None:
    """Replay the run's step with the fixes of the named rules applied."""
    from advisor.analysis import analyze
    from advisor.cli import say, stdout_console
    from advisor.config import load_config
    from advisor.engine import all_rules
    from advisor.units import saved_text

    cfg = load_config(config)
    analysis = analyze(path, run=run, config=cfg, cache=True)
    replay, modelled = analysis.stated_fixes(cfg.rule_options)
    primary = analysis.primary
    head = analysis.headline()
    if apply is None:
        # The report's findings: the fixes its headline replays together, in its order.
        ranked = [f.rule for f in analysis.findings]
        wanted = [r for r in ranked if head is not None and r in head.fixes and r in modelled]
    else:
        wanted = [r.strip() for r in apply.split(",") if r.strip()]
        from advisor.errors import did_you_mean

        known = {r.id for r in all_rules()}
        for rule in wanted:
            if rule not in known:
                raise InputError(None, f"unknown rule {rule!r} in --apply{did_you_mean(rule, known)}; run `advisor rules` to list them")
            if rule not in modelled:
                found = ", ".join(modelled) or "none"
                raise InputError(path, f"no finding of {rule!r} with a fix to replay on this run (replayable here: {found})")
    if not replay.available:
        raise InputError(path, "this run has no steps to replay")
    out = stdout_console()
    stored = analysis.headline()  # the replay's summary as the analysis made it: not replayed again
    head = stored if stored is not None and stored.rank == primary.rank else replay.summary()
    say(out, f"Run              {analysis.run.name}" + (f" (rank {primary.rank})" if len(analysis.ranks) > 1 else ""))
    mean = analysis.summary()["step_time_ms"]["mean"]
    replayed_one = f"; the replay takes its median step, {head.measured_ms:.2f} ms"
    say(out, f"Measured step    {mean:.2f} ms mean over the profiled window{replayed_one}" if mean is not None else f"Measured step    {head.measured_ms:.2f} ms (median of the profiled window)")
    if head.unprofiled_ms is not None and head.host_scale < 1.0:
        optimizer = f", optimizer step ×{head.optimizer_scale:.2f}" if head.optimizer_scale is not None else ""
        say(
            out,
            f"Replayed step    {head.baseline_ms:.2f} ms: host time scaled ×{head.host_scale:.2f} (DataLoader ×{replay.loader_scale:.2f}{optimizer}) to match "
            f"the {head.unprofiled_ms:.2f} ms median of the unprofiled steps, so the profiler's own cost is not counted",
        )
    elif head.unprofiled_ms is None and (noisy := analysis.noisy_caveat()) is not None:
        say(
            out,
            f"Replayed step    {head.baseline_ms:.2f} ms with host time ×{head.host_scale:.2f}: the profiler's own cost is not known on this "
            f"window ({noisy}; an estimate from its host events cannot tell them apart), and no unprofiled steps were recorded to "
            "measure it (`advisor profile --full` records them)",
        )
    elif head.scale_range is not None and head.baseline_range_ms is not None:
        lo, hi = head.baseline_range_ms
        say(
            out,
            f"Replayed step    {head.baseline_ms:.2f} ms (range {lo:.2f}–{hi:.2f}): host time scaled ×{head.host_scale:.2f} "
            f"(×{head.scale_range[0]:.2f}–×{head.scale_range[1]:.2f}) for the profiler's own cost, estimated from the host events it "
            "recorded (no unprofiled steps: `advisor profile --full` records them)",
        )
    else:
        say(out, f"Replayed step    {head.baseline_ms:.2f} ms (the step graph as measured)")
    if not wanted:
        say(out, "No finding of this run has a fix to replay.")
        return
    report = analysis.headline()
    if apply is None and report is not None and report.all_fixes_ms is not None:
        # The report's own figures: each finding's saving and the step with every ranked fix.
        # (each finding's own figure, as the report prints it, not the headline's rounded copy)
        by_rule = {f.rule: f for f in analysis.findings}
        alone = {
            rule: by_rule[rule].saving_alone_ms if rule in by_rule and by_rule[rule].saving_alone_ms is not None else report.savings.get(rule, 0.0)
            for rule in wanted
        }
        together = report.all_fixes_ms
    else:
        alone = {rule: replay.saving_ms(modelled[rule].change) for rule in wanted}
        together = min(replay.replayed_ms(replay.merged([modelled[rule].change for rule in wanted])), head.baseline_ms)
    saved = head.baseline_ms - together
    say(out, f"With the fixes   {together:.2f} ms per step ({saved_text(saved, head.baseline_ms)} of the replayed {head.baseline_ms:.2f} ms): " + ", ".join(wanted))
    for rule in wanted:
        say(out, f"  {rule:<26} alone: {alone[rule]:6.2f} ms/step")
    if apply is None and analysis.considered:
        say(out, "Considered, not ranked: " + ", ".join(f.rule for f in analysis.considered))
