"""The facts file's schema: its name, its typed fields, how it is read and checked.

`advisor profile` writes the file (advisor.capture.facts records it) and the analysis reads it
(advisor.analysis): both take the file name, the schema tag and the types from here, so the
writer and the reader cannot disagree. See advisor.capture.facts for what each field means.
"""

from __future__ import annotations

import functools
import math
import re
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
import orjson

from advisor.files import replace_file
from advisor.terminal_text import clean_strings

SCHEMA = "advisor/facts/v1"
# `advisor_facts.json`, or `advisor_facts.rank<R>.json` when several ranks share a log dir.
FACTS_FILE = re.compile(r"^advisor_facts(?:\.rank(\d+))?\.json$")


def facts_file_name(rank: int, world_size: int) -> str:
    return f"advisor_facts.rank{rank}.json" if world_size > 1 else "advisor_facts.json"


def write_facts(path: Path, document: dict[str, Any]) -> None:
    """Write the file in one go (temp file + rename), so a reader never sees half of it.

    Strings that are not valid Unicode (a script or argument named with bytes that are not
    UTF-8) are written with those bytes as `\\xNN`."""
    replace_file(path, orjson.dumps(clean_strings(document), option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS, default=str))


# --- reading: the file is input too ---------------------------------------------------------
# The typed schema of the file. Every field may be null (unknown); a value of the wrong type,
# or one no run can have (a negative worker count, a step of -3 ms), is read as null, with a
# warning naming the file and the field, so no rule ever sees it.
PositiveInt = Annotated[int, msgspec.Meta(ge=1)]
Count = Annotated[int, msgspec.Meta(ge=0)]
Bytes = Annotated[float, msgspec.Meta(ge=0, lt=2**53)]  # a count, written as an int or a float
Milliseconds = Annotated[float, msgspec.Meta(ge=0, lt=1e12)]
Capability = Annotated[str, msgspec.Meta(pattern=r"^[0-9]{1,2}\.[0-9]{1,2}$")]


class _Facts(msgspec.Struct):
    pass


class DataLoaderFacts(_Facts):
    batch_size: PositiveInt | None = None
    num_workers: Count | None = None
    pin_memory: bool | None = None
    persistent_workers: bool | None = None
    prefetch_factor: PositiveInt | None = None
    dataset_len: Count | None = None
    dataset_class: str | None = None
    multiprocessing_context: str | None = None
    drop_last: bool | None = None
    batches_per_epoch: Count | None = None  # len(loader); None for an iterable dataset without a length
    epoch_starts: list[Count] | None = None  # the step at which each iteration over it began


class DeviceFacts(_Facts):
    type: str | None = None
    name: str | None = None
    compute_capability: Capability | None = None
    total_memory_bytes: Bytes | None = None
    max_memory_allocated_bytes: Bytes | None = None
    max_memory_reserved_bytes: Bytes | None = None


class VersionFacts(_Facts):
    torch: str | None = None
    cuda: str | None = None
    cudnn: int | str | None = None
    python: str | None = None


class ThreadFacts(_Facts):
    intra_op: PositiveInt | None = None
    inter_op: PositiveInt | None = None
    omp_num_threads_env: str | None = None


class CpuFeatureFacts(_Facts):
    capability: str | None = None
    flags: list[str] | None = None


class AutocastFacts(_Facts):
    used: bool | None = None
    dtypes: list[str] | None = None


class CompileFacts(_Facts):
    used: bool | None = None
    modes: list[str] | None = None


class Tf32Facts(_Facts):
    matmul: bool | None = None
    cudnn: bool | None = None
    float32_matmul_precision: str | None = None


class ParallelFacts(_Facts):
    data_parallel: bool | None = None
    ddp: bool | None = None


class OptimizerFacts(_Facts):
    class_: str | None = msgspec.field(default=None, name="class")
    foreach: bool | None = None
    fused: bool | None = None


class WindowFacts(_Facts):
    wait: Count | None = None
    warmup: Count | None = None
    active: Count | None = None
    repeat: Count | None = None


class OwnProfilerFacts(_Facts):
    used: bool | None = None
    traces: list[str] | None = None


