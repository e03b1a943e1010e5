"""`advisor fix`: from a run's findings to the edit of the script that each finding asks for.

One module per fix family (loader.py, optimizer.py, backends.py, empty_cache.py,
precision.py, model.py, batch.py), each registering a fixer per rule (base.register). The
edits are libcst codemods (source.py): comments and formatting are kept, and each fix changes
only the arguments or statements it is about.

    plan = plan_fixes(Path("train.py"), findings, select=["dataloader-stall"])
    print(plan.diff())

Safe fixes keep the numerics (worker processes, pinned memory, set_to_none, foreach,
cudnn.benchmark, no empty_cache in the loop); unsafe ones change them (TF32, bf16 autocast,
torch.compile, channels-last, a larger batch) and are only written when asked for
(`unsafe=True`). A finding whose code runs inside a library gets that library's setting
(libraries.py) instead of an edit; a fix that cannot be placed safely says why.

This stage reads findings as the report's JSON dictionaries: it imports no rule and no CLI.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path

from advisor.fix import backends, batch, empty_cache, loader, model, optimizer, precision  # noqa: F401  (they register their fixers)
from advisor.fix.base import FIXES, SAFE, UNSAFE, Done, Placed, Setting, Skipped
from advisor.fix.source import Edits, Script

__all__ = ["FIXES", "SAFE", "UNSAFE", "FixResult", "Plan", "plan_fixes"]

# What each result's status means, as printed.
PLACED, DONE, SKIPPED, SETTING, UNSAFE_OFF, NO_FIX = "placed", "already", "not placed", "library setting", "unsafe (not asked for)", "no code fix"


@dataclass
class FixResult:
    rule: str
    fix: str  # the fix, in a few words ("" when the rule has no code fix)
    safety: str  # safe | unsafe | ""
    status: str
    detail: str  # what was written, why not, or the setting to change
    note: str = ""
    promised_ms: float | None = None
    promised_pct: float | None = None
    edits: Edits | None = field(default=None, repr=False)

    @property
    def placed(self) -> bool:
        return self.status == PLACED

    def to_dict(self) -> dict:
        return {
            "rule": self.rule,
            "fix": self.fix,
            "safety": self.safety,
            "status": self.status,
            "detail": self.detail,
            "note": self.note,
            "promised_ms": self.promised_ms,
            "promised_pct": self.promised_pct,
        }


@dataclass
class Plan:
    script: Script
    results: list[FixResult]

    @property
    def placed(self) -> list[FixResult]:
        return [r for r in self.results if r.placed]

    def fixed_text(self, rules: list[str] | None = None) -> str:
        """The script with the placed fixes (only these rules' when given) applied."""
        edits = Edits()
        for r in self.placed:
            if rules is None or r.rule in rules:
                assert r.edits is not None
                edits.merge(r.edits)
        return self.script.apply(edits)

    @property
    def changed(self) -> bool:
        return self.fixed_text() != self.script.text

    def diff(self, rules: list[str] | None = None) -> str:
        name = self.script.path.as_posix()
        after = self.fixed_text(rules)
        return "".join(
            difflib.unified_diff(self.script.text.splitlines(keepends=True), after.splitlines(keepends=True), fromfile=name, tofile=name)
        )


def plan_fixes(path: Path, findings: list[dict], select: list[str] | None = None, unsafe: bool = False, script: Script | None = None) -> Plan:
    """Each finding (report JSON dicts, ranked) mapped to its fix on the script at `path`."""
    script = script or Script.read(path)
    results: list[FixResult] = []
    seen: set[str] = set()
    for finding in findings:
        rule = str(finding.get("rule"))
        if (select and rule not in select) or rule in seen:
            continue
        seen.add(rule)
        promised = dict(promised_ms=finding.get("saving_ms"), promised_pct=finding.get("saving_pct"))
        kind = FIXES.get(rule)
        if kind is None:
            fix_text = str((finding.get("fix") or {}).get("text") or "")
            results.append(FixResult(rule, "", "", NO_FIX, "the advisor writes no code for this rule" + (f"; the finding says: {fix_text}" if fix_text else ""), **promised))
            continue
        if kind.safety == UNSAFE and not unsafe:
            results.append(FixResult(rule, kind.name, kind.safety, UNSAFE_OFF, "changes the numerics: written only with --unsafe-fixes", **promised))
            continue
        out = kind.fixer(script, finding)
        if isinstance(out, Placed):
            frames = [str(f) for f in (finding.get("evidence") or {}).get("source") or []]
            if frames and not script.frames(finding) and not out.note:
                out.note = f"the finding's line is {frames[0].split(': ')[0]}, not in this script: the script's own code that drives it is edited, never the library"
            results.append(FixResult(rule, kind.name, kind.safety, PLACED, out.what, out.note, edits=out.edits, **promised))
        elif isinstance(out, Done):
            results.append(FixResult(rule, kind.name, kind.safety, DONE, out.what, **promised))
        elif isinstance(out, Setting):
            results.append(FixResult(rule, kind.name, kind.safety, SETTING, f"{out.library}: {out.setting}", out.note, **promised))
        else:
            assert isinstance(out, Skipped)
            results.append(FixResult(rule, kind.name, kind.safety, SKIPPED, out.reason, **promised))
    return Plan(script, results)
