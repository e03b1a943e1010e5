"""The project's stages depend one way: read from the source of every module, not assumed.

rules/ holds rule pages only; measurements live in advisor/metrics/ (which never import a
rule or the engine), the what-if stage below the rules, and no stage imports the commands in
advisor/cli/.
"""

from __future__ import annotations

import ast
from pathlib import Path

from advisor.engine import builtin_rules

REPO = Path(__file__).resolve().parents[1]
STAGES = ["capture", "load", "metrics", "whatif", "render", "gate"]


def imported_modules(path: Path) -> set[str]:
    """Every advisor module a source file imports, at the top or inside a function."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return {m for m in out if m == "advisor" or m.startswith("advisor.")}


def imports_of(folder: str) -> dict[str, set[str]]:
    return {str(p.relative_to(REPO)): imported_modules(p) for p in sorted((REPO / folder).rglob("*.py"))}


def hits(imports: dict[str, set[str]], prefix: str) -> list[str]:
    return sorted(f"{f}: {m}" for f, ms in imports.items() for m in ms if m == prefix or m.startswith(prefix + "."))


def test_no_stage_imports_the_commands():
    for stage in STAGES:
        assert hits(imports_of(f"advisor/{stage}"), "advisor.cli") == [], stage


def test_measurements_and_the_replay_import_no_rule_and_no_engine():
    for stage in ("load", "metrics", "whatif"):
        found = imports_of(f"advisor/{stage}")
        assert hits(found, "advisor.rules") == [], stage
        assert hits(found, "advisor.engine") == [] and hits(found, "advisor.analysis") == [], stage


def test_rules_folder_holds_rule_pages_only():
    files = sorted(p.stem for p in (REPO / "rules").glob("*.py") if p.name != "__init__.py")
    rules = {r.module.__name__.rsplit(".", 1)[1] for r in builtin_rules()}
    assert files and set(files) == rules  # no helper module beside the rules
    # and no rule imports another rule: what two rules share is a measurement in advisor/metrics
    assert hits(imports_of("rules"), "advisor.rules") == []
