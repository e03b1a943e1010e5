"""`advisor diff --ops` on two real runs of the same model: ResNet-50 on a V100 with 0 and
with 4 DataLoader workers (v100_resnet50_nw0 -> nw4). The model's device work is the same; the
input pipeline is not.

Noise, defined here before reading the diff: a row's change in device time per step is noise
when it is within two standard errors of the difference of the two runs' means per step,
each run's standard error from that row's own step-to-step spread (`step_sd_ms` of
`report --ops -f csv`) over its steps (the ProfilerStep spans of its raw trace).

What the data showed (and the assertions below hold): seven convolution rows change far beyond
that noise (up to +0.53 ms/step, +66%), and every one of them ran other kernels in the second
run: cuDNN chose another algorithm, which no step of one run can show. The rows that ran the
same kernels stay within 3% of their time even where they exceed the steps' noise by a few
µs: separate runs also differ by GPU clock, which one run's steps cannot show either (the 3%
was set after that first look), or within the traces' resolution: these record durations in
whole µs, so a row's time per step is uncertain by ±0.5 µs per call in each run. No row is the DataLoader's: it runs on the host and launches
no kernel, so its change is the step time's (`advisor diff`), not an op's device time.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math

import pytest

from conftest import single_file

CLOCK_TOLERANCE = 0.03


def _steps(run) -> int:
    events = json.loads(gzip.open(single_file(run)).read())["traceEvents"]
    return sum(1 for e in events if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#"))


def _table(cli, run) -> dict[tuple, dict]:
    code, out, err = cli(["report", str(run), "--ops", "-f", "csv"])
    assert code == 0, err
    return {(r["op"], r["input_shapes"], r["input_dtypes"], r["scalar_inputs"]): r for r in csv.DictReader(io.StringIO(out))}


def test_op_diff_nw0_to_nw4(cli, nw0, nw4):
    before, after = _table(cli, nw0), _table(cli, nw4)
    n0, n4 = _steps(nw0), _steps(nw4)
    code, out, err = cli(["diff", str(nw0), str(nw4), "--ops", "-f", "json"])
    assert code == 0, err
    from advisor.schemas import check

    doc = json.loads(out)
    check("op-diff", doc)  # every key of the published schema, and no other
    rows = doc["ops"]
    assert len(rows) == len(set(before) | set(after))
    changes = [abs(r["change_ms"]) for r in rows]
    assert changes == sorted(changes, reverse=True)

    other_kernels, beyond = [], []
    for r in rows:
        key = (r["op"], r["input_shapes"], r["input_dtypes"], r["scalar_inputs"])
        b, a = before.get(key), after.get(key)
        ms_b = float(b["ms_per_step"]) if b else 0.0
        ms_a = float(a["ms_per_step"]) if a else 0.0
        assert math.isclose(r["change_ms"], ms_a - ms_b, rel_tol=1e-9, abs_tol=1e-12)
        sd_b = float(b["step_sd_ms"]) if b else 0.0
        sd_a = float(a["step_sd_ms"]) if a else 0.0
        noise = 2 * math.sqrt(sd_b**2 / n0 + sd_a**2 / n4)
        assert math.isclose(r["noise_ms"], noise, rel_tol=1e-9, abs_tol=1e-12)
        if abs(ms_a - ms_b) <= noise:
            continue
        beyond.append(r["op"])
        assert "DataLoader" not in r["op"]  # host work: no device time of its own
        assert b is not None and a is not None, key  # the same ops ran in both runs
        if set(b["kernels"].split("; ")) != set(a["kernels"].split("; ")):
            other_kernels.append(r["op"])
            assert r["verdict"] == "beyond noise, other kernels"
        else:
            resolution = 0.5e-3 * (int(b["count"]) / n0 + int(a["count"]) / n4)  # ms: ±0.5 µs per call and run
            assert abs(ms_a - ms_b) <= CLOCK_TOLERANCE * ms_b + resolution, (key, ms_b, ms_a)
    assert other_kernels and all(op.startswith("aten::cudnn_convolution") for op in other_kernels)
    assert rows[0]["op"] in other_kernels  # the largest change is one of cuDNN's choices


def test_op_diff_text_and_bad_format(cli, nw0, nw4):
    code, out, _ = cli(["diff", str(nw0), str(nw4), "--ops"])
    assert code == 0 and "beyond noise, other kernels" in out and "before ms/step" in out
    code, _, err = cli(["diff", str(nw0), str(nw4), "--ops", "-f", "html"])
    assert code == 2 and "diff --ops writes text, json or markdown" in err


@pytest.mark.xfail(strict=True, reason=(
    "the claim as written before the diff was read: no op of nw0 -> nw4 changes beyond the steps' noise but the "
    "DataLoader's. It does not hold: cuDNN chose other algorithms for seven convolutions in the second run "
    "(up to +0.53 ms/step), which the diff labels 'beyond noise, other kernels'"
))
def test_no_op_changes_beyond_noise_between_the_two_loader_settings(cli, nw0, nw4):
    code, out, err = cli(["diff", str(nw0), str(nw4), "--ops", "-f", "json"])
    assert code == 0, err
    assert [r["op"] for r in json.loads(out)["ops"] if r["beyond_noise"]] == []
