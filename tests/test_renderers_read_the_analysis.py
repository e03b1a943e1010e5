"""Every output is made from the analysis alone: one trace load per trace, whatever is rendered.

The analysis carries what the renderers draw beyond the figures (advisor.rank_view: the
median step's lanes, the replayed steps, memory, top ops and kernels, the replayable fixes),
so the text, JSON, Markdown and HTML reports, `diff`, `whatif` and the Python API never load
a trace again nor run a rule again. Counted on our own recordings, with the cache off.
"""

from __future__ import annotations

import io
import json
import re

import pytest
from rich.console import Console

import advisor.load.trace as trace_module
from conftest import REPO, SAMPLE_RUNS, count_calls, shared_trace

GPU_RUN = SAMPLE_RUNS / "resnet18_cifar" / "runs" / "gpu_baseline"
CPU_RUN = SAMPLE_RUNS / "cpu_transformer" / "runs" / "cpu_baseline"
TWO_RANKS = REPO / "tests" / "data" / "allreduce_gloo" / "runs" / "ddp"  # two gloo ranks


@pytest.fixture
def loads(monkeypatch):
    monkeypatch.setenv("ADVISOR_CACHE", "off")
    return count_calls(monkeypatch, trace_module, "load_trace", "a trace was loaded again")


@pytest.mark.parametrize("run", [GPU_RUN, CPU_RUN, TWO_RANKS], ids=["gpu", "cpu", "two-ranks"])
def test_every_output_of_an_analysis_loads_each_trace_once(run, loads):
    from advisor.analysis import analyze
    from advisor.api import RunAnalysis
    from advisor.render.diff import compare, diff_html, diff_json, diff_markdown
    from advisor.render.html import to_html
    from advisor.render.markdown import to_markdown
    from advisor.render.text import render_text

    a = analyze(run)
    assert loads.n == len(a.run.files)  # each trace once
    loads.forbid()  # from here on a load fails the test
    a.to_dict()
    to_markdown(a, verbose=True)
    render_text(a, Console(file=io.StringIO(), width=120), verbose=True)
    html = to_html(a)
    assert "One step in time" in html
    api = RunAnalysis(a)
    api.ops, api.kernels, api.findings, api.to_html()
    c = compare(a, a)
    diff_json(c), diff_markdown(c), diff_html(c)
    replay, stated = a.stated_fixes()
    if a.primary.has_device:
        assert replay.available and stated and ">Replayed step with every fix</h3>" in html
    rules = [f.rule for f in a.findings if f.rule in stated]
    if rules:
        assert a.replayed_saving(rules) is not None


def test_whatif_loads_the_trace_once(cli, loads):
    code, out, err = cli(["whatif", str(GPU_RUN)])
    assert code == 0, err
    assert loads.n == 1
    code, out, err = cli(["whatif", str(GPU_RUN), "--apply", "dataloader-stall"])
    assert code == 0, err
    assert loads.n == 2  # a second command, a second analysis


def test_user_rules_fixes_are_in_the_html_step_with_every_fix(cli, tmp_path, monkeypatch):
    # A rule from --rules DIR states a fix: the HTML report's step with every fix replays it
    # with the others, as the headline does (the renderer does not run the built-in rules again).
    monkeypatch.setenv("ADVISOR_CACHE", "off")
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "faster_device.py").write_text(
        '"""Every device op twice as fast."""\n'
        "from advisor.whatif.replay import Change\n"
        'ID = "faster-device"\nTITLE = "Faster device"\n\n'
        "def check(ctx):\n"
        '    return ctx.finding("A device twice as fast.", 1.0, change=Change(device_scale_all=0.5))\n'
    )
    code, out, err = cli(["report", "--rules", str(rules), "-f", "json", str(GPU_RUN)])
    assert code == 0, err
    head = json.loads(out)["whatif"]
    assert "faster-device" in head["fixes"]
    page = tmp_path / "report.html"
    code, out, err = cli(["report", "--rules", str(rules), "-o", str(page), str(GPU_RUN)])
    assert code == 0, err
    html = page.read_text()
    note = re.search(r"The same graph with the fixes of ([^:]+) applied together: ([0-9.]+) ms(?: for [0-9.]+× the samples, ([0-9.]+) ms per current step)?", html)
    assert note is not None
    assert "faster-device" in note.group(1).split(", ")
    assert set(note.group(1).split(", ")) == set(head["fixes"])
    # the drawn step is the replayed median step with every fix: the headline's figure, within the replay's spread
    # (per current step where a fix makes the batch larger)
    assert float(note.group(3) or note.group(2)) == pytest.approx(head["all_fixes_ms"], rel=0.05)


