"""The facts a report states, recomputed from the raw events of every trace.

A finding's message prints facts (whether the trace records input types, whether the run
trains, its peak memory) from fields of its evidence; here each field is worked out again
from the trace file's own JSON, with nothing of the advisor's loader or metrics, and compared,
on every public trace (../shared/traces) and every recording of the project's own:

- `record_shapes`: the header says `record_shapes`, or an event carries `Input Dims`,
  `Input dims` or `Input type`. A message saying "record_shapes=False" needs neither.
- `training`: an event named like a backward (`...Backward0`, `autograd::engine::...`,
  `aten::..._backward`) or an optimizer's step. A forward-only run's findings never speak
  of a GradScaler or of the backward.
- peak memory: the largest `Total Allocated` of the `[memory]` events of a device that is
  not the CPU (`Device Type` other than 0), as the summary and the text report state it.
- forward-only or training: a run whose evidence counts backward calls has backward events.
- the device used or idle: a trace with no kernel, copy or memset record states no device
  busy share above 0 and gets no finding that rests on kernels; one whose header lists a GPU
  that ran nothing says so in its notes or warnings; one whose only device records are
  copies or memsets (no kernel, no kernel launch) is said to have run no kernel; a trace with
  kernel records is never said to have run nothing, or no kernel.
- fused chains: a message saying it "fuses its N chains" states the count of its evidence
  (N > 0), and the raw kernels hold two elementwise kernels back to back on one stream.
- autocast's casts: a message saying "N casts per step" has N > 0, a trace that records input
  types (casts are counted from them), and at most three casts per autocast-listed op per step
  (a lower-precision op casts its inputs, each of at most three; an fp32-list op one).
- shares and their units: the device busy share is the merged kernel, copy and memset time
  inside the reported steps over their time, a fraction in the summary and a percent (one
  decimal) in the text; the top kernel's share is its total time over all kernel time, a
  percent in the text's kernel table; a finding's `saving_share` is a fraction (its saving
  over the measured step: the unprofiled steps' median where recorded, else the window's
  median step as measured, one-time work and all) and the text prints it as a percent beside
  its ms/step.

The last test counts the traces each check asserted on: a check that found nothing to assert
on anywhere would pass without meaning anything.
"""

from __future__ import annotations

import gzip
import re
from pathlib import Path
from typing import Any

import orjson
import pytest
from corpus import PUBLIC_ABSENT, analysis_of, own_runs, public_traces

from advisor.render.fmt import fmt_bytes

TRACES = [*public_traces(), *own_runs()]
SHAPE_KEYS = ("Input Dims", "Input dims", "Input type")
# Named in my own words, not the engine's pattern: any backward op or autograd node, or an optimizer's step.
BACKWARD = re.compile(r"backward|^autograd::engine|^Optimizer\.", re.IGNORECASE)
CPU_DEVICE = 0
FACTS = re.compile(r"^advisor_facts(\.rank\d+)?\.json$")


def raw_document(path: Path) -> Any:
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    return orjson.loads(data)


# lower-cased `cat` of device records: Kineto's (and the 2021 schema's) kernels, copies and
# memsets, and an MTIA accelerator's device events
DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset", "mtia_ccp_events"}
# Names of elementwise kernels as PyTorch's and Triton's pointwise kernels are called.
ELEMENTWISE = re.compile(r"elementwise_kernel|vectorized_elementwise|unrolled_elementwise|triton_poi_", re.IGNORECASE)
# Ops on autocast's lists (torch.amp docs, "CUDA Ops that can autocast to float16" and "... to
# float32"): each may add casts of its inputs.
AUTOCAST_OPS = re.compile(
    r"^aten::(?:_?convolution|conv\w*|cudnn_convolution\w*|mm|addmm|bmm|baddbmm|addbmm|matmul|linear|mv|addmv|addr|prelu|chain_matmul"
    r"|_scaled_dot_product\w*|scaled_dot_product_attention|layer_norm|native_layer_norm|group_norm|native_group_norm|batch_norm|norm"
    r"|softmax|_softmax|log_softmax|_log_softmax|\w*loss\w*|binary_cross_entropy\w*|cross_entropy\w*|exp|log|pow|rsqrt|reciprocal|cumsum|sum|prod|logsumexp|dist|cdist)$"
)


# A runtime call that launches a kernel (CUDA's, the driver's, HIP's, a graph's).
LAUNCH = re.compile(r"^(?:cudaLaunch|cuLaunch|hipLaunch|hipExtLaunch|hipModuleLaunch|hipExtModuleLaunch|cudaGraphLaunch|hipGraphLaunch)")


