"""The rule engine: discover rule files, run them on each rank, rank what they find.

A rule is one module in `rules/` (shipped as `advisor.rules`) or in a user's `--rules DIR`.
Its docstring is its documentation page (what `advisor explain RULE` prints) and it defines:

    ID = "dataloader-stall"            # kebab-case, unique
    TITLE = "The input pipeline starves the device"
    DOCS = "https://pytorch.org/docs/..."   # the PyTorch page that backs the advice
    DEFAULTS = {"min_share": 0.05}     # thresholds, overridable in [tool.advisor.rules.<ID>]
    TRAINING_ONLY = False               # True: silent on inference and evaluation runs
    SYMPTOM = False                     # True: saved only what the other findings' fixes leave
    SCOPE = "rank"                      # or "job": the rule compares the ranks (JobContext)
    def check(ctx: Context) -> Finding | Iterable[Finding] | None

A finding declares what its fix changes in the step (`ctx.finding(..., change=Change(...))`,
see `advisor.whatif`). The engine replays each rank's step graph with each change alone (the
finding's saving) and with all of them together (the run's headline), so savings come from
one simulation of the run, not from per-rule arithmetic, and no two findings count the same
time twice by construction. A finding with no change keeps its own estimate, capped at the
replayed step. A symptom rule (`SYMPTOM = True`, e.g. gpu-idle) is saved only what the other
findings' fixes leave: its change replayed on top of all of theirs. A rule that raises is reported as a warning naming it; the report goes on.

A run is inference when its facts file says so (`mode`, from `advisor profile`: steps found
with no backward pass and no optimizer step), or, with no facts, when its trace holds no
backward op and no optimizer span.

A rank rule runs where its rank is loaded (`rank_findings`, on a worker next to the trace),
with its replay, so only its findings and replay summary travel; a job rule runs once on the
reduce side over every rank's metrics without frames (`job_findings`). `combine_findings`
keeps each rule's worst rank. The replay sees one rank, not the waits between ranks: a rank
rule that lists a job rule in `CAUSES` (communication-exposed: straggler) gives up the wait
that job rule's finding claims.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import re
import sys
from dataclasses import asdict, dataclass, field, replace

import numpy as np
from pathlib import Path
from types import ModuleType
from typing import Any, Iterable

from advisor.errors import InputError
from advisor.files_read import remember
from advisor.metrics.breakdown import _matches
from advisor.metrics.collectives import JobWaits
from advisor.metrics.host_device import Timeline, timeline
from advisor.metrics.events import RankEvents, rank_events
from advisor.metrics.summary import Metrics
from advisor.whatif.replay import Change
from advisor.whatif.savings import RankReplay, RankWhatIf, rank_replay

# Host ops only a training step has: autograd's backward nodes and the optimizer's spans.
TRAINING_OPS = re.compile(r"(Backward\d*$|^autograd::engine::evaluate_function|^Optimizer\.(step|zero_grad)|## backward ##)")


def is_training(m: Metrics, facts: dict[str, Any] | None) -> bool:
    """Whether a rank's run trains: the facts' `mode` when recorded, else the trace's own ops."""
    mode = (facts or {}).get("mode")
    if mode in ("training", "inference"):
        return mode == "training"
    return m.shared("engine.is_training", lambda: bool(_matches(m.frames.host["name"], TRAINING_OPS).any()))


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
    # Why the fix gains nothing on this run (its replay saves nothing, or the rule sees that it
    # cannot): such a finding is not ranked, the reports list it as considered, with this reason.
    no_gain: str | None = None
    # A replayed fix's saving alone (what applying only this fix saves); saving_ms is what it
    # adds on top of the fixes ranked above it, so the ranked savings add up to the step with
    # every fix. None for findings without a replayed fix.
    saving_alone_ms: float | None = None
    # What the fix changes in the step (advisor.whatif.Change): set by Context.finding, replayed
    # by the engine, never reported (a plain attribute, not a field of the report's schema).
    change = None

    @property
    def symptom(self) -> bool:
        """A symptom rule's finding (SYMPTOM = True in its module): its saving is what the other findings' fixes leave."""
        from advisor.engine import find_loaded_rule

        rule = find_loaded_rule(self.rule)
        return bool(rule is not None and getattr(rule.module, "SYMPTOM", False))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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
    facts: dict[str, Any] | None
    options: dict[str, Any]
    rule: Rule
    world_size: int = 1
    # The user's options of every rule ([tool.advisor.rules.<ID>]), for a measurement that
    # depends on another rule's threshold.
    config: dict[str, dict[str, Any]] = field(default_factory=dict)

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
        from advisor.metrics.breakdown import DATALOADER_NAME, _matches

        return bool(self.fact("dataloaders")) or bool(_matches(self.events.host["name"], DATALOADER_NAME).any())

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


