"""The HTML report of real traces: self-contained, small, and drawing what the run did.

Expected figures come from outside the renderer: the TensorBoard plugin's published
breakdown of the V100 ResNet-50 run (../shared/traces/MANIFEST.md, /work/shared/ANCHORS.md),
sums over the raw trace events, and the definition of a median.
"""

from __future__ import annotations

import base64
import hashlib
import re
import subprocess
import sys
from collections import defaultdict
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from trace_edit import (
    by_cat,
    events,
    load_events,
    rename_events,
    trace_path,
    write_trace,
)

from advisor.analysis import analyze
from advisor.render.html import to_html
from advisor.whatif.timeline import step_timeline

MAX_SAMPLE_BYTES = 5 * 1024 * 1024  # the budget for the shipped samples
REPO = Path(__file__).resolve().parents[1]
# Recorded sample runs shipped with the repository (sample_runs/<model>/runs/<run>/).
SHIPPED_RUNS = sorted(p for p in REPO.glob("sample_runs/*/runs/*") if p.is_dir() and any(p.rglob("*.json*")))


class Elements(HTMLParser):
    """Every start tag with its attributes, and the text inside <style>/<script>/<title>."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.raw: dict[str, list[str]] = defaultdict(list)
        self._open: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, {k: v or "" for k, v in attrs}))
        self._open.append(tag)

    def handle_endtag(self, tag):
        while self._open and self._open.pop() != tag:
            pass

    def handle_data(self, data):
        if self._open:
            self.raw[self._open[-1]].append(data)

    def find(self, tag: str, cls: str | None = None) -> list[dict[str, str]]:
        return [a for t, a in self.tags if t == tag and (cls is None or cls in a.get("class", "").split())]


def _memory_lines(doc: Elements) -> list[dict[str, str]]:
    """The memory chart's curves (the copy bandwidth chart's lines are c-bw-*)."""
    return [a for a in doc.find("polyline", "line") if not any(c.startswith("c-bw-") for c in a.get("class", "").split())]


@pytest.fixture(scope="module")
def nw0_analysis():
    return analyze(trace_path("v100_resnet50_nw0")).with_primary_frames()  # the timeline test reads its frames


@pytest.fixture(scope="module")
def nw0_html(nw0_analysis) -> str:
    return to_html(nw0_analysis)


def test_report_is_self_contained_and_small(nw0_html):
    assert len(nw0_html.encode()) < MAX_SAMPLE_BYTES
    doc = Elements(nw0_html)
    # Nothing that would fetch: no external scripts, stylesheets, images, frames or fonts.
    for tag, attrs in doc.tags:
        assert tag not in ("link", "img", "iframe", "object", "embed"), tag
        assert "src" not in attrs, (tag, attrs)
        if tag != "a":
            assert not attrs.get("href", "").startswith(("http:", "https:", "//")), (tag, attrs)
    assert "@import" not in nw0_html and not re.search(r"url\((?!#)", nw0_html)
    (csp,) = [a["content"] for a in doc.find("meta") if a.get("http-equiv") == "Content-Security-Policy"]
    assert "default-src 'none'" in csp


@pytest.mark.parametrize("run", SHIPPED_RUNS or [None], ids=lambda p: p.name if p else "none")
def test_shipped_sample_reports_stay_under_5mb(run):
    if run is None:
        pytest.skip("no sample runs recorded under sample_runs/*/runs/ yet")
    html = to_html(analyze(run))
    assert len(html.encode()) < MAX_SAMPLE_BYTES
    assert 'class="hbar"' in html and 'class="tl-body"' in html


def test_csp_allows_exactly_the_inline_style_and_script(nw0_html):
    """A CSP hash that does not match would make the browser drop the page's CSS/JS."""
    doc = Elements(nw0_html)
    csp = next(a["content"] for t, a in doc.tags if t == "meta" and a.get("http-equiv") == "Content-Security-Policy")

    def sha(text: str) -> str:
        return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"

    (style,) = ["".join(doc.raw["style"])]
    (script,) = ["".join(doc.raw["script"])]
    assert f"style-src {sha(style)}" in csp
    assert f"script-src {sha(script)}" in csp
    assert "unsafe-inline" not in csp
    # Inline style attributes and event handler attributes would be blocked by that CSP.
    for tag, attrs in doc.tags:
        assert "style" not in attrs, (tag, attrs)
        assert not any(k.startswith("on") for k in attrs), (tag, attrs)