def raw_facts(path: Path) -> dict[str, Any]:
    """The facts one trace file's own events hold, without the advisor's reading of them."""
    doc = raw_document(path)
    events = doc if isinstance(doc, list) else doc.get("traceEvents") or []
    header = {} if isinstance(doc, list) else doc
    shapes = header.get("record_shapes") in (1, True, "1", "true", "True")
    props = header.get("deviceProperties") or header.get("computeProperties") or []
    training = False
    peak = None
    device: list[tuple[float, float]] = []
    kernels: list[tuple[str, float, float, str]] = []
    autocast_ops = launches = 0
    for e in events:
        if not isinstance(e, dict):
            continue
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        if e.get("ph") == "X":
            name = e.get("name") if isinstance(e.get("name"), str) else ""
            if not shapes and any(args.get(k) not in (None, [], "") for k in SHAPE_KEYS):
                shapes = True
            if not training and BACKWARD.search(name):
                training = True
            if AUTOCAST_OPS.match(name):
                autocast_ops += 1
            if LAUNCH.match(name):
                launches += 1
            cat = str(e.get("cat", "")).lower()
            if cat in DEVICE_CATS and isinstance(e.get("ts"), (int, float)) and isinstance(e.get("dur"), (int, float)) and e["dur"] >= 0:
                device.append((float(e["ts"]), float(e["ts"]) + float(e["dur"])))
                if cat == "kernel":
                    stream = args.get("stream", e.get("tid"))
                    kernels.append((name, float(e["ts"]), float(e["dur"]), f"{e.get('pid')}/{stream}"))
        elif e.get("name") == "[memory]":
            kind, total = args.get("Device Type"), args.get("Total Allocated")
            if isinstance(kind, int) and kind > CPU_DEVICE and isinstance(total, (int, float)):
                peak = total if peak is None else max(peak, total)
    return {
        "record_shapes": shapes, "training": training, "peak_allocated": peak, "gpu_listed": bool(props),
        "device": device, "kernels": kernels, "autocast_ops": autocast_ops, "launches": launches,
        "mtia": any(isinstance(e, dict) and e.get("cat") == "mtia_ccp_events" for e in events),
    }


def busy_share(device: list[tuple[float, float]], spans: list[tuple[float, float]]) -> float:
    """Merged device time inside the spans (µs) over their total time."""
    total = sum(e - s for s, e in spans)
    if total <= 0:
        return 0.0
    busy = 0.0
    for s, e in spans:
        cut = sorted((max(a, s), min(b, e)) for a, b in device if b > s and a < e)
        cur = None
        for a, b in cut:
            if cur is None or a > cur[1]:
                busy += (cur[1] - cur[0]) if cur else 0.0
                cur = [a, b]
            else:
                cur[1] = max(cur[1], b)
        busy += (cur[1] - cur[0]) if cur else 0.0
    return busy / total


def has_chain(kernels: list[tuple[str, float, float, str]]) -> bool:
    """Two elementwise kernels back to back on one stream (the first of a fusable chain)."""
    by_stream: dict[str, list[tuple[float, str]]] = {}
    for name, ts, _dur, stream in kernels:
        by_stream.setdefault(stream, []).append((ts, name))
    for ks in by_stream.values():
        ks.sort()
        if any(ELEMENTWISE.search(a) and ELEMENTWISE.search(b) for (_, a), (_, b) in zip(ks, ks[1:], strict=False)):
            return True
    return False


def report_text(a) -> str:
    """The text report as printed, in a wide terminal (no wrapped rows)."""
    import io

    from rich.console import Console

    from advisor.render.text import render_text

    buf = io.StringIO()
    render_text(a, Console(file=buf, width=400, color_system=None, force_terminal=False), notes=Console(file=io.StringIO()))
    return buf.getvalue()


def _has_facts_file(folder: Path) -> bool:
    return folder.is_dir() and any(FACTS.match(p.name) for p in folder.iterdir())


ASSERTED: dict[str, set[str]] = {
    name: set()
    for name in (
        "record_shapes", "training", "peak_memory", "forward_only_words", "backward_calls", "device_idle", "device_used", "device_no_kernel",
        "chains", "casts", "busy_share", "top_kernel_share", "saving_share",
    )
}
CHAINS = re.compile(r"fuses its ([\d,.]+) chains")
CASTS = re.compile(r"([\d,.]+) casts per step")
SAVING_LINE = re.compile(r"^\s*\d+\.\s+(\S+)\s+([\d.]+) ms/step \(([\d.]+)%\)", re.MULTILINE)


