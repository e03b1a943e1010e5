"""`advisor report --ops -f csv|parquet`: every op by (op, input shapes, input dtypes, scalar
inputs) with its calls' device-time distribution, on a real trace. Its totals are the
report's, and the report's are the raw trace's (read here with json/gzip)."""

from __future__ import annotations

import csv
import gzip
import io
import json

import pytest

from conftest import single_file


def _csv(cli, run) -> list[dict]:
    code, out, err = cli(["report", str(run), "--ops", "-f", "csv"])
    assert code == 0, err
    return list(csv.DictReader(io.StringIO(out)))


def test_csv_totals_are_the_reports_and_the_raw_kernels(cli, nw0):
    rows = _csv(cli, nw0)
    code, out, err = cli(["report", str(nw0), "--ops", "-f", "json"])
    assert code == 0, err
    report = json.loads(out)
    # Every kernel launched from inside a ProfilerStep span (its launch call, linked by
    # `correlation`, starts in the span: a step's device work runs past its host span), summed
    # from the raw events. This 2021-schema trace spells the categories `Kernel`, `Runtime`.
    events = json.loads(gzip.open(single_file(nw0)).read())["traceEvents"]
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("ph") == "X" and e.get("name", "").startswith("ProfilerStep#")]
    launched = {e["args"]["correlation"] for e in events if str(e.get("cat")).lower() in ("runtime", "cuda_runtime") and e.get("ph") == "X"
                and any(s <= e["ts"] < t for s, t in steps)}
    kernel_us = sum(e["dur"] for e in events if str(e.get("cat")).lower() == "kernel" and e["args"].get("correlation") in launched)
    total_ms = sum(float(r["total_ms"]) for r in rows)
    per_step = sum(float(r["ms_per_step"]) for r in rows)
    assert total_ms == pytest.approx(kernel_us / 1e3, rel=1e-6)
    assert per_step == pytest.approx(report["kernel_ms_per_step"], rel=1e-6)
    # Each op the roofline costs is in the CSV with at least that time (the CSV also holds the
    # shapes the roofline has no cost model for).
    by_op: dict[str, float] = {}
    for r in rows:
        by_op[r["op"]] = by_op.get(r["op"], 0.0) + float(r["ms_per_step"])
    roof: dict[str, float] = {}
    for r in report["ops"]:
        roof[r["op"]] = roof.get(r["op"], 0.0) + r["time_ms"]
    for op, ms in roof.items():
        assert by_op[op] >= ms * (1 - 1e-9), op
    # The distribution is that of the calls: mean x count is the total; p50 <= p90 <= max.
    for r in rows:
        assert float(r["mean_ms"]) * int(r["count"]) == pytest.approx(float(r["total_ms"]), rel=1e-6)
        assert float(r["p50_ms"]) <= float(r["p90_ms"]) + 1e-12 <= float(r["max_ms"]) + 2e-12


def test_rows_are_keyed_by_input_shapes_and_dtypes(cli, nw0):
    """ResNet-50's convolutions share their op name but not their inputs: one row each."""
    rows = _csv(cli, nw0)
    keys = [(r["op"], r["input_shapes"], r["input_dtypes"], r["scalar_inputs"]) for r in rows]
    assert len(keys) == len(set(keys))
    conv = [r for r in rows if r["op"] == "aten::cudnn_convolution"]
    assert len({r["input_shapes"] for r in conv}) == len(conv) > 10
    first = json.loads(conv[0]["input_shapes"])
    assert isinstance(first, list) and len(first[0]) == 4  # NCHW input
    assert json.loads(conv[0]["input_dtypes"])[0] == "float"


def test_parquet_is_the_csv(cli, nw0, tmp_path):
    import pyarrow.parquet as pq

    rows = _csv(cli, nw0)
    target = tmp_path / "ops.parquet"
    code, _, err = cli(["report", str(nw0), "--ops", "-f", "parquet", "-o", str(target)])
    assert code == 0, err
    table = pq.read_table(target).to_pylist()
    assert [r["op"] for r in table] == [r["op"] for r in rows]
    assert sum(r["total_ms"] for r in table) == pytest.approx(sum(float(r["total_ms"]) for r in rows))
    code, _, err = cli(["report", str(nw0), "--ops", "-f", "parquet"])
    assert code == 2 and "-o FILE.parquet" in err
    code, _, err = cli(["report", str(nw0), "-f", "csv"])
    assert code == 2 and "use it with --ops" in err
