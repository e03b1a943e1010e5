"""The HTML reports in a real browser: headless Chromium, driven over the DevTools protocol.

Checks what only a browser can: the page's script runs under its own Content-Security-Policy,
the charts are drawn with real sizes, sorting and zooming work, nothing logs an error, and a
trace full of markup runs nothing. Screenshots go to test-artifacts/ (or
$ADVISOR_TEST_ARTIFACTS) for CI to keep.

Skips when no Chromium is installed (`apt-get install chromium`; CI's .ci/run installs it).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from cdp import Chromium, find_chromium
from conftest import REPO, shared_trace
from trace_edit import (
    by_cat,
    events,
    load_events,
    name_contains,
    rename_events,
    trace_path,
    write_trace,
)

from advisor.analysis import analyze
from advisor.render.diff import compare, diff_html
from advisor.render.html import to_html

ARTIFACTS = Path(os.environ.get("ADVISOR_TEST_ARTIFACTS", REPO / "test-artifacts"))
# Shipped sample runs, preferred over the shared V100 trace when they have been recorded.
SAMPLE_RUNS = [REPO / "sample_runs" / "resnet18_cifar" / "runs" / "cpu_baseline"]


@pytest.fixture(scope="module")
def browser():
    binary = find_chromium()
    if binary is None:
        pytest.skip("chromium not installed (apt-get install chromium; CI's .ci/run installs it)")
    b = Chromium.launch(binary, width=1280, height=900)
    yield b
    b.close()


def sample_run() -> Path:
    for run in SAMPLE_RUNS:
        if run.is_dir() and any(p.name.endswith((".json", ".json.gz")) for p in run.rglob("*")):
            return run
    return trace_path("v100_resnet50_nw0")


def drawn_rects(page, selector: str) -> int:
    """Rects inside `selector` that the browser laid out with a visible size."""
    return page.evaluate(
        f"""Array.from(document.querySelectorAll({selector!r} + ' rect')).filter(r => {{
              const b = r.getBoundingClientRect(); return b.width > 0 && b.height > 0; }}).length"""
    )


def test_sample_report_draws_its_charts(browser, tmp_path):
    run = sample_run()
    path = tmp_path / "report.html"
    path.write_text(to_html(analyze(run)), encoding="utf-8")
    page = browser.open(path)

    assert page.evaluate("document.documentElement.getAttribute('data-report-ready')") == "1", "the report's script did not run (CSP hash?)"
    assert page.evaluate("getComputedStyle(document.body).fontFamily").startswith("system-ui"), "the stylesheet was not applied"
    assert drawn_rects(page, "svg.hbar") >= 2  # the average step, split by category
    assert drawn_rects(page, "svg.chart") >= 2  # per-step bars (and the memory bands)
    assert drawn_rects(page, "svg.tl-body") >= 10  # the timeline
    # The average-step bar is laid out edge to edge: its segments fill the bar's width.
    widths = page.evaluate(
        """(() => { const svg = document.querySelector('svg.hbar');
             const sum = Array.from(svg.querySelectorAll('rect')).reduce((s, r) => s + r.getBoundingClientRect().width, 0);
             return [sum, svg.getBoundingClientRect().width]; })()"""
    )
    assert widths[0] == pytest.approx(widths[1], abs=2)

    # Sorting: the kernel table by calls, descending then ascending.
    def calls_column() -> list[float]:
        return page.evaluate(
            """Array.from(document.querySelectorAll('table.kernels tbody tr')).map(r => parseFloat(r.cells[2].getAttribute('data-v')))"""
        )

    if page.evaluate("document.querySelector('table.kernels') !== null"):
        page.evaluate("document.querySelector('table.kernels thead th:nth-child(3)').click()")
        got = calls_column()
        assert got == sorted(got, reverse=True) and len(got) > 1
        page.evaluate("document.querySelector('table.kernels thead th:nth-child(3)').click()")
        got = calls_column()
        assert got == sorted(got)

    # Zoom: 4× makes the timeline four times wider, and shows that zoom level's ticks.
    before = page.evaluate("document.querySelector('svg.tl-body').getBoundingClientRect().width")
    page.evaluate("document.querySelector('.tl button[data-zoom=\"4\"]').click()")
    after = page.evaluate("document.querySelector('svg.tl-body').getBoundingClientRect().width")
    assert after == pytest.approx(4 * before, abs=2)
    assert page.evaluate("getComputedStyle(document.querySelector('.tl .tick.z4')).display") != "none"
    assert page.evaluate("getComputedStyle(document.querySelector('.tl .tick.z1')).display") == "none"
    page.evaluate("document.querySelector('.tl button[data-zoom=\"1\"]').click()")

    # Long kernel names wrap or clamp: nothing pushes the page wider than the window.
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    assert page.errors() == []
    shot = page.screenshot(ARTIFACTS / "report.png")
    assert shot.stat().st_size > 20_000


def test_diff_report_in_browser(browser, tmp_path):
    c = compare(analyze(trace_path("v100_resnet50_nw0")), analyze(trace_path("v100_resnet50_nw4")))
    path = tmp_path / "diff.html"
    path.write_text(diff_html(c), encoding="utf-8")
    page = browser.open(path)
    assert page.evaluate("document.documentElement.getAttribute('data-report-ready')") == "1"
    assert drawn_rects(page, "svg.hbar") >= 6  # promised/measured bars and before/after breakdowns
    text = page.evaluate("document.body.innerText")
    assert "resolved" in text and "dataloader-stall" in text
    assert page.errors() == []
    page.screenshot(ARTIFACTS / "diff.png")


# --- hostile trace ------------------------------------------------------------------------
# Each payload, if it ever ran, leaves a trace the test looks for: window.__xss, a changed
# document.title, or an <xss-marker> element.
SCRIPT_TAG = '<script>window.__xss="script";document.title="pwned"</script>'
ATTR_BREAK = "\"><img src=x onerror=\"window.__xss='img';document.body.appendChild(document.createElement('xss-marker'))\">"
SVG_BREAK = "'><svg onload=\"window.__xss='svg'\"></svg><title>pwned</title>"
DATALOADER_SPAN = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


def hostile_run(tmp_path: Path) -> Path:
    """nw0 with hostile strings where the report shows trace strings. Changed, nothing else:

    - every kernel event: its name gets SCRIPT_TAG + ATTR_BREAK appended (kernel table,
      timeline tooltips, rule evidence);
    - every `aten::cudnn_convolution` op: renamed to that name + ATTR_BREAK + SVG_BREAK (ops
      table, "launched by" column, timeline);
    - the DataLoader spans: SCRIPT_TAG inserted into the name, which still matches the
      DataLoader pattern (dataloader-stall evidence, gpu-idle message, timeline lane);
    - the run folder is named `run"><svg onload=...>` (page heading and title).
    """
    doc = load_events(trace_path("v100_resnet50_nw0"))
    assert rename_events(doc, by_cat("Kernel"), lambda e: e["name"] + SCRIPT_TAG + ATTR_BREAK) > 1000
    assert rename_events(doc, lambda e: e.get("name") == "aten::cudnn_convolution", "aten::cudnn_convolution" + ATTR_BREAK + SVG_BREAK) > 10
    hostile_dl = DATALOADER_SPAN.replace("#_", "#" + SCRIPT_TAG + "_")
    assert rename_events(doc, lambda e: e.get("name") == DATALOADER_SPAN, hostile_dl) > 0
    assert events(doc, name_contains("<script>"))
    run = tmp_path / ('run"><svg onload=window.__xss=1>')
    write_trace(doc, run / "worker0.pt.trace.json")
    return run


def assert_nothing_ran(page) -> None:
    assert page.evaluate("typeof window.__xss") == "undefined"
    assert page.evaluate("document.title").startswith("advisor: run")
    assert "pwned" not in page.evaluate("document.title")
    assert page.evaluate("document.querySelectorAll('xss-marker, img, iframe, script[src]').length") == 0
    assert page.evaluate("document.querySelectorAll('[onerror], [onload]').length") == 0
    assert page.evaluate("document.querySelectorAll('script').length") == 1  # the report's own


def test_hostile_trace_runs_nothing_and_shows_the_text(browser, tmp_path):
    html = to_html(analyze(hostile_run(tmp_path)))
    with_csp = tmp_path / "hostile.html"
    with_csp.write_text(html, encoding="utf-8")
    # The same page without its Content-Security-Policy: escaping alone must hold.
    without_csp = tmp_path / "hostile-no-csp.html"
    stripped, n = re.subn(r'<meta http-equiv="Content-Security-Policy" content="[^"]*">', "", html)
    assert n == 1
    without_csp.write_text(stripped, encoding="utf-8")

    for path in (with_csp, without_csp):
        page = browser.open(path)
        assert page.evaluate("document.documentElement.getAttribute('data-report-ready')") == "1"
        assert_nothing_ran(page)
        text = page.evaluate("document.body.textContent")
        assert SCRIPT_TAG in text and ATTR_BREAK in text and SVG_BREAK in text  # shown as text
        tooltips = page.evaluate("Array.from(document.querySelectorAll('svg title')).map(t => t.textContent).join('\\n')")
        assert SCRIPT_TAG in tooltips and ATTR_BREAK in tooltips
        # Hover and sort: the table script moves rows around; still nothing may run.
        page.evaluate("document.querySelectorAll('table.sortable th').forEach(th => th.click())")
        assert_nothing_ran(page)
        assert page.errors() == []  # with the CSP on: no violation, so nothing even tried
    page.screenshot(ARTIFACTS / "hostile.png", full_page=False)


# --- narrow and wide windows --------------------------------------------------------------
LAYOUT = """(() => {
  const W = document.documentElement.clientWidth;
  const right = el => el.getBoundingClientRect().right;
  const cards = Array.from(document.querySelectorAll('.card')).filter(c => right(c) > W + 1).length;
  const tables = Array.from(document.querySelectorAll('table')).filter(t => right(t) > right(t.parentElement) + 1).length;
  // chart text as drawn: its font size in chart units times the chart's scale on screen
  const text = Array.from(document.querySelectorAll('svg.chart')).map(svg => {
    const scale = svg.getBoundingClientRect().width / svg.viewBox.baseVal.width;
    const t = svg.querySelector('text.axis');
    return t ? parseFloat(getComputedStyle(t).fontSize) * scale : 99;
  });
  // the timeline's last visible tick label inside the timeline's own box
  const body = document.querySelector('svg.tl-body');
  const labels = Array.from(document.querySelectorAll('.tl .tick.z1 text'));
  const last = labels.length ? right(labels[labels.length - 1]) - right(body) : 0;
  const kernels = Array.from(document.querySelectorAll('table.kernels tbody td.name:first-child')).map(td => td.textContent);
  return {W, scroll: document.documentElement.scrollWidth, cards, tables, smallest_chart_text: Math.min(...text), last_tick_overhang: last, kernels};
})()"""


@pytest.mark.parametrize("width", [1400, 800])
@pytest.mark.parametrize("key", ["gpu", "ranks"])
def test_report_fits_wide_and_narrow_windows(browser, tmp_path, key, width):
    # The H100 sample (finding cards with code, charts, the timeline, mangled cutlass kernels)
    # and a two-rank trace (the ranks table).
    run = REPO / "sample_runs" / "resnet18_cifar" / "runs" / "gpu_baseline" if key == "gpu" else shared_trace("a100_two_ranks")
    path = tmp_path / f"{key}.html"
    path.write_text(to_html(analyze(run)), encoding="utf-8")
    page = browser.open(path, width=width)
    got = page.evaluate(LAYOUT)
    assert got["scroll"] <= got["W"], (key, got)  # nothing pushes the page wider than the window
    assert got["cards"] == 0 and got["tables"] == 0, (key, got)
    assert got["smallest_chart_text"] >= 10, (key, got)  # readable: ~7 px before
    assert got["last_tick_overhang"] <= 0.5, (key, got)
    assert not any(name.startswith("_Z") for name in got["kernels"]), got["kernels"]
    if key == "gpu":
        assert any(name.startswith("cutlass__5x_cudnn::Kernel<") for name in got["kernels"]), got["kernels"]
    assert page.errors() == []
    shot = page.screenshot(ARTIFACTS / f"report-{key}-{width}.png")
    assert shot.stat().st_size > 20_000


FIRST_SCREEN = """(() => {
  const top = sel => { const e = document.querySelector(sel); return e ? e.getBoundingClientRect().top + window.scrollY : null; };
  const bottom = sel => { const e = document.querySelector(sel); return e ? e.getBoundingClientRect().bottom + window.scrollY : null; };
  const tiles = Array.from(document.querySelectorAll('.tiles .tile')).map(t => Math.round(t.getBoundingClientRect().top));
  const rows = {}; tiles.forEach(y => rows[y] = (rows[y] || 0) + 1);
  return {H: window.innerHeight, verdict_bottom: bottom('#verdict'), first_finding_top: top('#finding-1'),
          caveat: (document.querySelector('#verdict .caveat') || {}).textContent || '',
          answer: (document.querySelector('#verdict .answer') || {}).textContent || '',
          fixes: Array.from(document.querySelectorAll('#verdict ol.topfixes li')).map(li => li.textContent),
          tile_rows: Object.values(rows), replayed: document.querySelectorAll('[id^=timeline-replayed]').length,
          kernels: document.querySelectorAll('#kernels').length};
})()"""


@pytest.mark.parametrize("width", [1400, 800])
def test_the_first_screen_holds_the_verdict(browser, tmp_path, width):
    """The H100 sample: the step, what bounds it, the top fixes with their savings, the caveat
    that the profiler slowed the steps, and the first finding card, all above the fold."""
    run = REPO / "sample_runs" / "resnet18_cifar" / "runs" / "gpu_baseline"
    analysis = analyze(run)
    path = tmp_path / "gpu.html"
    path.write_text(to_html(analysis), encoding="utf-8")
    page = browser.open(path, width=width)
    got = page.evaluate(FIRST_SCREEN)
    page.screenshot(ARTIFACTS / f"first-screen-gpu-{width}.png", full_page=False)
    assert got["verdict_bottom"] is not None and got["verdict_bottom"] < got["H"], got
    assert got["first_finding_top"] is not None and got["first_finding_top"] < got["H"], got
    mean = float(analysis.summary()["step_time_ms"]["mean"])  # the one step time every output states
    assert f"{mean:.2f} ms per step" in got["answer"] and "bound by the input pipeline" in got["answer"], got["answer"]
    top = analysis.findings[0]
    assert len(got["fixes"]) == 3 and got["fixes"][0].startswith(f"{top.rule} saves {top.saving_ms:.2f} ms/step"), got["fixes"]
    # the window's median step (85.34 ms, the headline's) over the 39 unprofiled steps' (63.08 ms): 1.35x
    assert "the profiler slowed the recorded steps 1.4x" in got["caveat"], got
    assert min(got["tile_rows"]) > 1, got["tile_rows"]  # no tile alone on a row
    assert page.errors() == []


def test_a_cpu_run_shows_no_empty_device_charts(browser, tmp_path):
    run = REPO / "sample_runs" / "resnet18_cifar" / "runs" / "cpu_baseline"
    path = tmp_path / "cpu.html"
    path.write_text(to_html(analyze(run)), encoding="utf-8")
    for width in (1400, 800):
        page = browser.open(path, width=width)
        got = page.evaluate(FIRST_SCREEN)
        page.screenshot(ARTIFACTS / f"first-screen-cpu-{width}.png", full_page=False)
        assert got["replayed"] == 0 and got["kernels"] == 0, got  # no replayed step, no kernel table
        assert got["first_finding_top"] is not None and got["first_finding_top"] < got["H"], got
        assert "bound by host (CPU) work" in got["answer"], got["answer"]
        assert len(got["tile_rows"]) == 1, got  # two tiles, one row
        assert page.errors() == []