def check_trace(name: str) -> None:
    a = analysis_of(name)
    m = a.primary
    path = m.frames.path
    raw = raw_facts(path)
    findings = [f for f in [*a.findings, *a.considered] if f.rank in (None, m.rank)]
    for f in findings:
        ev = f.evidence or {}
        if "record_shapes" in ev:
            assert ev["record_shapes"] is raw["record_shapes"], (name, f.rule, ev["record_shapes"], raw["record_shapes"])
            ASSERTED["record_shapes"].add(name)
        if "record_shapes=False" in f.message:
            assert not raw["record_shapes"], (name, f.rule, "says record_shapes=False, yet the trace records input types")
        # The facts file's `mode` decides over the trace's ops where there is one.
        if "training" in ev and not _has_facts_file(path.parent):
            assert ev["training"] is raw["training"], (name, f.rule, ev["training"], raw["training"])
            ASSERTED["training"].add(name)
    if not raw["training"] and not _has_facts_file(path.parent):
        for f in findings:
            said = " ".join([f.message, f.fix.text if f.fix else "", f.fix.snippet if f.fix else ""])
            assert "GradScaler" not in said and "in the backward" not in said, (name, f.rule, "a forward-only run")
        ASSERTED["forward_only_words"].add(name)
    if raw["peak_allocated"] is not None and len(a.ranks) == 1:
        s = a.summary()
        assert s["peak_memory_bytes"] == pytest.approx(raw["peak_allocated"]), (name, s["peak_memory_bytes"], raw["peak_allocated"])
        from advisor.render.text import _peak_memory_text

        assert _peak_memory_text(s).startswith(f"{fmt_bytes(raw['peak_allocated'])} allocated"), name
        ASSERTED["peak_memory"].add(name)


    check_device_and_shares(name, a, m, raw, findings)


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def check_device_and_shares(name: str, a, m, raw: dict[str, Any], findings: list) -> None:
    from device_rules import CPU_RUN_RULES, KERNEL_RULES

    s = a.summary()
    text = report_text(a) if len(a.ranks) == 1 else None
    # backward calls counted: the trace has backward events
    for f in findings:
        if (f.evidence or {}).get("backward_calls_per_step"):
            assert raw["training"], (name, f.rule, "counts backward calls in a forward-only run")
            ASSERTED["backward_calls"].add(name)
    # the device used or idle
    if not raw["device"]:
        assert not s["gpu_utilization"], (name, "a device busy share without a device record", s["gpu_utilization"])
        rules = {f.rule for f in a.findings} & (KERNEL_RULES if raw["gpu_listed"] else KERNEL_RULES - CPU_RUN_RULES)
        assert not rules, (name, "findings resting on kernels without a kernel record", sorted(rules))
        if raw["gpu_listed"]:
            said = " ".join([*a.notes(), *a.warnings])
            assert re.search(r"listed in the trace but no kernel|ran nothing|activity is missing|no kernel|CPU activity only|device's activity", said), (name, "a GPU listed, no device record, and nothing said")
        ASSERTED["device_idle"].add(name)
    else:
        said = " ".join([*a.notes(), *(text.splitlines()[:3] if text else [])])
        assert "ran nothing" not in said and "read as a CPU run" not in said, (name, "said to have run nothing with device records")
        ASSERTED["device_used"].add(name)
        # (an MTIA accelerator's kernels are among its ccp events, beside its waits and DMA)
        ran_kernels = bool(raw["kernels"]) or raw["mtia"]
        if not ran_kernels and raw["gpu_listed"] and not raw["launches"]:
            # copies or memsets only: the device did none of the compute, and the notes say so
            assert any("ran no kernel" in n for n in a.notes()), (name, "a device of copies only, not said")
            ASSERTED["device_no_kernel"].add(name)
        if ran_kernels:
            assert not any("ran no kernel" in n for n in a.notes()), (name, "said to have run no kernel, with kernel records")
    # fused chains
    for f in findings:
        for hit in CHAINS.finditer(f.message):
            n = _number(hit.group(1))
            # the message rounds the count per step to a whole number
            assert n > 0 and n == pytest.approx(float(f.evidence["fusable_chains_per_step"]), abs=0.5), (name, f.rule, hit.group(0), f.evidence.get("fusable_chains_per_step"))
            assert has_chain(raw["kernels"]), (name, f.rule, "fuses chains, yet no two elementwise kernels run back to back")
            ASSERTED["chains"].add(name)
    # autocast's casts
    steps = max(len(m.steps), 1)
    for f in findings:
        for hit in CASTS.finditer(f.message):
            n = _number(hit.group(1))
            assert n > 0, (name, f.rule, hit.group(0))
            assert raw["record_shapes"], (name, f.rule, "casts counted without input types")
            assert n <= 3 * raw["autocast_ops"] / steps + 1e-9, (name, f.rule, n, raw["autocast_ops"], steps)
            ASSERTED["casts"].add(name)
    # the device busy share: a fraction in the summary, a percent in the text
    if raw["device"] and len(a.ranks) == 1 and s.get("projected") is None and len(m.steps):
        base = a.with_primary_frames().primary.frames.base_us
        spans = [(base + st / 1e3, base + en / 1e3) for st, en in zip(m.steps["start"], m.steps["end"], strict=True)]
        share = busy_share(raw["device"], spans)
        assert s["gpu_utilization"] == pytest.approx(share, abs=0.005), (name, s["gpu_utilization"], share)
        line = next(x for x in text.splitlines() if "utilisation" in x and "of step time" in x)
        assert f"{100 * s['gpu_utilization']:.1f}% of step time" in line, (name, line)
        ASSERTED["busy_share"].add(name)
    # the top kernel's share of kernel time: a percent in the text's table
    if raw["kernels"] and text is not None:
        totals: dict[str, float] = {}
        for kname, _ts, dur, _stream in raw["kernels"]:
            totals[kname] = totals.get(kname, 0.0) + dur
        whole = sum(totals.values())
        if whole > 0 and "Top kernels" in text:
            top = max(totals.values()) / whole
            table = text[text.index("Top kernels") :]
            shown = [float(x) for x in re.findall(r"│\s*([\d.]+)%\s*│", table.split("\n\n")[0])]
            assert shown and shown[0] == pytest.approx(100 * top, abs=0.06), (name, shown[:2], 100 * top)
            ASSERTED["top_kernel_share"].add(name)
    # a saving's share: a fraction in the JSON, a percent in the text
    if text is not None:
        from advisor.engine import measured_step_ms

        doc = a.to_dict()
        w = a.headline()
        printed = {r: (float(ms), float(p)) for r, ms, p in SAVING_LINE.findall(text)}
        for j in doc["findings"]:
            if not j.get("saving_ms") or j.get("saving_share") is None or (j.get("evidence") or {}).get("unprofiled_step_ms"):
                continue
            assert 0 <= j["saving_share"] <= 1, (name, j["rule"], j["saving_share"])
            step = measured_step_ms(w) if w is not None else float(s["step_time_ms"]["median"])
            assert j["saving_share"] == pytest.approx(j["saving_ms"] / step, rel=0.01), (name, j["rule"], j["saving_share"], j["saving_ms"], step)
            if j["rule"] in printed:
                assert printed[j["rule"]][1] == pytest.approx(100 * j["saving_share"], abs=0.051), (name, j["rule"], printed[j["rule"]])
            ASSERTED["saving_share"].add(name)


