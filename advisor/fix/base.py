"""What a fix family gives back for one finding: the edits it placed, why it placed none, or
the setting to change in a library's own API.

A fixer is `fixer(script, finding) -> Placed | Skipped | Setting | Done`:

- `Placed`: edits to the script (source.Edits) and one line saying what they do;
- `Done`: the script already does what the finding asks (fixing a fixed script changes nothing);
- `Skipped`: the fix could not be placed safely, and why (never a guess);
- `Setting`: the code the finding is about runs inside a library (a `transformers` Trainer,
  Lightning): the setting of that library's API to change, since its files are not the user's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Union

from advisor.fix.source import Edits, Script

SAFE = "safe"  # the same numerics: only where and when the work happens changes
UNSAFE = "unsafe"  # changes numerics or semantics (precision, batch size, compiled kernels)


@dataclass
class Placed:
    edits: Edits
    what: str
    note: str = ""


@dataclass
class Done:
    what: str


@dataclass
class Skipped:
    reason: str


@dataclass
class Setting:
    library: str
    setting: str
    note: str = ""


Outcome = Union[Placed, Done, Skipped, Setting]
Fixer = Callable[[Script, dict], Outcome]


@dataclass(frozen=True)
class FixKind:
    rule: str
    name: str  # what the fix is, in a few words
    safety: str
    fixer: Fixer
    settings: dict[str, str] = field(default_factory=dict)  # library -> setting template ({n}: the finding's value)


FIXES: dict[str, FixKind] = {}


def register(rule: str, name: str, safety: str, settings: dict[str, str] | None = None) -> Callable[[Fixer], Fixer]:
    def add(fn: Fixer) -> Fixer:
        FIXES[rule] = FixKind(rule, name, safety, fn, settings or {})
        return fn

    return add


def text_of(finding: dict[str, Any]) -> str:
    fix = finding.get("fix") or {}
    return f"{fix.get('text') or ''} {finding.get('message') or ''}"


def number_after(pattern: str, finding: dict[str, Any]) -> int | None:
    """The first integer the finding's fix text (then its message) gives after `pattern`."""
    m = re.search(pattern + r"\s*(\d+)", text_of(finding))
    return int(m.group(1)) if m else None


def literal(node: Any) -> Any:
    """The Python value of a literal True/False/None/int/str node; `...` (Ellipsis) when it is not one."""
    import libcst as cst

    if isinstance(node, cst.Name) and node.value in ("True", "False", "None"):
        return {"True": True, "False": False, "None": None}[node.value]
    if isinstance(node, cst.Integer):
        return int(node.value, 0)
    if isinstance(node, cst.SimpleString):
        return node.evaluated_value
    return ...
