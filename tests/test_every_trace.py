"""Invariants of the reading of a trace, checked on every real trace in reach.

Each check is computed from the analysis and the trace's own events, so it holds (or fails)
on any trace, not on one picked to show a case:

- the iteration: a step found without `ProfilerStep` markers holds a whole forward of the
  root module (the outermost `nn.Module` call, or the outermost forward annotation where the
  trace records no modules), and no step holds two forwards of it; the notes say how the
  iteration was found;
- one-time work (a runtime call that happens once and lasts far longer than the others of its
  kind: a library load in the first launch, context creation, autotuning) is never a per-step
  saving: the ranked savings together stay within the step without it;
- missing or skewed device data (launches without kernel records, copy calls without copy
  records, a device timeline outside the host's) gets a warning, and no finding that rests on
  the device's records;
- without unprofiled steps, the profiler-cost calibration of host time never turns a window
  whose device idles most of the step into one the device holds;
- no step outside its marks: on a trace with `ProfilerStep` marks, every step starts at or
  after the first mark's start; where the host paced the last step (its work was launched
  onto an idle device, after other steps with device work) every step ends by the last
  mark's end, plus no more than the other
  steps' device work ran past their own marks (or the last step's work started after its
  mark's start): a trailing synchronisation never stretches the last step past its mark.
  Where the device paces the steps (the last step's work queued behind earlier work), the
  steps lie on the device's timeline, behind the marks, and the last is no longer than 1.5x
  the longest other step (no drained queue);
- a finding's source line (where to look) is never PyTorch's own code or Python's: the
  profiler writes an installed package's file under its own folder (`torchvision/models/
  resnet.py`), as it writes the user's script (`train.py`).

They run over `public_traces()` (../shared/traces, skipped with the reason when absent) and
`own_runs()` (this project's recordings); each run is analysed once per process.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest
from conftest import check_invariant_minimum
from corpus import analysis_of, own_runs, public_traces
from device_rules import COPY_RULES, KERNEL_RULES

ALL_RUNS = public_traces() + own_runs()

MODULE_CALL = re.compile(r"^nn\.Module: ")
FORWARD_ANNOTATION = re.compile(r"(?i)(?:^|[^a-z])forward(?:[^a-z]|$)")
LAUNCH_CALL = re.compile(
    r"^(cudaLaunch|cuLaunch|hipLaunch|hipExtLaunch|hipModuleLaunch|hipExtModuleLaunch|cudaGraphLaunch|hipGraphLaunch)"
)
COPY_CALL = re.compile(r"^(cuda|hip)Memcpy")


# (checks: iteration, one-time, device-gaps, calibration, rules-run, source)
# Runs where an invariant does not hold for a reason the trace itself sets (strict: the day
# it holds, the mark must go). Keyed by (check, run).
KNOWN: dict[tuple[str, str], str] = {}

# On how many traces each check must reach its assertion: (with ../shared/traces, without it).
# Counted on the traces in reach when the counts were introduced (73 runs: 43 public, 30 of
# this project's own); a case where the check does not apply is a skip that says why, and the
# run's summary prints the counts. The project's own recordings all have ProfilerStep markers,
# unprofiled steps or a busy device, and complete device records: without the public traces,
# the iteration, calibration and device-data checks have nothing to assert on.
MINIMUM: dict[str, tuple[int, int]] = {
    "iteration": (24, 0),
    # asserted on 51 runs when introduced (21 public traces and the 30 own recordings have marks)
    "step-marks": (45, 25),
    "one-time": (73, 30),
    "device-gaps": (7, 0),
    "calibration": (17, 0),
    "rules-run": (73, 30),
    "source": (73, 30),
}


def _params(check: str) -> list:
    out = []
    for name in ALL_RUNS:
        why = KNOWN.get((check, name))
        marks = [pytest.mark.xfail(reason=why, strict=True)] if why else []
        out.append(pytest.param(name, id=name, marks=marks))
    return out


def _full(name: str):
    """The analysis and its slowest rank with frames loaded (the raw events)."""
    a = analysis_of(name)
    return a, a.with_primary_frames().primary


def _outermost(ts: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Which spans are in no other span of the set (ties: the longer one is the outer)."""
    order = np.lexsort((-end, ts))
    keep = np.zeros(len(ts), dtype=bool)
    last = np.iinfo(np.int64).min
    for i in order:
        if end[i] > last:
            keep[i] = ts[i] >= last
            last = max(last, end[i])
    return keep


