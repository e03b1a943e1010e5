"""The optimizer's fixes: `zero_grad(set_to_none=True)` (zero-grad-memset) and the multi-tensor
update, `foreach=True` (single-tensor-optimizer). Both safe: the same update, fewer kernels.

`foreach=True` is the change the finding's saving is for; `fused=True` goes further where the
optimizer has it, and the finding says so, but it is left to the user: a fused step needs
every parameter on the GPU in a floating type, which the script's source cannot show.
"""

from __future__ import annotations

import libcst as cst

from advisor.fix.base import SAFE, Done, Outcome, Placed, Skipped, literal, register
from advisor.fix.libraries import library_of
from advisor.fix.source import Edits, Script, dotted, has_star_kwargs, keyword

OPTIMIZERS = {"SGD", "Adam", "AdamW", "Adamax", "Adadelta", "Adagrad", "NAdam", "RAdam", "RMSprop", "Rprop", "ASGD"}


def optimizer_calls(script: Script) -> list[cst.Call]:
    """`torch.optim.AdamW(...)`, `optim.SGD(...)`, or `AdamW(...)` imported from torch.optim."""
    names = script.imported_names()
    out = []
    for call in script.calls(last=OPTIMIZERS):
        full = dotted(call.func) or ""
        head = full.split(".")[0]
        resolved = names.get(head, head) + full[len(head):]
        if resolved.startswith("torch.optim."):
            out.append(call)
    return out


def _at_lines(script: Script, calls: list[cst.Call], finding: dict) -> list[cst.Call]:
    lines = set(script.frames(finding))
    hit = [c for c in calls if lines & set(script.lines(script.statement_of(c)))]
    return hit or calls


@register("zero-grad-memset", "zero_grad(set_to_none=True)", SAFE)
def fix_zero_grad(script: Script, finding: dict) -> Outcome:
    calls = script.calls(method="zero_grad")
    if not calls:
        lib = library_of(script)
        return lib.setting("zero-grad-memset", finding) if lib else Skipped("no zero_grad() call in the script")
    calls = _at_lines(script, calls, finding)
    edits = Edits()
    for call in calls:
        arg = keyword(call, "set_to_none")
        if arg is None and call.args:  # zero_grad(False): the positional set_to_none
            arg = call.args[0]
            if literal(arg.value) is not True:
                return Skipped(f"zero_grad at line {script.line(call)} passes set_to_none by position; write set_to_none=True there")
            continue
        if arg is None or literal(arg.value) is not True:
            edits.set_keywords(call, {"set_to_none": "True"})
    if edits.empty:
        return Done("every zero_grad() call already passes set_to_none=True")
    lines = ", ".join(str(script.line(c)) for c in edits.keywords)
    return Placed(edits, f"set_to_none=True on zero_grad (line{'s' if len(edits.keywords) > 1 else ''} {lines})")


@register("single-tensor-optimizer", "multi-tensor optimizer step (foreach=True)", SAFE)
def fix_foreach(script: Script, finding: dict) -> Outcome:
    calls = optimizer_calls(script)
    if not calls:
        lib = library_of(script)
        return lib.setting("single-tensor-optimizer", finding) if lib else Skipped("no torch.optim optimizer constructed in the script")
    calls = _at_lines(script, calls, finding)
    edits = Edits()
    for call in calls:
        fused, foreach = keyword(call, "fused"), keyword(call, "foreach")
        if (fused is not None and literal(fused.value) is True) or (foreach is not None and literal(foreach.value) is True):
            continue
        if has_star_kwargs(call):
            return Skipped(f"the optimizer at line {script.line(call)} passes **kwargs: foreach may be set there")
        edits.set_keywords(call, {"foreach": "True"})
    if edits.empty:
        return Done("the optimizer already passes foreach=True (or fused=True)")
    lines = ", ".join(str(script.line(c)) for c in edits.keywords)
    return Placed(edits, f"foreach=True on the optimizer (line {lines})", "fused=True goes further where every parameter is a floating tensor on the GPU")