@pytest.mark.parametrize("name", TRACES)
def test_stated_facts_match_the_raw_events(name):
    check_trace(name)


# At least this many runs per check: about half of what each asserts on today over the public
# set and the project's recordings (76 runs: record_shapes 10, training 4, peak memory 19,
# forward-only wording 31, backward calls 6, device idle 27, device used 48, device of copies
# only 2, fused chains 13, casts 6, busy share 41, top kernel share 41, saving share 48).
LEAST = {
    "record_shapes": 5, "training": 2, "peak_memory": 10, "forward_only_words": 15, "backward_calls": 3, "device_idle": 13,
    "device_used": 24, "device_no_kernel": 1, "chains": 6, "casts": 3, "busy_share": 20, "top_kernel_share": 20, "saving_share": 24,
}


def test_every_check_asserted_on_real_traces():
    if PUBLIC_ABSENT in public_traces():
        pytest.skip("public traces not found: ../shared/traces (the data set beside the repository) is absent; the counts are over it")
    for name in TRACES:
        if not any(name in names for names in ASSERTED.values()):
            check_trace(name)  # analysed once per process (corpus.analysis_of): cheap after the test above
    counts = {k: len(v) for k, v in ASSERTED.items()}
    print("traces asserted on, per check:", counts)
    assert all(counts[k] >= n for k, n in LEAST.items()), counts