def root_forwards(host: pd.DataFrame) -> pd.DataFrame:
    """The root module's forward calls, per thread: the outermost `nn.Module` calls, else the
    outermost annotations named forward. Empty when the trace records neither."""
    names = host["name"].astype(str)
    for sel in (
        (host["kind"].astype(str) == "python") & names.str.match(MODULE_CALL.pattern),
        (host["kind"].astype(str) == "annotation") & names.str.contains(FORWARD_ANNOTATION.pattern),
    ):
        calls = host[sel.to_numpy()]
        if len(calls) == 0:
            continue
        out = []
        for _, g in calls.groupby(calls["tid"].astype(str), sort=False):
            keep = _outermost(g["ts"].to_numpy(np.int64), g["end"].to_numpy(np.int64))
            out.append(g[keep])
        return pd.concat(out).assign(name=lambda d: d["name"].astype(str), tid=lambda d: d["tid"].astype(str))
    return host.iloc[:0]


MIN_PASS_OPS = 8  # a repeated sequence of fewer operators is a loop inside the model


def top_level_ops(host: pd.DataFrame, start: int, end: int) -> np.ndarray:
    """Names of the outermost operators and annotations of the busiest thread in [start, end]."""
    kinds = host["kind"].astype(str)
    h = host[((kinds == "op") | (kinds == "annotation")).to_numpy()]
    h = h[(h["ts"] >= start).to_numpy() & (h["end"] <= end).to_numpy()]
    if len(h) == 0:
        return np.array([], dtype=object)
    tid = h["tid"].astype(str).value_counts().index[0]
    h = h[(h["tid"].astype(str) == tid).to_numpy()]
    keep = _outermost(h["ts"].to_numpy(np.int64), h["end"].to_numpy(np.int64))
    h = h[keep].sort_values("ts", kind="stable")
    return h["name"].astype(str).to_numpy()