# --- discovery ----------------------------------------------------------------------------
_LOADED: dict[str, "Rule"] = {}


def find_loaded_rule(rule_id: str) -> "Rule | None":
    """A rule already discovered in this process (None for findings read back from a cache)."""
    return _LOADED.get(rule_id)


def _rule_from_module(mod: ModuleType, source: str) -> Rule:
    missing = [a for a in ("ID", "TITLE", "check") if not hasattr(mod, a)]
    if missing:
        raise InputError(getattr(mod, "__file__", mod.__name__), f"not a rule: missing {', '.join(missing)}")
    scope = getattr(mod, "SCOPE", "rank")
    if scope not in SCOPES:
        raise InputError(getattr(mod, "__file__", mod.__name__), f"SCOPE must be one of {', '.join(SCOPES)}, not {scope!r}")
    group = getattr(mod, "GROUP", "")
    if not isinstance(group, str) or not re.fullmatch(r"[a-z0-9][a-z0-9-]*|", group.strip().lower()):
        raise InputError(getattr(mod, "__file__", mod.__name__), f"GROUP must be a group name (letters, digits, dashes), not {group!r}")
    rule = Rule(
        id=mod.ID,
        title=mod.TITLE,
        doc=(mod.__doc__ or "").strip(),
        docs_url=getattr(mod, "DOCS", ""),
        defaults=dict(getattr(mod, "DEFAULTS", {})),
        module=mod,
        source=source,
        training_only=bool(getattr(mod, "TRAINING_ONLY", False)),
        scope=scope,
        group=group.strip().lower(),
    )
    _LOADED[rule.id] = rule
    return rule


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
        remember(path)  # an input like any other file read: never an output
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
    from advisor.rule_selection import did_you_mean

    ids = [r.id for r in all_rules(extra_dir)]
    raise InputError(None, f"unknown rule {rule_id!r}{did_you_mean(rule_id, ids)}; `advisor rules` lists them")


def select_rules(rules: list[Rule], select: Iterable[str] = (), ignore: Iterable[str] = ()) -> list[Rule]:
    """The rules `select` and `ignore` leave: ids, groups and prefixes (advisor/rule_selection.py)."""
    from advisor.rule_selection import resolve

    return resolve(rules, select, ignore)


# --- running ------------------------------------------------------------------------------
RankFindings = list[tuple[str, Finding]]  # (rule id, finding) of one rank, in rule order


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
    for rule in rules:
        if rule.scope != "rank" or (rule.training_only and not is_training(metrics, facts)):
            continue
        opts = {**rule.defaults, **options.get(rule.id, {})}
        ctx = Context(metrics=metrics, facts=facts, options=opts, rule=rule, world_size=world_size, config=options)
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
    out = replace(f, evidence=dict(f.evidence), causes=list(f.causes))
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
    for f in findings:
        if f.no_gain is None and f.saving_ms is not None and f.saving_pct is not None and f.saving_pct < MIN_RANKED_SHARE:
            f.no_gain = f"It saves {f.saving_ms:.2f} ms/step, under {100 * MIN_RANKED_SHARE:.1f}% of the step."
            f.saving_alone_ms = f.saving_alone_ms if f.saving_alone_ms is not None else f.saving_ms
            f.saving_ms, f.saving_pct, f.severity = 0.0, 0.0, "low"
        if f.saving_alone_ms is None:
            # a finding without a replayed fix: its saving alone is its own (0 for a risk with no time cost)
            f.saving_alone_ms = f.saving_ms if f.saving_ms is not None else 0.0
    findings.sort(key=lambda f: (f.saving_ms is None, -(f.saving_ms or 0), f.rule))
    return _after_what_they_depend_on(findings)


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


