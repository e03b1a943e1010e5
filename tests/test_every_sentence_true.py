"""Every sentence a report states is true of the trace it reads: the formats and edges it must
read (the autograd profiler's bare-list export, a loop of a few ops, a trailing sync, an empty
window, a GPU listed but idle, launches whose kernels were never recorded, long kernel names),
the window it measures, and the facts it states.

The traces are small ones written here, each showing one edge as the profiler writes it; the
expected figures are worked out by hand from the events written (the arithmetic is in the
comments), never read from the advisor's own output.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO

from advisor.analysis import analyze
from advisor.config import Config
from advisor.load.trace import load_trace

Event = dict[str, Any]


# --- small traces as the profilers write them ---------------------------------------------
def span(cat: str, name: str, ts: float, dur: float, tid: int = 1, **args: Any) -> Event:
    """A complete event of the Kineto schema (µs)."""
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}


def write(path: Path, events: list[Any], **header: Any) -> Path:
    path.write_text(json.dumps({**header, "traceEvents": events}))
    return path


def write_bare(path: Path, events: list[Event]) -> Path:
    path.write_text(json.dumps(events))
    return path


def report(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "advisor", "report", str(path), *args],
        capture_output=True, text=True, cwd=REPO, timeout=180,
    )


def analysis(path: Path):
    return analyze(path, config=Config())


# --- the autograd profiler's export: a bare JSON list -----------------------------------------
# As torch.autograd.profiler's EventList.export_chrome_trace wrote it (also torch.profiler's
# where Kineto was not built in, 2019-2022): "[" + one complete event per op on
# "pid": "CPU functions" (no "cat"), and per kernel of the op an "s"/"f" flow pair of cat
# "cpu_to_cuda" and a complete event on "pid": "CUDA functions" whose "tid" is the device.
STEP_OPS = (("aten::linear", 300.0), ("aten::relu", 100.0), ("aten::mse_loss", 80.0), ("aten::backward", 400.0),
            ("c10d::allreduce_", 200.0), ("Optimizer.step#Adam.step", 250.0))
GAP_US = 20.0


def legacy_export(steps: int = 3) -> list[Event]:
    events: list[Event] = []
    t, flow = 1000.0, 0
    for s in range(steps):
        cur, ops = t + 10.0, []
        for name, dur in STEP_OPS:
            ops.append((name, cur, dur))
            cur += dur + GAP_US
        events.append({"name": f"ProfilerStep#{s}", "ph": "X", "ts": t, "dur": cur - t, "tid": 1, "pid": "CPU functions", "args": {}})
        for name, ts, dur in ops:
            events.append({"name": name, "ph": "X", "ts": ts, "dur": dur, "tid": 1, "pid": "CPU functions", "args": {}})
            if name == "aten::linear":
                events.append({"name": name, "ph": "s", "ts": ts, "tid": 1, "pid": "CPU functions", "id": flow, "cat": "cpu_to_cuda", "args": {}})
                events.append({"name": "volta_sgemm_128x64_nn", "ph": "f", "ts": ts + 30, "tid": 0, "pid": "CUDA functions", "id": flow, "cat": "cpu_to_cuda", "args": {}})
                events.append({"name": "volta_sgemm_128x64_nn", "ph": "X", "ts": ts + 30, "dur": 250.0, "tid": 0, "pid": "CUDA functions", "args": {}})
                flow += 1
        t = cur + 5.0
    return events


def test_bare_list_export_is_read_as_ops_steps_and_kernels(tmp_path):
    """Refused before ("trace has no profiler events", exit 2): its spans have no `cat`."""
    path = write_bare(tmp_path / "legacy.json", legacy_export(steps=3))
    a = analysis(path)
    m = a.primary
    # Steps from the ProfilerStep marks: 10 µs lead + six ops (1,330 µs) + six 20 µs gaps = 1,460 µs each.
    assert len(m.steps) == 3
    assert m.steps["duration"].to_numpy() / 1e3 == pytest.approx([1460.0] * 3, abs=1.0)
    frames = load_trace(path)
    names = set(frames.host["name"].astype(str))
    assert {"c10d::allreduce_", "Optimizer.step#Adam.step", "aten::linear"} <= names
    kernels = frames.device
    assert len(kernels) == 3 and set(kernels["name"].astype(str)) == {"volta_sgemm_128x64_nn"}
    assert kernels["dur"].sum() / 1e3 == pytest.approx(750.0)  # 3 kernels of 250 µs
    # The report names the format it read.
    assert any("autograd profiler's exporter" in w for w in a.warnings)
    p = report(path)
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr


def test_bare_list_that_is_not_a_trace_is_still_one_clear_line(tmp_path):
    path = write_bare(tmp_path / "notes.json", [{"x": 1}, {"y": 2}])
    p = report(path)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "notes.json" in p.stderr


# --- a loop of three ops, without markers -------------------------------------------------------
def test_three_op_loop_is_a_three_op_iteration(tmp_path):
    """10 iterations of rand (100 µs), square (50 µs), .to() (300 µs), 5 µs apart: each iteration
    is 465 µs start to start (the last ends with its .to(): 460 µs). Read before as a 9-op
    period: 3 steps of about 1.4 ms ("3.33333 calls per step")."""
    events, t = [], 0.0
    for _ in range(10):
        for name, dur in (("aten::rand", 100.0), ("aten::square", 50.0), ("aten::to", 300.0)):
            events.append(span("cpu_op", name, t, dur))
            t += dur + 5.0
    a = analysis(write(tmp_path / "tiny.json", events))
    steps_us = a.primary.steps["duration"].to_numpy() / 1e3
    assert len(steps_us) == 10
    assert steps_us[:-1] == pytest.approx([465.0] * 9, abs=1.0)
    assert steps_us[-1] == pytest.approx(460.0, abs=1.0)


# --- a trailing sync: the last step stays by its mark ------------------------------------------
def _step_with_kernel(start: float, host_us: float, kernel_us: float, corr: int) -> list[Event]:
    """A ProfilerStep of host_us with one launch at +100 µs (10 µs) of a kernel that starts at
    +140 µs and runs kernel_us."""
    return [
        span("user_annotation", f"ProfilerStep#{corr}", start, host_us),
        span("cpu_op", "aten::mm", start + 90.0, 30.0, **{"External id": corr}),
        span("cuda_runtime", "cudaLaunchKernel", start + 100.0, 10.0, correlation=corr, **{"External id": corr}),
        span("kernel", "sgemm_kernel", start + 140.0, kernel_us, tid=7, device=0, stream=7, correlation=corr, **{"External id": corr}),
    ]


def test_last_step_ends_by_its_mark_not_where_the_queue_drains(tmp_path):
    """Marks of 2,700 µs at 0, 2,720 and 5,440 µs. Steps 0 and 1's kernels (140 µs in, 2,600 µs
    long) end 40 µs past their marks; step 2's runs 8,000 µs, to 13,580 µs, 5,440 µs past its
    mark. Steps: 0 → 2,740 µs; 1 → 2,740–5,460 (2,720 µs); step 2's first launch (5,540 µs)
    finds the device idle (step 1's kernel ended at 5,460): the host paced it, so it ends at its
    mark's end 8,140 plus the most any step's device work trails its host (its kernel starts 140
    µs in, more than the others' 40 µs overhang): 8,280, a 2,820 µs step (8,120 µs before, and a
    "step times vary" note the steps do not support)."""
    events = [*_step_with_kernel(0.0, 2700.0, 2600.0, 0), *_step_with_kernel(2720.0, 2700.0, 2600.0, 1), *_step_with_kernel(5440.0, 2700.0, 8000.0, 2)]
    path = write(tmp_path / "trailing.json", events, deviceProperties=[{"id": 0, "name": "NVIDIA A100-SXM4-80GB"}])
    a = analysis(path)
    steps = a.primary.steps
    assert steps["duration"].to_numpy() / 1e3 == pytest.approx([2740.0, 2720.0, 2820.0], abs=1.0)
    # no step outside its marks: each starts at or after its mark and ends before the next one's
    # device work (the last: within its mark plus the lag its device work starts with)
    assert (steps["start"] >= steps["host_start"]).all()
    notes = " ".join(a.notes())
    assert "step times vary" not in notes
    assert "5.44 ms past its ProfilerStep mark" in notes


def test_last_step_a_little_longer_than_the_others_is_still_cut_at_its_marks_overhang(tmp_path):
    """The same marks; step 2's kernel runs 3,600 µs (the others 2,600): 5,580–9,180 µs, 1,040 µs
    past its mark. Its span is under 1.5x the others', so before it was read whole (a 3,720 µs
    step, 9,180 − 5,460). Launched onto an idle device, it ends no further past its mark than
    the others' work ran past theirs (40 µs) or its own work started after its mark's start
    (140 µs): 8,140 + 140 = 8,280 µs, a 2,820 µs step from 5,460."""
    events = [*_step_with_kernel(0.0, 2700.0, 2600.0, 0), *_step_with_kernel(2720.0, 2700.0, 2600.0, 1), *_step_with_kernel(5440.0, 2700.0, 3600.0, 2)]
    path = write(tmp_path / "longer.json", events, deviceProperties=[{"id": 0, "name": "NVIDIA A100-SXM4-80GB"}])
    a = analysis(path)
    assert a.primary.steps["duration"].to_numpy() / 1e3 == pytest.approx([2740.0, 2720.0, 2820.0], abs=1.0)
    assert "1.04 ms past its ProfilerStep mark" in " ".join(a.notes())


def test_device_paced_steps_stay_on_the_device_timeline(tmp_path):
    """The host runs ahead: marks of 1,000 µs at 0, 1,010 and 2,020 µs, each launching a 3,000
    µs kernel that queues behind the one before (kernels at 140–3,140, 3,140–6,140, 6,140–9,140
    µs). The device paces the steps: each lasts its kernel's 3,000 µs (the first from its mark's
    start: 3,140 µs), the last ending at 9,140 µs, past the marks (3,020 µs): ending it at its mark
    would read a 3.0 ms step as none."""
    events = []
    for i, t0 in enumerate((0.0, 1010.0, 2020.0)):
        k = 140.0 + 3000.0 * i
        events += [
            span("user_annotation", f"ProfilerStep#{i}", t0, 1000.0),
            span("cpu_op", "aten::mm", t0 + 90.0, 30.0, **{"External id": i}),
            span("cuda_runtime", "cudaLaunchKernel", t0 + 100.0, 10.0, correlation=i, **{"External id": i}),
            span("kernel", "sgemm_kernel", k, 3000.0, tid=7, device=0, stream=7, correlation=i, **{"External id": i}),
        ]
    a = analysis(write(tmp_path / "queued.json", events, deviceProperties=[{"id": 0, "name": "NVIDIA A100-SXM4-80GB"}]))
    assert a.primary.steps["duration"].to_numpy() / 1e3 == pytest.approx([3140.0, 3000.0, 3000.0], abs=1.0)


# --- an empty window ------------------------------------------------------------------------
def test_empty_window_is_said_plainly_not_reported_as_a_step(tmp_path):
    """Only a ProfilerStep mark (210.6 ms) and the profiler's own span: no op, kernel or launch.
    Reported before as a normal run with a 210.6 ms "step" of "other" time."""
    events = [
        span("user_annotation", "ProfilerStep#5", 0.0, 210600.0),
        span("Trace", "PyTorch Profiler (0)", 0.0, 210700.0),
    ]
    path = write(tmp_path / "empty.json", events, deviceProperties=[{"id": 0, "name": "Tesla T4"}])
    p = report(path)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    line = p.stderr.strip()
    assert len(line.splitlines()) == 1 and "empty.json" in line
    assert "no op, kernel or runtime call" in line and "Step time" not in p.stdout


# --- a GPU listed but idle -------------------------------------------------------------------
def test_gpu_listed_but_idle_reads_as_a_cpu_run(tmp_path):
    """The header lists a Tesla V100 but the trace holds CPU ops only (a CPU run on a GPU
    host): said so, never "Device Tesla V100" alone as if it ran the work."""
    events, t = [], 0.0
    for i in range(4):
        events.append(span("user_annotation", f"ProfilerStep#{i}", t, 1000.0))
        events.append(span("cpu_op", "aten::conv2d", t + 10.0, 600.0))
        events.append(span("cpu_op", "aten::relu", t + 620.0, 300.0))
        t += 1000.0
    path = write(tmp_path / "cpu_on_gpu_host.json", events, deviceProperties=[{"id": 0, "name": "Tesla V100-SXM2-32GB"}])
    a = analysis(path)
    assert any("Tesla V100-SXM2-32GB is listed in the trace but no kernel, copy or launch is recorded on it" in n for n in a.notes())
    p = report(path)
    assert p.returncode == 0, p.stderr
    device_line = next(line for line in p.stdout.splitlines() if line.startswith("Device"))
    assert "ran nothing: read as a CPU run" in device_line


def _t4_cpu_convolutions() -> list[Event]:
    """Four 20,000 µs ProfilerSteps on a host whose header lists a Tesla T4: two convolutions
    each (aten::conv2d → aten::mkldnn_convolution, oneDNN's CPU convolution, 7,940-7,980 µs)
    and a relu, all on the CPU; in the first step only, one 4 MB pageable copy to the T4
    (cudaMemcpyAsync, a 200 µs `Memcpy HtoD`). No kernel, no kernel launch."""
    events, t = [], 0.0
    for i in range(4):
        events += [
            span("user_annotation", f"ProfilerStep#{i}", t, 20000.0),
            span("cpu_op", "aten::conv2d", t + 100.0, 8000.0),
            span("cpu_op", "aten::convolution", t + 110.0, 7980.0),
            span("cpu_op", "aten::_convolution", t + 120.0, 7960.0),
            span("cpu_op", "aten::mkldnn_convolution", t + 130.0, 7940.0),
            span("cpu_op", "aten::relu", t + 8200.0, 1500.0),
            span("cpu_op", "aten::conv2d", t + 9800.0, 8000.0),
            span("cpu_op", "aten::mkldnn_convolution", t + 9810.0, 7980.0),
        ]
        if i == 0:
            events += [
                span("cpu_op", "aten::to", t + 18000.0, 300.0, **{"External id": 100}),
                span("cuda_runtime", "cudaMemcpyAsync", t + 18010.0, 250.0, correlation=100, **{"External id": 100}),
                span("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", t + 18030.0, 200.0, tid=7, device=0, stream=7, correlation=100,
                     bytes=4_000_000, **{"External id": 100}),
            ]
        t += 20010.0
    return events


def test_gpu_listed_with_a_copy_but_no_kernel_says_the_convolutions_ran_on_the_cpu(tmp_path):
    """The T4 holds one 200 µs copy and nothing else: it did none of the compute. Before, the
    report read "Device Tesla T4" and "GPU utilisation 1.0%" as a GPU run, and dropped the last
    3 steps ("the profiler did not capture all of their device work": they launched none)."""
    from device_rules import KERNEL_RULES

    t4 = [{"id": 0, "name": "Tesla T4", "computeMajor": 7, "computeMinor": 5, "totalGlobalMem": 15.8e9}]
    path = write(tmp_path / "t4_cpu_convs.json", _t4_cpu_convolutions(), deviceProperties=t4)
    a = analysis(path)
    # four marks of 20,000 µs, none missing device work (none launched any)
    assert a.primary.steps["duration"].to_numpy() / 1e3 == pytest.approx([20000.0] * 4, abs=1.0)
    assert not any("dropped the last" in n for n in a.notes())
    note = next(n for n in a.notes() if n.startswith("Tesla T4 ran no kernel"))
    assert "1 copy (0.20 ms in all)" in note and "convolutions ran on the CPU" in note and "aten::mkldnn_convolution" in note
    assert not {f.rule for f in a.findings} & KERNEL_RULES
    p = report(path)
    assert p.returncode == 0, p.stderr
    text = " ".join(p.stdout.split())  # the header's rows wrap in a narrow terminal
    assert "Device Tesla T4, compute capability 7.5, 14.7 GiB (listed; ran no kernel, copies only: the compute ran on the CPU)" in text


def test_public_gpu_listed_cpu_only_trace_reads_as_a_cpu_run():
    """Particle Transformer profiled with CPU activity only on a host whose header lists an A100:
    its raw events hold 7 CUDA runtime calls and no kernel, copy or memset."""
    from conftest import SHARED_TRACES

    path = SHARED_TRACES / "corpus" / "a100_host_cpu_activity_only.json.gz"
    if not path.is_file():
        pytest.skip(f"public trace not found: {path}")
    events = _raw_events(path)
    assert not [e for e in events if e.get("ph") == "X" and str(e.get("cat", "")).lower() in ("kernel", "gpu_memcpy", "gpu_memset")]
    a = analysis(path)
    assert any("A100-PCIE-40GB is listed in the trace but no kernel, copy or launch is recorded on it" in n for n in a.notes())
    assert a.summary()["gpu_utilization"] is None
    assert not a.findings or all(f.rule.startswith("cpu") or f.rule in ("dataloader-stall", "inference-mode") for f in a.findings)


# --- launches whose kernels were never recorded --------------------------------------------
def test_launches_without_kernel_records_at_the_end_are_warned(tmp_path):
    """40 launches, 100 µs apart; the first 12 have their kernel recorded, the last 28 none (the
    profiler stopped with them queued): 28 of 40 unrecorded, all after the last recorded one,
    over the 10% below which the device's activity counts as missing altogether."""
    events = []
    for i in range(40):
        t = 100.0 * i
        events.append(span("cpu_op", "aten::add", t, 40.0, **{"External id": i}))
        events.append(span("cuda_runtime", "cudaLaunchKernel", t + 5.0, 10.0, correlation=i, **{"External id": i}))
        if i < 12:
            events.append(span("kernel", "elementwise_kernel", t + 20.0, 60.0, tid=7, device=0, stream=7, correlation=i, **{"External id": i}))
    path = write(tmp_path / "backlog.json", events, deviceProperties=[{"id": 0, "name": "NVIDIA A100-SXM4-80GB"}])
    a = analysis(path)
    assert any("28 of 40 kernel launches have no kernel record" in w for w in a.warnings), a.warnings


# --- the window by recurrence --------------------------------------------------------------------
def _freeing_step(i: int, start: float) -> list[Event]:
    """A 40 ms ProfilerStep: one op launching a 1 ms kernel, ten 20 µs cudaFree calls and one
    that stalls 30 ms (as a caching allocator's trim does when memory runs short), every step."""
    out = [
        span("user_annotation", f"ProfilerStep#{i}", start, 40000.0),
        span("cpu_op", "aten::mm", start + 10.0, 50.0, **{"External id": i}),
        span("cuda_runtime", "cudaLaunchKernel", start + 20.0, 10.0, correlation=i, **{"External id": i}),
        span("kernel", "sgemm_kernel", start + 40.0, 1000.0, tid=7, device=0, stream=7, correlation=i, **{"External id": i}),
    ]
    t = start + 1100.0
    for _ in range(10):
        out.append(span("cuda_runtime", "cudaFree", t, 20.0, correlation=-1))
        t += 100.0
    out.append(span("cuda_runtime", "cudaFree", t, 30000.0, correlation=-1))
    return out


def test_work_that_recurs_in_every_step_is_never_one_time(tmp_path):
    """Four 40 ms steps, each with a 30 ms cudaFree stall (over 20x the typical 20 µs call, so
    it looked like a first-call stall): it recurs in all four steps, so it is the steps' own
    work. Before, 4 x 30 ms were cut out as one-time work and the steps read about 10 ms."""
    events = [e for i in range(4) for e in _freeing_step(i, i * 40010.0)] + [span("Trace", "PyTorch Profiler (0)", 0.0, 4 * 40010.0)]
    a = analysis(write(tmp_path / "frees.json", events, deviceProperties=[{"id": 0, "name": "NVIDIA A100-SXM4-80GB"}]))
    steps_ms = a.primary.steps["duration"].to_numpy() / 1e6
    assert steps_ms == pytest.approx([40.0] * 4, abs=0.1)
    assert not any("one-time work" in n for n in a.notes())


def test_a_stall_in_one_step_only_is_still_one_time(tmp_path):
    """The same steps, the 30 ms stall only in the first: it happens once, so it is cut out
    (40 ms less its 30 ms excess over the typical 20 µs call = 10.02 ms), and the note says so."""
    events = [e for i in range(4) for e in _freeing_step(i, i * 40010.0)] + [span("Trace", "PyTorch Profiler (0)", 0.0, 4 * 40010.0)]
    events = [e for e in events if not (e["name"] == "cudaFree" and e["dur"] > 1000 and e["ts"] > 40000.0)]
    path = write(tmp_path / "first_free.json", events, deviceProperties=[{"id": 0, "name": "NVIDIA A100-SXM4-80GB"}])
    a = analysis(path)
    assert any("one-time work" in n for n in a.notes())
    # The headline is the window as measured: four 40 ms steps, a 1 ms kernel in each (2.5% busy).
    s = a.summary()
    assert s["step_time_ms"]["mean"] == pytest.approx(40.0, abs=0.01)
    assert s["gpu_utilization"] == pytest.approx(4.0 / 160.0, abs=1e-4)
    assert sum(s["breakdown_ms"].values()) == pytest.approx(40.0, abs=0.01)
    # Beside it, named as one, the projection: the first step less the 29.98 ms excess of its
    # stall over the typical 20 µs call (10.02 ms), the others as they were: mean 32.505 ms,
    # 4 ms of kernels in 130.02 ms (3.08% busy). Before, these were the headline.
    p = s["projected"]
    assert p["step_time_ms"]["mean"] == pytest.approx((10.02 + 3 * 40.0) / 4, abs=0.01)
    assert p["gpu_utilization"] == pytest.approx(4.0 / 130.02, abs=1e-4)
    out = report(path).stdout
    step_line = next(line for line in out.splitlines() if line.startswith("Step time"))
    assert "40.00 ms mean" in step_line
    text = " ".join(out.split())  # the header's rows wrap in a narrow terminal
    projected = text[text.index("Projected") : text.index("Replayed step")]
    assert "32.50 ms mean step without the one-time work" in projected or "32.51 ms mean step without the one-time work" in projected
    assert "a projection, not a measurement" in projected
    replayed = text[text.index("Replayed step") :]
    assert replayed.startswith("Replayed step without one-time work (a projection)")


# --- long C++ kernel names never cut a figure --------------------------------------------------
SOFTMAX = (
    "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
    "at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(float*, float const*, int)"
)


@pytest.mark.parametrize("columns", [60, 80, 200])
def test_long_kernel_names_are_cut_never_the_figures(tmp_path, columns):
    """20 launches of one softmax kernel of 400 µs: 8.00 ms in all, 100.0% of kernel time. In a
    terminal of any width the name is cut ("…"), the calls, total and share columns never."""
    from rich.console import Console

    from advisor.render.text import render_text

    events = []
    for i in range(20):
        t = i * 1000.0
        events.append(span("cpu_op", "aten::softmax", t, 50.0, **{"External id": i}))
        events.append(span("cuda_runtime", "cudaLaunchKernel", t + 5.0, 10.0, correlation=i, **{"External id": i}))
        events.append(span("kernel", SOFTMAX, t + 20.0, 400.0, tid=7, device=0, stream=7, correlation=i, **{"External id": i}))
    a = analysis(write(tmp_path / "softmax.json", events, deviceProperties=[{"id": 0, "name": "NVIDIA A100-SXM4-80GB"}]))
    console = Console(width=columns, force_terminal=True, color_system=None, record=True)
    render_text(a, console)
    lines = console.export_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("Top kernels"))
    header, row = lines[at + 1], lines[at + 3]
    for word in ("calls", "total ms", "share", "precision"):
        assert word in header, header
    assert [c.strip() for c in row.split("│")[1:4]] == ["20", "8.00", "100.0%"], row
    assert "cunn_SoftMaxForward" in row or "…" in row


