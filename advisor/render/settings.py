"""`advisor report PATH --show-settings`: the configuration a report would run with, resolved.

Printed as TOML, the way it would be written in `[tool.advisor]`: where it came from, the
selectors and the rules they leave (groups and prefixes expanded), and every option of each
rule that runs, with the configuration's values over the rule's defaults (a comment marks
which is which).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return orjson.dumps(str(v)).decode()  # a basic TOML string: JSON's escapes are TOML's


def settings_text(config: Any, select: list[str], ignore: list[str], rules_dir: Path | None, scheduler: str | None) -> str:
    from advisor.config import check_rule_options
    from advisor.engine import all_rules, select_rules

    rules = all_rules(rules_dir)
    if config.rule_options:
        config = check_rule_options(config, rules)
    chosen = select_rules(rules, select=select or config.select, ignore=[*ignore, *config.ignore])
    lines = [
        f"# config file: {config.path if config.path else 'none found (defaults)'}",
        "# command line: " + (" ".join([*(f"--select {s}" for s in select), *(f"--ignore {s}" for s in ignore)]) or "no --select/--ignore"),
        "[tool.advisor]",
        f"select = {_toml_value(select or config.select)}",
        f"ignore = {_toml_value([*ignore, *config.ignore])}",
        f"scheduler = {_toml_value(scheduler or config.scheduler or '')}  # empty: a local process pool",
        f"# ADVISOR_CACHE = {_toml_value(os.environ.get('ADVISOR_CACHE', 'on'))}",
        f"# rules that run ({len(chosen)} of {len(rules)}): " + ", ".join(r.id for r in chosen),
    ]
    for r in chosen:
        given = config.rule_options.get(r.id, {})
        lines.append("")
        lines.append(f"[tool.advisor.rules.{r.id}]  # group: {r.group or 'none'}, source: {r.source}")
        if not r.defaults:
            lines.append("# no options")
        for name, default in r.defaults.items():
            value = given.get(name, default)
            lines.append(f"{name} = {_toml_value(value)}  # " + ("from the config file" if name in given else "default"))
    return "\n".join(lines) + "\n"