def _restate(message: str, old: float, new: float) -> str:
    """The rule's promise in its message, replaced by the replayed one."""
    for fmt in (".2f", ".1f", ".0f"):
        before = f"~{old:{fmt}} ms"
        if before in message:
            return message.replace(before, f"~{new:{fmt}} ms")
    return message.rstrip() + f" Replayed on this run: ~{new:.2f} ms/step."


# A replayed saving under this (ms per step) is no gain: the finding is considered, not ranked.
NO_GAIN_MS = 0.005
# A finding that saves less than this share of the measured step is listed as considered, not ranked.
MIN_RANKED_SHARE = 0.005


def _device_ms_with(m: Metrics, change: Change) -> float:
    """The device's busy time per step with `change` applied: the window's busy time scaled by
    what the change does to the device ops' summed time (and per current step's samples)."""
    device_ms = (m.gpu_utilization or 0.0) * m.mean_step_ns / 1e6
    if not (change.device_scale or change.device_add or change.device_scale_all != 1.0 or change.per_sample != 1.0):
        return device_ms
    dur = rank_events(m).device["dur"].to_numpy(np.float64)
    before = float(dur.sum())
    if before <= 0:
        return device_ms
    rows = np.fromiter(change.device_scale.keys(), dtype=np.int64, count=len(change.device_scale))
    factors = np.fromiter(change.device_scale.values(), dtype=np.float64, count=len(change.device_scale))
    ok = (rows >= 0) & (rows < len(dur))
    after = (before + float((dur[rows[ok]] * (factors[ok] - 1.0)).sum())) * change.device_scale_all + float(sum(change.device_add.values()))
    return device_ms * max(after, 0.0) / before / max(change.per_sample, 1e-9)


def critical_path(m: Metrics, replay: RankReplay, change: Change) -> str:
    """One clause naming what holds the replayed step with `change` applied, with its time:
    the device's own work (as the change leaves it) where it fills most of the step, else the
    host's. Neither is ever stated as more than the replayed step."""
    step = replay.replayed_ms(change)
    bd = m.breakdown_mean_ms
    util = m.gpu_utilization
    device_ms = _device_ms_with(m, change)
    host_ms = sum(bd.get(c, 0.0) for c in ("runtime", "dataloader", "cpu_exec", "other"))
    d = 2 if step < 1.0 else 1  # a sub-millisecond step keeps its figures
    if util is not None and device_ms >= 0.8 * step:
        return f"the device's own work holds the step, {min(device_ms, step):.{d}f} ms of the {step:.{d}f} ms replayed step"
    loader = bd.get("dataloader", 0.0)
    if change.host_remove and loader > 0:
        # a fix that takes host windows off (the DataLoader's wait): what it leaves of the host
        host_ms = max(host_ms - max(replay.baseline_ms - step, 0.0), 0.0)
        loader = min(loader, host_ms)
    host_ms = min(host_ms, step)
    parts = f", {min(loader, host_ms):.{d}f} ms of it the DataLoader" if loader >= 0.05 * max(host_ms, 1e-9) and loader > 0 else ""
    return f"the host's own work holds the step, {host_ms:.{d}f} ms per step outside device work{parts}, of the {step:.{d}f} ms replayed step"


def _own_step_ms(f: Finding) -> float | None:
    """The step a finding without a replayed fix measured itself on: the unprofiled steps'
    mean (`evidence.unprofiled_step_ms`), where its rule read them; else None."""
    own = f.evidence.get("unprofiled_step_ms") if f.change is None else None
    return float(own) if isinstance(own, (int, float)) and own > 0 else None


def measured_step_ms(summary: RankWhatIf) -> float:
    """The measured step every share is taken of: the unprofiled steps' median where the run
    recorded them, else the window's median (never the profiler-corrected replay)."""
    return summary.unprofiled_ms if summary.unprofiled_ms is not None else summary.measured_ms


