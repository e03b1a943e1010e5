"""AdvisorBench's manifest, scripts and scoring, without profiling or running any workload."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from advisor.engine.discovery import builtin_rules

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "advisorbench"


def _load_runner():
    spec = importlib.util.spec_from_file_location("advisorbench_run", BENCH / "run.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


bench = _load_runner()


def test_manifest_is_well_formed_and_covers_the_workload_kinds():
    workloads = bench.load_manifest()
    seeded_on_cpu = [w for w in workloads if w.seeded and "cpu" in w.devices]
    controls = [w for w in workloads if w.control]
    assert len(seeded_on_cpu) >= 12
    assert len(controls) >= 3
    kinds = {w.kind for w in workloads}
    for kind in ("CNN training", "transformer training", "tabular MLP training", "inference loop",
                 "2-process DDP over gloo"):
        assert kind in kinds
    # the DDP workloads are profiled as two ranks
    assert all(w.nproc == 2 for w in workloads if "DDP" in w.kind)
    # every file the manifest names exists, and every workload script is in the manifest
    named = {w.defect for w in workloads} | {w.twin for w in workloads if w.twin}
    on_disk = {p.name for p in (BENCH / "workloads").glob("*.py") if not p.name.startswith("_")}
    assert named == on_disk


def test_every_workload_script_compiles_and_takes_the_device_option():
    for script in sorted((BENCH / "workloads").glob("*.py")):
        source = script.read_text()
        compile(source, str(script), "exec")
        if not script.name.startswith("_"):
            # the runner passes --device and times the steps through the shared helper
            assert "parse_args(" in source and "StepTimer(args)" in source, script.name


def test_seeded_rules_are_in_the_rule_catalogue():
    catalogue = {rule.id for rule in builtin_rules()}
    for workload in bench.load_manifest():
        assert set(workload.seeded) <= catalogue, workload.name


def test_a_twin_differs_from_its_defect_script():
    for workload in bench.load_manifest():
        if workload.twin:
            defect = (BENCH / "workloads" / workload.defect).read_text()
            twin = (BENCH / "workloads" / workload.twin).read_text()
            assert defect != twin, workload.name


@pytest.mark.parametrize(
    ("entry", "complaint"),
    [
        ('kind = "x"\ndefect = "a.py"\nseeded = ["cpu-threads"]\ndevices = ["cpu"]\n', "needs 'twin'"),
        ('kind = "x"\ndefect = "a.py"\nseeded = []\ndevices = ["tpu"]\n', "devices"),
        ('kind = "x"\ndefect = "a.py"\nseeded = ["cpu-threads"]\ndevices = ["cpu"]\ntwin = "b.py"\n'
         'twin_from = "hand"\nfirst_fix = "inference-mode"\n', "is not seeded"),
        ('kind = "x"\ndefect = "a.py"\nseeded = []\ndevices = ["cpu"]\nspeed = 1\n', "unknown keys"),
    ],
)
def test_a_malformed_manifest_entry_is_named(tmp_path, entry, complaint):
    manifest = tmp_path / "manifest.toml"
    manifest.write_text("[broken]\n" + entry)
    with pytest.raises(ValueError, match=rf"manifest.toml \[broken\].*{complaint}"):
        bench.load_manifest(manifest)


def test_scoring_on_a_hand_made_table():
    Result = bench.Result
    results = [
        # found, ranked first; promised 10% against 20% measured: error 0.5
        Result("a", ("r1",), "r1", [("r1", 10.0, 0.10)], measured_pct=0.20),
        # both found, but the other seeded rule ranks first; promised 4% against 5%: error 0.2
        Result("b", ("r2", "r3"), "r2", [("r3", 5.0, 0.06), ("r2", 4.0, 0.04)], measured_pct=0.05),
        # not found: first fix wrong, promised nothing against 10%: error 1.0
        Result("c", ("r4",), "r4", [], measured_pct=0.10),
        # a control with a finding under 5% of its step: not a false positive
        Result("d", (), None, [("r5", 3.0, 0.03)]),
        # a control with a finding of 8%: a false positive
        Result("e", (), None, [("r6", 8.0, 0.08)]),
        # found and first, plus an unseeded finding of 7% (false positive); gain 2%: not scored
        Result("f", ("r1",), "r1", [("r1", 2.0, 0.02), ("r7", 7.0, 0.07)], measured_pct=0.02),
        # a workload that failed to run counts nowhere
        Result("g", ("r1",), "r1", [], error="boom"),
        # found and first; promised 30% against 25%: error 0.2
        Result("h", ("r8",), "r8", [("r8", 1.0, 0.30)], measured_pct=0.25),
    ]
    totals = bench.score(results)
    # seeded: a 1 + b 2 + c 1 + f 1 + h 1 = 6; found: a, b (2), f, h = 5; false positives: e, f
    assert totals["seeded"] == 6
    assert totals["found"] == 5
    assert totals["false_positives"] == 2
    assert totals["recall"] == pytest.approx(5 / 6)
    assert totals["precision"] == pytest.approx(5 / 7)
    # first fix right on a, f, h of a, b, c, f, h
    assert totals["first_fix_accuracy"] == pytest.approx(3 / 5)
    # errors 0.5, 0.2, 1.0, 0.2 -> sorted 0.2, 0.2, 0.5, 1.0: median (0.2 + 0.5) / 2;
    # 80th percentile at rank 0.8 * 3 = 2.4: 0.5 + 0.4 * (1.0 - 0.5)
    assert totals["scored_pairs"] == 4
    assert totals["error_median"] == pytest.approx(0.35)
    assert totals["error_p80"] == pytest.approx(0.7)
    assert totals["within_30pct"] == 2


def test_scoring_with_nothing_to_score():
    totals = bench.score([bench.Result("c", (), None, [])])
    assert totals["precision"] is None and totals["recall"] is None
    assert totals["error_median"] is None and totals["scored_pairs"] == 0


def test_the_table_shows_promise_and_measurement_per_workload():
    result = bench.Result("pair", ("r1",), "r1", [("r1", 12.0, 0.12)], measured_ms=10.0, measured_pct=0.10,
                          spread_pct=(0.08, 0.14), defect_ms=100.0, twin_ms=90.0)
    control = bench.Result("control", (), None, [("r2", 9.0, 0.09)])
    table = bench.render([result, control], bench.score([result, control]), "cpu", 5, [1.0, 3.0], 12.0)
    assert "first fix: r1 (right)" in table
    assert "promised 12.0 ms (12.0%); measured 10.0 ms (10.0%, paired runs 8.0% to 14.0%)" in table
    assert "control: seeded (control)\n  detected: r2 9.0%" in table
    # one false positive (the control's 9% finding): precision 1 / 2; error |12 - 10| / 10 = 20%
    assert "precision 50% (1 unseeded finding(s)" in table
    assert "median 20%, 80th percentile 20%, within ±30%: 1 of 1" in table
    assert "median 2.00, max 3.00" in table