class ProfilerFacts(_Facts):
    with_stack: bool | None = None
    record_shapes: bool | None = None
    profile_memory: bool | None = None


class FactsFile(_Facts):
    """advisor/facts/v1 as types (see the module docstring for what each field means). A
    section (device, compile, ...) is always there, its fields None where not recorded; a
    value or a list is None where not recorded. `schema` is None for a run without facts."""

    schema: str | None = None
    script: str | None = None
    argv: list[str] | None = None
    rank: Count | None = None
    world_size: PositiveInt | None = None
    device: DeviceFacts = msgspec.field(default_factory=DeviceFacts)
    versions: VersionFacts = msgspec.field(default_factory=VersionFacts)
    cpu_count: PositiveInt | None = None
    torch_threads: ThreadFacts = msgspec.field(default_factory=ThreadFacts)
    cpu_features: CpuFeatureFacts = msgspec.field(default_factory=CpuFeatureFacts)
    dataloaders: list[DataLoaderFacts] | None = None
    batch_size: PositiveInt | None = None
    autocast: AutocastFacts = msgspec.field(default_factory=AutocastFacts)
    grad_scaler: bool | None = None
    compile: CompileFacts = msgspec.field(default_factory=CompileFacts)
    cudnn_benchmark: bool | None = None
    tf32: Tf32Facts = msgspec.field(default_factory=Tf32Facts)
    parallel: ParallelFacts = msgspec.field(default_factory=ParallelFacts)
    optimizers: list[OptimizerFacts] | None = None
    zero_grad_set_to_none: bool | None = None
    window: WindowFacts = msgspec.field(default_factory=WindowFacts)
    stopped_early: bool | None = None
    step_times_ms: list[Milliseconds] | None = None
    loader_wait_ms: list[Milliseconds] | None = None
    optimizer_step_ms: list[Milliseconds] | None = None
    other_cpu_cores: list[Annotated[float, msgspec.Meta(ge=0, lt=1e6)] | None] | None = None
    device_step_times_ms: list[Milliseconds | None] | None = None
    profiled_steps: list[Count] | None = None
    step_source: str | None = None
    mode: Literal["training", "inference"] | None = None
    wall_time_s: Annotated[float, msgspec.Meta(ge=0)] | None = None
    outcome: str | None = None
    exit_code: int | None = None
    own_profiler: OwnProfilerFacts = msgspec.field(default_factory=OwnProfilerFacts)
    profiler: ProfilerFacts = msgspec.field(default_factory=ProfilerFacts)
    notes: list[str] | None = None


def steps_as_run(host_ms: list, device_ms: object) -> list:
    """Each step's time as the run took it: the device clock's (`device_step_times_ms`) where it
    timed the step, else the host's. The host's clock runs ahead of a device-bound step (by up
    to the launch queue's depth, and by whole steps under CUDA graphs); see
    advisor.capture.device_clock."""
    if not isinstance(device_ms, list) or len(device_ms) != len(host_ms):
        return list(host_ms)
    return [d if isinstance(d, (int, float)) and not isinstance(d, bool) and d > 0 else h for h, d in zip(host_ms, device_ms, strict=True)]


class FactsProblem(ValueError):
    """Not a facts file at all (not an object, or no advisor/facts schema)."""


def _fit(value: Any, tp: Any, where: str, problems: list[str]) -> Any:
    """value as the type says, per field for structures and per item for lists of them; what
    does not fit is None (or left out of its list) and named in problems. A value that fits
    whole is checked in one msgspec call (a list of 100,000 DataLoaders took 26 s field by
    field); only one that does not is taken apart to name what is wrong."""
    if value is None:
        return None
    if _fits_whole(value, tp):
        return value
    inner = _struct_of(tp)
    if inner is not None:
        if not isinstance(value, dict):
            problems.append(f"{where} is {_short(value)}, expected an object")
            return None
        out = dict(value)  # keys this version does not know are kept: nothing reads them
        for f in _fields(inner):
            if f.encode_name in value:
                out[f.encode_name] = _fit(value[f.encode_name], f.type, f"{where}.{f.encode_name}", problems)
        return out
    item = _list_of_struct(tp)
    if item is not None:
        if not isinstance(value, list):
            problems.append(f"{where} is {_short(value)}, expected a list")
            return None
        kept = [_fit(v, item, f"{where}[{i}]", problems) for i, v in enumerate(value)]
        return [v for v in kept if v is not None]
    try:
        msgspec.convert(value, tp, strict=True)
    except msgspec.ValidationError as exc:
        problems.append(f"{where} is {_short(value)}: {exc}")
        return None
    if isinstance(value, float) and not math.isfinite(value):
        problems.append(f"{where} is {value}, expected a finite number")
        return None
    return value


