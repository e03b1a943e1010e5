"""The shapes of the advisor's JSON outputs, as types: the report (`advisor/report/v1`), the
baseline (`advisor/baseline/v1`), the gate result (`advisor/gate/v1`) and the record of
`advisor fix --verify` (a baseline with its verification, `verify.schema.json`).

The JSON Schemas published under docs/schemas/ are generated from these types
(`python -m advisor.schemas docs/schemas`), and the tests validate real outputs against
them, so a field added to an output without a schema change fails a test. Parts the code
already declares as types are used as they are, never declared again here: the report
(advisor.analysis.Report, the type `Analysis.report()` builds and the JSON report encodes),
with its summary (advisor.metrics.summary.Summary), profiler overhead
(advisor.metrics.unprofiled.ProfilerOverhead), findings and their fixes (advisor.engine.Finding,
the same type the engine ranks and the cache stores) and the rank's replay
(advisor.whatif.savings.RankWhatIf); a baseline's finding records and environment.
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path
from typing import Any, Literal, Optional

import msgspec
import msgspec.inspect
import orjson

from advisor.analysis import Report
from advisor.gate.record import Environment, FindingRecord

Severity = Literal["low", "medium", "high"]
CheckStatus = Literal["pass", "warn", "inconclusive", "fail"]


class _Out(msgspec.Struct, forbid_unknown_fields=True):
    """Every output object: its keys are all present, and no other key is."""


# --- advisor/ops/v1 (`advisor report --ops --format json`) ---------------------------------------
class OpRoofline(_Out):
    """One distinct (op, types, shapes, scalar arguments) of the slowest rank, per step: FLOPs
    and bytes per call from its shapes, its kernels' time, the rates and the device's ceiling
    (null where the device is unknown or the op's precision has none)."""

    op: str
    kind: Literal["gemm", "conv", "attention", "norm", "softmax", "elementwise", "reduce", "optimizer"]
    shape: str
    dtype: str
    precision: str
    calls: float
    time_ms: float
    flops: float
    bytes: float
    tflops: Optional[float]
    tbps: Optional[float]
    intensity: Optional[float]
    peak_tflops: Optional[float]
    peak_tbps: Optional[float]
    attainable_tflops: Optional[float]
    ceiling_share: Optional[float]
    bound: Literal["compute", "memory", ""]
    m: int
    n: int
    k: int
    batch: int


class DeviceCeiling(_Out):
    """The device's datasheet ceilings (advisor.metrics.devices): dense TFLOP/s per precision, TB/s."""

    name: str
    peak_tflops: dict[str, Optional[float]]
    memory_tbps: float
    source: str


class OpsReport(_Out):
    """`advisor report --ops --format json`."""

    schema: Literal["advisor/ops/v1"]
    advisor_version: str
    source: str
    run: str
    rank: int
    device: Optional[str]
    ceiling: Optional[DeviceCeiling]
    shapes_recorded: bool
    modelled_ms_per_step: float
    kernel_ms_per_step: float
    ops: list[OpRoofline]
    notes: list[str]


# --- advisor/kernels/v1 (`advisor report --kernels --format json`) -------------------------------
Family = Literal[
    "gemm", "grouped_gemm", "conv", "attention", "elementwise", "reduction", "norm", "softmax", "copy", "optimizer", "embedding", "sort",
    "communication:all_reduce", "communication:all_gather", "communication:reduce_scatter", "communication:all_to_all",
    "communication:send_recv", "communication:other", "other",
]
NamePrecision = Literal["fp64", "fp32", "tf32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2", "mxfp8", "mxfp4", "nvfp4", "int8", "mixed", "unknown"]
Unit = Literal["yes", "no", "unknown"]


class KernelRow(_Out):
    """One distinct kernel name of the slowest rank: what its name says (advisor.metrics.kernel_taxonomy),
    the precision and Tensor Core use the rules read, and its time."""

    name: str
    library: str
    family: Family
    precision: NamePrecision
    matrix_unit: Unit
    precision_used: Optional[str]
    tensor_core: bool
    matrix_units: Unit
    calls: int
    total_ms: float
    share: float
    convention: Optional[str]


class KernelsReport(_Out):
    """`advisor report --kernels --format json`."""

    schema: Literal["advisor/kernels/v1"]
    advisor_version: str
    source: str
    run: str
    rank: int
    kernels: list[KernelRow]


# --- advisor/collectives/v1 (`advisor report --collectives --format json`) ---------------------
class CollectiveRow(_Out):
    """One collective kind and message size bucket over every rank: NCCL's algorithm and bus
    bandwidth (null where the message size is not recorded), and its share of the link's peak
    (null where the link is unknown). One row per process group (its name as the kernels
    record it, null where they do not; group_size: its ranks, the n of the bus bandwidth)."""

    group: Optional[str]
    group_size: Optional[int]
    kind: str
    bucket: str
    algorithm: str
    count: int
    ranks: int
    time_ms: float
    bytes: Optional[float]
    algbw_gbps: Optional[float]
    busbw_gbps: Optional[float]
    peak_share: Optional[float]


class CollectiveRank(_Out):
    """One rank: its collectives, how late it started them behind the earliest rank (clocks
    aligned on the collectives' ends) and how long it waited for the last (null: not compared)."""

    rank: int
    collectives: int
    time_ms: float
    matched: int
    mean_lag_ms: Optional[float]
    max_lag_ms: Optional[float]
    wait_ms: Optional[float]


class RankOverlap(_Out):
    """One rank's kernel time: compute, communication, both at once, communication alone."""

    rank: int
    compute_ms: float
    communication_ms: float
    overlapped_ms: float
    exposed_ms: float
    overlap_share: Optional[float]


class Link(_Out):
    name: Optional[str]
    peak_gbps: Optional[float]
    why: str


class CollectivesReport(_Out):
    """`advisor report --collectives --format json`."""

    schema: Literal["advisor/collectives/v1"]
    advisor_version: str
    source: str
    run: str
    group_size: Optional[int]
    link: Link
    collectives: list[CollectiveRow]
    ranks: list[CollectiveRank]
    skew_p50_ms: Optional[float]
    skew_max_ms: Optional[float]
    overlap: list[RankOverlap]
    notes: list[str]


# --- advisor/op-diff/v1 (`advisor diff --ops --format json`) -----------------------------------
class OpChange(_Out):
    """One (op, input shapes, input dtypes, scalar inputs) in two runs: device time per step,
    its spread over the steps, calls and kernels on each side, the change and its noise."""

    op: str
    input_shapes: str
    input_dtypes: str
    scalar_inputs: str
    ms_per_step_before: float
    step_sd_ms_before: float
    count_before: int
    kernels_before: Optional[str]
    ms_per_step_after: float
    step_sd_ms_after: float
    count_after: int
    kernels_after: Optional[str]
    change_ms: float
    noise_ms: float
    beyond_noise: bool
    status: Literal["both", "new", "gone"]
    kernels_changed: bool
    verdict: str


class OpDiff(_Out):
    """`advisor diff --ops --format json`."""

    schema: Literal["advisor/op-diff/v1"]
    advisor_version: str
    before: str
    after: str
    ops: list[OpChange]


# --- advisor/launches/v1 (`advisor report --launches --format json`) ---------------------------
class StreamLaunches(_Out):
    """One stream (-1: all of them): its linked ops, the delay from launch call to device start
    (µs) and the stream's queue length at each launch."""

    stream: int
    ops: int
    delay_p50_us: float
    delay_p90_us: float
    delay_max_us: float
    queue_mean: float
    queue_max: int


class StreamIdle(_Out):
    """One stream (-1: all of them): its idle time between consecutive ops (ms), by cause."""

    stream: int
    gaps: int
    idle_ms: float
    host_wait_ms: float
    kernel_wait_ms: float
    other_ms: float


class LaunchesReport(_Out):
    """`advisor report --launches --format json`."""

    schema: Literal["advisor/launches/v1"]
    advisor_version: str
    source: str
    run: str
    rank: int
    streams: list[StreamLaunches]
    idle: list[StreamIdle]


# --- advisor/baseline/v1 --------------------------------------------------------------------
class BaselineMetrics(_Out):
    steps: int
    step_time_median_ms: Optional[float]
    step_time_mean_ms: Optional[float]
    gpu_utilization: Optional[float]
    peak_memory_bytes: Optional[float]
    samples_per_s: Optional[float]


class Baseline(_Out):
    """`advisor baseline`: every step time, so a later gate can weigh the noise."""

    schema: Literal["advisor/baseline/v1"]
    advisor_version: str
    created: str
    source: str
    run: str
    step_times_ms: Optional[list[float]]
    metrics: BaselineMetrics
    breakdown_ms: dict[str, Optional[float]]
    breakdown_share: dict[str, float]
    findings: list[FindingRecord]
    considered: Optional[list[FindingRecord]]  # fired, not ranked (the gate's "new" leaves them out)
    environment: Environment


# --- advisor fix --verify: a baseline of the fixed script, with the verification ------------
class VerifyRun(_Out):
    variant: str  # "original", a rule id (that fix alone), or "all fixes"
    round: int
    median_ms: Optional[float]
    step_times_ms: list[float]
    wall_s: float
    error: str


class VerifyFix(_Out):
    rule: str
    fix: str
    safety: Literal["safe", "unsafe"]
    promised_ms: Optional[float]
    promised_share: Optional[float]
    original_ms: Optional[float]
    fixed_ms: Optional[float]
    saving_ms: Optional[float]
    saving_share: Optional[float]
    round_savings_ms: list[float]
    spread_ms: Optional[float]
    verdict: Literal["kept", "missed", "failed"]
    why: str


class Verification(_Out):
    script: str
    steps: int
    warmup: int
    rounds: int
    kept_share: float
    runs: list[VerifyRun]
    fixes: list[VerifyFix]


class VerifyRecord(Baseline):
    """`advisor fix --verify -o FILE`: an `advisor/baseline/v1` document of the fixed script
    (its unprofiled step times; the findings its fixes left), which `advisor gate` reads as a
    baseline, with the verification under `verify`."""

    verify: Verification


# --- advisor/gate/v1 ------------------------------------------------------------------------
class GateCheck(_Out):
    id: str
    title: str
    status: CheckStatus
    measured: str
    limit: str
    message: str
    details: dict[str, Any]
    effective_status: CheckStatus


class NewFinding(_Out):
    rule: str
    severity: Severity
    title: str
    saving_ms: Optional[float]
    message: str


class ResolvedFinding(_Out):
    rule: str
    severity: Severity
    title: str


class RunEnvironment(_Out):
    device_name: Optional[str]
    compute_capability: Optional[str]
    world_size: Optional[int]
    batch_size: Optional[int]
    versions: dict[str, str]


class RunSummary(_Out):
    """A judged run (the candidate) or the baseline it was judged against."""

    source: str
    run: str
    kind: Literal["run", "baseline", "report"]
    steps: int
    step_time_median_ms: Optional[float]
    step_time_mean_ms: Optional[float]
    gpu_utilization: Optional[float]
    peak_memory_bytes: Optional[float]
    breakdown_share: dict[str, float]
    findings: list[str]
    environment: RunEnvironment
    advisor_version: str


class GateBudgets(_Out):
    max_step_time_ms: Optional[float]
    min_gpu_utilization: Optional[float]
    max_share: dict[str, float]
    max_peak_memory: Optional[float]
    max_severity: Optional[Literal["none", "low", "medium", "high"]]
    forbid_rules: list[str]
    min_samples_per_s: Optional[float]
    max_ms_per_sample: Optional[float]


class GateSettings(_Out):
    baseline: Optional[str]
    tolerance: float
    confidence: float
    min_steps: int
    strict: bool
    fail_on_new_findings: bool
    batch_size: Optional[int]
    budgets: GateBudgets
    sources: list[str]


class GateResult(_Out):
    """`advisor gate --json`."""

    schema: Literal["advisor/gate/v1"]
    advisor_version: str
    verdict: Literal["pass", "inconclusive", "fail"]
    exit_code: int
    strict: bool
    headline: str
    checks: list[GateCheck]
    new_findings: list[NewFinding]
    resolved_findings: list[ResolvedFinding]
    warnings: list[str]
    candidate: RunSummary
    baseline: Optional[RunSummary]
    settings: GateSettings


SCHEMAS: dict[str, type] = {
    "report": Report, "baseline": Baseline, "gate": GateResult, "verify": VerifyRecord, "ops": OpsReport, "kernels": KernelsReport,
    "collectives": CollectivesReport, "op-diff": OpDiff, "launches": LaunchesReport,
}


def json_schema(name: str) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of one output, with its id and title. The same text
    whichever msgspec the dependency range installs: descriptions as `inspect.cleandoc` cleans
    docstrings, "null" last among a field's alternatives, and the empty default of a field
    made by a factory stated."""
    schema = msgspec.json.schema(SCHEMAS[name])
    _canonical(schema)
    _factory_defaults(schema.get("$defs", {}), SCHEMAS[name])
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"advisor/{name}/v1",
        "title": f"advisor/{name}/v1",
        **schema,
    }


def _canonical(node: Any) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "description" and isinstance(value, str):
                node[key] = inspect.cleandoc(value)
            elif key == "anyOf" and isinstance(value, list):
                value.sort(key=lambda alt: alt == {"type": "null"})  # stable: the others keep their order
                _canonical(value)
            else:
                _canonical(value)
    elif isinstance(node, list):
        for value in node:
            _canonical(value)


def _factory_defaults(defs: dict[str, Any], root: Any) -> None:
    """Each Struct or dataclass field whose default is an empty dict or list made by a
    factory: that default in its property (msgspec states it from 0.23 on, not before)."""
    seen: set[int] = set()

    def visit(info: Any) -> None:
        if id(info) in seen:
            return
        seen.add(id(info))
        if isinstance(info, (msgspec.inspect.StructType, msgspec.inspect.DataclassType)):
            props = defs.get(info.cls.__name__, {}).get("properties", {})
            for f in info.fields:
                if f.default_factory in (dict, list) and f.encode_name in props:
                    props[f.encode_name].setdefault("default", f.default_factory())
        for value in vars(info).values() if hasattr(info, "__dict__") else (getattr(info, a, None) for a in getattr(info, "__struct_fields__", ())):
            for child in value if isinstance(value, tuple) else (value,):
                if isinstance(child, (msgspec.inspect.Type, msgspec.inspect.Field)):
                    visit(child)

    visit(msgspec.inspect.type_info(root))


def schema_text(name: str) -> str:
    return orjson.dumps(json_schema(name), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode() + "\n"


def write_schemas(folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name in SCHEMAS:
        path = folder / f"{name}.schema.json"
        path.write_text(schema_text(name), encoding="utf-8")
        written.append(path)
    return written


def check(name: str, document: Any) -> Any:
    """The document as the typed output (msgspec.ValidationError when it does not fit)."""
    return msgspec.convert(document, SCHEMAS[name])


if __name__ == "__main__":
    for p in write_schemas(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/schemas")):
        print(p)
