"""bf16 autocast around the forward pass and the loss (tensor-cores-unused). Unsafe: the
matmuls and convolutions run in bfloat16 (8 mantissa bits); bf16 has fp32's range, so no
GradScaler is needed.

Where: in the loop that calls `loss.backward()`, the statements from the first assignment
after the batch is moved to the device (or the loop's first statement) up to the one that
assigns `loss`, all simple assignments in the same block. An autocast block already there
(perhaps switched off by a flag) is the user's: the fix says so and leaves it.
"""

from __future__ import annotations

import libcst as cst

from advisor.fix.base import UNSAFE, Done, Outcome, Placed, Skipped, literal, register
from advisor.fix.libraries import library_of
from advisor.fix.source import Edits, Script, dotted

AUTOCAST = {"torch.autocast", "autocast", "torch.cuda.amp.autocast", "torch.amp.autocast"}


def _backward_calls(script: Script) -> list[cst.Call]:
    return [c for c in script.calls(method="backward") if script.in_loop(c)]


def _loss_name(call: cst.Call) -> str | None:
    """`loss` in `loss.backward()` and `scaler.scale(loss).backward()`."""
    receiver = call.func.value if isinstance(call.func, cst.Attribute) else None
    if isinstance(receiver, cst.Name):
        return receiver.value
    if isinstance(receiver, cst.Call) and receiver.args and isinstance(receiver.args[0].value, cst.Name):
        return receiver.args[0].value.value
    return None


def _assigns(stmt: cst.CSTNode) -> set[str]:
    if not isinstance(stmt, cst.SimpleStatementLine):
        return set()
    out = set()
    for s in stmt.body:
        if isinstance(s, cst.Assign):
            for t in s.targets:
                if isinstance(t.target, cst.Name):
                    out.add(t.target.value)
                elif isinstance(t.target, cst.Tuple):
                    out.update(e.value.value for e in t.target.elements if isinstance(e.value, cst.Name))
    return out


def _plain(stmt: cst.CSTNode, script: Script) -> bool:
    """A line of assignments that moves nothing to the device and zeroes nothing."""
    if not isinstance(stmt, cst.SimpleStatementLine) or not all(isinstance(s, (cst.Assign, cst.AnnAssign)) for s in stmt.body):
        return False
    code = script.module.code_for_node(stmt)
    return ".to(" not in code and ".cuda(" not in code and "zero_grad" not in code


@register("tensor-cores-unused", "bf16 autocast around the forward pass and the loss", UNSAFE)
def fix_autocast(script: Script, finding: dict) -> Outcome:
    existing = [w for w in script.nodes(cst.With) if any(isinstance(i.item, cst.Call) and dotted(i.item.func) in AUTOCAST for i in w.items)]
    for w in existing:
        call = next(i.item for i in w.items if isinstance(i.item, cst.Call))
        enabled = next((a for a in call.args if a.keyword is not None and a.keyword.value == "enabled"), None)
        if enabled is not None and literal(enabled.value) is not True:
            return Skipped(f"the script has an autocast block at line {script.line(w)} switched by `enabled={script.module.code_for_node(enabled.value)}`: turn it on there")
    if existing:
        return Done(f"the forward pass already runs under autocast (line {script.line(existing[0])})")
    backwards = _backward_calls(script)
    if not backwards:
        lib = library_of(script)
        return lib.setting("tensor-cores-unused", finding) if lib else Skipped("no loss.backward() inside a loop in the script")
    if len(backwards) > 1:
        return Skipped("several backward() calls in loops: the fix does not guess which forward pass to wrap")
    call = backwards[0]
    loss = _loss_name(call)
    stmt = script.statement_of(call)
    block = script.parent(stmt)
    if loss is None or not isinstance(block, cst.IndentedBlock):
        return Skipped(f"the backward call at line {script.line(call)} is not `loss.backward()` in a loop's block")
    body = list(block.body)
    at = body.index(stmt)
    last = next((i for i in range(at - 1, -1, -1) if loss in _assigns(body[i])), None)
    if last is None:
        return Skipped(f"`{loss}` is not assigned in the same block before line {script.line(call)}")
    first = last
    while first - 1 >= 0 and _plain(body[first - 1], script):
        first -= 1
    if not script.imports_torch_as_torch():
        return Skipped("the script does not `import torch`")
    edits = Edits()
    edits.wrap[body[first]] = (body[last], 'with torch.autocast("cuda", dtype=torch.bfloat16)')
    return Placed(
        edits,
        f"lines {script.line(body[first])}-{script.lines(body[last])[-1]} under torch.autocast(\"cuda\", dtype=torch.bfloat16)",
        "bf16 keeps fp32's range (no GradScaler); check the loss curve against an fp32 run",
    )