@functools.lru_cache(maxsize=None)
def _fields(struct: type) -> tuple[Any, ...]:
    return msgspec.structs.fields(struct)


def _fits_whole(value: Any, tp: Any) -> bool:
    """VALUE is of type TP throughout, with no NaN or infinity anywhere in it."""
    try:
        msgspec.convert(value, tp, strict=True)
    except (msgspec.ValidationError, TypeError, RecursionError):
        return False
    return _all_finite(value)


def _all_finite(value: Any) -> bool:
    t = type(value)
    if t is float:
        return math.isfinite(value)
    if t is list:
        return all(_all_finite(v) for v in value if type(v) is not int and type(v) is not str)
    if t is dict:
        return all(_all_finite(v) for v in value.values() if type(v) is not int and type(v) is not str)
    return True


def _short(value: Any) -> str:
    text = orjson.dumps(value, default=str, option=orjson.OPT_NON_STR_KEYS).decode() if not isinstance(value, float) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _struct_of(tp: Any) -> type | None:
    """The Struct in `S` or `S | None`."""
    for t in (tp, *typing.get_args(tp)):
        if isinstance(t, type) and issubclass(t, msgspec.Struct):
            return t
    return None


def _list_of_struct(tp: Any) -> type | None:
    """S for `list[S]` or `list[S] | None`."""
    for t in (tp, *typing.get_args(tp)):
        if typing.get_origin(t) is list:
            (item,) = typing.get_args(t)
            if isinstance(item, type) and issubclass(item, msgspec.Struct):
                return item
    return None


def validate_facts(doc: Any) -> tuple[dict[str, Any], list[str]]:
    """The facts document with every value of the wrong type read as null, and what was wrong
    (one line per field). Raises FactsProblem when it is not a facts file at all."""
    if not isinstance(doc, dict) or not isinstance(doc.get("schema"), str) or not doc["schema"].startswith("advisor/facts/"):
        raise FactsProblem("not an advisor facts file")
    problems: list[str] = []
    return _fit(doc, FactsFile, "facts", problems), [p.replace("facts.", "", 1) for p in problems]


def typed_facts(doc: dict[str, Any] | None) -> FactsFile:
    """A facts document (as validate_facts returns it) as FactsFile; None (no facts recorded):
    every field None. A value that does not fit the types is None, as validate_facts reads it."""
    if not isinstance(doc, dict):
        return FactsFile()
    fitted = _fit(doc, FactsFile, "facts", [])
    return msgspec.convert({k: v for k, v in fitted.items() if v is not None}, FactsFile)


# A facts file is kilobytes (a million steps' times: tens of MB); one larger than this is not read.
MAX_FACTS_BYTES = 256 * 2**20


def read_facts_bytes(path: Path) -> bytes:
    """A facts file's bytes: never a FIFO (no hang), a device (a link to /dev/zero) or more than
    MAX_FACTS_BYTES; OSError says which. Every reader of facts files goes through here."""
    from advisor.files_read import read_regular

    return read_regular(path, MAX_FACTS_BYTES)


def read_facts(path: Path) -> dict[str, Any]:
    """A facts file parsed (OSError as read_facts_bytes, ValueError for invalid JSON)."""
    return orjson.loads(read_facts_bytes(Path(path)))


__all__ = ["FACTS_FILE", "MAX_FACTS_BYTES", "SCHEMA", "FactsFile", "FactsProblem", "facts_file_name", "read_facts", "read_facts_bytes", "steps_as_run", "typed_facts", "validate_facts", "write_facts"]
