"""Settling the findings of one rank by its replay: each fix alone, the symptoms on top of
their causes, the findings the replay cannot model capped at the replayed step, then the
ranked order (advisor.engine.ranking)."""

from __future__ import annotations

from typing import Any

from advisor.engine.contract import Finding
from advisor.engine.critical_path import _own_step_ms, critical_path, departs_from_estimate, measured_step_ms
from advisor.engine.ranking import NO_GAIN_MS, _say_what_capped_it, in_rank_order
from advisor.metrics.summary import Metrics
from advisor.whatif.savings import RankReplay, RankWhatIf, rank_replay


def settle_by_replay(m: Metrics, facts: dict[str, Any] | None, findings: list[Finding], whatif: list[RankWhatIf] | None = None) -> list[Finding]:
    """Savings of one rank's findings from its replay: each change alone, then all together."""
    replay = rank_replay(m, facts)
    if not replay.available or not findings:
        if whatif is not None and replay.available:
            whatif.append(replay.summary())
        return findings
    base = replay.baseline_ms
    summary = replay.summary()
    measured = measured_step_ms(summary)
    changes = []
    symptoms = {f.rule for f in findings if f.symptom}
    fixes = [f for f in findings if f.change is not None and f.rule not in symptoms and f.saving_ms is not None]
    # Each fix replayed alone. One that lengthens the step (work it adds, such as a compiled
    # region's host time, outweighs what it removes) or gains nothing stays out of the headline.
    alone = {f.rule: base - replay.replayed_ms(f.change) for f in fixes}
    lengthens = {rule for rule, gain in alone.items() if gain < -0.005}
    gains = [f for f in fixes if alone[f.rule] >= NO_GAIN_MS and f.no_gain is None]
    # A fix that gains nothing alone (a device fix on a step the host holds) may gain once
    # another fix exposes the work it speeds up: it is replayed again on top of the fixes
    # ranked above it (`in_rank_order`), and considered only where it gains nothing there too.
    dependent = {f.rule for f in fixes if alone[f.rule] < NO_GAIN_MS and f.no_gain is None}
    others = replay.merged([f.change for f in gains]) if gains else None
    dropped = set()
    for f in findings:
        if f.saving_ms is None:
            continue
        if f.change is not None and f.symptom and others is not None:
            # A symptom (the device idles) is what its causes' fixes leave: its saving is
            # the replayed step with every other fix minus that step with its change too.
            with_others = replay.replayed_ms(others)
            saving = max(replay.gain_ms(with_others, replay.merged([others, f.change]), f.change, others), 0.0)
            f.causes = [c.rule for c in gains]
            f.evidence["estimate_ms"] = round(f.saving_ms, 3)
            if saving <= 0.01 * base:
                dropped.add(f.rule)  # explained by the other findings: they carry the saving
            else:
                changes.append(f.change)
                summary.fixes.append(f.rule)
        elif f.change is not None:
            saving = max(alone[f.rule], 0.0) if f.rule in alone else replay.saving_ms(f.change)
            if saving >= NO_GAIN_MS and f.no_gain is None:
                changes.append(f.change)
                summary.fixes.append(f.rule)
            f.evidence["estimate_ms"] = round(f.saving_ms, 3)
        else:
            saving = _not_modelled_saving(m, f, base)
        if f.change is not None and f.rule not in dropped:
            _say_what_capped_it(replay, f)
            if f.rule in dependent:
                f.evidence["saving_alone_replayed_ms"] = round(alone[f.rule], 3)
            else:
                _say_what_holds_the_step(m, replay, f, saving, alone.get(f.rule), f.rule in lengthens)
        _set_saving(f, saving, measured)
        summary.savings[f.rule] = round(f.saving_ms, 3)
    kept = [f for f in findings if f.rule not in dropped]
    if changes:
        # Fixes that each gain alone can still interact; the step with every fix is never
        # reported longer than the step without them.
        summary.all_fixes_ms = min(replay.replayed_ms(replay.merged(changes)), base)
        in_rank_order(replay, base, kept, summary, [f for f in kept if f.rule in dependent], alone)
    for f in kept:
        if f.rule in dependent and f.rule not in summary.fixes and f.no_gain is None:
            # gains nothing alone, nor on top of the fixes ranked above it
            gain = alone[f.rule]
            if gain < -0.005:
                f.no_gain = (f"Replayed on this run, this fix makes the step {-gain:.2f} ms longer, alone and on top of the "
                             "other fixes: the work it adds outweighs what it removes.")
            else:
                f.no_gain = "This fix alone gains nothing on this run now: " + critical_path(m, replay, f.change) + "."
            f.evidence["critical_path"] = f.no_gain
            f.message = f.message.rstrip() + " " + f.no_gain
            f.saving_ms, f.saving_pct, f.severity = 0.0, 0.0, "low"
            f.saving_alone_ms = 0.0
            summary.savings[f.rule] = 0.0
    if whatif is not None:
        whatif.append(summary)
    return kept


