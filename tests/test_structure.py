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


def test_rules_read_the_trace_only_through_the_typed_view():
    # A rule sees a rank through its metrics and `ctx.events` (advisor/metrics/events.py):
    # never the loader's frames, never the loader itself.
    reads = []
    for path in sorted((REPO / "rules").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr == "frames":
                reads.append(f"{path.name}:{node.lineno}")
    assert reads == []
    assert hits(imports_of("rules"), "advisor.load") == []


def test_the_view_holds_every_documented_column_of_real_traces():
    from conftest import SAMPLE_RUNS, shared, single_file

    from advisor.analysis import analyze
    from advisor.metrics.events import COLUMNS, RankEvents, rank_events

    for run in (shared("whatif/h100_vit/baseline"), SAMPLE_RUNS / "resnet18_cifar" / "runs" / "cpu_baseline", single_file(shared("traces/v100_resnet50_nw0"))):
        m = analyze(run).with_primary_frames().primary
        events = rank_events(m)
        assert isinstance(events, RankEvents)
        for table, columns in COLUMNS.items():
            assert set(getattr(events, table).columns) == set(columns), (run, table)
        assert not hasattr(events, "path") and not hasattr(events, "metadata")
        # the same rows as the loader's, so a fix names the rows its rule detected
        assert events.device is m.frames.device and events.host is m.frames.host


def module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def test_no_import_cycle_in_advisor():
    """The graph of advisor/'s imports (at the top or inside a function) has no cycle: each
    module can be read knowing only what it imports."""
    modules = {module_name(p): p for p in (REPO / "advisor").rglob("*.py")}
    graph = {m: {d for d in imported_modules(p) if d in modules and d != m} for m, p in modules.items()}
    # depth-first search for a back edge
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                cycles.append(path[path.index(d):] + [d] if d in path else [m, d])
            elif d not in state:
                visit(d, path + [d])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert cycles == [], cycles


def test_one_cache_module_and_one_facts_schema():
    """Frames and analyses are cached by advisor/cache.py alone; the facts file's name and
    types live in advisor/facts.py, which the capture (writer) and the analysis (reader) import."""
    assert not (REPO / "advisor" / "load" / "cache.py").exists() and not (REPO / "advisor" / "analysis_cache.py").exists()
    assert "advisor.facts" in imported_modules(REPO / "advisor" / "capture" / "facts.py")
    assert "advisor.facts" in imported_modules(REPO / "advisor" / "analysis.py")
    for p in (REPO / "advisor").rglob("*.py"):
        assert "advisor_facts(?:" not in p.read_text(encoding="utf-8") or p.name == "facts.py", p


def test_loading_reads_no_cache_and_the_configuration_no_gate():
    # Data goes one way: loading is below the cache (which reads frames through it), the
    # configuration below the gate (whose table it checks through advisor.gate_table).
    assert hits(imports_of("advisor/load"), "advisor.cache") == []
    config = {"advisor/config.py": imported_modules(REPO / "advisor" / "config.py")}
    assert hits(config, "advisor.gate") == []
    # and what the renderers draw is made with the analysis: no renderer loads a trace
    render = imports_of("advisor/render")
    assert hits(render, "advisor.cache") == [] and hits(render, "advisor.load.trace.load_trace") == []