def repeats_from_start(names: np.ndarray) -> int | None:
    """The length of a sequence the names repeat from the first at least twice (to the end,
    the last repeat possibly cut short), or None."""
    n = len(names)
    for p in range(MIN_PASS_OPS, n // 2 + 1):
        if names[p] == names[0] and (names[p:] == names[: n - p]).all():
            return p
    return None


# --- the iteration ------------------------------------------------------------------------
@pytest.mark.invariant("iteration", minimum=MINIMUM["iteration"][0], minimum_own=MINIMUM["iteration"][1])
@pytest.mark.parametrize("name", _params("iteration"))
def test_iteration_holds_one_whole_forward_of_the_root_module(name):
    a, m = _full(name)
    frames = m.frames
    if len(frames.steps):
        pytest.skip("not applicable: the user's ProfilerStep markers are the iteration")
    notes = " ".join(n for n in a.notes())
    assert "no ProfilerStep markers" in notes, "the notes say how the iteration was found"
    if len(m.steps) == 0:
        pytest.skip("not applicable: no iteration found (the notes say so)")
    roots = root_forwards(frames.host)
    if len(roots) == 0:
        # nothing names the model's forward: a step whose own top-level operators repeat one
        # sequence from its start (a model called in a loop) holds several passes of it
        for i, (s, e) in enumerate(zip(m.steps["host_start"], m.steps["host_end"], strict=True)):
            period = repeats_from_start(top_level_ops(frames.host, int(s), int(e)))
            assert period is None, f"step {i} repeats a sequence of {period} top-level operators: iterations merged"
        return  # asserted: no step repeats a sequence of top-level operators
    r_ts, r_end = roots["ts"].to_numpy(np.int64), roots["end"].to_numpy(np.int64)
    steps = m.steps
    s_ts, s_end = steps["host_start"].to_numpy(np.int64), steps["host_end"].to_numpy(np.int64)
    r_name, r_tid = roots["name"].to_numpy(), roots["tid"].to_numpy()
    # the loop's thread: the one whose forwards fall in the most steps (a server's other
    # threads serve their own requests meanwhile)
    idx = np.searchsorted(s_ts, r_ts, side="right") - 1
    ok = (idx >= 0) & (r_end <= s_end[np.maximum(idx, 0)])
    per_thread = pd.Series(idx[ok]).groupby(r_tid[ok]).nunique() if ok.any() else pd.Series(dtype=np.int64)
    loop_tid = per_thread.idxmax() if len(per_thread) else None
    for i, (s, e) in enumerate(zip(s_ts, s_end, strict=True)):
        inside = (r_ts >= s) & (r_end <= e)
        assert inside.any() or len(steps) == 1, (
            f"step {i} ({(e - s) / 1e6:.2f} ms) holds no whole forward of the root module "
            f"({r_name[0]}): it is a part of an iteration"
        )
        # on one thread, a step holds one forward of a module: a single step over the whole
        # window that holds several is iterations merged into one (a server's other threads
        # may run the same module meanwhile)
        mine = inside & (r_tid == loop_tid)
        if mine.any():
            names, counts = np.unique(r_name[mine], return_counts=True)
            assert counts.max() <= 1, f"step {i} holds {counts.max()} forwards of {names[counts.argmax()]}: iterations merged"


# --- no step outside its marks ----------------------------------------------------------------
MARK = re.compile(r"^ProfilerStep#\d+$")
MARK_TOL_NS = 5_000  # a few µs: the loader rounds µs floats to ns
LAST_STEP_SPAN = 1.5  # a device-paced last step at most this many times the longest other step


def raw_marks_ns(m) -> np.ndarray:
    """The ProfilerStep marks as the trace file writes them ([start, end] per mark, ns from the
    loader's base time), read from the file's own JSON."""
    import gzip

    import orjson

    data = m.frames.path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    doc = orjson.loads(data)
    events = doc if isinstance(doc, list) else doc.get("traceEvents") or []
    out = [
        (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)))
        for e in events
        if isinstance(e, dict) and e.get("ph") == "X" and isinstance(e.get("name"), str) and MARK.match(e["name"]) and "ts" in e
    ]
    return (np.array(out, dtype=np.float64).reshape(-1, 2) - m.frames.base_us) * 1000.0


def launched_per_mark(m) -> list[tuple[float, float] | None]:
    """Per reported step, the device work launched inside its mark (launch call within the
    mark): (first start, last end) in ns, None where it launched none."""
    rt, dev = m.frames.runtime, m.frames.device
    out: list[tuple[float, float] | None] = [None] * len(m.steps)
    if len(rt) == 0 or len(dev) == 0:
        return out
    calls = rt[(rt["correlation"] >= 0).to_numpy()].drop_duplicates("correlation")
    joined = dev[["correlation", "ts", "end"]].merge(calls[["correlation", "ts", "end"]].rename(columns={"ts": "l_ts", "end": "l_end"}), on="correlation")
    l_ts, l_end = joined["l_ts"].to_numpy(np.float64), joined["l_end"].to_numpy(np.float64)
    for k, (hs, he) in enumerate(zip(m.steps["host_start"], m.steps["host_end"], strict=True)):
        mine = (l_ts >= hs) & (l_end <= he)
        if mine.any():
            out[k] = (float(joined["ts"].to_numpy(np.float64)[mine].min()), float(joined["end"].to_numpy(np.float64)[mine].max()))
    return out


def last_step_queued(m) -> bool:
    """Whether the last step's device work queued behind earlier work: some device activity
    launched (or started) before the step's first launch was still running at that launch."""
    rt, dev = m.frames.runtime, m.frames.device
    if len(rt) == 0 or len(dev) == 0:
        return False
    last = m.steps.iloc[-1]
    calls = rt[(rt["correlation"] >= 0).to_numpy()].drop_duplicates("correlation")
    joined = dev[["correlation", "ts", "end"]].merge(calls[["correlation", "ts", "end"]].rename(columns={"ts": "l_ts", "end": "l_end"}), on="correlation", how="left")
    l_ts, l_end = joined["l_ts"].to_numpy(np.float64), joined["l_end"].to_numpy(np.float64)
    mine = (l_ts >= last["host_start"]) & (l_end <= last["host_end"])
    if not mine.any():
        return False
    first = l_ts[mine].min()
    d_ts, d_end = joined["ts"].to_numpy(np.float64), joined["end"].to_numpy(np.float64)
    earlier = ~mine & ((l_ts < first) | (d_ts < first))
    return bool((earlier & (d_end > first)).any())


