"""Switches of torch.backends set once, after the imports: `cudnn.benchmark` (cudnn-benchmark,
safe: the same convolutions, the fastest algorithm found once) and TF32 matmuls and
convolutions (tf32-disabled, unsafe: a 10-bit mantissa inside the products).

An assignment the script already has is changed where it is (`benchmark = False` becomes
True); a missing one goes after the last import, so it runs before any model is built.
"""

from __future__ import annotations

import libcst as cst

from advisor.fix.base import SAFE, UNSAFE, Done, Outcome, Placed, Skipped, literal, register
from advisor.fix.libraries import library_of
from advisor.fix.source import Edits, Script, dotted


def _assignments_to(script: Script, target: str) -> list[cst.Assign]:
    return [a for a in script.nodes(cst.Assign) if any(dotted(t.target) == target for t in a.targets)]


def set_flags(script: Script, flags: list[str], what: str) -> Outcome:
    """`flag = True` for each dotted flag: existing assignments changed, missing ones added."""
    edits = Edits()
    missing: list[str] = []
    for flag in flags:
        found = _assignments_to(script, flag)
        for a in found:
            if literal(a.value) is not True:
                edits.values[a] = "True"
        if not found:
            missing.append(flag)
    if missing:
        if not script.imports_torch_as_torch():
            return Skipped("the script does not `import torch`: the switch has nowhere safe to go")
        anchor = script.last_import()
        if anchor is None:
            return Skipped("no import lines at the top of the script to put the switch after")
        edits.insert_after(anchor, [f"{flag} = True" for flag in missing])
    if edits.empty:
        return Done(f"the script already sets {what}")
    return Placed(edits, f"{what} after the imports" if missing else f"{what} where the script sets it")


@register("cudnn-benchmark", "torch.backends.cudnn.benchmark = True", SAFE)
def fix_cudnn(script: Script, finding: dict) -> Outcome:
    return set_flags(script, ["torch.backends.cudnn.benchmark"], "torch.backends.cudnn.benchmark = True")


@register("tf32-disabled", "TF32 matmuls and convolutions", UNSAFE)
def fix_tf32(script: Script, finding: dict) -> Outcome:
    lib = library_of(script)
    if lib is not None and lib.name == "transformers":  # the Trainer sets the switches from its arguments
        return lib.setting("tf32-disabled", finding)
    precision = [c for c in script.calls(name="torch.set_float32_matmul_precision")]
    if any(c.args and literal(c.args[0].value) in ("high", "medium") for c in precision):
        flags = ["torch.backends.cudnn.allow_tf32"]  # matmuls already allowed
    else:
        flags = ["torch.backends.cuda.matmul.allow_tf32", "torch.backends.cudnn.allow_tf32"]
    if precision and any(c.args and literal(c.args[0].value) == "highest" for c in precision):
        return Skipped("the script asks for torch.set_float32_matmul_precision('highest') on purpose: change it by hand if TF32 is acceptable")
    out = set_flags(script, flags, "TF32 on (torch.backends.cuda.matmul.allow_tf32 / cudnn.allow_tf32 = True)")
    if isinstance(out, Placed):
        out.note = "TF32 rounds the inputs of matmuls and convolutions to 10 mantissa bits: check the loss curve"
    return out
