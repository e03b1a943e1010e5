"""A larger batch (spare-gpu-memory). Unsafe: fewer optimizer steps per epoch, and the
learning rate must follow (linear scaling with warm-up), so the fix writes the batch size
only where it is a number in the DataLoader call, and always says what to do with the
learning rate.
"""

from __future__ import annotations

import re

from advisor.fix.base import UNSAFE, Done, Outcome, Placed, Skipped, literal, register
from advisor.fix.loader import DATALOADER_POSITIONAL, loader_argument, training_loader
from advisor.fix.libraries import library_of
from advisor.fix.source import Edits, Script, code_of, has_star_kwargs, star_args_may_pass

LR_NOTE = "scale the learning rate with the batch (x{k}: linear scaling, with warm-up) and check that the run still converges"


def _sizes(finding: dict) -> tuple[int, int] | None:
    text = str((finding.get("fix") or {}).get("text") or "")
    m = re.search(r"batch_size=(\d+)\s*→\s*(\d+)", text)
    return (int(m.group(1)), int(m.group(2))) if m else None


@register("spare-gpu-memory", "a larger batch (with the learning rate scaled)", UNSAFE)
def fix_batch(script: Script, finding: dict) -> Outcome:
    call = training_loader(script, finding)
    sizes = _sizes(finding)
    if sizes is None:  # "a 2x larger batch" of a batch the trace does not record: from what to what is not known
        return Skipped("the finding names no batch size to go to (the run's batch size is not recorded: profile with `advisor profile`)")
    old, new = sizes
    k = new // old if old else 0
    if call is None:
        lib = library_of(script)
        return lib.setting("spare-gpu-memory", finding, new) if lib else Skipped("no DataLoader call in the script to set the batch size on")
    if isinstance(call, Skipped):
        return call
    if star_args_may_pass(call, "batch_size", DATALOADER_POSITIONAL):
        return Skipped(f"the DataLoader call at line {script.line(call)} passes *args: batch_size may be set there")
    arg = loader_argument(call, "batch_size")
    if arg is None and has_star_kwargs(call):
        return Skipped(f"the DataLoader call at line {script.line(call)} passes **kwargs: batch_size may be set there")
    value = literal(arg.value) if arg is not None else 1
    if value == new:
        return Done(f"the DataLoader at line {script.line(call)} already has batch_size={new}")
    if value != old:
        shown = code_of(arg.value) if arg is not None else "(default 1)"
        return Skipped(f"batch_size is {shown} at line {script.line(call)}, not the {old} the run used: run with batch size {new} and " + LR_NOTE.format(k=k))
    edits = Edits()
    edits.set_keywords(call, {"batch_size": str(new)}, DATALOADER_POSITIONAL)
    return Placed(edits, f"batch_size={old} → {new} on the DataLoader at line {script.line(call)}", LR_NOTE.format(k=k))
