"""A warm report: the text, JSON or Markdown report rendered before for an unchanged run is
written again from its analysis entry, byte for byte the report the full path writes
(`ADVISOR_CACHE=off`), without importing pandas, pyarrow or rich; an edited, moved or
re-sealed stored report is never served.

A stored report is proved served by making the analysis fail: only a stored text can answer.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from conftest import count_calls, shared_trace

from advisor import analysis
from advisor import cache as store

REPO = Path(__file__).resolve().parents[1]
SAMPLE_RUN = REPO / "sample_runs" / "resnet18_cifar" / "runs" / "cpu_baseline"
FORMATS = (["-f", "json"], [], ["-v"], ["-f", "md"], ["--format=markdown", "-v"])


@pytest.fixture(autouse=True)
def private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))
    monkeypatch.delenv("ADVISOR_CACHE", raising=False)


@pytest.fixture
def analyses(monkeypatch):
    """How many analyses were made; `analyses.forbid()` makes analysing fail (only a stored report passes)."""
    return count_calls(monkeypatch, analysis, "analyze", "analysed: the stored report was not served")


def copy_run(source: Path, tmp_path: Path, name: str = "run") -> Path:
    run = tmp_path / name
    shutil.copytree(source, run, copy_function=shutil.copyfile, ignore=shutil.ignore_patterns(".advisor-cache"))
    run.chmod(0o755)
    return run


def user_entries() -> list[Path]:
    return sorted((Path(os.environ["XDG_CACHE_HOME"]) / "torch-advisor").glob("analysis-*"))


@pytest.mark.parametrize("source", ["sample", "v100_resnet50_nw0"])
def test_a_warm_report_is_the_cold_report_byte_for_byte(source, tmp_path, cli, analyses):
    run = copy_run(SAMPLE_RUN if source == "sample" else shared_trace(source), tmp_path)
    for args in FORMATS:
        off = cli(["report", *args, str(run)], tmp_path, {"ADVISOR_CACHE": "off"})
        analyses.forbid(False)
        cold = cli(["report", *args, str(run)], tmp_path)
        analyses.forbid()
        warm = cli(["report", *args, str(run)], tmp_path)
        analyses.forbid(False)
        assert off[0] == cold[0] == warm[0] == 0, (cold[2], warm[2])
        assert warm[1] == cold[1] == off[1] and warm[2] == cold[2] == off[2] == "", args
    # one entry (a run quicker to analyse than an entry is worth is kept too: its report is),
    # holding one report per format and option set
    (entry,) = user_entries()
    assert len(list(entry.glob(f"{store.REPORT_PREFIX}*"))) == len(FORMATS)
    code, out, _ = cli(["cache", "info"], tmp_path)
    assert code == 0 and f"reports kept in the analyses: {len(FORMATS)} " in out


def test_what_the_text_depends_on_is_in_its_key(tmp_path, cli, analyses):
    """The console's width, the path as given and the run's copy: each its own stored report,
    each the one the full path writes."""
    run = copy_run(SAMPLE_RUN, tmp_path)
    for env in ({"COLUMNS": "200"}, {"COLUMNS": "72"}, {"COLUMNS": "72", "NO_COLOR": "1"}):
        analyses.forbid(False)
        code, off, err = cli(["report", str(run)], tmp_path, {**env, "ADVISOR_CACHE": "off"})
        assert code == 0 and off, err
        assert cli(["report", str(run)], tmp_path, env)[1] == off
        analyses.forbid()
        assert cli(["report", str(run)], tmp_path, env)[1] == off, env
    analyses.forbid(False)
    assert cli(["report", str(run)], tmp_path, {"COLUMNS": "200"})[1] != cli(["report", str(run)], tmp_path, {"COLUMNS": "72"})[1]
    # the same bytes elsewhere, and the same run named by a relative path: reports that name them
    other = copy_run(SAMPLE_RUN, tmp_path, "other")
    for path in (str(other), "other", "run"):
        analyses.forbid(False)
        off = cli(["report", "-f", "json", path], tmp_path, {"ADVISOR_CACHE": "off"})[1]
        assert cli(["report", "-f", "json", path], tmp_path)[1] == off
        analyses.forbid()
        assert cli(["report", "-f", "json", path], tmp_path)[1] == off
        assert orjson.loads(off)["source"] == path
    analyses.forbid(False)


def test_a_changed_trace_or_option_is_reported_afresh(tmp_path, cli, analyses):
    run = copy_run(SAMPLE_RUN, tmp_path)
    report = ["report", "-f", "json", str(run)]
    first = cli(report, tmp_path)[1]
    # other rules selected (after the parser): its own report, stored and served too
    before = analyses.n
    selected = cli([*report[:-1], "--select", "dataloader-stall", str(run)], tmp_path)[1]
    assert analyses.n == before + 1 and selected != first
    analyses.forbid()
    assert cli([*report[:-1], "--select", "dataloader-stall", str(run)], tmp_path)[1] == selected
    analyses.forbid(False)
    # the trace's bytes change (its size and mtime put back): a new analysis, not the stored text
    trace = next(run.glob("*.pt.trace.json.gz"))
    st = trace.stat()
    import gzip

    doc = orjson.loads(gzip.decompress(trace.read_bytes()))
    steps = [e for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")]
    last = max(steps, key=lambda e: e["ts"])
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e is not last]  # one step fewer
    data = gzip.compress(orjson.dumps(doc))
    trace.write_bytes(data)
    os.utime(trace, ns=(st.st_atime_ns, st.st_mtime_ns))
    before = analyses.n
    changed = cli(report, tmp_path)
    assert changed[0] == 0 and analyses.n == before + 1, "the stored report of other bytes was served"
    assert changed[1] == cli(report, tmp_path, {"ADVISOR_CACHE": "off"})[1] != first


def test_an_edited_or_moved_stored_report_is_never_served(tmp_path, cli, analyses):
    run = copy_run(SAMPLE_RUN, tmp_path)
    report = ["report", "-f", "json", str(run)]
    good = cli(report, tmp_path)[1]
    assert cli(["report", str(run)], tmp_path)[0] == 0  # a second stored report (text) in the entry
    (entry,) = user_entries()
    key = orjson.loads((entry / "seal.json").read_bytes())["key"]
    stored = {p.name: p.read_bytes() for p in entry.iterdir()}
    json_name = next(n for n, b in stored.items() if n.startswith(store.REPORT_PREFIX) and orjson.loads(b)["text"].startswith("{"))
    text_name = next(n for n in stored if n.startswith(store.REPORT_PREFIX) and n != json_name)

    def refused(forge, reseal: bool) -> None:
        for name, data in stored.items():
            (entry / name).write_bytes(data)
        forge()
        if reseal:  # sealed again with this installation's own secret: the report's own MAC still refuses it
            store.seal(entry, "analysis", key)
        before = analyses.n
        code, out, err = cli(report, tmp_path)
        assert analyses.n == before + 1, "a forged stored report was served"
        if forge is other_analysis and reseal:
            # an analysis sealed by this installation is served (its values' own checks pass a
            # warning), and the report is rendered from it, not the one stored from the first
            assert code == 0 and "FORGED warning" in out, err
        else:
            assert (code, out) == (0, good), err
            assert "FORGED" not in out

    def edit_text() -> None:
        doc = orjson.loads(stored[json_name])
        doc["text"] = doc["text"].replace('"findings"', '"FORGED"', 1)
        (entry / json_name).write_bytes(orjson.dumps(doc))

    def moved() -> None:  # the text report put where the JSON one is looked for
        (entry / json_name).write_bytes(stored[text_name].replace(text_name.encode(), json_name.encode()))

    def other_analysis() -> None:  # the analysis edited: its reports were rendered from another one
        doc = orjson.loads(stored["analysis.json"])
        doc["warnings"].append("FORGED warning")
        (entry / "analysis.json").write_bytes(orjson.dumps(doc))

    for forge in (edit_text, moved, other_analysis):
        refused(forge, reseal=False)
        refused(forge, reseal=True)
    # sealed with another installation's secret
    for name, data in stored.items():
        (entry / name).write_bytes(data)
    edit_text()
    store.seal(entry, "analysis", key, key=os.urandom(32))
    before = analyses.n
    assert cli(report, tmp_path)[1] == good and analyses.n == before + 1


def test_a_warm_report_imports_no_frames_library(tmp_path):
    """A whole `advisor report` process, the second time: neither pandas, pyarrow, NumPy, rich
    nor torch is imported, and what it prints is the first process's output."""
    run = copy_run(SAMPLE_RUN, tmp_path)
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "xdg"), "PYTHONWARNINGS": "ignore"}
    env.pop("COLUMNS", None)
    probe = (  # said at exit: the program ends the process itself (advisor.leaving), after the atexit handlers
        "import atexit, sys; from advisor.cli import program\n"
        "heavy = lambda: sorted(m for m in ('pandas', 'pyarrow', 'numpy', 'rich', 'torch') if m in sys.modules)\n"
        "atexit.register(lambda: print('imported:', ','.join(heavy()), file=sys.stderr))\n"
        "program()\n"
    )
    for args in ([], ["-f", "json"], ["-f", "md", "-v"]):
        cmd = [sys.executable, "-c", probe, "report", *args, str(run)]
        cold = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tmp_path)
        warm = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tmp_path)
        assert cold.returncode == warm.returncode == 0, cold.stderr + warm.stderr
        assert "pandas" in cold.stderr.splitlines()[-1]
        assert warm.stderr.splitlines()[-1] == "imported: ", warm.stderr
        assert warm.stdout == cold.stdout


