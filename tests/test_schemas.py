"""The published JSON Schemas (docs/schemas/) are the ones the output types generate, and what
the advisor writes validates against them: reports of real runs (CPU, H100, V100, several
ranks), baselines and gate results."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import msgspec
import pytest
from conftest import REPO, SAMPLE_RUNS, shared_trace

from advisor.schemas import SCHEMAS, check, json_schema, schema_text

jsonschema = pytest.importorskip("jsonschema")

RUNS = SAMPLE_RUNS / "resnet18_cifar" / "runs"


def validate(name: str, doc: dict) -> None:
    """Both ways: the JSON Schema a consumer would use, and the types it was generated from."""
    jsonschema.Draft202012Validator(json_schema(name)).validate(doc)
    check(name, doc)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_published_schema_is_the_generated_one(name):
    published = REPO / "docs" / "schemas" / f"{name}.schema.json"
    assert published.read_text() == schema_text(name), "regenerate with: python -m advisor.schemas docs/schemas"
    jsonschema.Draft202012Validator.check_schema(json.loads(published.read_text()))


def _report(cli, tmp_path: Path, run: Path) -> dict:
    code, out, err = cli(["report", str(run), "--format", "json"], cwd=tmp_path)
    assert code == 0, err
    return json.loads(out)


@pytest.mark.parametrize("run", sorted(p.name for p in RUNS.iterdir() if p.is_dir()))
def test_reports_of_the_sample_runs_validate(cli, tmp_path, run):
    doc = _report(cli, tmp_path, RUNS / run)
    validate("report", doc)


@pytest.mark.parametrize("rel", ["v100_resnet50_nw0", "misc/a100_80gb_train.json.gz"])
def test_reports_of_public_traces_validate(cli, tmp_path, rel):
    validate("report", _report(cli, tmp_path, shared_trace(rel)))


def test_multi_rank_report_validates(cli, tmp_path):
    ranks = shared_trace("a100_two_ranks")
    doc = _report(cli, tmp_path, ranks)
    assert len(doc["ranks"]) > 1
    validate("report", doc)


def test_a_report_with_an_unknown_or_missing_key_does_not_validate(cli, tmp_path):
    doc = _report(cli, tmp_path, RUNS / "gpu_baseline")
    extra = copy.deepcopy(doc)
    extra["summary"]["breakdown_ms"]["idle"] = 1.0
    missing = copy.deepcopy(doc)
    del missing["ranks"][0]["summary"]["h2d"]["pinned_count"]
    wrong = copy.deepcopy(doc)
    wrong["summary"]["steps"] = "3"
    for bad in (extra, missing, wrong):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.Draft202012Validator(json_schema("report")).validate(bad)
        with pytest.raises(msgspec.ValidationError):
            check("report", bad)


def test_baseline_and_gate_outputs_validate(cli, tmp_path):
    base = tmp_path / "base.json"
    code, _, err = cli(["baseline", str(RUNS / "gpu_baseline"), "-o", str(base)], cwd=tmp_path)
    assert code == 0, err
    validate("baseline", json.loads(base.read_text()))
    # against a baseline, with budgets that fail (new findings and a step-time budget)
    gate = tmp_path / "gate.json"
    code, _, err = cli(
        ["gate", str(RUNS / "gpu_workers"), "--baseline", str(base), "--max-step-time-ms", "1", "--max-share", "dataloader=0.01",
         "--max-severity", "low", "--fail-on-new-findings", "--json", str(gate)],
        cwd=tmp_path,
    )  # fmt: skip
    assert code == 1, err
    result = json.loads(gate.read_text())
    assert result["baseline"] is not None and result["checks"]
    validate("gate", result)
    # budgets only, no baseline
    code, _, err = cli(["gate", str(RUNS / "cpu_baseline"), "--max-step-time-ms", "10000", "--json", str(gate)], cwd=tmp_path)
    assert code == 0, err
    result = json.loads(gate.read_text())
    assert result["baseline"] is None
    validate("gate", result)