def test_average_step_bar_matches_the_tensorboard_breakdown(nw0_html):
    """ANCHORS.md: the plugin's nw0 breakdown is dataloader 59.26 ms and kernel 98.59 ms of 177.59."""
    bar = nw0_html[nw0_html.index('<svg class="hbar"') :]
    bar = bar[: bar.index("</svg>")]
    widths = {m.group(1): float(m.group(2)) for m in re.finditer(r'<rect class="c-(\w+)" x="[\d.]+%" y="0" width="([\d.]+)%"', bar)}
    assert widths["dataloader"] == pytest.approx(100 * 59.26 / 177.59, abs=0.1)
    assert widths["kernel"] == pytest.approx(100 * 98.59 / 177.59, abs=0.1)
    assert sum(widths.values()) == pytest.approx(100, abs=0.05)


def test_per_step_bars_one_column_per_profiled_step(nw0_html, nw0_analysis):
    doc = Elements(nw0_html)
    raw = load_events(trace_path("v100_resnet50_nw0"))
    step_names = {e["name"] for e in events(raw, lambda e: str(e.get("name", "")).startswith("ProfilerStep#"))}
    assert len(doc.find("g", "bar")) == len(step_names) == 6
    for n in step_names:
        assert f">{n.split('#')[1]}</text>" in nw0_html  # each step is labelled by its number


def test_timeline_shows_the_median_step_and_its_idle_time(nw0_analysis, nw0_html):
    m = nw0_analysis.primary
    tl = step_timeline(m)
    durations = m.steps["duration"].to_numpy()
    # The representative step is a median one: as many steps are shorter as are longer.
    d = durations[m.steps["step"].tolist().index(tl.step)]
    assert abs(int((durations < d).sum()) - int((durations > d).sum())) <= 1
    # Idle gaps + device-busy time = the step; the drawn gaps agree with the utilisation the
    # metrics measure independently (union of device activity per step).
    idle_ns = int(tl.idle["total"].sum())
    util = float(m.utilization.loc[tl.step])
    assert tl.device_busy_ns == pytest.approx(util * tl.duration_ns, rel=1e-6)
    assert idle_ns + tl.device_busy_ns == tl.duration_ns
    # Every device event of the step is in a device lane (coalescing only applies to huge lanes).
    device_spans = sum(int(l.spans["count"].sum()) for l in tl.lanes if l.group == "device")
    dev = m.frames.device
    row = m.steps.set_index("step").loc[tl.step]
    overlapping = int(((dev["end"] > row["start"]) & (dev["ts"] < row["end"])).sum())
    assert device_spans == overlapping
    # and the page draws them: the DataLoader lane, a stream lane, the idle lane.
    for label in ("DataLoader", "stream 7", "device idle"):
        assert f">{label}</text>" in nw0_html


