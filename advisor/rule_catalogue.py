"""The shipped rules as `advisor rules` and `advisor explain` show them, read from the rule
files' text without running them.

A rule file imports the measurements it checks with (numpy, pandas, the metrics), which takes
longer than listing the rules should. What the catalogue shows is declared at the top of each
file as plain values (ID, TITLE, GROUP, DOCS, DEFAULTS, TRAINING_ONLY, SCOPE, TESTED_ON and the
module's docstring), so it is read from the file's syntax tree. A file whose page is not plain
values (a docstring made by a function, an option computed from another module) is imported
as the engine imports it; so is every rule of a `--rules` folder (advisor.engine).
"""

from __future__ import annotations

import ast
import importlib.util
import operator
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# What a page needs from a rule file, with the engine's defaults (advisor.engine.discovery).
DECLARED = {"ID": None, "TITLE": None, "GROUP": "", "DOCS": "", "DEFAULTS": {}, "TRAINING_ONLY": False, "SCOPE": "rank", "TESTED_ON": ()}
_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv, ast.LShift: operator.lshift, ast.Pow: operator.pow}


class NotPlain(Exception):
    """A rule file whose page is not plain values: it is imported instead."""


@dataclass(frozen=True)
class RulePage:
    """What `advisor rules` lists and `advisor explain` prints of one rule (the attributes of
    advisor.engine.Rule they read; `module` holds TESTED_ON, as a rule's module does)."""

    id: str
    title: str
    doc: str | None  # None: the module makes its page when it runs (rule_page imports it)
    docs_url: str
    defaults: dict[str, Any]
    source: str
    training_only: bool
    scope: str
    group: str
    module: Any = field(default=None, compare=False)


def _value(node: ast.expr) -> Any:
    """A plain value: a literal, or numbers joined by + - * / << ** (`1 << 20`)."""
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _value(node.left), _value(node.right)
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (left, right)):
            raise NotPlain()
        return _OPERATORS[type(node.op)](left, right)
    if isinstance(node, ast.Dict):
        return {_value(k): _value(v) for k, v in zip(node.keys, node.values, strict=True) if k is not None}
    if isinstance(node, (ast.Tuple, ast.List)):
        values = [_value(v) for v in node.elts]
        return tuple(values) if isinstance(node, ast.Tuple) else values
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise NotPlain() from None


def page_of_file(path: Path) -> RulePage:
    """A shipped rule's page from its file's text; NotPlain when it is not declared as plain values."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    declared = dict(DECLARED)
    defines_check = False
    doc_made = False
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "check":
            defines_check = True
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) and node.value is not None else []
        for target in targets:
            name = target.id if isinstance(target, ast.Name) else None
            if name == "check":
                raise NotPlain()  # a check made when the module runs
            doc_made = doc_made or name == "__doc__"  # `__doc__ = with_precision_page(__doc__)`
            if name in declared:
                declared[name] = _value(node.value)  # type: ignore[union-attr,arg-type]
    if not defines_check or not isinstance(declared["ID"], str) or not isinstance(declared["TITLE"], str):
        raise NotPlain()
    if not isinstance(declared["GROUP"], str) or not isinstance(declared["DEFAULTS"], dict):
        raise NotPlain()
    return RulePage(
        id=declared["ID"],
        title=declared["TITLE"],
        doc=None if doc_made else (ast.get_docstring(tree, clean=False) or "").strip(),
        docs_url=declared["DOCS"],
        defaults=dict(declared["DEFAULTS"]),
        source="builtin",
        training_only=bool(declared["TRAINING_ONLY"]),
        scope=declared["SCOPE"],
        group=declared["GROUP"].strip().lower(),
        module=types.SimpleNamespace(TESTED_ON=tuple(declared["TESTED_ON"] or ()), __file__=str(path)),
    )


def page_of_rule(rule: Any) -> RulePage:
    """The page of a rule the engine imported (advisor.engine.Rule)."""
    return RulePage(rule.id, rule.title, rule.doc, rule.docs_url, dict(rule.defaults), rule.source, rule.training_only, rule.scope, rule.group, rule.module)


def _shipped_files() -> list[Path]:
    """The shipped rule files, in the engine's order (advisor.rules, found as the engine finds it)."""
    spec = importlib.util.find_spec("advisor.rules")
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    return sorted((p for folder in folders for p in Path(folder).glob("*.py") if not p.name.startswith("_")), key=lambda p: p.stem)


def rule_page(rule_id: str, rules_dir: str | Path | None = None) -> RulePage:
    """One rule's page, whole (its module imported when it makes its page itself); an
    InputError naming the closest id when there is no such rule."""
    pages = rule_pages(rules_dir)
    page = next((p for p in pages if p.id == rule_id), None)
    if page is None:
        from advisor.errors import InputError, did_you_mean

        raise InputError(None, f"unknown rule {rule_id!r}{did_you_mean(rule_id, [p.id for p in pages])}; `advisor rules` lists them")
    if page.doc is None:
        from advisor.engine import find_rule

        return page_of_rule(find_rule(rule_id, rules_dir))
    return page


def rule_pages(rules_dir: str | Path | None = None) -> list[RulePage]:
    """Every rule's page, in the engine's order: the shipped rules read from their files, those
    of a `--rules` folder (or a shipped file that is not plain values) as the engine loads them."""
    if rules_dir is not None:
        from advisor.engine import all_rules

        return [page_of_rule(r) for r in all_rules(rules_dir)]
    pages = []
    for path in _shipped_files():
        try:
            pages.append(page_of_file(path))
        except (NotPlain, SyntaxError, OSError, UnicodeDecodeError):
            from advisor.engine import all_rules

            return [page_of_rule(r) for r in all_rules()]  # the engine's own account, whole
    return pages
