"""Changes to the model object, written right after the line that builds or moves it (the
last `model = ...` before the optimizer takes `model.parameters()`): `torch.compile(model)`
(unfused-elementwise; unsafe: generated kernels, other rounding, minutes of compiling) and
channels-last memory (channels-last; unsafe: convolutions pick other algorithms).
"""

from __future__ import annotations

import libcst as cst

from advisor.fix.base import UNSAFE, Done, Outcome, Placed, Skipped, register
from advisor.fix.libraries import library_of
from advisor.fix.optimizer import optimizer_calls
from advisor.fix.source import Edits, Script, dotted


def model_anchor(script: Script, rule: str, finding: dict) -> tuple[str, cst.CSTNode] | Outcome:
    """The model's name and the statement after which to change it."""
    optimizers = optimizer_calls(script)
    names = set()
    for call in optimizers:
        if call.args:
            arg = call.args[0].value
            if isinstance(arg, cst.Call) and isinstance(arg.func, cst.Attribute) and arg.func.attr.value == "parameters":
                base = dotted(arg.func.value)
                if base is not None:
                    names.add((base, call))
    if not names:
        lib = library_of(script)
        if lib is not None:
            return lib.setting(rule, finding)
        return Skipped("no optimizer built from model.parameters() in the script: the model object is not found")
    if len({n for n, _ in names}) > 1:
        return Skipped("several models feed optimizers (" + ", ".join(sorted({n for n, _ in names})) + "): the fix does not guess which one")
    name, optimizer = next(iter(names))
    if "." in name or name == "self":
        lib = library_of(script)
        if lib is not None:
            return lib.setting(rule, finding)
        return Skipped(f"the optimizer takes {name}.parameters(): an attribute, not a model variable the fix can rebind")
    opt_line = script.line(optimizer)
    block = script.parent(script.statement_of(optimizer))
    before = [a for a in script.assignments(name) if script.line(a) < opt_line and script.parent(script.statement_of(a)) is block]
    if not before:
        return Skipped(f"no `{name} = ...` before the optimizer: the fix has nowhere safe to change the model")
    return name, script.statement_of(before[-1])


def _mentions(script: Script, text: str) -> bool:
    return text in script.text


def _after_the_model(script: Script, rule: str, finding: dict, already: Outcome | None, line: str, what: str, note: str) -> Outcome:
    """Insert `line` (NAME standing for the model's name) after the model is built, unless the
    script already does it (`already`)."""
    anchor = model_anchor(script, rule, finding)
    if not isinstance(anchor, tuple):
        return anchor
    if already is not None:
        return already
    name, stmt = anchor
    edits = Edits()
    edits.insert_after(stmt, [line.replace("NAME", name)])
    return Placed(edits, f"{what.replace('NAME', name)} after line {script.line(stmt)}", note)


@register("unfused-elementwise", "torch.compile(model)", UNSAFE)
def fix_compile(script: Script, finding: dict) -> Outcome:
    already = None
    compiles = script.calls(name="torch.compile")
    if compiles:
        conditional = [c for c in compiles if any(isinstance(a, cst.If) for a in script.ancestors(c))]
        if len(conditional) == len(compiles):
            already = Skipped(f"the script compiles the model under a condition (line {script.line(compiles[0])}): switch it on there")
        else:
            already = Done("the script already calls torch.compile")
    return _after_the_model(
        script, "unfused-elementwise", finding, already, "NAME = torch.compile(NAME)", "NAME = torch.compile(NAME)",
        "compiling takes a while on the first steps; numerics differ at rounding level",
    )


@register("channels-last", "channels-last memory format for the model", UNSAFE)
def fix_channels_last(script: Script, finding: dict) -> Outcome:
    already = Done("the script already uses torch.channels_last") if _mentions(script, "torch.channels_last") else None
    return _after_the_model(
        script, "channels-last", finding, already, "NAME = NAME.to(memory_format=torch.channels_last)", "NAME.to(memory_format=torch.channels_last)",
        "inputs follow the weights' layout inside the first convolution; x.to(memory_format=torch.channels_last) saves that conversion too",
    )
