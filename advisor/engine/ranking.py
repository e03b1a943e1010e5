"""Ranking: the greedy order of the replayed fixes (each on top of those above it), recipe
changes behind speed fixes of a like size, and the reduce's final list over ranks and jobs."""

from __future__ import annotations

import numpy as np

from advisor.engine.contract import Finding, RankFindings, Rule, find_loaded_rule
from advisor.engine.critical_path import _own_step_ms, critical_path_of_base, measured_step_ms
from advisor.metrics.summary import Metrics
from advisor.whatif.parts import parts_text, settle_parts, unchecked_ms
from advisor.whatif.savings import RankReplay, RankWhatIf


# A replayed saving under this (ms per step) is no gain: the finding is considered, not ranked.
NO_GAIN_MS = 0.005
# A finding that saves less than this share of the measured step is listed as considered, not ranked.
MIN_RANKED_SHARE = 0.005



# A fix that changes what is trained (the batch size, the precision) ranks above a fix that
# changes nothing but speed only where it saves more than this many times as much.
RECIPE_MARGIN = 2.0


def changes_recipe(f: Finding) -> str | None:
    """What a finding's fix changes beside speed ("batch size", "precision"): its rule's RECIPE."""
    rule = find_loaded_rule(f.rule)
    return getattr(rule.module, "RECIPE", None) if rule is not None else None


# A fix whose promise has parts no measured pair has checked ("up to" figures: evidence
# `promise_parts`) ranks above a fix whose model measured pairs confirm (its rule's
# CONFIRMED_BY) only where it saves more than this many times as much.
UNCHECKED_MARGIN = 2.0
# ... where those parts are at least this share of its saving (a layout part of 0.07 ms in a
# 6 ms promise the measured parts make is not what decides it).
UNCHECKED_SHARE = 0.05


def confirmed_by(f: Finding) -> str | None:
    """The measured pairs that confirm a finding's saving model: its rule's CONFIRMED_BY."""
    rule = find_loaded_rule(f.rule)
    return getattr(rule.module, "CONFIRMED_BY", None) if rule is not None else None


def _pick(trials: list[tuple[float, Finding]], pool: list[Finding]) -> tuple[float, Finding]:
    """The fix to rank next: the one that saves most, unless it changes the recipe and a fix
    that changes nothing but speed saves at least 1/RECIPE_MARGIN of it, or its promise has
    "up to" parts and a fix whose model measured pairs confirm saves at least 1/UNCHECKED_MARGIN
    of it (the one passed over says so: evidence `ranked_after_measured`)."""
    order = lambda t: (t[0], -pool.index(t[1]))
    gain, best = max(trials, key=order)
    if changes_recipe(best) is not None:
        speed = [t for t in trials if changes_recipe(t[1]) is None and t[0] >= NO_GAIN_MS]
        if speed:
            alt = max(speed, key=order)
            if alt[0] * RECIPE_MARGIN >= gain:
                return alt
    if confirmed_by(best) is None and unchecked_ms(best.evidence) >= max(UNCHECKED_SHARE * gain, NO_GAIN_MS):
        measured = [t for t in trials if confirmed_by(t[1]) is not None and t[0] >= NO_GAIN_MS
                    and (changes_recipe(t[1]) is None or changes_recipe(best) is not None)]
        if measured:
            alt = max(measured, key=order)
            if alt[0] * UNCHECKED_MARGIN >= gain:
                passed = best.evidence.setdefault("ranked_after_measured", [])
                if alt[1].rule not in passed:
                    passed.append(alt[1].rule)
                return alt
    return gain, best


def _in_parts(findings: list[Finding]) -> None:
    """A bundled fix's parts add up to its saving alone, and its message says each (the ones no
    measured pair checked as "up to")."""
    for f in findings:
        if "promise_parts" not in f.evidence or f.evidence.get("promise_parts_total_ms") is not None:
            continue
        alone = f.saving_alone_ms if f.saving_alone_ms is not None else f.saving_ms
        settle_parts(f.evidence, alone or 0.0)
        if said := parts_text(f.evidence):
            f.message = f.message.rstrip() + " " + said


