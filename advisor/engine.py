"""The rule engine: discover rule files, run them on each rank, rank what they find.

A rule is one module in `rules/` (shipped as `advisor.rules`) or in a user's `--rules DIR`.
Its docstring is its documentation page (what `advisor explain RULE` prints) and it defines:

    ID = "dataloader-stall"            # kebab-case, unique
    TITLE = "The input pipeline starves the device"
    DOCS = "https://pytorch.org/docs/..."   # the PyTorch page that backs the advice
    DEFAULTS = {"min_share": 0.05}     # thresholds, overridable in [tool.advisor.rules.<ID>]
    CAUSES = ()                         # for symptom rules: ids of rules that explain them
    SCOPE = "rank"                      # or "job": the rule compares the ranks (JobContext)
    def check(ctx: Context) -> Finding | Iterable[Finding] | None

A rank rule runs where its rank is loaded (`rank_findings`, on a worker next to the trace),
so only its findings travel; a job rule runs once on the reduce side over every rank's
metrics without frames (`job_findings`). `combine_findings` keeps each rule's worst rank.

Findings are ranked by saving. A symptom rule (CAUSES non-empty) is not counted twice with
its causes: when a cause fired, the symptom keeps only the part of its saving the causes do
not already claim, and points at them. Savings of one run never add up to more than its
step time.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Iterable

from advisor.errors import InputError
from advisor.metrics.collectives import JobWaits
from advisor.metrics.summary import Metrics

SCOPES = ("rank", "job")


@dataclass
class Fix:
    text: str
    snippet: str = ""


@dataclass
class Finding:
    rule: str
    severity: str
    title: str
    message: str
    saving_ms: float | None  # per step; None only for risks that cost no time now (e.g. OOM risk)
    saving_pct: float | None  # of the mean step time
    confidence: str
    evidence: dict[str, Any] = field(default_factory=dict)
    fix: Fix = field(default_factory=lambda: Fix(""))
    causes: list[str] = field(default_factory=list)
    rank: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Rule:
    id: str
    title: str
    doc: str
    docs_url: str
    defaults: dict[str, Any]
    causes: tuple[str, ...]
    module: ModuleType
    source: str  # "builtin" or the user's folder
    scope: str = "rank"  # "rank": one rank's metrics and frames; "job": every rank, no frames

    def check(self, ctx: "Context") -> list[Finding]:
        out = self.module.check(ctx)
        if out is None:
            return []
        if isinstance(out, Finding):
            return [out]
        return list(out)


@dataclass
class Context:
    """What a rule sees: one rank's metrics, the run's facts (if recorded) and its options."""

    metrics: Metrics
    facts: dict[str, Any] | None
    options: dict[str, Any]
    rule: Rule
    world_size: int = 1

    @property
    def frames(self):
        return self.metrics.frames

    @property
    def step_ms(self) -> float:
        return self.metrics.mean_step_ns / 1e6

    @property
    def uses_dataloader(self) -> bool:
        """Whether the run loads batches through a DataLoader: its spans in the trace, or its
        settings in the facts file. Advice about DataLoader settings needs one."""
        from advisor.metrics.breakdown import DATALOADER_NAME, _matches

        return bool(self.fact("dataloaders")) or bool(_matches(self.frames.host["name"], DATALOADER_NAME).any())

    def fact(self, *keys: str, default: Any = None) -> Any:
        """A nested value from the facts file, or default when absent (no facts recorded)."""
        node: Any = self.facts
        for k in keys:
            if isinstance(node, dict) and k in node:
                node = node[k]
            elif isinstance(node, list) and isinstance(k, int) and k < len(node):
                node = node[k]
            else:
                return default
        return node

    def finding(self, message: str, saving_ms: float | None, **kwargs: Any) -> Finding:
        return build_finding(self.rule, self.step_ms, self.metrics.rank, message, saving_ms, **kwargs)


@dataclass
class JobContext:
    """What a job rule sees: every rank's metrics (FramesHeader, not frames: the frames stay
    where each rank was loaded), the collective waits between ranks, the facts and its options."""

    ranks: list[Metrics]
    waits: JobWaits | None
    facts: dict[int, dict[str, Any]]
    options: dict[str, Any]
    rule: Rule

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    @property
    def step_ms(self) -> float:
        """The job's mean step: the slowest rank's."""
        return max((m.mean_step_ns / 1e6 for m in self.ranks), default=0.0)

    def metrics_of(self, rank: int) -> Metrics:
        return next(m for m in self.ranks if m.rank == rank)

    def finding(self, message: str, saving_ms: float | None, *, rank: int | None = None, **kwargs: Any) -> Finding:
        return build_finding(self.rule, self.step_ms, rank, message, saving_ms, **kwargs)


def build_finding(
    rule: Rule,
    step_ms: float,
    rank: int | None,
    message: str,
    saving_ms: float | None,
    *,
    confidence: str = "high",
    evidence: dict[str, Any] | None = None,
    fix: str | None = None,
    snippet: str | None = None,
    severity: str | None = None,
    title: str | None = None,
) -> Finding:
    """A finding of `rule`: its share of the step, a severity from that share, the module's FIX
    and AFTER unless given."""
    pct = (saving_ms / step_ms) if (saving_ms is not None and step_ms > 0) else None
    if severity is None:
        severity = "low" if pct is None else ("high" if pct >= 0.10 else "medium" if pct >= 0.03 else "low")
    mod = rule.module
    return Finding(
        rule=rule.id,
        severity=severity,
        title=title or rule.title,
        message=message,
        saving_ms=saving_ms,
        saving_pct=pct,
        confidence=confidence,
        evidence=evidence or {},
        fix=Fix(fix if fix is not None else getattr(mod, "FIX", ""), snippet if snippet is not None else getattr(mod, "AFTER", "")),
        rank=rank,
    )


# --- discovery ----------------------------------------------------------------------------
def _rule_from_module(mod: ModuleType, source: str) -> Rule:
    missing = [a for a in ("ID", "TITLE", "check") if not hasattr(mod, a)]
    if missing:
        raise InputError(getattr(mod, "__file__", mod.__name__), f"not a rule: missing {', '.join(missing)}")
    scope = getattr(mod, "SCOPE", "rank")
    if scope not in SCOPES:
        raise InputError(getattr(mod, "__file__", mod.__name__), f"SCOPE must be one of {', '.join(SCOPES)}, not {scope!r}")
    return Rule(
        id=mod.ID,
        title=mod.TITLE,
        doc=(mod.__doc__ or "").strip(),
        docs_url=getattr(mod, "DOCS", ""),
        defaults=dict(getattr(mod, "DEFAULTS", {})),
        causes=tuple(getattr(mod, "CAUSES", ())),
        module=mod,
        source=source,
        scope=scope,
    )


def builtin_rules() -> list[Rule]:
    """The rules that ship with the package (found through the package, so a wheel has them)."""
    import advisor.rules as pkg

    rules = []
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        rules.append(_rule_from_module(importlib.import_module(f"advisor.rules.{info.name}"), "builtin"))
    return rules


def user_rules(folder: str | Path) -> list[Rule]:
    folder = Path(folder)
    if not folder.is_dir():
        raise InputError(folder, "rules folder not found")
    rules = []
    for path in sorted(folder.glob("*.py")):
        if path.name.startswith("_"):
            continue
        name = f"advisor_user_rules.{path.stem}"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise InputError(path, "cannot load rule file")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        try:
            spec.loader.exec_module(mod)
        except Exception as exc:  # a user's rule file is user input
            raise InputError(path, f"rule file failed to load: {type(exc).__name__}: {exc}") from None
        rules.append(_rule_from_module(mod, str(folder)))
    return rules


def all_rules(extra_dir: str | Path | None = None) -> list[Rule]:
    rules = builtin_rules()
    if extra_dir is not None:
        rules += user_rules(extra_dir)
    seen: dict[str, Rule] = {}
    for r in rules:
        if r.id in seen:
            raise InputError(r.module.__file__, f"rule id {r.id!r} is already defined by {seen[r.id].module.__file__}")
        seen[r.id] = r
    return rules


def find_rule(rule_id: str, extra_dir: str | Path | None = None) -> Rule:
    for r in all_rules(extra_dir):
        if r.id == rule_id:
            return r
    known = ", ".join(r.id for r in all_rules(extra_dir))
    raise InputError(None, f"unknown rule {rule_id!r}; known rules: {known}")


def select_rules(rules: list[Rule], select: Iterable[str] = (), ignore: Iterable[str] = ()) -> list[Rule]:
    select, ignore = list(select), list(ignore)
    known = {r.id for r in rules}
    for rid in select + ignore:
        if rid not in known:
            raise InputError(None, f"unknown rule {rid!r} in select/ignore; run `advisor rules` to list them")
    if select:
        rules = [r for r in rules if r.id in select]
    return [r for r in rules if r.id not in ignore]


# --- running ------------------------------------------------------------------------------
RankFindings = list[tuple[str, Finding]]  # (rule id, finding) of one rank, in rule order


def rank_findings(
    rules: list[Rule],
    metrics: Metrics,
    facts: dict[str, Any] | None,
    options: dict[str, dict[str, Any]] | None = None,
    world_size: int = 1,
) -> RankFindings:
    """Every rank rule on one rank: the findings that buy time, or name a risk with no time figure."""
    options = options or {}
    out: RankFindings = []
    for rule in rules:
        if rule.scope != "rank":
            continue
        opts = {**rule.defaults, **options.get(rule.id, {})}
        ctx = Context(metrics=metrics, facts=facts, options=opts, rule=rule, world_size=world_size)
        for finding in rule.check(ctx):
            if finding.saving_ms is not None and not finding.saving_ms > 0:
                continue  # a finding must buy time, or be a risk with no time figure
            out.append((rule.id, finding))
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


def combine_findings(rules: list[Rule], ranks: list[tuple[Metrics, RankFindings]], job: RankFindings = ()) -> list[Finding]:
    """The reduce: each rank rule's worst rank (ranks in rank order, the first of equals),
    then the job rules' findings; ranked by saving, symptoms deferring to their causes."""
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
    step_ms = max((m.mean_step_ns / 1e6 for m, _ in ranks), default=0.0)
    return _settle(findings, rules, step_ms)