def critical_path_of_base(replay: RankReplay, change: Change) -> str:
    """What the fix alone leaves on the replayed step, in a few words."""
    return f"the replayed step goes from {replay.baseline_ms:.1f} to {replay.replayed_ms(change):.1f} ms"


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
    others = Change.merge([f.change for f in gains]) if gains else None
    dropped = set()
    for f in findings:
        if f.saving_ms is None:
            continue
        if f.change is not None and f.symptom and others is not None:
            # A symptom (the device idles) is what its causes' fixes leave: its saving is
            # the replayed step with every other fix minus that step with its change too.
            with_others = replay.replayed_ms(others)
            saving = max(with_others - replay.replayed_ms(Change.merge([others, f.change])), 0.0)
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
            # Not modelled: its own estimate, as the same share of the replayed step (which is
            # the unprofiled step where the facts have one), and never more than that step.
            window = m.mean_step_ns / 1e6
            own = _own_step_ms(f)
            if own is not None:
                # measured on the unprofiled steps (their mean: a stall the window's prefetched
                # batches hid): that share of that step, whatever the window or the replay say
                saving = min(f.saving_ms * (own / window if window > 0 else 1.0), own)
            else:
                saving = min(f.saving_ms * (base / window if window > 0 else 1.0), base)
                if saving < f.saving_ms * (base / window if window > 0 else 1.0) - 1e-9:
                    f.evidence["capped"] = f"saving capped from {f.saving_ms:.2f} ms at the replayed step"
        if abs(saving - f.saving_ms) >= 0.005 and f.rule not in dependent:
            f.message = _restate(f.message, f.saving_ms, saving)
        if f.change is not None and f.rule not in dropped:
            estimate = f.evidence.get("estimate_ms")
            if f.rule in dependent:
                f.evidence["saving_alone_replayed_ms"] = round(alone[f.rule], 3)
            elif f.no_gain is None and f.rule in lengthens:
                f.no_gain = (f"Replayed on this run, this fix makes the step {-alone[f.rule]:.2f} ms longer: the work it adds "
                             "outweighs what it removes.")
            elif f.no_gain is None and saving < NO_GAIN_MS:
                f.no_gain = "This fix alone gains nothing on this run now: " + critical_path(m, replay, f.change) + "."
            elif f.no_gain is None and estimate is not None and not (0.5 * estimate <= saving <= 2.0 * estimate):
                # Invariant 5: the replay departs from the rule's first-order estimate; say what holds the path.
                why = critical_path(m, replay, f.change)
                f.evidence["critical_path"] = why
                f.message = f.message.rstrip() + f" The replay gives {saving:.2f} ms against the rule's estimate of {estimate:.2f} ms: with the fix, {why}."
            if f.no_gain is not None:
                f.evidence["critical_path"] = f.no_gain
                if f.no_gain not in f.message:
                    f.message = f.message.rstrip() + " " + f.no_gain
        f.saving_ms = saving
        step_of_f = _own_step_ms(f) if f.change is None and _own_step_ms(f) is not None else measured
        f.saving_pct = saving / step_of_f if step_of_f > 0 else None
        if f.change is not None:
            f.severity = "high" if f.saving_pct and f.saving_pct >= 0.10 else "medium" if f.saving_pct and f.saving_pct >= 0.03 else "low"
            if f.no_gain is not None or saving < NO_GAIN_MS:
                f.saving_ms = 0.0  # still found; the reports list it as considered, with the reason
                f.saving_pct = 0.0
                f.severity = "low"
        summary.savings[f.rule] = round(f.saving_ms, 3)
    kept = [f for f in findings if f.rule not in dropped]
    if changes:
        # Fixes that each gain alone can still interact; the step with every fix is never
        # reported longer than the step without them.
        summary.all_fixes_ms = min(replay.replayed_ms(Change.merge(changes)), base)
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
            f.message = _restate(f.message, f.evidence.get("estimate_ms", 0.0), 0.0).rstrip() + " " + f.no_gain
            f.saving_ms, f.saving_pct, f.severity = 0.0, 0.0, "low"
            f.saving_alone_ms = 0.0
            summary.savings[f.rule] = 0.0
    if whatif is not None:
        whatif.append(summary)
    return kept


# A fix that changes what is trained (the batch size, the precision) ranks above a fix that
# changes nothing but speed only where it saves more than this many times as much.
RECIPE_MARGIN = 2.0