# --- facts stated wrongly: record_shapes --------------------------------------------------------
A100 = [{"id": 0, "name": "NVIDIA A100-SXM4-80GB", "computeMajor": 8, "computeMinor": 0, "totalGlobalMem": 85e9}]


def _fp32_matmul_steps(with_types: bool) -> list[Event]:
    """Four 9.12 ms steps, each one aten::mm (no input types on it) launching a 9 ms fp32
    `ampere_sgemm` kernel the host waits for; with_types: an aten::add per step that carries
    `Input type` and `Input Dims`, as every op does under record_shapes=True."""
    events = []
    for i in range(4):
        t = i * 9120.0
        events.append(span("user_annotation", f"ProfilerStep#{i}", t, 9120.0))
        if with_types:
            events.append(span("cpu_op", "aten::add", t + 5.0, 20.0, **{"External id": 100 + i, "Input type": ["float", "float"], "Input Dims": [[4], [4]]}))
        events.append(span("cpu_op", "aten::mm", t + 50.0, 60.0, **{"External id": i}))
        events.append(span("cuda_runtime", "cudaLaunchKernel", t + 60.0, 10.0, correlation=i, **{"External id": i}))
        events.append(span("cuda_runtime", "cudaDeviceSynchronize", t + 75.0, 9030.0, correlation=-1))
        events.append(span("kernel", "ampere_sgemm_128x64_nn", t + 100.0, 9000.0, tid=7, device=0, stream=7, correlation=i, **{"External id": i}))
    return events


