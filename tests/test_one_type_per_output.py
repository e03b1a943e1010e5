"""One type per output shape, and typed facts for the rules.

The JSON report is one msgspec type (advisor.analysis.Report) and its parts are each one type:
the summary, a rank's entry and communication, the profiler overhead, a finding
(advisor.engine.Finding) and a rank's replay (advisor.whatif.savings.RankWhatIf). The report
is their encoding, key for key, and reads back into them. The rules read the facts file through the same types `advisor profile`'s file
is checked with (advisor.facts.FactsFile), decoded once per rank: what they report is what the
recorded file says.
"""

from __future__ import annotations

import ast
import copy
import json
import pickle

import msgspec
import pytest
from conftest import REPO, SAMPLE_RUNS, count_calls, shared_trace

import advisor.engine.contract
import advisor.engine.running
from advisor.analysis import Report, analyze
from advisor.engine import Finding
from advisor.facts import FactsFile, read_facts, typed_facts, validate_facts
from advisor.metrics.summary import plain
from advisor.whatif.savings import RankWhatIf

RUN = SAMPLE_RUNS / "resnet18_cifar" / "runs" / "gpu_baseline"


def test_the_json_report_is_the_types_encoding(cli, tmp_path):
    code, out, err = cli(["report", str(RUN), "--format", "json"], cwd=tmp_path)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["findings"] and doc["whatif"] is not None
    findings = msgspec.convert(doc["findings"] + doc["considered"], list[Finding])
    assert [f.to_dict() for f in findings] == doc["findings"] + doc["considered"]
    keys = [f.encode_name for f in msgspec.structs.fields(Finding)]  # the JSON names (saving_share for saving_pct)
    assert [list(d) for d in doc["findings"]] == [keys] * len(doc["findings"])
    head = msgspec.convert(doc["whatif"], RankWhatIf)
    assert head.to_dict() == doc["whatif"] and list(doc["whatif"]) == list(RankWhatIf.__struct_fields__)


def _keys(value) -> list:
    """Every object's keys in the order they are written, nested objects' under their key."""
    if isinstance(value, dict):
        return [(k, _keys(v)) for k, v in value.items()]
    if isinstance(value, list):
        return [_keys(v) for v in value]
    return []


def test_the_whole_report_is_the_report_types_encoding(cli, tmp_path):
    code, out, err = cli(["report", str(RUN), "--format", "json"], cwd=tmp_path)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["profiler_overhead"] is not None and doc["ranks"][0]["summary"]["h2d"]["count"] > 0
    back = plain(msgspec.convert(doc, Report))
    assert back == doc and _keys(back) == _keys(doc)


def test_a_jobs_communication_is_the_report_types_encoding(monkeypatch):
    monkeypatch.setenv("ADVISOR_CACHE", "off")
    a = analyze(shared_trace("corpus/rtx4090_nccl_2rank"))
    doc = json.loads(json.dumps(a.to_dict()))
    comms = [r["communication"] for r in doc["ranks"]]
    assert len(comms) == 2 and all(c is not None and c["wait_ms_per_step"] is not None for c in comms)
    back = plain(msgspec.convert(doc, Report))
    assert back == doc and _keys(back) == _keys(doc)
    assert [plain(a.communication(m)) for m in a.ranks] == comms


def test_a_finding_keeps_its_change_through_a_pickle(monkeypatch):
    monkeypatch.setenv("ADVISOR_CACHE", "off")
    stated = analyze(RUN).view.stated
    assert stated
    for f in stated.values():
        back = pickle.loads(pickle.dumps(f))
        assert back == f and back.change is not None and type(back.change) is type(f.change)


# A recording from before `mode` and the DataLoaders' `epoch_starts` were written, and one after.
NEWER = SAMPLE_RUNS / "heldout_h200" / "resnet18_host_clock" / "fed_batch512"