def test_timeline_shows_the_replayed_step_beside_the_measured_one(nw0_analysis, nw0_html):
    from advisor.whatif.replay import Change, replay_graph, replay_step
    from advisor.whatif.savings import rank_replay

    m = nw0_analysis.primary
    r = rank_replay(m, nw0_analysis.run_facts())
    base = replay_step(r.graph, r.base)
    # The replay of the unchanged graph is the measured run: the replayed median step lasts
    # what the measured median step lasts (within the replay's 3%), and its device ops keep
    # the durations the trace measured.
    measured = float(np.median(m.steps["duration"].to_numpy()))
    assert replay_step(r.graph, Change()).duration_ns == pytest.approx(measured, rel=0.03)
    # The step drawn as the baseline is the headline's: no unprofiled steps here, so the host
    # is scaled by the profiler's estimated cost, and the step is shorter than measured.
    head = nw0_analysis.headline()
    assert head.scale_range is not None and head.host_scale < 1.0
    assert base.duration_ns / 1e6 == pytest.approx(head.baseline_ms, rel=0.03) and base.duration_ns < measured
    dur = m.frames.device["dur"].to_numpy(np.int64)[base.device_row]
    assert len(dur) > 100 and np.abs((base.device_end - base.device_start) - dur).max() <= 1
    # With every fix of the headline, the drawn step is the one the replay times.
    head = nw0_analysis.headline()
    assert head.fixes
    from advisor.engine import all_rules, check_rank_rules

    stated = check_rank_rules([x for x in all_rules() if x.id in head.fixes], m, None)
    change = Change.merge([r.base, *[f.change for f in stated if f.change is not None]])
    fixed = replay_step(r.graph, change)
    assert fixed.duration_ns / fixed.per_sample == pytest.approx(replay_graph(r.graph, change).step_ns[fixed.index], abs=1)
    assert fixed.duration_ns / fixed.per_sample < 0.6 * base.duration_ns  # the fixes' headline: well under the step
    for heading in ("Replayed step", "Replayed step with every fix"):
        assert f">{heading}</h3>" in nw0_html
    # Every trace string in the replayed charts is text: kernel names such as
    # `void at::native::...<float>` come out escaped, and only the chart's own tags remain.
    part = nw0_html[nw0_html.index('id="timeline-replayed-0"') : nw0_html.index("<h2", nw0_html.index('id="timeline-replayed-0"'))]
    assert "&lt;" in part
    tags = set(re.findall(r"<([A-Za-z][\w-]*)", part))
    assert tags <= {"h3", "p", "div", "button", "svg", "defs", "pattern", "rect", "text", "title", "g", "line", "ul", "li", "span"}


def test_memory_curve_of_an_old_trace_is_the_running_sum_of_allocations(nw0_html):
    """nw0 (2021 schema) records each allocation's size only; its peak running sum on the GPU
    is computed here from the raw [memory] events."""
    raw = load_events(trace_path("v100_resnet50_nw0"))
    sizes = [e["args"]["Bytes"] for e in events(raw, lambda e: e.get("name") == "[memory]" and e.get("args", {}).get("Device Type") == 1)]
    events_sorted = sorted(
        events(raw, lambda e: e.get("name") == "[memory]" and e.get("args", {}).get("Device Type") == 1), key=lambda e: e["ts"]
    )
    running = np.cumsum([e["args"]["Bytes"] for e in events_sorted])
    peak = running.max() - min(running.min(), 0)
    assert len(sizes) > 1000
    assert f"Peak allocated {peak / 1024**3:.1f} GiB" in nw0_html
    assert "running sum" in nw0_html
    # The V100's 32 GB (totalGlobalMem 34084028416 B = 31.7 GiB) is far above the curve: said, not drawn.
    assert f"device total 31.7 GiB is above this scale: the peak allocation uses at least {100 * peak / 34084028416:.1f}% of it" in nw0_html
    assert '<line class="hline' not in nw0_html
    doc = Elements(nw0_html)
    assert len(_memory_lines(doc)) == 1


def test_memory_near_the_device_total_draws_the_total(tmp_path):
    """nw0 edited as if the model already held 28.5 GiB before the window: each GPU [memory]
    event gets `Total Allocated` = 28.5 GiB + the running sum of `Bytes` so far, and `Total
    Reserved` = 31.5 GiB (the current schema's fields). The curve then comes near the V100's
    31.7 GiB, which must be drawn as a line, and the allocator's own totals are used."""
    doc = load_events(trace_path("v100_resnet50_nw0"))
    gpu_mem = sorted(events(doc, lambda e: e.get("name") == "[memory]" and e.get("args", {}).get("Device Type") == 1), key=lambda e: e["ts"])
    running, peak = 0, 0
    for e in gpu_mem:
        running += e["args"]["Bytes"]
        peak = max(peak, running)
        e["args"]["Total Allocated"] = int(28.5 * 1024**3) + running
        e["args"]["Total Reserved"] = int(31.5 * 1024**3)
    path = write_trace(doc, tmp_path / "run" / "worker0.pt.trace.json")
    html = to_html(analyze(path.parent))
    total = 34084028416
    held = int(28.5 * 1024**3) + peak
    assert held < total  # below the device (a peak above it is refused as impossible)
    assert f"Peak allocated {held / 1024**3:.1f} GiB ({100 * held / total:.1f}% of the device)" in html
    assert html.count('<line class="hline c-limit"') == 1 and "device total 31.7 GiB</text>" in html
    assert "running sum" not in html and "is above this scale" not in html
    assert len(_memory_lines(Elements(html))) == 2  # allocated and reserved