@pytest.mark.parametrize(
    ("header", "with_types", "recorded"),
    [({"record_shapes": 1}, False, True), ({}, True, True), ({}, False, False)],
    ids=["header-says-so", "events-carry-types", "neither"],
)
def test_names_only_precision_never_says_record_shapes_false_when_it_was_on(tmp_path, header, with_types, recorded):
    """tf32-disabled reads the sgemm kernels' precision from their names (the aten::mm carries no
    input types). Before, it said "the trace has no input types: record_shapes=False" even where
    the header says record_shapes: 1 or other ops carry `Input type`."""
    path = write(tmp_path / "sgemm.json", _fp32_matmul_steps(with_types), deviceProperties=A100, **header)
    a = analysis(path)
    f = next(f for f in [*a.findings, *a.considered] if f.rule == "tf32-disabled")
    assert f.evidence["record_shapes"] is recorded
    assert ("record_shapes=False" in f.message) is (not recorded)
    if recorded:
        assert "record_shapes=True" in f.message


# --- facts stated wrongly: a GradScaler on a forward-only run -------------------------------------
def test_forward_only_run_gets_no_gradscaler_and_no_loss(tmp_path):
    """The same fp32 sgemm steps on a V100 (cc 7.0: the 16-bit target is fp16), with no backward
    op and no optimizer: a forward-only run. Before, tensor-cores-unused said "Autocast to float16
    with a GradScaler" and "scale the loss with torch.amp.GradScaler" there."""
    events = [{**e, "name": "volta_sgemm_128x64_nn"} if e["name"] == "ampere_sgemm_128x64_nn" else e for e in _fp32_matmul_steps(False)]
    v100 = [{"id": 0, "name": "Tesla V100-SXM2-32GB", "computeMajor": 7, "computeMinor": 0, "totalGlobalMem": 34e9}]
    a = analysis(write(tmp_path / "v100_infer.json", events, deviceProperties=v100))
    f = next(f for f in [*a.findings, *a.considered] if f.rule == "tensor-cores-unused")
    assert f.evidence["training"] is False
    for text in (f.message, f.fix.text, f.fix.snippet):
        assert "GradScaler" not in text and "loss" not in text.replace("no loss to scale", ""), text
    assert "float16" in f.fix.text