def _as_recorded(typed, raw):
    """The typed value with the fields the file does not hold left out (they must be None)."""
    if isinstance(typed, dict):
        absent = {k: v for k, v in typed.items() if k not in raw}
        assert all(v is None or (isinstance(v, dict) and set(v.values()) <= {None}) for v in absent.values()), absent
        return {k: _as_recorded(v, raw[k]) for k, v in typed.items() if k in raw}
    if isinstance(typed, list) and isinstance(raw, list) and len(typed) == len(raw):
        return [_as_recorded(t, r) for t, r in zip(typed, raw, strict=True)]
    return typed


@pytest.mark.parametrize("run", [RUN, NEWER], ids=["older", "newer"])
def test_typed_facts_hold_what_the_file_records(run):
    raw = read_facts(run / "advisor_facts.json")
    doc, problems = validate_facts(raw)
    assert problems == []
    assert _as_recorded(msgspec.to_builtins(typed_facts(doc)), raw) == raw  # every field the file holds, as it holds it


def test_the_fields_the_rules_read_are_declared_and_older_files_read_as_none():
    """`mode` and each DataLoader's `batches_per_epoch` and `epoch_starts` are typed fields: read
    from a file that has them, None from one written before them, None when of the wrong type."""
    raw = read_facts(NEWER / "advisor_facts.json")
    assert raw["mode"] == "training" and raw["dataloaders"][0]["epoch_starts"]
    t = typed_facts(validate_facts(raw)[0])
    assert t.mode == raw["mode"]
    assert t.dataloaders[0].epoch_starts == raw["dataloaders"][0]["epoch_starts"]
    assert t.dataloaders[0].batches_per_epoch == raw["dataloaders"][0]["batches_per_epoch"]
    older = read_facts(RUN / "advisor_facts.json")
    assert "mode" not in older and "epoch_starts" not in older["dataloaders"][0]
    t = typed_facts(validate_facts(older)[0])
    assert t.mode is None and t.dataloaders[0].epoch_starts is None and t.dataloaders[0].batches_per_epoch is None
    bad = copy.deepcopy(raw)
    bad["mode"], bad["dataloaders"][0]["epoch_starts"] = "eval", [0, -20]
    doc, problems = validate_facts(bad)
    assert [p.split(" ")[0] for p in problems] == ["dataloaders[0].epoch_starts", "mode"]
    t = typed_facts(doc)
    assert t.mode is None and t.dataloaders[0].epoch_starts is None and t.dataloaders[0].batches_per_epoch == raw["dataloaders"][0]["batches_per_epoch"]


def test_the_rules_helpers_read_the_typed_facts():
    """epoch-end's boundaries: the recorded `epoch_starts` where the file has them, else every
    `batches_per_epoch` steps; the TF32 switches and the training mode from the typed fields."""
    from advisor.engine import is_training
    from advisor.engine.discovery import builtin_rules
    from advisor.metrics.precision import Tf32Switches

    raw = read_facts(NEWER / "advisor_facts.json")
    n = len(raw["step_times_ms"])
    loader = raw["dataloaders"][0]
    (rule,) = [r for r in builtin_rules() if r.id == "epoch-end"]
    ends = rule.module.epoch_ends(typed_facts(raw))
    assert ends is not None and ends.boundaries_recorded and ends.starts == [s for s in loader["epoch_starts"] if 0 < s < n]
    assert ends.loader.batch_size == loader["batch_size"] and ends.loader.num_workers == loader["num_workers"]
    older = copy.deepcopy(raw)
    del older["dataloaders"][0]["epoch_starts"]
    ends = rule.module.epoch_ends(typed_facts(older))
    assert ends is not None and not ends.boundaries_recorded
    assert ends.starts == list(range(loader["batches_per_epoch"], n, loader["batches_per_epoch"]))
    switches = Tf32Switches.from_facts(typed_facts(raw))
    precision_says = raw["tf32"]["float32_matmul_precision"] in ("high", "medium")
    assert switches.matmul == (True if precision_says else raw["tf32"]["matmul"]) and switches.cudnn == raw["tf32"]["cudnn"]
    # a training trace (backward ops): the trace's verdict without a recorded mode, else the facts'
    m = analyze(RUN).with_primary_frames().primary
    older = read_facts(RUN / "advisor_facts.json")
    assert "mode" not in older and is_training(m, typed_facts(older))
    assert not is_training(m, typed_facts({**older, "mode": "inference"})) and is_training(m, typed_facts({**older, "mode": "training"}))