def test_top_kernel_table_starts_with_the_kernel_with_most_time(nw0_html):
    raw = load_events(trace_path("v100_resnet50_nw0"))
    total: dict[str, float] = defaultdict(float)
    for e in events(raw, by_cat("Kernel")):
        total[e["name"]] += e["dur"]
    top = max(total, key=total.get)
    table = nw0_html[nw0_html.index('<table class="sortable kernels">') :]
    first_cell = re.search(r'<td class="name"><div class="clamp">(.*?)</div>', table).group(1)
    import html

    assert html.unescape(first_cell) == top
    assert f"{total[top] / 1000:.2f}" in table  # total ms of that kernel, from the raw durations (µs)


def test_findings_are_cards_with_saving_fix_and_evidence(nw0_analysis, nw0_html):
    doc = Elements(nw0_html)
    cards = doc.find("article", "card")
    assert len(cards) == len(nw0_analysis.findings) >= 1
    first = nw0_html[nw0_html.index('id="finding-1"') :]
    first = first[: first.index("</article>")]
    # MANIFEST.md: on nw0 the DataLoader is a third of the step (plugin: 59.26 of 177.59 ms,
    # 33.4%), the top fix; its replayed saving is nearly all of that, as a share of the
    # measured step (the window's median, 177.44 ms), not of the profiler-corrected replay.
    assert "dataloader-stall" in first and "59.3 ms of each 177.6 ms step" in first
    stall = next(f for f in nw0_analysis.findings if f.rule == "dataloader-stall")
    saving = stall.saving_pct
    assert 0.29 <= saving <= 0.334 and f"({100 * saving:.1f}%)" in first
    assert saving == pytest.approx(stall.saving_ms / nw0_analysis.headline().measured_ms)
    assert "<pre><code" in first and "num_workers" in first and "<summary>Evidence</summary>" in first


def test_two_ranks_get_a_rank_comparison():
    a = analyze(trace_path("a100_two_ranks"))
    html = to_html(a)
    assert 'id="ranks"' in html
    assert html.count('<div class="rank-bar">') == 2
    for m in a.ranks:
        assert f"rank {m.rank}: {sum(m.breakdown_mean_ms.values()):.2f} ms" in html


def test_cpu_only_trace_renders_host_lanes_only():
    html = to_html(analyze(trace_path("cpu_only")))
    assert "CPU only" in html and "no device activity" in html
    assert ">device idle</text>" not in html
    assert ">Collectives (host)</text>" in html  # its gloo:all_reduce spans


def test_hostile_names_are_escaped_in_the_markup(tmp_path):
    """Raw-markup check; tests/browser/ checks in a real browser that nothing runs."""
    doc = load_events(trace_path("v100_resnet50_nw0"))
    payload = '<script>document.title="x"</script>"><img src=x onerror=alert(1)>'
    assert rename_events(doc, by_cat("Kernel"), lambda e: e["name"] + payload) > 0
    path = write_trace(doc, tmp_path / "run" / "worker0.pt.trace.json")
    html = to_html(analyze(path.parent))
    assert "<script>document" not in html and "<img" not in html
    assert "&lt;script&gt;document.title=&quot;x&quot;&lt;/script&gt;&quot;&gt;&lt;img src=x onerror=alert(1)&gt;" in html