# --- facts stated wrongly: "fuses its 0 chains" ---------------------------------------------------
EW = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)"
CONV = "sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16_stage4_warpsize2x2x1_g1_tensor16x8x8_kernel"


def test_no_chain_to_fuse_is_never_promised(tmp_path):
    """Per 3.4 ms step: twice a layout transpose (300 µs), a convolution (1,000 µs) and one add
    kernel (400 µs), in that order: every elementwise kernel stands alone between others, so there
    is no chain to fuse (0 per step); what compiling removes is the 2 transposes (0.6 ms/step).
    Before, the message said "fuses its 0 chains per step into one kernel each"."""
    events, corr = [], 0
    for i in range(4):
        t0 = i * 3500.0
        events.append(span("user_annotation", f"ProfilerStep#{i}", t0, 3500.0))
        t = t0 + 50.0
        for name, dur in (("nchwToNhwcKernel", 300.0), (CONV, 1000.0), (EW, 400.0)) * 2:
            events.append(span("cpu_op", "aten::add" if name == EW else "aten::cudnn_convolution", t0 + 1 + corr % 6 * 4, 3.0, **{"External id": corr}))
            events.append(span("cuda_runtime", "cudaLaunchKernel", t0 + 2 + corr % 6 * 4, 1.0, correlation=corr, **{"External id": corr}))
            events.append(span("kernel", name, t, dur, tid=7, device=0, stream=7, correlation=corr, **{"External id": corr}))
            t += dur
            corr += 1
        events.append(span("cuda_runtime", "cudaDeviceSynchronize", t0 + 30.0, t - t0 - 25.0, correlation=-1))
    a = analysis(write(tmp_path / "no_chains.json", events, deviceProperties=A100))
    f = next(f for f in [*a.findings, *a.considered] if f.rule == "unfused-elementwise")
    assert f.evidence["fusable_chains_per_step"] == 0
    assert "chains" not in f.message and "fuses" not in f.message
    assert f.evidence["layout_transposes_per_step"] == 2 and "2 layout transposes go" in f.message