def _say_what_capped_it(replay: RankReplay, f: Finding) -> None:
    """Where a bound capped the fix's replayed saving (RankReplay.removable, RankReplay.leaves,
    RankReplay.gain_ms), the evidence (`capped`) and the message say which, once."""
    why = replay.capped_by(f.change)
    if why is None or f.evidence.get("capped") == why:
        return
    f.evidence["capped"] = why
    f.message = f.message.rstrip() + f" The replayed saving is {why}."


def in_rank_order(replay: RankReplay, base: float, findings: list[Finding], summary: RankWhatIf,
                  dependent: list[Finding] = (), alone_of: dict[str, float] | None = None) -> None:
    """Each ranked finding's saving on top of the fixes ranked above it, so the list adds up to
    the step with every fix, never to more than the step.

    The replayed fixes are taken greedily: first the one that saves most alone, then the one
    that saves most with it, and so on; a symptom's saving is already what the others leave.
    A fix that changes what is trained (its rule's RECIPE: the batch size, the precision) is
    taken before a fix that changes nothing but speed only where it saves more than
    RECIPE_MARGIN times as much. A fix that gains nothing alone (`dependent`: a device fix on a
    step the host holds) joins the candidates once a fix is chosen, and is ranked with what it
    saves on top of the fixes above it, saying so. A fix that saves under MIN_RANKED_SHARE of
    the measured step on top of those above it is listed as considered, with its saving alone.
    Its saving alone (the promise of applying only that fix) stays in `saving_alone_ms` and in
    the headline's `savings`. A fix that gains nothing once the fixes above it are in is not
    ranked (the same time is theirs; it is listed as considered, with its saving alone). A
    finding the replay cannot model keeps its estimate, capped at what the replayed fixes
    leave of the step."""
    pool = [f for f in findings if f.change is not None and f.no_gain is None and not f.symptom and f.rule in summary.fixes]
    waiting = list(dependent)  # gain nothing alone: tried on top of the fixes chosen
    measured = measured_step_ms(summary)
    # The step a saving recurs on: where first-call work was taken out of a single pass, the
    # steps without it (the projection), else the measured one. The floor and the severity are
    # judged on it (600 ms of first calls in the window do not make a 4 ms fix trivial); the
    # share shown stays of the measured step.
    steady = summary.unprofiled_ms if summary.unprofiled_ms is not None else (summary.measured_ms or measured)
    alone_of = alone_of or {}
    symptoms = [f for f in findings if f.change is not None and f.no_gain is None and f.symptom and f.rule in summary.fixes]
    chosen: list[Finding] = []
    step = base
    while pool or (waiting and chosen):
        # the first round is each fix alone: the replays its saving came from (cached)
        candidates = [*pool, *(waiting if chosen else ())]
        # each saving on top of the fixes chosen, never past what the fix itself changes (RankReplay.gain_ms)
        above = replay.merged([c.change for c in chosen]) if chosen else None
        trials = [(replay.gain_ms(step, replay.merged([*(c.change for c in chosen), f.change]) if chosen else f.change, f.change, above), f) for f in candidates]
        gain, best = _pick(trials, candidates)
        _say_what_capped_it(replay, best)
        if best in waiting:
            if gain < NO_GAIN_MS:
                break  # none of them gains on top of the fixes chosen
            waiting.remove(best)
            above = ", ".join(c.rule for c in chosen)
            lone = alone_of.get(best.rule, 0.0)
            said = (f"makes the step {-lone:.2f} ms longer" if lone < -0.005 else "gains nothing")
            why = (f"Alone this fix {said} on this run ({critical_path_of_base(replay, best.change)}); it saves time on top "
                   f"of the fixes ranked above it ({above}), which expose the work it speeds up.")
            best.message = best.message.rstrip() + " " + why
            best.evidence["critical_path"] = why
            best.evidence["depends_on"] = [c.rule for c in chosen]
            best.saving_alone_ms = max(lone, 0.0)
            chosen.append(best)
            summary.fixes.append(best.rule)
            summary.savings[best.rule] = round(max(lone, 0.0), 3)
            step -= gain
            best.saving_ms = gain
            best.saving_pct = gain / measured if measured > 0 else None
            best.severity = "high" if gain >= 0.10 * steady else "medium" if gain >= 0.03 * steady else "low"
            continue
        pool.remove(best)
        alone = best.saving_ms or 0.0
        best.saving_alone_ms = alone
        if gain < NO_GAIN_MS:
            above = ", ".join(c.rule for c in chosen)
            best.no_gain = (f"Nothing left for it once the fixes ranked above it are in ({above}): they take the same time. "
                            f"Alone it saves ~{alone:.2f} ms/step.")
            best.evidence["critical_path"] = best.no_gain
            best.saving_ms, best.saving_pct, best.severity = 0.0, 0.0, "low"
            summary.fixes.remove(best.rule)
            continue
        if gain < MIN_RANKED_SHARE * steady:
            above = ", ".join(c.rule for c in chosen) or "none"
            best.no_gain = (f"It saves {gain:.2f} ms/step on top of the fixes ranked above it ({above}), under "
                            f"{100 * MIN_RANKED_SHARE:.1f}% of the {steady:.1f} ms step. Alone it saves ~{alone:.2f} ms/step.")
            if (why := replay.capped_by(best.change, on_top=True)) is not None:
                best.no_gain += f" On top of them its replayed saving is {why}."
            best.evidence["critical_path"] = best.no_gain
            best.evidence["saving_after_fixes_above_ms"] = round(gain, 3)
            best.saving_ms, best.saving_pct, best.severity = 0.0, 0.0, "low"
            summary.fixes.remove(best.rule)
            continue
        chosen.append(best)
        step -= gain
        best.saving_ms = gain
        best.saving_pct = gain / measured if measured > 0 else None
        best.severity = "high" if gain >= 0.10 * steady else "medium" if gain >= 0.03 * steady else "low"
    for f in findings:  # a symptom's causes: the fixes that stay ranked
        f.causes = [c for c in f.causes if c in summary.fixes]
    for f in symptoms:
        f.saving_alone_ms = f.saving_ms or 0.0
        if (f.saving_ms or 0.0) < MIN_RANKED_SHARE * steady:
            f.no_gain = (f"It saves {f.saving_ms or 0.0:.2f} ms/step once the other fixes are in, under "
                         f"{100 * MIN_RANKED_SHARE:.1f}% of the {steady:.1f} ms step.")
            f.saving_ms, f.saving_pct, f.severity = 0.0, 0.0, "low"
            summary.fixes.remove(f.rule)
            continue
        chosen.append(f)
    _in_parts(findings)
    if chosen:
        # without symptoms the last round replayed every chosen fix together: `step` is that replay
        together = step if not symptoms else replay.replayed_ms(replay.merged([c.change for c in chosen]))
        summary.all_fixes_ms = min(together, base)
    # Findings without a replayed fix: their estimates, in turn, never past the step the fixes leave.
    left = summary.all_fixes_ms if summary.all_fixes_ms is not None else base
    for f in sorted((f for f in findings if f.change is None and f.saving_ms is not None), key=lambda f: -(f.saving_ms or 0.0)):
        if f.saving_ms > left:
            f.evidence["capped"] = f"saving capped from {f.saving_ms:.2f} ms at the {left:.2f} ms the replayed fixes leave of the step"
            f.saving_alone_ms = f.saving_ms
            f.saving_ms = max(left, 0.0)
            step_of_f = _own_step_ms(f) or measured
            f.saving_pct = f.saving_ms / step_of_f if step_of_f > 0 else None
        left -= f.saving_ms