def test_a_value_of_the_wrong_type_is_none_and_every_section_is_there():
    raw = read_facts(RUN / "advisor_facts.json")
    bad = copy.deepcopy(raw)
    bad["dataloaders"][0]["batch_size"] = "32"
    bad["compile"] = None
    bad["device"] = "an H100"
    t = typed_facts(validate_facts(bad)[0])
    assert t.dataloaders[0].batch_size is None and t.dataloaders[0].num_workers == raw["dataloaders"][0]["num_workers"]
    assert t.compile.used is None and t.device.compute_capability is None
    assert t.cpu_count == raw["cpu_count"]
    empty = typed_facts(None)
    sections = [f.name for f in msgspec.structs.fields(FactsFile) if isinstance(getattr(empty, f.name), msgspec.Struct)]
    assert "device" in sections and "compile" in sections
    assert all(v is None for s in sections for v in msgspec.structs.astuple(getattr(empty, s)))


def test_the_rules_report_the_recorded_facts_decoded_once_per_rank(monkeypatch):
    monkeypatch.setenv("ADVISOR_CACHE", "off")
    per_rank = count_calls(monkeypatch, advisor.engine.running, "typed_facts", "")
    per_rule = count_calls(monkeypatch, advisor.engine.contract, "typed_facts", "")
    a = analyze(RUN)
    assert per_rank.n == len(a.ranks) == 1 and per_rule.n == 0
    raw = read_facts(RUN / "advisor_facts.json")
    loader = raw["dataloaders"][0]
    by_rule = {f.rule: f for f in a.findings + a.considered}
    stall = by_rule["dataloader-stall"].evidence
    assert stall["dataloader_settings"] == {k: loader[k] for k in ("batch_size", "num_workers", "pin_memory", "persistent_workers", "prefetch_factor")}
    assert stall["cpu_count"] == raw["cpu_count"]
    assert by_rule["h2d-pageable-copy"].evidence["dataloader_pin_memory"] == [dl["pin_memory"] for dl in raw["dataloaders"]]
    spare = by_rule["spare-gpu-memory"].evidence
    assert spare["batch_size"] == loader["batch_size"]
    assert spare["device_memory_bytes"] == raw["device"]["total_memory_bytes"]


def _reads_of_the_raw_facts(path) -> list[str]:
    """`ctx.facts` and `ctx.fact(...)` in a rule's source: the facts as plain JSON."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        f"{path.name}:{node.lineno} ctx.{node.attr}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr in ("facts", "fact") and isinstance(node.value, ast.Name) and node.value.id == "ctx"
    ]


def test_the_shipped_rules_read_the_typed_facts(tmp_path):
    """ctx.fact(...) and ctx.facts stay for user rules (README, "Your own rules"); the shipped ones
    read ctx.recorded, and hand it (not the plain JSON) to the helpers they share."""
    rules = sorted((REPO / "rules").glob("*.py"))
    assert rules and [hit for p in rules for hit in _reads_of_the_raw_facts(p)] == []
    assert any("ctx.recorded." in p.read_text(encoding="utf-8") for p in rules)
    # the check sees the reads it is there to find
    planted = tmp_path / "r.py"
    planted.write_text("def check(ctx):\n    return first_loader(ctx.facts), ctx.fact('mode')\n", encoding="utf-8")
    assert sorted(_reads_of_the_raw_facts(planted)) == ["r.py:2 ctx.fact", "r.py:2 ctx.facts"]