# --- facts stated wrongly: "after allowing TF32" where convolutions ran TF32 -------------------------
def test_after_allowing_tf32_names_the_switch_and_what_already_runs_tf32(tmp_path):
    """Per step on an A100: a TF32 convolution kernel (sm80_xmma ..._tf32f32..., 3 ms, from
    aten::cudnn_convolution) and an fp32 FMA sgemm (ampere_sgemm, 6 ms, from aten::mm). cuDNN's
    TF32 switch is on (its TF32 kernel ran); the matmul one looks off (no TF32 GEMM ran). Before,
    tensor-cores-unused said "after allowing TF32", as if the convolutions needed it too."""
    events, corr = [], 0
    for i in range(4):
        t0 = i * 9200.0
        events.append(span("user_annotation", f"ProfilerStep#{i}", t0, 9200.0))
        t = t0 + 100.0
        for op, name, dur in (("aten::cudnn_convolution", CONV, 3000.0), ("aten::mm", "ampere_sgemm_128x64_nn", 6000.0)):
            events.append(span("cpu_op", op, t0 + 5 + 10 * (corr % 2), 8.0, **{"External id": corr}))
            events.append(span("cuda_runtime", "cudaLaunchKernel", t0 + 6 + 10 * (corr % 2), 2.0, correlation=corr, **{"External id": corr}))
            events.append(span("kernel", name, t, dur, tid=7, device=0, stream=7, correlation=corr, **{"External id": corr}))
            t += dur
            corr += 1
        events.append(span("cuda_runtime", "cudaDeviceSynchronize", t0 + 30.0, t - t0 - 25.0, correlation=-1))
    a = analysis(write(tmp_path / "conv_tf32.json", events, deviceProperties=A100))
    f = next(f for f in [*a.findings, *a.considered] if f.rule == "tensor-cores-unused")
    assert f.evidence["tf32_off_for"] == ["matmuls"] and f.evidence["tf32_ran_for"] == ["convolutions"]
    assert "after allowing TF32 for matmuls (convolutions already run TF32)" in f.message


