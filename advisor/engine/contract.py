"""The rule contract: what a rule module defines, what it sees (Context, JobContext) and what
it returns (Finding). The rules this process has loaded are registered here, so a finding can
ask its rule's declarations (SYMPTOM, RECIPE, CAUSES) wherever it travels."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from types import ModuleType
from typing import Annotated, Any, Literal

import msgspec

from advisor.facts import FactsFile, typed_facts
from advisor.metrics.breakdown import name_matches
from advisor.metrics.collectives import JobWaits
from advisor.metrics.events import RankEvents, rank_events
from advisor.metrics.host_device import Timeline, timeline
from advisor.metrics.summary import Metrics, plain
from advisor.whatif.replay import Change
from advisor.whatif.savings import RankReplay, rank_replay

# Host ops only a training step has: autograd's backward nodes and the optimizer's spans.
TRAINING_OPS = re.compile(r"(Backward\d*$|^autograd::engine::evaluate_function|^Optimizer\.(step|zero_grad)|## backward ##)")


def is_training(m: Metrics, recorded: FactsFile) -> bool:
    """Whether a rank's run trains: the facts' `mode` when recorded, else the trace's own ops."""
    if recorded.mode is not None:
        return recorded.mode == "training"
    return m.shared("engine.is_training", lambda: bool(name_matches(m.frames.host["name"], TRAINING_OPS).any()))


SCOPES = ("rank", "job")



NonNegative = Annotated[float, msgspec.Meta(ge=0)]


class Fix(msgspec.Struct, forbid_unknown_fields=True):
    """What to change: a sentence, and the code after the change (may be empty)."""

    text: str
    snippet: str = ""


def _stated(cls: type[Finding], fields: tuple[Any, ...], change: Change | None) -> Finding:
    out = cls(*fields)
    out.change = change
    return out


class Finding(msgspec.Struct, forbid_unknown_fields=True, dict=True):
    """A rule's finding: the one type the engine ranks, the cache stores and the JSON report writes."""

    rule: str
    severity: Literal["low", "medium", "high"]
    title: str
    message: str
    saving_ms: NonNegative | None  # per step; None only for risks that cost no time now (e.g. OOM risk)
    # A share (0.30: 30%) of the mean step time; written `saving_share` in the JSON report, as its
    # other shares are (the text shows it as a percentage).
    saving_pct: NonNegative | None = msgspec.field(name="saving_share")
    confidence: str
    evidence: dict[str, Any] = {}
    fix: Fix = msgspec.field(default_factory=lambda: Fix(""))
    causes: list[str] = []
    rank: int | None = None
    # Why the fix gains nothing on this run (its replay saves nothing, or the rule sees that it
    # cannot): such a finding is not ranked, the reports list it as considered, with this reason.
    no_gain: str | None = None
    # A replayed fix's saving alone (what applying only this fix saves); saving_ms is what it
    # adds on top of the fixes ranked above it, so the ranked savings add up to the step with
    # every fix. None for findings without a replayed fix.
    saving_alone_ms: NonNegative | None = None
    # What the fix changes in the step (advisor.whatif.Change): set by Context.finding, replayed
    # by the engine, never reported (a plain attribute, not a field of the report's schema).
    change = None

    def __reduce__(self):
        """Pickled with its change (a rank's stated findings travel back from a worker)."""
        return (_stated, (type(self), msgspec.structs.astuple(self), self.change))

    @property
    def symptom(self) -> bool:
        """A symptom rule's finding (SYMPTOM = True in its module): its saving is what the other findings' fixes leave."""
        rule = find_loaded_rule(self.rule)
        return bool(rule is not None and getattr(rule.module, "SYMPTOM", False))

    def to_dict(self) -> dict[str, Any]:
        """The finding as the JSON report writes it."""
        return plain(self)


