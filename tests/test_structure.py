"""The project's stages depend one way: read from the source of every module, not assumed.

The layers are the import-linter contract in pyproject.toml (`.ci/run` runs lint-imports);
this file reads the same contract and checks it with its own reading of the imports, which
also sees imports inside functions and rules/ under its shipped name advisor.rules.
rules/ holds rule pages only; measurements live in advisor/metrics/ (which never import a
rule or the engine), the what-if stage below the rules, and no stage imports the commands in
advisor/cli/.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

from advisor.engine import builtin_rules

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
STAGES = ["capture", "load", "metrics", "whatif", "render", "gate"]  # bottom up, as in the contract


def layers_contract() -> tuple[list[list[str]], set[tuple[str, str]]]:
    """The layers (top first, each a list of sibling modules) and the imports it lets pass."""
    doc = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    [contract] = [c for c in doc["tool"]["importlinter"]["contracts"] if c["type"] == "layers"]
    layers = [[m.strip() for m in re.split(r"[|:]", layer)] for layer in contract["layers"]]
    ignored = {tuple(part.strip() for part in line.split("->")) for line in contract.get("ignore_imports", [])}
    return layers, ignored  # type: ignore[return-value]


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


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def test_every_import_follows_the_layers_of_the_contract():
    """No module imports one of a higher layer (pyproject.toml's [tool.importlinter] layers),
    imports inside functions included; every module of advisor/ and rules/ is in a layer."""
    layers, ignored = layers_contract()
    # (an import of the bare package is the engine's of advisor.rules, which this reader sees by name)
    ignored = {(a, b) for a, b in ignored if b != "advisor"}
    assert [["advisor.cli", "advisor.api", "advisor.schemas"]] == layers[:1], "the commands are on top"
    # STAGES, first to last, are the contract's layers from the bottom up, one layer each
    index = {m.removeprefix("advisor."): i for i, layer in enumerate(layers) for m in layer}
    order = [index[s] for s in STAGES]
    assert order == sorted(set(order), reverse=True), order

    def layer_of(module: str) -> int | None:
        module = "rules" + module[len("advisor.rules") :] if _within(module, "advisor.rules") else module
        return next((i for i, layer in enumerate(layers) for m in layer if _within(module, m)), None)

    wrong, outside = [], []
    for folder, package in (("advisor", "advisor"), ("rules", "rules")):
        for path in sorted((REPO / folder).rglob("*.py")):
            name = ".".join((package, *path.relative_to(REPO / folder).with_suffix("").parts)).removesuffix(".__init__")
            mine = layer_of(name)
            if mine is None:
                if name not in ("advisor", "advisor.__main__", "rules"):
                    outside.append(name)
                continue
            for d in imported_modules(path):
                theirs = layer_of(d)
                if theirs is not None and theirs < mine and not any(_within(name, a) and _within(d, b) for a, b in ignored):
                    wrong.append(f"{name} imports {d}")
    assert outside == [] and sorted(set(wrong)) == []


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
    """Frames and analyses are cached by the advisor/cache/ package alone; the facts file's name and
    types live in advisor/facts.py, which the capture (writer) and the analysis (reader) import."""
    assert not (REPO / "advisor" / "load" / "cache.py").exists() and not (REPO / "advisor" / "analysis_cache.py").exists()
    assert (REPO / "advisor" / "cache" / "__init__.py").is_file() and not (REPO / "advisor" / "cache.py").exists()
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


def test_each_module_lives_where_its_job_is():
    """load/ reads traces (running each rank's analysis on workers is advisor/ranks.py and
    advisor/cluster.py, beside the analysis); render/ turns an analysis into text and opens,
    writes and starts nothing (where a report goes is advisor/output.py, beside
    advisor/files.py; the browser and TensorBoard are started by the commands, advisor/cli/;
    the resolved configuration is printed by advisor/config.py)."""
    assert sorted(p.stem for p in (REPO / "advisor" / "load").glob("*.py")) == ["__init__", "batches", "categories", "columns", "decode", "discover", "trace"]
    for gone in ("output", "settings", "view", "tensorboard"):
        assert not (REPO / "advisor" / "render" / f"{gone}.py").exists(), gone
    starts = {"subprocess", "webbrowser", "socket", "tempfile", "multiprocessing", "concurrent.futures", "advisor.files"}
    for p in sorted((REPO / "advisor" / "render").rglob("*.py")):
        found = set()
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                found.add(node.module)
        assert found & starts == set(), p


def test_every_rule_page_says_what_it_needs_from_the_trace_and_what_it_says_without_it():
    """Each rule's page (its module docstring) has a `## What it needs from the trace` section,
    after what it detects: what the rule reads (kernels, copies, memory events, input shapes,
    the facts file, marks) and what it says when that is missing. Where the analysis does not
    run it on a trace missing a side (advisor.metrics.device_records, the cold window), the
    section says so."""
    from advisor.metrics.device_records import HOST_SIDE_RULES
    from advisor.metrics.one_time import HOST_PACE_RULES

    missing, silent, gating = [], [], []
    for rule in builtin_rules():
        doc = rule.doc
        if "## What it needs from the trace" not in doc:
            missing.append(rule.id)
            continue
        section = doc.split("## What it needs from the trace", 1)[1].split("\n## ", 1)[0]
        text = " ".join(section.split())
        if doc.index("## What it detects") > doc.index("## What it needs from the trace") or len(text) < 80:
            missing.append(rule.id)
        if not re.search(r"says nothing|gets nothing|is not run|not a finding|stays silent|makes it silent", text):
            silent.append(rule.id)
        if rule.id not in HOST_SIDE_RULES and "kernel records" not in text:
            gating.append(f"{rule.id}: kernel records")
        if rule.id in HOST_PACE_RULES and "first-call work" not in text:
            gating.append(f"{rule.id}: cold window")
    assert missing == [], f"rule pages without the section: {missing}"
    assert silent == [], f"rule pages that do not say what the rule says when its input is missing: {silent}"
    assert gating == [], f"rule pages silent on when the analysis does not run them: {gating}"
