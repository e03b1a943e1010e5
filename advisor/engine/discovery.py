"""Finding the rules: the shipped ones (through the package, so a wheel has them), a user's
`--rules DIR`, and the selection `--select`/`--ignore` leaves."""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Iterable

from advisor.engine.contract import _LOADED, SCOPES, Rule
from advisor.errors import InputError
from advisor.files_read import remember


def _rule_from_module(mod: ModuleType, source: str) -> Rule:
    missing = [a for a in ("ID", "TITLE", "check") if not hasattr(mod, a)]
    if missing:
        raise InputError(getattr(mod, "__file__", mod.__name__), f"not a rule: missing {', '.join(missing)}")
    scope = getattr(mod, "SCOPE", "rank")
    if scope not in SCOPES:
        raise InputError(getattr(mod, "__file__", mod.__name__), f"SCOPE must be one of {', '.join(SCOPES)}, not {scope!r}")
    group = getattr(mod, "GROUP", "")
    if not isinstance(group, str) or not re.fullmatch(r"[a-z0-9][a-z0-9-]*|", group.strip().lower()):
        raise InputError(getattr(mod, "__file__", mod.__name__), f"GROUP must be a group name (letters, digits, dashes), not {group!r}")
    rule = Rule(
        id=mod.ID,
        title=mod.TITLE,
        doc=(mod.__doc__ or "").strip(),
        docs_url=getattr(mod, "DOCS", ""),
        defaults=dict(getattr(mod, "DEFAULTS", {})),
        module=mod,
        source=source,
        training_only=bool(getattr(mod, "TRAINING_ONLY", False)),
        scope=scope,
        group=group.strip().lower(),
    )
    _LOADED[rule.id] = rule
    return rule


def builtin_rules() -> list[Rule]:
    """The rules that ship with the package (found through the package, so a wheel has them)."""
    import advisor.rules as pkg

    rules = []
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        rules.append(_rule_from_module(importlib.import_module(f"advisor.rules.{info.name}"), "builtin"))
    return rules


def user_rules(folder: str | Path) -> list[Rule]:
    folder = Path(folder)
    if not folder.is_dir():
        raise InputError(folder, "rules folder not found")
    rules = []
    for path in sorted(folder.glob("*.py")):
        if path.name.startswith("_"):
            continue
        remember(path)  # an input like any other file read: never an output
        name = f"advisor_user_rules.{path.stem}"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise InputError(path, "cannot load rule file")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        try:
            spec.loader.exec_module(mod)
        except Exception as exc:  # a user's rule file is user input
            raise InputError(path, f"rule file failed to load: {type(exc).__name__}: {exc}") from None
        rules.append(_rule_from_module(mod, str(folder)))
    return rules


def all_rules(extra_dir: str | Path | None = None) -> list[Rule]:
    rules = builtin_rules()
    if extra_dir is not None:
        rules += user_rules(extra_dir)
    seen: dict[str, Rule] = {}
    for r in rules:
        if r.id in seen:
            raise InputError(r.module.__file__, f"rule id {r.id!r} is already defined by {seen[r.id].module.__file__}")
        seen[r.id] = r
    return rules


def find_rule(rule_id: str, extra_dir: str | Path | None = None) -> Rule:
    for r in all_rules(extra_dir):
        if r.id == rule_id:
            return r
    from advisor.errors import did_you_mean

    ids = [r.id for r in all_rules(extra_dir)]
    raise InputError(None, f"unknown rule {rule_id!r}{did_you_mean(rule_id, ids)}; `advisor rules` lists them")


def select_rules(rules: list[Rule], select: Iterable[str] = (), ignore: Iterable[str] = ()) -> list[Rule]:
    """The rules `select` and `ignore` leave: ids, groups and prefixes (advisor/rule_selection.py)."""
    from advisor.rule_selection import resolve

    return resolve(rules, select, ignore)