@dataclass
class Rule:
    id: str
    title: str
    doc: str
    docs_url: str
    defaults: dict[str, Any]
    module: ModuleType
    source: str  # "builtin" or the user's folder
    training_only: bool = False
    scope: str = "rank"  # "rank": one rank's metrics and frames; "job": every rank, no frames
    group: str = ""  # the rule file's GROUP (`--select input`); "" where it declares none

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
    # The facts file as plain JSON (None: not recorded), what `fact()` reads for rules written
    # against it; the shipped rules read `recorded` and hand it to the helpers they share.
    facts: dict[str, Any] | None
    options: dict[str, Any]
    rule: Rule
    world_size: int = 1
    # The user's options of every rule ([tool.advisor.rules.<ID>]), for a measurement that
    # depends on another rule's threshold.
    config: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The facts `advisor profile` recorded of this rank's run, as types (advisor.facts.FactsFile),
    # decoded once per rank: `ctx.recorded.dataloaders[0].batch_size`, `ctx.recorded.compile.used`.
    # A value not recorded (or no facts file at all) is None; a section is always there.
    recorded: FactsFile = None  # type: ignore[assignment]  # decoded from `facts` when not given

    def __post_init__(self) -> None:
        if self.recorded is None:
            self.recorded = typed_facts(self.facts)

    @property
    def frames(self):
        raise AttributeError("a rule reads the trace through ctx.events (typed tables: advisor/metrics/events.py), not ctx.frames")

    @property
    def events(self) -> RankEvents:
        """This rank's events as typed tables (`advisor.metrics.events`): all a rule reads of
        the trace beside its metrics."""
        return rank_events(self.metrics)

    def options_of(self, rule_id: str) -> dict[str, Any]:
        """Another rule's options as the user configured them (its defaults where not set)."""
        other = find_loaded_rule(rule_id)
        return {**(other.defaults if other is not None else {}), **self.config.get(rule_id, {})}

    @property
    def timeline(self) -> Timeline:
        """This rank's host/device idle timeline (built once per rank). The DataLoader's time is
        left out of the idle time when it reaches `dataloader-stall`'s `min_share` as configured:
        then it is the input pipeline's, not a cause another rule should find in it."""
        return timeline(self.metrics, self.options_of("dataloader-stall").get("min_share"))

    @property
    def step_ms(self) -> float:
        return self.metrics.mean_step_ns / 1e6

    @property
    def replay(self) -> RankReplay:
        """This rank's step replay (built once per rank), for rules that test their fix's saving."""
        return rank_replay(self.metrics, self.facts)

    def replayed_saving(self, change: Change) -> float | None:
        """ms per step the change saves on this rank's replayed step; None where it cannot replay."""
        r = self.replay
        if not r.available:
            return None
        return r.saving_ms(change)

    @property
    def uses_dataloader(self) -> bool:
        """Whether the run loads batches through a DataLoader: its spans in the trace, or its
        settings in the facts file. Advice about DataLoader settings needs one."""
        from advisor.metrics.breakdown import DATALOADER_NAME, name_matches

        return bool(self.recorded.dataloaders) or bool(name_matches(self.events.host["name"], DATALOADER_NAME).any())

    def fact(self, *keys: str, default: Any = None) -> Any:
        """A nested value from the facts file as plain JSON values, or default when absent (no
        facts recorded): `ctx.fact("dataloaders", 0, "batch_size")`. The shipped rules read the
        typed `ctx.recorded`; this stays for rules written against it (README, "Your own rules")."""
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
    change: Change | None = None,
    no_gain: str | None = None,
) -> Finding:
    """A finding of `rule`: its share of the step, a severity from that share, the module's FIX
    and AFTER unless given, and what its fix changes in the step (replayed by the engine)."""
    pct = (saving_ms / step_ms) if (saving_ms is not None and step_ms > 0) else None
    if severity is None:
        severity = "low" if pct is None else ("high" if pct >= 0.10 else "medium" if pct >= 0.03 else "low")
    mod = rule.module
    f = Finding(
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
        no_gain=no_gain,
    )
    f.change = change
    return f


RankFindings = list[tuple[str, Finding]]  # (rule id, finding) of one rank, in rule order

# The rules discovered in this process, by id (advisor.engine.discovery registers them).
_LOADED: dict[str, Rule] = {}


def find_loaded_rule(rule_id: str) -> Rule | None:
    """A rule already discovered in this process (None for findings read back from a cache)."""
    return _LOADED.get(rule_id)
