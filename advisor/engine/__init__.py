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

from advisor.engine.contract import (
    SCOPES,
    TRAINING_OPS,
    Context,
    Finding,
    Fix,
    JobContext,
    RankFindings,
    Rule,
    build_finding,
    find_loaded_rule,
    is_training,
)
from advisor.engine.critical_path import critical_path, measured_step_ms
from advisor.engine.discovery import all_rules, builtin_rules, find_rule, select_rules, user_rules
from advisor.engine.ranking import MIN_RANKED_SHARE, NO_GAIN_MS, RECIPE_MARGIN, changes_recipe, combine_findings, in_rank_order
from advisor.engine.running import check_rank_rules, job_findings, rank_findings, run_rules
from advisor.engine.settling import settle_by_replay

__all__ = [
    "MIN_RANKED_SHARE",
    "NO_GAIN_MS",
    "RECIPE_MARGIN",
    "SCOPES",
    "TRAINING_OPS",
    "Context",
    "Finding",
    "Fix",
    "JobContext",
    "RankFindings",
    "Rule",
    "all_rules",
    "build_finding",
    "builtin_rules",
    "changes_recipe",
    "check_rank_rules",
    "combine_findings",
    "critical_path",
    "find_loaded_rule",
    "find_rule",
    "in_rank_order",
    "is_training",
    "job_findings",
    "measured_step_ms",
    "rank_findings",
    "run_rules",
    "select_rules",
    "settle_by_replay",
    "user_rules",
]
