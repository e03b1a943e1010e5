"""Running the rules: every rank rule on each rank (with its replay, where the rank was
loaded), every job rule once over all ranks, and the reduce that keeps each rule's worst rank."""

from __future__ import annotations

from typing import Any

import msgspec

from advisor.engine.contract import Context, Finding, JobContext, RankFindings, Rule, is_training
from advisor.engine.ranking import combine_findings
from advisor.engine.settling import settle_by_replay
from advisor.facts import typed_facts
from advisor.metrics.collectives import JobWaits
from advisor.metrics.summary import Metrics
from advisor.whatif.savings import RankWhatIf


def check_rank_rules(
    rules: list[Rule],
    metrics: Metrics,
    facts: dict[str, Any] | None,
    options: dict[str, dict[str, Any]] | None = None,
    world_size: int = 1,
    warnings: list[str] | None = None,
) -> list[Finding]:
    """Every rank rule's findings on one rank, as the rules state them (each with the change its
    fix makes), before the replay. A rule that raises becomes a warning when `warnings` is given."""
    options = options or {}
    found: list[Finding] = []
    recorded = typed_facts(facts)  # the rank's facts as types, decoded once for all its rules
    for rule in rules:
        if rule.scope != "rank" or (rule.training_only and not is_training(metrics, recorded)):
            continue
        opts = {**rule.defaults, **options.get(rule.id, {})}
        ctx = Context(metrics=metrics, facts=facts, options=opts, rule=rule, world_size=world_size, config=options, recorded=recorded)
        try:
            found.extend(rule.check(ctx))
        except Exception as exc:  # noqa: BLE001 - one broken rule must not cost the report
            if warnings is None:
                raise
            warnings.append(f"rule {rule.id} failed on rank {metrics.rank} and was skipped: {type(exc).__name__}: {exc}")
    return found


def rank_findings(
    rules: list[Rule],
    metrics: Metrics,
    facts: dict[str, Any] | None,
    options: dict[str, dict[str, Any]] | None = None,
    world_size: int = 1,
    warnings: list[str] | None = None,
    whatif: list[RankWhatIf] | None = None,
    stated: dict[str, Finding] | None = None,
) -> RankFindings:
    """Every rank rule on one rank, their savings replayed on this rank's step graph: the
    findings that buy time, name a risk with no time figure, or are a fix the rule saw time in.
    The rank's replay summary is appended to `whatif`; `stated` gets each finding with a fix
    to replay as the rule stated it (rule -> a copy of the finding, its change kept), for the
    replays the reports make later."""
    found = check_rank_rules(rules, metrics, facts, options, world_size, warnings)
    if stated is not None:
        stated.update({f.rule: _as_stated(f) for f in found if f.change is not None and f.saving_ms is not None})
    out: RankFindings = []
    for finding in settle_by_replay(metrics, facts, found, whatif):
        if finding.saving_ms is not None and not finding.saving_ms > 0 and not finding.evidence.get("estimate_ms", 0) > 0:
            continue
        finding.change = None  # replayed: only the finding travels back to the reduce
        out.append((finding.rule, finding))
    return out


def _as_stated(f: Finding) -> Finding:
    """A copy of a finding as its rule stated it, with its change (the replay settles the original)."""
    out = msgspec.structs.replace(f, evidence=dict(f.evidence), causes=list(f.causes))
    out.change = f.change
    return out


def job_findings(
    rules: list[Rule],
    ranks: list[Metrics],
    waits: JobWaits | None,
    facts: dict[int, dict[str, Any]] | None = None,
    options: dict[str, dict[str, Any]] | None = None,
) -> RankFindings:
    """Every job rule, once, over all ranks (they need at least two)."""
    options = options or {}
    out: RankFindings = []
    if len(ranks) < 2:
        return out
    for rule in rules:
        if rule.scope != "job":
            continue
        opts = {**rule.defaults, **options.get(rule.id, {})}
        ctx = JobContext(ranks=ranks, waits=waits, facts=facts or {}, options=opts, rule=rule)
        for finding in rule.check(ctx):
            if finding.saving_ms is not None and not finding.saving_ms > 0:
                continue
            out.append((rule.id, finding))
    return out


def run_rules(
    rules: list[Rule],
    ranks: list[Metrics],
    facts: dict[int, dict[str, Any]] | None = None,
    options: dict[str, dict[str, Any]] | None = None,
    warnings: list[str] | None = None,
    whatif: list[RankWhatIf] | None = None,
) -> list[Finding]:
    """Every rule on ranks held in one process (frames and all): rank rules (and their replay)
    on each, job rules on all, then the reduce. `advisor.analysis` runs the same steps with the
    ranks spread over workers."""
    from advisor.metrics.collectives import job_waits

    facts = facts or {}
    per_rank = [(m, rank_findings(rules, m, facts.get(m.rank) or facts.get(-1), options, len(ranks), warnings, whatif)) for m in ranks]
    waits = job_waits([(m.rank, m.comm) for m in ranks]) if len(ranks) > 1 else None
    return combine_findings(rules, per_rank, job_findings(rules, ranks, waits, facts, options))