def combine_findings(rules: list[Rule], ranks: list[tuple[Metrics, RankFindings]], job: RankFindings = ()) -> list[Finding]:
    """The reduce: each rank rule's worst rank (ranks in rank order, the first of equals), then
    the job rules' findings; ranked by (replayed) saving."""
    by_rule: dict[str, Finding] = {}
    ranks_hit: dict[str, list[int]] = {}
    per_rule: dict[str, list[tuple[int, Finding]]] = {}
    for m, found in ranks:
        for rule_id, finding in found:
            per_rule.setdefault(rule_id, []).append((m.rank, finding))
    for rule in rules:
        for rank, finding in per_rule.get(rule.id, ()):
            ranks_hit.setdefault(rule.id, []).append(rank)
            best = by_rule.get(rule.id)
            if best is None or (finding.saving_ms or 0) > (best.saving_ms or 0):
                by_rule[rule.id] = finding
    findings = list(by_rule.values())
    for f in findings:
        if len(ranks) > 1:
            f.evidence["ranks"] = sorted(set(ranks_hit[f.rule]))
    best_of_job: dict[str, Finding] = {}
    for rule_id, finding in job:
        best = best_of_job.get(rule_id)
        if rule_id not in by_rule and (best is None or (finding.saving_ms or 0) > (best.saving_ms or 0)):
            best_of_job[rule_id] = finding
    findings += best_of_job.values()
    # The per-rank replay cannot see waits for other ranks: a rank finding whose rule lists a
    # job rule in CAUSES (communication-exposed: straggler) gives up the wait that one claims.
    rule_of = {r.id: r for r in rules}
    for f in findings:
        claimed = [best_of_job[c] for c in getattr(rule_of[f.rule].module, "CAUSES", ()) if f.rule in rule_of and c in best_of_job]
        if claimed and f.saving_ms is not None:
            left = max(f.saving_ms - sum(c.saving_ms or 0 for c in claimed), 0.0)
            if f.saving_pct is not None and f.saving_ms > 0:
                f.saving_pct *= left / f.saving_ms  # the same step, a smaller saving
            f.saving_ms = left
            f.causes = [c.rule for c in claimed]
    findings = [f for f in findings if f.saving_ms is None or f.saving_ms > 0 or f.evidence.get("estimate_ms", 0) > 0]
    # where first-call work was taken out of a rank's single pass, the floor is judged on the
    # steps without it (as in `in_rank_order`), the share shown staying of the measured step
    steady = {m.rank: float(np.median(m.step_ms)) for m, _ in ranks if m.measured is not None and len(m.step_ms)}
    for f in findings:
        share = f.saving_ms / steady[f.rank] if f.rank in steady and f.saving_ms is not None and steady[f.rank] > 0 else f.saving_pct
        if f.no_gain is None and f.saving_ms is not None and share is not None and share < MIN_RANKED_SHARE:
            f.no_gain = f"It saves {f.saving_ms:.2f} ms/step, under {100 * MIN_RANKED_SHARE:.1f}% of the step."
            f.saving_alone_ms = f.saving_alone_ms if f.saving_alone_ms is not None else f.saving_ms
            f.saving_ms, f.saving_pct, f.severity = 0.0, 0.0, "low"
        if f.saving_alone_ms is None:
            # a finding without a replayed fix: its saving alone is its own (0 for a risk with no time cost)
            f.saving_alone_ms = f.saving_ms if f.saving_ms is not None else 0.0
    _in_parts(findings)
    findings.sort(key=lambda f: (f.saving_ms is None, -listed_saving(f), f.rule))
    return _after_what_they_depend_on(findings)


def listed_saving(f: Finding) -> float:
    """The saving a finding is listed by: a fix that changes what is trained (its rule's RECIPE)
    counts 1/RECIPE_MARGIN of its saving, so it is listed above a fix that changes nothing but
    speed only where it saves more than RECIPE_MARGIN times as much, whichever of the two the
    greedy replay took first (a symptom's saving, what the fixes leave, is taken after them)."""
    saving = f.saving_ms or 0.0
    return saving / RECIPE_MARGIN if saving > 0 and changes_recipe(f) is not None else saving


def _after_what_they_depend_on(findings: list[Finding]) -> list[Finding]:
    """A fix whose saving is on top of others (evidence `depends_on`) is listed after them, so
    "each on top of the fixes above it" holds however the savings compare."""
    out = list(findings)
    for _ in range(len(out)):
        moved = False
        for i, f in enumerate(out):
            deps = {d for d in f.evidence.get("depends_on") or () if isinstance(d, str)}
            last = max((j for j, g in enumerate(out) if g.rule in deps), default=-1)
            if last > i:
                out.insert(last, out.pop(i))
                moved = True
                break
        if not moved:
            break
    return out