def test_cli_writes_the_html_report(tmp_path):
    out = tmp_path / "report.html"
    r = subprocess.run(
        [sys.executable, "-m", "advisor", "report", str(trace_path("v100_resnet50_nw0")), "--format", "html", "-o", str(out)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    assert out.read_text().startswith("<!DOCTYPE html>")


@pytest.mark.parametrize("rel", ["v100_resnet50_nw0", "corpus/a4000_gpu_only_vit_infer.json.gz", "corpus/b200_ep_moe_ref_fwd.json.gz"])
def test_the_kernel_table_is_what_grouping_the_kernels_by_name_gives(rel):
    """The kernel table's rows, counted over codes, are pandas' groupby of every kernel by its
    name as text: calls, total and mean time, Tensor Cores, share, and the op launching each
    most often (of equal counts, the first by name); kernels whose op is unknown count under ''."""
    import pandas as pd

    from advisor.render.html import TOP_KERNELS, kernel_summary

    kernels = analyze(trace_path(rel)).view.kernels
    got = kernel_summary(kernels)
    k = pd.DataFrame({"name": kernels["name"].astype(object), "op": kernels["op"].astype(object).where(kernels["op"].notna(), ""),
                      "dur": kernels["dur"], "tensor_core": kernels["tensor_core"]})
    k = k[k["name"].notna()].astype({"name": str, "op": str})
    g = k.groupby("name").agg(count=("dur", "size"), total_ns=("dur", "sum"), mean_ns=("dur", "mean"), tensor_core=("tensor_core", "any"))
    g["share"] = g["total_ns"] / kernels["dur"].sum()
    ops = k.groupby(["name", "op"]).size().rename("n").reset_index().sort_values(["name", "n"], ascending=[True, False], kind="stable")
    g["op"] = ops.drop_duplicates("name").set_index("name")["op"]
    want = g.sort_values("total_ns", ascending=False).head(TOP_KERNELS).reset_index()
    assert len(got) == min(TOP_KERNELS, kernels["name"].nunique()) > 0
    for col in ("count", "total_ns", "mean_ns", "share", "tensor_core", "op"):
        by_name = dict(zip(want["name"], want[col], strict=True))
        assert {n: by_name.get(n) for n in got["name"]} == dict(zip(got["name"], got[col], strict=True)), col
    assert list(got["total_ns"]) == sorted(got["total_ns"], reverse=True)


# --- C++ kernel names for display ---------------------------------------------------------
def test_mangled_kernel_names_are_shown_as_cpp():
    from advisor.render.demangle import _runtime, demangle
    from advisor.render.html import kernel_summary

    run = Path(__file__).resolve().parent.parent / "sample_runs" / "resnet18_cifar" / "runs" / "gpu_baseline"
    a = analyze(run).with_primary_frames()  # kernel_summary reads the full kernel table
    mangled = [n for n in kernel_summary(a.primary.kernels)["name"] if n.startswith("_ZN")]
    assert mangled, "the H100 sample launches mangled cutlass kernels"
    # this one is beyond the C++ runtime's demangler: its qualified name is read from the symbol
    assert all(demangle(n).startswith("cutlass__5x_cudnn::Kernel<") for n in mangled), [demangle(n)[:80] for n in mangled]
    html = to_html(a)
    assert "cutlass__5x_cudnn::Kernel&lt;" in html and '<div class="clamp">_ZN' not in html
    # a name the demangler takes comes out whole; anything else is left as it is
    simple = demangle("_ZN17cutlass__5x_cudnn6KernelINS_4conv6kernel23ImplicitGemmConvolutionEEEvNT_6ParamsE")
    if _runtime() is not None:  # the C++ runtime's demangler is there (Linux, macOS)
        assert simple == "void cutlass__5x_cudnn::Kernel<cutlass__5x_cudnn::conv::kernel::ImplicitGemmConvolution>(cutlass__5x_cudnn::conv::kernel::ImplicitGemmConvolution::Params)"
    else:
        assert simple == "cutlass__5x_cudnn::Kernel<…>(…)"
    for plain in ("volta_sgemm_128x64_nn", "void at::native::vectorized_elementwise_kernel<4>", "_Znot a symbol", "_ZN999x"):
        assert demangle(plain) == plain