def test_a_cached_analysis_renders_without_its_trace(tmp_path, monkeypatch):
    # The view is stored with the analysis: read back, it renders the same HTML and replays
    # the same fixes, and no trace is loaded.
    from advisor.analysis import analyze
    from advisor.render.html import to_html

    monkeypatch.setenv("ADVISOR_CACHE", str(tmp_path / "cache"))
    fresh = analyze(GPU_RUN, cache=True, store=True)
    assert fresh.cache_entry is not None
    loads = count_calls(monkeypatch, trace_module, "load_trace", "a cached analysis loaded its trace")
    loads.forbid()
    cached = analyze(GPU_RUN, cache=True)
    assert cached.cache_entry is not None
    assert to_html(cached) == to_html(fresh)
    replay, stated = cached.stated_fixes()
    fresh_replay, fresh_stated = fresh.stated_fixes()
    assert set(stated) == set(fresh_stated)
    for rule in stated:
        assert replay.saving_ms(stated[rule].change) == pytest.approx(fresh_replay.saving_ms(fresh_stated[rule].change), abs=1e-9)
        assert stated[rule].evidence == fresh_stated[rule].evidence


def test_a_long_runs_stored_fixes_hold_its_replayed_block_and_replay_as_the_whole_ones(tmp_path, monkeypatch):
    # 99 iterations of a compiled linear (GTX 1650): the replay takes a block of 8. The view
    # stores each fix cut to the block's calls and device ops, a fraction of its rows, and
    # from the cache every fix and all of them together replay as the whole fixes do.
    from advisor.analysis import analyze
    from advisor.whatif.replay import Change

    def rows(c: Change) -> int:
        return len(c.call_scale) + len(c.unwait) + len(c.device_scale) + len(c.tight_launch) + len(c.device_add)

    path = shared_trace("corpus/gtx1650_compile_infer_stack_mem.json.gz")
    monkeypatch.setenv("ADVISOR_CACHE", str(tmp_path / "cache"))
    fresh_replay, fresh = analyze(path, cache=True, store=True).stated_fixes()
    replay, stated = analyze(path, cache=True).stated_fixes()
    assert fresh_replay.first_step > 0 and set(stated) == set(fresh) and fresh
    assert 0 < sum(rows(f.change) for f in stated.values()) < sum(rows(f.change) for f in fresh.values()) / 4
    for rule in stated:
        assert replay.saving_ms(stated[rule].change) == fresh_replay.saving_ms(fresh[rule].change), rule
    assert replay.replayed_ms(Change.merge([f.change for f in stated.values()])) == fresh_replay.replayed_ms(Change.merge([f.change for f in fresh.values()]))


def test_a_report_that_draws_no_timeline_makes_none(loads, monkeypatch):
    """`advisor report -f json` without a cache draws no step: the analysis leaves the view's
    lanes out (the replayed steps cost as much as a rule); an analysis stored for later formats
    keeps them, and asking this one for them after all reads its trace once more to make them."""
    import advisor.rank_view as view_module
    from advisor.analysis import analyze
    from advisor.render.html import to_html

    drawn = count_calls(monkeypatch, view_module, "replayed_steps", "replayed steps drawn")
    a = analyze(GPU_RUN, draw=False)
    assert loads.n == 1 and drawn.n == 0
    assert a.primary_view is not None and not a.primary_view.drawn and a.primary_view.timeline is None
    assert a.primary_view.kernels is not None and len(a.primary_view.ops)  # the tables are kept: `--ops`, the API
    html = to_html(a)  # drawn after all: from the trace, once
    assert loads.n == 2 and drawn.n == 1 and ">Replayed step with every fix</h3>" in html
    b = analyze(GPU_RUN)  # the default draws
    assert b.primary_view.drawn and b.primary_view.timeline is not None and drawn.n == 2 and loads.n == 3


def test_the_json_report_command_draws_no_step_and_the_html_one_does(cli, loads, monkeypatch, tmp_path):
    import advisor.rank_view as view_module

    drawn = count_calls(monkeypatch, view_module, "replayed_steps", "replayed steps drawn")
    code, out, err = cli(["report", str(GPU_RUN), "-f", "json"])
    assert code == 0, err
    assert drawn.n == 0 and json.loads(out)["findings"]
    code, out, err = cli(["report", str(GPU_RUN), "-o", str(tmp_path / "r.html")])
    assert code == 0, err
    assert drawn.n == 1 and loads.n == 2