def _not_modelled_saving(m: Metrics, f: Finding, base: float) -> float:
    """A finding the replay cannot model: its own estimate, as the same share of the replayed
    step (which is the unprofiled step where the facts have one), never more than that step."""
    window = m.mean_step_ns / 1e6
    own = _own_step_ms(f)
    if own is not None:
        # measured on the unprofiled steps (their mean: a stall the window's prefetched
        # batches hid): that share of that step, whatever the window or the replay say
        return min(f.saving_ms * (own / window if window > 0 else 1.0), own)
    scaled = f.saving_ms * (base / window if window > 0 else 1.0)
    saving = min(scaled, base)
    if saving < scaled - 1e-9:
        f.evidence["capped"] = f"saving capped from {f.saving_ms:.2f} ms at the replayed step"
    return saving


def _say_what_holds_the_step(m: Metrics, replay: RankReplay, f: Finding, saving: float, alone: float | None, lengthens: bool) -> None:
    """Why a replayed fix gains nothing (`no_gain`), or, where its replay departs from its rule's
    estimate, what holds the replayed step: in the evidence (`critical_path`) and the message,
    without the saving (the reports print it, and the estimate beside it)."""
    if f.no_gain is None and lengthens:
        f.no_gain = (f"Replayed on this run, this fix makes the step {-alone:.2f} ms longer: the work it adds "
                     "outweighs what it removes.")
    elif f.no_gain is None and saving < NO_GAIN_MS:
        f.no_gain = "This fix alone gains nothing on this run now: " + critical_path(m, replay, f.change) + "."
    elif f.no_gain is None and departs_from_estimate(f.evidence.get("estimate_ms"), saving):
        # Invariant 5: the replay departs from the rule's first-order estimate; say what holds the path.
        why = critical_path(m, replay, f.change)
        f.evidence["critical_path"] = why
        f.message = f.message.rstrip() + f" The replay departs from the rule's estimate: with the fix, {why}."
    if f.no_gain is not None:
        f.evidence["critical_path"] = f.no_gain
        if f.no_gain not in f.message:
            f.message = f.message.rstrip() + " " + f.no_gain


def _set_saving(f: Finding, saving: float, measured: float) -> None:
    """A finding's settled saving, its share of its step and (a replayed fix's) severity; a fix
    that gains nothing keeps 0 (the reports list it as considered, with the reason)."""
    f.saving_ms = saving
    own = _own_step_ms(f) if f.change is None else None
    step_of_f = own if own is not None else measured
    f.saving_pct = saving / step_of_f if step_of_f > 0 else None
    if f.change is not None:
        f.severity = "high" if f.saving_pct and f.saving_pct >= 0.10 else "medium" if f.saving_pct and f.saving_pct >= 0.03 else "low"
        if f.no_gain is not None or saving < NO_GAIN_MS:
            f.saving_ms, f.saving_pct, f.severity = 0.0, 0.0, "low"
