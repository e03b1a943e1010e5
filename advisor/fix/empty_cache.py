"""`torch.cuda.empty_cache()` out of the training loop (empty-cache). Safe: the caching
allocator hands the same memory back without asking the driver for it again.

The call is removed where it is a statement of its own inside a `for`/`while` loop, or at the
line the finding names (a Lightning `training_step` is a loop body the library runs). A call
outside any loop (once, before training) is left alone: it costs nothing per step.
"""

from __future__ import annotations

import libcst as cst

from advisor.fix.base import SAFE, Done, Outcome, Placed, Skipped, register
from advisor.fix.libraries import library_of
from advisor.fix.source import Edits, Script


@register("empty-cache", "no torch.cuda.empty_cache() inside the loop", SAFE)
def fix_empty_cache(script: Script, finding: dict) -> Outcome:
    calls = script.calls(name="torch.cuda.empty_cache")
    if not calls:
        lib = library_of(script)
        if lib is not None:
            return lib.setting("empty-cache", finding)
        return Done("no torch.cuda.empty_cache() call in the script")
    lines = set(script.frames(finding))
    edits = Edits()
    for call in calls:
        stmt = script.statement_of(call)
        in_step = script.in_loop(call) or bool(lines & set(script.lines(stmt)))
        if not in_step:
            continue
        alone = isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Expr) and stmt.body[0].value is call
        if not alone:
            return Skipped(f"torch.cuda.empty_cache() at line {script.line(call)} is part of a larger statement: remove it by hand")
        edits.remove.add(stmt)
    if edits.empty:
        return Done("no torch.cuda.empty_cache() inside the training loop")
    where = ", ".join(str(script.line(s)) for s in edits.remove)
    return Placed(edits, f"removed torch.cuda.empty_cache() from the loop (line {where})")