def changes_recipe(f: Finding) -> str | None:
    """What a finding's fix changes beside speed ("batch size", "precision"): its rule's RECIPE."""
    rule = find_loaded_rule(f.rule)
    return getattr(rule.module, "RECIPE", None) if rule is not None else None


def _pick(trials: list[tuple[float, Finding]], pool: list[Finding]) -> tuple[float, Finding]:
    """The fix to rank next: the one that saves most, unless it changes the recipe and a fix
    that changes nothing but speed saves at least 1/RECIPE_MARGIN of it."""
    order = lambda t: (t[0], -pool.index(t[1]))
    gain, best = max(trials, key=order)
    if changes_recipe(best) is not None:
        speed = [t for t in trials if changes_recipe(t[1]) is None and t[0] >= NO_GAIN_MS]
        if speed:
            alt = max(speed, key=order)
            if alt[0] * RECIPE_MARGIN >= gain:
                return alt
    return gain, best


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
    alone_of = alone_of or {}
    symptoms = [f for f in findings if f.change is not None and f.no_gain is None and f.symptom and f.rule in summary.fixes]
    chosen: list[Finding] = []
    step = base
    while pool or (waiting and chosen):
        # the first round is each fix alone: the replays its saving came from (cached)
        candidates = [*pool, *(waiting if chosen else ())]
        trials = [(step - replay.replayed_ms(Change.merge([*(c.change for c in chosen), f.change]) if chosen else f.change), f) for f in candidates]
        gain, best = _pick(trials, candidates)
        if best in waiting:
            if gain < NO_GAIN_MS:
                break  # none of them gains on top of the fixes chosen
            waiting.remove(best)
            above = ", ".join(c.rule for c in chosen)
            lone = alone_of.get(best.rule, 0.0)
            said = (f"makes the step {-lone:.2f} ms longer" if lone < -0.005 else "gains nothing")
            best.message = _restate(best.message, best.evidence.get("estimate_ms", 0.0), gain)
            why = (f"Alone this fix {said} on this run ({critical_path_of_base(replay, best.change)}); on top of the fixes "
                   f"ranked above it ({above}), which expose the work it speeds up, it saves ~{gain:.2f} ms/step.")
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
            best.severity = "high" if gain >= 0.10 * measured else "medium" if gain >= 0.03 * measured else "low"
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
        if gain < MIN_RANKED_SHARE * measured:
            above = ", ".join(c.rule for c in chosen) or "none"
            best.no_gain = (f"It saves {gain:.2f} ms/step on top of the fixes ranked above it ({above}), under "
                            f"{100 * MIN_RANKED_SHARE:.1f}% of the {measured:.1f} ms step. Alone it saves ~{alone:.2f} ms/step.")
            best.evidence["critical_path"] = best.no_gain
            best.evidence["saving_after_fixes_above_ms"] = round(gain, 3)
            best.saving_ms, best.saving_pct, best.severity = 0.0, 0.0, "low"
            summary.fixes.remove(best.rule)
            continue
        chosen.append(best)
        step -= gain
        best.saving_ms = gain
        best.saving_pct = gain / measured if measured > 0 else None
        best.severity = "high" if gain >= 0.10 * measured else "medium" if gain >= 0.03 * measured else "low"
    for f in findings:  # a symptom's causes: the fixes that stay ranked
        f.causes = [c for c in f.causes if c in summary.fixes]
    for f in symptoms:
        f.saving_alone_ms = f.saving_ms or 0.0
        if (f.saving_ms or 0.0) < MIN_RANKED_SHARE * measured:
            f.no_gain = (f"It saves {f.saving_ms or 0.0:.2f} ms/step once the other fixes are in, under "
                         f"{100 * MIN_RANKED_SHARE:.1f}% of the {measured:.1f} ms step.")
            f.saving_ms, f.saving_pct, f.severity = 0.0, 0.0, "low"
            summary.fixes.remove(f.rule)
            continue
        chosen.append(f)
    if chosen:
        # without symptoms the last round replayed every chosen fix together: `step` is that replay
        together = step if not symptoms else replay.replayed_ms(Change.merge([c.change for c in chosen]))
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