@pytest.mark.invariant("step-marks", minimum=MINIMUM["step-marks"][0], minimum_own=MINIMUM["step-marks"][1])
@pytest.mark.parametrize("name", _params("step-marks"))
def test_no_step_outside_its_marks(name):
    a, m = _full(name)
    marks = raw_marks_ns(m)
    if len(marks) == 0:
        pytest.skip("not applicable: the trace has no ProfilerStep marks")
    if len(m.steps) == 0:
        pytest.skip("not applicable: no step reported")
    lo, hi = float(marks[:, 0].min()), float(marks[:, 1].max())
    starts, ends = m.steps["start"].to_numpy(np.float64), m.steps["end"].to_numpy(np.float64)
    assert (starts >= lo - MARK_TOL_NS).all(), f"a step starts {(lo - starts.min()) / 1e3:.1f} µs before the first mark"
    with_work = [sp for sp in launched_per_mark(m) if sp is not None] if m.has_device else []
    if len(with_work) < 2:
        return  # asserted: no step starts before the marks (one step has no other to measure its tail by)
    if not last_step_queued(m):
        # the host paced the last step (or there is no device): every step ends by the last
        # mark's end, plus no more than the other steps' device work ran past their own marks
        # or the last step's own work started after its mark's start (a trailing sync, a
        # queue drained at the end, never stretches it)
        spans = launched_per_mark(m)
        he = m.steps["host_end"].to_numpy(np.float64)
        hs = m.steps["host_start"].to_numpy(np.float64)
        over = [sp[1] - he[k] for k, sp in enumerate(spans[:-1]) if sp is not None]
        lag = spans[-1][0] - hs[-1] if spans[-1] is not None else 0.0
        allowed = max([0.0, lag, *over])
        assert (ends <= hi + allowed + MARK_TOL_NS).all(), (
            f"the last step ends {(ends.max() - hi) / 1e6:.3f} ms past the last mark, its work launched onto an idle device, "
            f"where the other steps' work ran at most {allowed / 1e6:.3f} ms past theirs"
        )
    else:
        d = m.steps["duration"].to_numpy(np.float64)
        if len(d) > 1:
            assert d[-1] <= LAST_STEP_SPAN * d[:-1].max(), f"the device-paced last step lasts {d[-1] / 1e6:.2f} ms, others at most {d[:-1].max() / 1e6:.2f} ms"


# --- one-time work ------------------------------------------------------------------------
ONE_TIME_FACTOR = 20.0  # a call this many times longer than the median of its kind...
ONE_TIME_MIN_NS = 5_000_000  # ...and at least 5 ms, happening once
WAIT_CALL = re.compile(r"synchroni[sz]e|wait|query")


def one_time_ns(m) -> float:
    """Time in the steps spent in runtime calls that happen once: far longer than the other
    calls of their name (the first launch loading a library, context creation, autotuning)."""
    rt = m.frames.runtime
    if len(rt) == 0:
        return 0.0
    dur = (rt["end"] - rt["ts"]).to_numpy(np.int64)
    names = rt["name"].astype(str).to_numpy()
    med = pd.Series(dur).groupby(names).transform("median").to_numpy()
    count = pd.Series(dur).groupby(names).transform("size").to_numpy()
    # a wait for the device lasts as long as the device's work: not one-time work of its own
    waits = pd.Series(names).str.contains(WAIT_CALL.pattern, case=False).to_numpy()
    outlier = (dur >= ONE_TIME_MIN_NS) & (dur > ONE_TIME_FACTOR * med) & (count >= 3) & ~waits
    ts = rt["ts"].to_numpy(np.int64)
    s, e = m.steps["start"].to_numpy(np.int64), m.steps["end"].to_numpy(np.int64)
    idx = np.searchsorted(s, ts, side="right") - 1
    in_step = (idx >= 0) & (ts < e[np.maximum(idx, 0)])
    return float(dur[outlier & in_step].sum())


