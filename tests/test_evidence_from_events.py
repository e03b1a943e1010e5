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
from corpus import analysis_of, own_runs, public_traces

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


def raw_facts(path: Path) -> dict[str, Any]:
    """The facts one trace file's own events hold, without the advisor's reading of them."""
    doc = raw_document(path)
    events = doc if isinstance(doc, list) else doc.get("traceEvents") or []
    header = {} if isinstance(doc, list) else doc
    shapes = header.get("record_shapes") in (1, True, "1", "true", "True")
    training = False
    peak = None
    for e in events:
        if not isinstance(e, dict):
            continue
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        if e.get("ph") == "X":
            if not shapes and any(args.get(k) not in (None, [], "") for k in SHAPE_KEYS):
                shapes = True
            if not training and isinstance(e.get("name"), str) and BACKWARD.search(e["name"]):
                training = True
        elif e.get("name") == "[memory]":
            kind, total = args.get("Device Type"), args.get("Total Allocated")
            if isinstance(kind, int) and kind > CPU_DEVICE and isinstance(total, (int, float)):
                peak = total if peak is None else max(peak, total)
    return {"record_shapes": shapes, "training": training, "peak_allocated": peak}


def _has_facts_file(folder: Path) -> bool:
    return folder.is_dir() and any(FACTS.match(p.name) for p in folder.iterdir())


ASSERTED: dict[str, set[str]] = {"record_shapes": set(), "training": set(), "peak_memory": set(), "forward_only_words": set()}


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


@pytest.mark.parametrize("name", TRACES)
def test_stated_facts_match_the_raw_events(name):
    check_trace(name)


# At least this many runs per check: about half of what each asserts on today over the public
# set and the project's recordings (73 runs: record_shapes 10, training 4, peak memory 19,
# forward-only wording 31).
LEAST = {"record_shapes": 5, "training": 2, "peak_memory": 10, "forward_only_words": 15}


def test_every_check_asserted_on_real_traces():
    if not public_traces():
        pytest.skip("public traces not found: ../shared/traces (the data set beside the repository) is absent; the counts are over it")
    for name in TRACES:
        if not any(name in names for names in ASSERTED.values()):
            check_trace(name)  # analysed once per process (corpus.analysis_of): cheap after the test above
    counts = {k: len(v) for k, v in ASSERTED.items()}
    assert all(counts[k] >= n for k, n in LEAST.items()), counts