def test_an_entry_keeps_its_newest_reports(tmp_path, cli, analyses, monkeypatch):
    """A terminal of each new width adds a report to the entry; past MAX_REPORTS the least
    recently written goes (and is made again when asked for)."""
    monkeypatch.setattr(store.reports, "MAX_REPORTS", 2)
    run = copy_run(SAMPLE_RUN, tmp_path)
    widths = ("100", "90", "80")
    texts = {w: cli(["report", str(run)], tmp_path, {"COLUMNS": w})[1] for w in widths}
    (entry,) = user_entries()
    assert len(list(entry.glob(f"{store.REPORT_PREFIX}*"))) == 2
    analyses.forbid()
    for w in widths[1:]:
        assert cli(["report", str(run)], tmp_path, {"COLUMNS": w})[1] == texts[w]
    analyses.forbid(False)
    before = analyses.n
    assert cli(["report", str(run)], tmp_path, {"COLUMNS": "100"})[1] == texts["100"]
    assert analyses.n == before + 1


@pytest.mark.parametrize(
    "line",
    [
        ["run"], ["run", "-f", "md"], ["-v", "run", "--format", "json"], ["run", "--format=markdown", "-v"], ["run", "-f", "TXT"],
        ["run", "-f", "html"], ["run", "-f", "pdf"], ["run", "-o", "r.md"], ["run", "--select", "a"], ["run", "-v", "-v"],
        ["run", "-f"], ["run", "-fmd"], ["run", "-f=md"], ["run", "--verbose=1"], ["run", "other"], ["--", "run"], ["-", "run"],
    ],
)
def test_the_early_reading_of_a_report_line_agrees_with_the_parser(line):
    """What the warm path reads before the parser is built is what the parser itself reads,
    or nothing (then the parser decides)."""
    import typer.main

    from advisor.cli import app, format_option, report
    from advisor.cli.warm import ANSWERED_EARLY, _arguments

    early = _arguments(line, report)
    try:
        parsed = typer.main.get_command(app).commands["report"].make_context("report", list(line)).params
    except Exception:  # noqa: BLE001 - a usage error: the early reading must not answer it either
        parsed = None
    if early is None:
        return
    if parsed is None:  # only a format the parser refuses gets this far, and it is refused early too
        with pytest.raises(typer.BadParameter):
            format_option(early.get("format"))
        return
    assert str(parsed["path"]) == early["path"] and parsed["verbose"] == bool(early.get("verbose"))
    assert parsed["format"] == format_option(early.get("format"))
    only_early = all(parsed[k] in (None, False, []) for k in parsed if k not in ANSWERED_EARLY)
    assert only_early == (set(early) <= set(ANSWERED_EARLY))