@pytest.mark.invariant("one-time", minimum=MINIMUM["one-time"][0], minimum_own=MINIMUM["one-time"][1])
@pytest.mark.parametrize("name", _params("one-time"))
def test_no_per_step_saving_from_work_done_once(name):
    a, m = _full(name)
    if len(m.steps) == 0:
        pytest.skip("not applicable: no step found")
    # without work done once (0 ms), the check still holds: the ranked fixes save at most the step
    once = one_time_ns(m) / 1e6 / len(m.steps)
    step = float(m.steps["duration"].mean()) / 1e6
    saved = sum(f.saving_ms or 0.0 for f in a.findings if f.rank in (None, m.rank))
    assert saved <= step - once + 0.01 * step, (
        f"the ranked fixes save {saved:.1f} ms of a {step:.1f} ms step, {once:.1f} ms of which is work done once"
    )
    for f in a.findings:
        assert (f.saving_ms or 0.0) <= step - once + 0.01 * step, f"{f.rule} saves {f.saving_ms:.1f} ms, more than the steady step"


# --- missing or skewed device data ----------------------------------------------------------
def device_gaps(m) -> list[str]:
    """What the trace's own events say is missing or skewed on the device side."""
    frames = m.frames
    rt, dev, host = frames.runtime, frames.device, frames.host
    out = []
    rt_names = rt["name"].astype(str) if len(rt) else pd.Series([], dtype=str)
    launches = int(rt_names.str.match(LAUNCH_CALL.pattern).sum()) if len(rt) else 0
    copies = int(rt_names.str.match(COPY_CALL.pattern).sum()) if len(rt) else 0
    kinds = dev["kind"].astype(str) if len(dev) else pd.Series([], dtype=str)
    kernels = int((kinds == "kernel").sum())
    if launches >= 20 and kernels < 0.1 * launches:
        out.append(f"{launches} launches, {kernels} kernel records")
    elif launches + copies > 0 and len(dev) == 0:
        out.append(f"{launches + copies} launch and copy calls, no device records")
    if copies >= 5 and int((kinds == "memcpy").sum()) == 0:
        out.append(f"{copies} copy calls, no copy records")
    if len(dev) and len(host):
        h0, h1 = int(host["ts"].min()), int(host["end"].max())
        d0, d1 = int(dev["ts"].min()), int(dev["end"].max())
        if d0 >= h1 or d1 <= h0:
            out.append("device timeline outside the host's")
    if len(dev) and len(rt) and not (host["kind"].astype(str) == "op").any():
        out.append("host operators missing")
    if len(dev) and len(rt) and not out:
        # launched work that waits to start with nothing on the device meanwhile
        d = dev.sort_values("ts", kind="stable")
        launch_end = d["correlation"].map(rt.drop_duplicates("correlation").set_index("correlation")["end"]).to_numpy(np.float64)
        prev = np.concatenate([[-np.inf], np.maximum.accumulate(d["end"].to_numpy(np.float64))[:-1]])
        waited = d["ts"].to_numpy(np.float64) - np.maximum(launch_end, prev)
        waited = waited[np.isfinite(waited)]
        if len(waited) and waited.max() > 0.5 * (frames.window[1] - frames.window[0]):
            out.append("device work waited unrecorded")
    return out


IDLE_RULES = {"gpu-idle", "launch-bound", "host-sync", "step-time-variance", "straggler", "communication-exposed", "dataloader-stall"}


@pytest.mark.invariant("device-gaps", minimum=MINIMUM["device-gaps"][0], minimum_own=MINIMUM["device-gaps"][1])
@pytest.mark.parametrize("name", _params("device-gaps"))
def test_missing_or_skewed_device_data_is_warned_and_not_advised_on(name):
    a, m = _full(name)
    gaps = device_gaps(m)
    if not gaps:
        pytest.skip("not applicable: the trace's own events show no missing or skewed device data")
    said = [w for w in a.warnings if re.search(r"device|kernel|copy|host's operators", w, re.IGNORECASE)]
    assert said, f"{'; '.join(gaps)}: no warning"
    rules = {f.rule for f in a.findings}
    if any("waited unrecorded" in g for g in gaps):
        assert not rules & IDLE_RULES, f"{'; '.join(gaps)}: idle-based findings {sorted(rules & IDLE_RULES)}"
    if any("host operators" in g for g in gaps):
        assert not rules & (IDLE_RULES | {"cpu-tensor-then-copy", "empty-cache", "allocator-churn"}), f"{'; '.join(gaps)}: {sorted(rules)}"
    if any("kernel" in g or "device records" in g or "outside" in g for g in gaps):
        assert not rules & KERNEL_RULES, f"{'; '.join(gaps)}: device-based findings {sorted(rules & KERNEL_RULES)}"
    if any("copy" in g for g in gaps):
        assert not rules & COPY_RULES, f"{'; '.join(gaps)}: copy findings {sorted(rules & COPY_RULES)}"