def run_rules(
    rules: list[Rule],
    ranks: list[Metrics],
    facts: dict[int, dict[str, Any]] | None = None,
    options: dict[str, dict[str, Any]] | None = None,
) -> list[Finding]:
    """Every rule on ranks held in one process (frames and all): rank rules on each, job rules
    on all, then the reduce. `advisor.analysis` runs the same steps with the ranks spread over workers."""
    from advisor.metrics.collectives import job_waits

    facts = facts or {}
    per_rank = [(m, rank_findings(rules, m, facts.get(m.rank) or facts.get(-1), options, len(ranks))) for m in ranks]
    waits = job_waits([(m.rank, m.comm) for m in ranks]) if len(ranks) > 1 else None
    return combine_findings(rules, per_rank, job_findings(rules, ranks, waits, facts, options))


def _settle(findings: list[Finding], rules: list[Rule], step_ms: float) -> list[Finding]:
    """Symptoms defer to their causes; the total saving is capped at the step time."""
    causes = {r.id: r.causes for r in rules}
    fired = {f.rule: f for f in findings}
    raw = {f.rule: f.saving_ms for f in findings}
    settled: dict[str, float | None] = {}
    dropped: set[str] = set()

    def settle(rule_id: str, seen: frozenset = frozenset()) -> float | None:
        # A cause is settled before the symptom that lists it, so nothing is subtracted twice;
        # a symptom fully explained by its causes is dropped and claims nothing.
        if rule_id in settled:
            return settled[rule_id]
        saving = raw[rule_id]
        explained = [c for c in causes.get(rule_id, ()) if c in fired and c not in seen]
        if saving is not None and explained:
            saving -= sum(settle(c, seen | {rule_id}) or 0 for c in explained)
            if saving <= 0.01 * step_ms:
                dropped.add(rule_id)
                saving = 0.0
        settled[rule_id] = saving
        return saving

    kept = []
    for f in findings:
        f.saving_ms = settle(f.rule)
        if f.rule in dropped:
            continue  # fully explained by its causes: they carry the saving
        f.causes = [c for c in causes.get(f.rule, ()) if c in fired]
        if f.causes and f.saving_ms is not None:
            f.saving_pct = f.saving_ms / step_ms if step_ms else None
        kept.append(f)
    for f in kept:
        f.causes = [c for c in f.causes if c not in dropped]
    kept.sort(key=lambda f: (f.saving_ms is None, -(f.saving_ms or 0), f.rule))
    remaining = step_ms
    out = []
    for f in kept:
        if f.saving_ms is not None:
            if remaining <= 0:
                continue
            if f.saving_ms > remaining:
                f.evidence["capped"] = f"saving capped from {f.saving_ms:.2f} ms: earlier findings already claim the rest of the step"
                f.saving_ms = remaining
                f.saving_pct = remaining / step_ms if step_ms else None
            remaining -= f.saving_ms
        out.append(f)
    return out