# Command lines a plain command may be, or may seem to be: each is read early as its parser reads it, or not at all.
EARLY_LINES = {
    "report": [
        ["run"], ["run", "-f", "json", "-o", "r.txt"], ["-o", "out.md", "run", "-v"], ["run", "--output=r.html"], ["run", "-o", "-"],
        ["run", "-f", "pdf", "-o", "r.json"], ["run", "-o"], ["run", "-o", "a", "-o", "b"], ["run", "-o", "r.json", "--ops"],
        ["run", "--select", "a", "-o", "r"], ["run", "-or.json"], ["run", "-o", ""],
    ],
    "whatif": [
        ["run"], ["run", "--apply", "launch-bound"], ["--apply", "a,b", "run"], ["run", "--apply=a"], ["run", "--apply"],
        ["run", "--apply", "a", "--apply", "b"], ["run", "--run", "r1"], ["run", "--config", "advisor.toml"], ["run", "--apply", ""],
        ["run", "other"], ["--", "run"], ["run", "-a", "x"], ["run", "--help"],
    ],
}


@pytest.mark.parametrize("name,line", [(name, line) for name, lines in EARLY_LINES.items() for line in lines])
def test_a_command_made_without_the_parser_gets_the_parsers_arguments(name, line):
    """A plain report or whatif line is run by calling the command's function directly: with
    every argument the parser would give it, or not at all (then the parser reads the line)."""
    import typer.main

    from advisor.cli import _optional_command, _register_optional_commands, app, report
    from advisor.cli.warm import MADE_EARLY, early_arguments

    command = report if name == "report" else _optional_command(name)
    early = early_arguments(list(line), command, MADE_EARLY[name])
    _register_optional_commands(name)
    try:
        parsed = typer.main.get_command(app).commands[name].make_context(name, list(line)).params
    except BaseException:  # noqa: BLE001 - a usage error, or --help's exit: never answered early
        parsed = None
    if early is None:
        return
    assert parsed is not None
    assert early == parsed
    assert {k: type(v) for k, v in early.items()} == {k: type(v) for k, v in parsed.items()}