# --- the profiler's cost without unprofiled steps --------------------------------------------
HOST_BOUND = 0.5  # the device busy at most half the step: the host holds it
DEVICE_BOUND = 0.5  # the device busy more than this share of the replayed step: the device holds it


@pytest.mark.invariant("calibration", minimum=MINIMUM["calibration"][0], minimum_own=MINIMUM["calibration"][1])
@pytest.mark.parametrize("name", _params("calibration"))
def test_calibration_without_unprofiled_steps_keeps_a_host_bound_window_host_bound(name):
    a, m = _full(name)
    w = a.headline()
    if w is None or not m.has_device or len(m.steps) == 0:
        pytest.skip("not applicable: no replayed step with device work")
    if w.unprofiled_ms is not None:
        pytest.skip("not applicable: unprofiled steps calibrate the host's time")
    busy = (m.utilization.to_numpy(np.float64) * m.steps["duration"].to_numpy(np.float64) / 1e6)
    measured_share = float(np.median(m.utilization.to_numpy(np.float64)))
    if measured_share > HOST_BOUND:
        pytest.skip(f"not applicable: the device is busy more than {HOST_BOUND:.0%} of the measured step")
    replayed_share = float(np.median(busy)) / max(w.baseline_ms, 1e-9)
    assert replayed_share <= DEVICE_BOUND, (
        f"the device is busy {measured_share:.0%} of the measured step but {replayed_share:.0%} of the "
        f"replayed one (host time x{w.host_scale:.2f}): the calibration made a host-bound window device-bound"
    )


# --- every rule runs to its end -------------------------------------------------------------
@pytest.mark.invariant("rules-run", minimum=MINIMUM["rules-run"][0], minimum_own=MINIMUM["rules-run"][1])
@pytest.mark.parametrize("name", _params("rules-run"))
def test_no_rule_fails_on_a_real_trace(name):
    # A rule that raises is skipped with a warning so the report goes on; on a real trace that
    # is a bug in the rule (a fact read the wrong way, a column assumed), never the trace's fault.
    failed = [w for w in analysis_of(name).warnings if re.search(r"^rule \S+ failed on rank", w)]
    assert not failed, "; ".join(failed)


# --- the user's line is the user's ---------------------------------------------------------
# PyTorch's packages and Python's own as the profiler names their files (the path under the
# sys.path folder that holds them), and as their absolute paths read.
NOT_THE_USERS = re.compile(
    r"^(?:torch|torchvision|torchaudio|torchtext|functorch|multiprocessing|concurrent|asyncio|importlib|threading\.py)[/(]"
    r"|/(?:site-packages|dist-packages)/torch(?:vision|audio)?/"
)


@pytest.mark.invariant("source", minimum=MINIMUM["source"][0], minimum_own=MINIMUM["source"][1])
@pytest.mark.parametrize("name", _params("source"))
def test_a_findings_source_line_is_not_pytorchs_or_pythons_own_code(name):
    a = analysis_of(name)
    lines = [(f.rule, line) for f in [*a.findings, *a.considered] for line in f.evidence.get("source") or []]
    wrong = [(rule, line) for rule, line in lines if NOT_THE_USERS.search(str(line))]
    assert not wrong, f"source lines in library code: {wrong[:3]}"


# --- each check asserted on enough traces (runs last: every case of the file before it) --------
@pytest.mark.parametrize("invariant", sorted(MINIMUM))
def test_each_check_asserted_on_its_minimum_of_traces(invariant):
    check_invariant_minimum(invariant)