# --- a folder of which one file is read: titled with the file, said at the top --------------------
def test_report_of_one_file_of_a_folder_is_titled_with_the_file(tmp_path):
    """Two traces in one folder from different devices (an A100 and a V100): not one job, so the
    report reads the newer file alone. Before, it was titled with the folder's name and said which
    file it read only in a warning at the end."""
    import os

    run = tmp_path / "experiments"
    run.mkdir()
    v100 = [{"id": 0, "name": "Tesla V100-SXM2-32GB", "computeMajor": 7, "computeMinor": 0, "totalGlobalMem": 34e9}]
    old = write(run / "old_v100.json", _fp32_matmul_steps(False), deviceProperties=v100)
    new = write(run / "new_a100.json", _fp32_matmul_steps(False), deviceProperties=A100)
    os.utime(old, (1_700_000_000, 1_700_000_000))
    os.utime(new, (1_700_000_100, 1_700_000_100))
    a = analysis(run)
    assert a.run.name == "new_a100.json" and [p.name for p in a.run.files] == ["new_a100.json"]
    p = report(run)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].startswith("Run") and "new_a100.json" in lines[0] and "experiments  (" not in lines[0]
    assert "reads 1 of the 2 trace files" in lines[1]


# --- memory near the limit with the kernels' records missing; the peak in the text ---------------
def _memory(ts: float, allocated: float, reserved: float) -> Event:
    """A `[memory]` instant event as profile_memory=True writes it (device type 1: CUDA)."""
    args = {"Device Type": 1, "Device Id": 0, "Addr": 1, "Bytes": 1024, "Total Allocated": allocated, "Total Reserved": reserved}
    return {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": ts, "args": args}


def test_memory_near_limit_speaks_without_kernel_records_and_text_shows_the_peak(tmp_path):
    """Three 10 ms steps of 10 launches each, none with a kernel record (the device's activity is
    missing), and memory events reaching 45.4 GB allocated, 46.0 GB reserved, of a 47.7 GB
    device: 95.2%, over memory-near-limit's 90%. Before, the rule was not run (the kernels are
    missing) and the text report had no peak memory line (shown only with device activity)."""
    events, corr = [], 0
    for i in range(3):
        t0 = i * 10000.0
        events.append(span("user_annotation", f"ProfilerStep#{i}", t0, 10000.0))
        for j in range(10):
            t = t0 + 100.0 + j * 900.0
            events.append(span("cpu_op", "aten::mm", t, 50.0, **{"External id": corr}))
            events.append(span("cuda_runtime", "cudaLaunchKernel", t + 10.0, 10.0, correlation=corr, **{"External id": corr}))
            corr += 1
        events.append(_memory(t0 + 50.0, 45.0e9, 46.0e9))
        events.append(_memory(t0 + 500.0, 45.4e9, 46.0e9))
    gpu = [{"id": 0, "name": "NVIDIA RTX A6000", "computeMajor": 8, "computeMinor": 6, "totalGlobalMem": 47.7e9}]
    path = write(tmp_path / "no_kernels.json", events, deviceProperties=gpu)
    a = analysis(path)
    assert any("device's activity is missing" in w for w in a.warnings)
    f = next(f for f in [*a.findings, *a.considered] if f.rule == "memory-near-limit")
    assert "95%" in f.message
    p = report(path)
    assert p.returncode == 0, p.stderr
    peak = next(line for line in p.stdout.splitlines() if line.startswith("Peak memory"))
    # 45.4e9 B = 42.28 GiB of 47.7e9 B = 44.42 GiB (95.2%); reserved 46.0e9 B = 42.84 GiB
    assert "42.3 GiB allocated" in peak and "95" in peak and "42.8 GiB reserved" in peak, peak


# --- unfused-elementwise on a CPU run: what it claims, and what it says without shapes --------------
def test_unfused_elementwise_claims_cpu_runs_with_its_page_saying_how():
    """The rule reads a CPU-only run's host ops (its chains of elementwise ops): its metadata
    claims CPU traces (backed by a recording, tests/test_rule_vendors.py) and its page says
    how the CPU figure is made."""
    from advisor.engine import builtin_rules

    rule = next(r for r in builtin_rules() if r.id == "unfused-elementwise")
    assert "cpu" in rule.module.TESTED_ON
    page = " ".join(rule.doc.split())
    assert "**On a CPU**" in page and "with no chain, no finding" in page


def test_unfused_elementwise_on_a_cpu_run_without_shapes_promises_up_to_the_chains_work(tmp_path):
    """Four CPU steps of 1000 µs: aten::conv2d 600 µs, then aten::relu 150, aten::add 100 and
    aten::mul 100 µs, 5 µs apart, no shapes recorded. By hand: one chain per step (relu, add,
    mul; the conv2d is no elementwise op), 360 µs from its start to its end. Each op is taken
    without the profiler's cost of its own event (1.9 µs, PROFILER_NS_PER_EVENT's central
    figure): 148.1, 98.1, 98.1 µs. Without shapes the fused loop is bounded only, at its
    costliest member's work (relu), and no op of at most 4096 elements gives a dispatch figure:
    344.3 - 148.1 = 196.2 µs of work plus the 10 µs between the ops, 206.2 µs, less the fused
    loop's call from generated code (53.6 µs, COMPILED_HOST_NS_PER_KERNEL): 152.6 µs, 0.153 ms
    per step."""
    events = []
    for i in range(4):
        t0 = i * 1000.0
        events.append(span("user_annotation", f"ProfilerStep#{i}", t0, 1000.0))
        t = t0 + 10.0
        for name, dur in (("aten::conv2d", 600.0), ("aten::relu", 150.0), ("aten::add", 100.0), ("aten::mul", 100.0)):
            events.append(span("cpu_op", name, t, dur))
            t += dur + 5.0
    a = analysis(write(tmp_path / "cpu_ew.json", events))
    (f,) = [f for f in [*a.findings, *a.considered] if f.rule == "unfused-elementwise"]
    ev = f.evidence
    assert ev["chains_per_step"] == 1.0 and ev["chain_ops_per_step"] == 3.0
    assert ev["intermediates_from_shapes"] is False and ev["dispatch_us_per_op"] is None
    assert ev["removed_ms_per_step"] == pytest.approx(0.1526, abs=1e-3)
    assert "no shapes recorded" in f.message and "up to" in f.message
    assert all(p["up_to"] for p in ev["promise_parts"])


# --- the headline is the measured window: a public single-pass trace --------------------------------
def _raw_events(path: Path) -> list[Event]:
    import gzip

    data = gzip.decompress(path.read_bytes()) if path.name.endswith(".gz") else path.read_bytes()
    doc = json.loads(data)
    return doc if isinstance(doc, list) else doc["traceEvents"]


def _busy_share(events: list[Event]) -> tuple[float, float]:
    """(window ms, device busy share) from the raw events: the window from the first host event
    (op, annotation, runtime call) to the last event's end, device kernels/copies/memsets merged."""
    spans = [e for e in events if e.get("ph") == "X"]
    host = [e for e in spans if e.get("cat") in ("cpu_op", "user_annotation", "cuda_runtime")]
    device = sorted((e["ts"], e["ts"] + e["dur"]) for e in spans if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    start = min(e["ts"] for e in host)
    end = max([t for _, t in device] + [e["ts"] + e["dur"] for e in host])
    busy, cur = 0.0, None
    for s, t in device:
        if cur is None or s > cur[1]:
            busy += (cur[1] - cur[0]) if cur else 0.0
            cur = [s, t]
        else:
            cur[1] = max(cur[1], t)
    busy += (cur[1] - cur[0]) if cur else 0.0
    return (end - start) / 1e3, busy / (end - start)


def test_single_pass_headline_is_the_measured_window_and_the_projection_is_named():
    """The RTX 4090 TP2 job (two ranks, one cold pass each, no ProfilerStep): 387 and 422 ms of
    first-call stalls. From the raw events, rank 0's window is 1,001.49 ms with the device busy
    57.3% of it, rank 1's 1,011.50 ms. Before, the headline read 614.66 ms and 93.4% busy (the
    projection without the stalls); now those are shown beside it, named a projection."""
    from conftest import SHARED_TRACES

    folder = SHARED_TRACES / "corpus" / "rtx4090_llama_tp2"
    if not folder.is_dir():
        pytest.skip(f"public trace not found: {folder}")
    windows = {p.stem.split(".")[0]: _busy_share(_raw_events(p)) for p in sorted(folder.glob("rank*.json.gz"))}
    a = analysis(folder)
    s = a.summary()
    assert s["step_time_ms"]["mean"] == pytest.approx(max(w for w, _ in windows.values()), abs=0.05)
    primary = f"rank{a.primary.rank}"
    assert s["gpu_utilization"] == pytest.approx(windows[primary][1], abs=0.002)
    assert s["projected"] is not None and s["projected"]["step_time_ms"]["mean"] < 0.7 * s["step_time_ms"]["mean"]
    assert any("one-time work" in n and "the headline is the window as measured" in n for n in a.notes())


def test_public_forward_only_run_with_tf32_convolutions_is_described_as_it_ran():
    """SAM's automatic mask generator on an A100 (compiled, CUDA graphs): its raw events hold
    TF32 convolution kernels (`..._tf32f32...` names on convolution work) and no backward op or
    optimizer step. tensor-cores-unused used to say "after allowing TF32" and count autocast's
    casts "in the backward" there."""
    from conftest import SHARED_TRACES

    path = SHARED_TRACES / "corpus" / "a100_sam_amg_compile_cudagraph.json.gz"
    if not path.is_file():
        pytest.skip(f"public trace not found: {path}")
    events = _raw_events(path)
    names = [str(e.get("name", "")) for e in events if e.get("ph") == "X"]
    assert not any("backward" in n.lower() or n.startswith("Optimizer.") for n in names)
    assert any("tf32" in n.lower() and ("fprop" in n or "dgrad" in n or "conv" in n.lower()) for n in names)
    a = analysis(path)
    f = next(f for f in [*a.findings, *a.considered] if f.rule == "tensor-cores-unused")
    assert f.evidence["training"] is False
    assert "after allowing TF32 for matmuls (convolutions already run TF32)" in f.message
    assert "in the backward" not in f.message and "GradScaler" not in f.message + f.fix.text


# --- a single pass with a first-call stall: shares are of the measured step -----------------------
def _single_pass_with_stall() -> list[Event]:
    """One forward (a `Model_Forward` annotation, no ProfilerStep) of 20 aten::mm, each launching
    a 2,000 µs fp32 sgemm; the first launch stalls 300,000 µs (a library loaded), the others take
    10 µs. The host runs ahead (a launch every 55 µs), so the kernels run back to back from
    300,010 µs to 340,010 µs; a closing cudaDeviceSynchronize waits for them."""
    events, t, kend = [], 0.0, 0.0
    for i in range(20):
        launch = 300000.0 if i == 0 else 10.0
        events.append(span("cpu_op", "aten::mm", t, launch + 25.0, **{"External id": i}))
        events.append(span("cuda_runtime", "cudaLaunchKernel", t + 5.0, launch, correlation=i, **{"External id": i}))
        k0 = max(t + 5.0 + launch + 5.0, kend)
        events.append(span("kernel", "ampere_sgemm_128x64_nn", k0, 2000.0, tid=7, device=0, stream=7, correlation=i, **{"External id": i}))
        kend = k0 + 2000.0
        t += launch + 45.0
    events.append(span("cuda_runtime", "cudaDeviceSynchronize", t, kend - t + 5.0, correlation=-1))
    events.append(span("user_annotation", "Model_Forward", -5.0, kend + 20.0))
    return events


def test_single_pass_savings_shares_are_of_the_measured_step(tmp_path):
    """The window as measured: the annotation's -5 µs to its end at 340,025 µs, 340.03 ms. The
    projection without the stall is 40.04 ms (the kernels' 40 ms and the host's lead). Allowing
    TF32 halves the 40 ms of fp32 sgemm: 20 ms per step, 5.9% of the measured 340.03 ms step
    (it read 50%, of the projection, before)."""
    path = write(tmp_path / "single_pass.json", _single_pass_with_stall(), deviceProperties=A100)
    a = analysis(path)
    assert a.summary()["step_time_ms"]["mean"] == pytest.approx(340.03, abs=0.01)
    f = next(f for f in a.findings if f.rule == "tf32-disabled")
    assert f.saving_ms == pytest.approx(20.0, abs=0.5)
    assert f.saving_pct == pytest.approx(f.saving_ms / 340.03, rel=1e-3)
    doc = json.loads(report(path, "--format", "json").stdout)
    j = next(x for x in doc["findings"] if x["rule"] == "tf32-disabled")
    assert j["saving_share"] == pytest.approx(j["saving_ms"] / 340.03, rel=1e-3)  # a fraction
    out = report(path).stdout
    line = next(x for x in out.splitlines() if "tf32-disabled" in x and "ms/step" in x)
    assert f"({100 * j['saving_ms'] / 340.03:.1f}%)" in line  # a percent in the text


def test_public_single_pass_shares_are_of_the_measured_window():
    """The RTX 4090 TP2 job (one cold pass per rank, 387 and 422 ms of first-call stalls): the
    step every share is taken of is the window as the raw events measure it (rank 0 1,001.49 ms,
    rank 1 1,011.50 ms), not the projection without the stalls (about 615 ms)."""
    from conftest import SHARED_TRACES

    from advisor.engine import measured_step_ms

    folder = SHARED_TRACES / "corpus" / "rtx4090_llama_tp2"
    if not folder.is_dir():
        pytest.skip(f"public trace not found: {folder}")
    windows = {p.stem.split(".")[0]: _busy_share(_raw_events(p))[0] for p in sorted(folder.glob("rank*.json.gz"))}
    a = analysis(folder)
    w = a.headline()
    assert w.measured_ms < 0.7 * windows[f"rank{a.primary.rank}"]  # the replay stands on the projection
    assert measured_step_ms(w) == pytest.approx(windows[f"rank{a.primary.rank}"], abs=0.05)
