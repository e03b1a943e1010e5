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
from advisor.errors import InputError
from advisor.fix.source import Edits, Script, compile_error, recorded_frames

__all__ = ["FIXES", "SAFE", "UNSAFE", "FixResult", "Plan", "baseline_step_ms", "plan_fixes", "promise"]

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
    promised_share: float | None = None
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
            "promised_share": self.promised_share,
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

    def fixed_bytes(self, rules: list[str] | None = None) -> bytes:
        """The fixed script as the file's bytes (its line endings and byte order mark kept),
        checked to compile: InputError, naming the script, where it would not."""
        data = self.script.encode(self.fixed_text(rules))
        why = compile_error(data, self.script.path)
        if why is not None:
            before = compile_error(self.script.encode(self.script.text), self.script.path)
            if before is not None:
                raise InputError(self.script.path, f"does not compile as Python ({before}); nothing is written")
            raise InputError(self.script.path, f"the fixed script would not compile ({why}); nothing is written: please report this script's shape")
        return data

    @property
    def changed(self) -> bool:
        return self.fixed_text() != self.script.text

    def diff(self, rules: list[str] | None = None) -> str:
        name = self.script.path.as_posix()
        after = self.fixed_text(rules)
        return "".join(
            difflib.unified_diff(self.script.text.splitlines(keepends=True), after.splitlines(keepends=True), fromfile=name, tofile=name)
        )


def promise(finding: dict, step_ms: float | None = None) -> tuple[float | None, float | None]:
    """(ms, share of the step) one finding's fix promises applied alone: its `saving_alone_ms`
    where the replay set one, else its `saving_ms` (its ranked saving counts the fixes above
    it as done). The share is against `step_ms` (the replay's baseline step), else scaled from
    the finding's own ranked share."""
    ms, pct, alone = finding.get("saving_ms"), finding.get("saving_share", finding.get("saving_pct")), finding.get("saving_alone_ms")
    if not isinstance(alone, (int, float)):
        return ms, pct
    if step_ms:
        return alone, alone / step_ms
    if isinstance(ms, (int, float)) and ms > 0 and isinstance(pct, (int, float)):
        return alone, pct * alone / ms
    return alone, None


def baseline_step_ms(report: dict) -> float | None:
    """The step a report's savings are shares of (its what-if replay's baseline), if any."""
    whatif = report.get("whatif")
    value = whatif.get("baseline_ms") if isinstance(whatif, dict) else None
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def plan_fixes(
    path: Path,
    findings: list[dict],
    select: list[str] | None = None,
    unsafe: bool = False,
    script: Script | None = None,
    considered: list[dict] | None = None,
    step_ms: float | None = None,
) -> Plan:
    """Each finding (report JSON dicts, ranked) mapped to its fix on the script at `path`.

    `considered` are the report's findings whose fix gains nothing on the run: their fixes are
    planned only when `select` names them, and the result says that the run gains nothing."""
    script = script or Script.read(path)
    results: list[FixResult] = []
    seen: set[str] = set()
    asked = [f for f in considered or [] if select and str(f.get("rule")) in select]
    for finding in [*findings, *asked]:
        before = len(results)
        rule = str(finding.get("rule"))
        if (select and rule not in select) or rule in seen:
            continue
        seen.add(rule)
        ms, pct = promise(finding, step_ms)
        promised = dict(promised_ms=ms, promised_share=pct)
        kind = FIXES.get(rule)
        if kind is None:
            fix_text = str((finding.get("fix") or {}).get("text") or "")
            results.append(FixResult(rule, "", "", NO_FIX, "the advisor writes no code for this rule" + (f"; the finding says: {fix_text}" if fix_text else ""), **promised))
        elif kind.safety == UNSAFE and not unsafe:
            results.append(FixResult(rule, kind.name, kind.safety, UNSAFE_OFF, "changes the numerics: written only with --unsafe-fixes", **promised))
        else:
            results.append(_result(script, finding, rule, kind, promised))
        if finding.get("no_gain") is not None:
            for r in results[before:]:
                r.note = _with_no_gain(r.note, str(finding["no_gain"]))
    return Plan(script, results)


def _result(script: Script, finding: dict, rule: str, kind, promised: dict) -> FixResult:
    """The outcome of the rule's fixer on the script, as a result."""
    out = kind.fixer(script, finding)
    if isinstance(out, Placed):
        frames = [f for f, _ in recorded_frames(finding)]
        if frames and not script.frames(finding, enclosing=True) and not out.note:
            out.note = f"the finding's line is {frames[0].split(': ')[0]}, not in this script: the script's own code that drives it is edited, never the library"
        return FixResult(rule, kind.name, kind.safety, PLACED, out.what, out.note, edits=out.edits, **promised)
    if isinstance(out, Done):
        return FixResult(rule, kind.name, kind.safety, DONE, out.what, **promised)
    if isinstance(out, Setting):
        return FixResult(rule, kind.name, kind.safety, SETTING, f"{out.library}: {out.setting}", out.note, **promised)
    assert isinstance(out, Skipped)
    return FixResult(rule, kind.name, kind.safety, SKIPPED, out.reason, **promised)


def _with_no_gain(note: str, no_gain: str) -> str:
    """A result's note, led by the finding's reason when its fix gains nothing on the run."""
    said = f"gains nothing on this run: {no_gain}" if no_gain else "gains nothing on this run"
    return f"{said}; {note}" if note else said
