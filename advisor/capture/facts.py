"""The facts file: what the trace cannot tell about how the script trains.

`advisor_facts.json` (or `advisor_facts.rank<R>.json` when several ranks share a log dir)
sits beside the trace, is written with orjson, and carries `"schema": "advisor/facts/v1"`.
Fields (all always present; unknown values are null):

    script, argv, rank, world_size,
    device {type, name, compute_capability, total_memory_bytes,
            max_memory_allocated_bytes, max_memory_reserved_bytes},
    versions {torch, cuda, cudnn, python}, cpu_count,
    dataloaders [{batch_size, num_workers, pin_memory, persistent_workers, prefetch_factor,
                  dataset_len, dataset_class, multiprocessing_context, drop_last,
                  batches_per_epoch, epoch_starts}],
    autocast {used, dtypes}, grad_scaler, compile {used, modes}, cudnn_benchmark,
    tf32 {matmul, cudnn, float32_matmul_precision}, parallel {data_parallel, ddp},
    optimizers [{class, foreach, fused}], zero_grad_set_to_none,
    window {wait, warmup, active, repeat}, stopped_early,
    step_times_ms, profiled_steps, step_source, wall_time_s

and, beyond v1's list, `torch_threads` {intra_op, inter_op, omp_num_threads_env},
`outcome` (finished | stopped | exit | error | interrupted), `exit_code`, `mode` (training
once a backward pass or an optimizer step ran, inference when steps were found without
either, else null; training-only rules stay silent on inference runs),
`own_profiler` {used, traces} and `notes` (lines for the reader).

`epoch_starts` lists, per DataLoader, the step index at which each iteration over it began
(each epoch): the step then running takes the epoch's first batch; `batches_per_epoch` is
`len(loader)` (null for an iterable dataset without a length).

`step_times_ms[k]` is the wall time of step k (ProfilerStep#k in the trace); step 0 also
holds the script's start-up (imports, building the model and data) because a step starts
where the previous one ended. Flags that can change while the script runs (cudnn.benchmark,
TF32) are sampled at every step end up to the end of the profiled window, so they say what
was in force while it was recorded. This module imports torch only inside functions.
"""

from __future__ import annotations

import functools
import math
import os
import platform
import typing
from pathlib import Path
from typing import Annotated, Any

import msgspec
import orjson

from advisor.terminal_text import clean_strings

SCHEMA = "advisor/facts/v1"


def facts_file_name(rank: int, world_size: int) -> str:
    return f"advisor_facts.rank{rank}.json" if world_size > 1 else "advisor_facts.json"


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def _batches(loader: Any) -> int | None:
    """len(loader): batches per epoch on this rank (None for an iterable dataset without __len__)."""
    try:
        return int(len(loader))
    except Exception:
        return None


def _physical_memory() -> int | None:
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class FactsRecorder:
    """Collects facts while the script runs; `document()` turns them into the file's dict."""

    def __init__(self, script: str, argv: list[str], rank: int = 0, world_size: int = 1) -> None:
        self.script = script
        self.argv = list(argv)
        self.rank = rank
        self.world_size = world_size
        self.dataloaders: dict[int, dict[str, Any]] = {}
        self.autocast_dtypes: list[str] = []
        self.grad_scaler = False
        self.compile_modes: list[str] = []
        self.flags: dict[str, Any] = {}
        self.parallel = {"data_parallel": False, "ddp": False}
        self.optimizers: dict[int, dict[str, Any]] = {}
        self.zero_grad_set_to_none: bool | None = None

    # -- seen while running -----------------------------------------------------------------
    def saw_dataloader(self, loader: Any, step: int | None = None) -> None:
        """A DataLoader's iteration begins (an epoch): its settings once, and the step it began at."""
        key = id(loader)
        if key in self.dataloaders:
            if step is not None:
                self.dataloaders[key]["epoch_starts"].append(step)
            return
        dataset = getattr(loader, "dataset", None)
        try:
            dataset_len = len(dataset)  # type: ignore[arg-type]
        except Exception:
            dataset_len = None
        batch_size = getattr(loader, "batch_size", None)
        if batch_size is None:
            batch_size = getattr(getattr(loader, "batch_sampler", None), "batch_size", None)
        num_workers = int(getattr(loader, "num_workers", 0) or 0)
        ctx = getattr(loader, "multiprocessing_context", None)
        start_method = None
        if num_workers > 0:
            try:
                if ctx is not None:
                    start_method = ctx.get_start_method()
                else:
                    import multiprocessing

                    start_method = multiprocessing.get_start_method()
            except Exception:
                start_method = None
        cls = type(dataset)
        module = getattr(cls, "__module__", "") or ""
        name = cls.__qualname__ if module in ("__main__", "__mp_main__", "builtins", "") else f"{module}.{cls.__qualname__}"
        self.dataloaders[key] = {
            "batch_size": batch_size,
            "num_workers": num_workers,
            "pin_memory": bool(getattr(loader, "pin_memory", False)),
            "persistent_workers": bool(getattr(loader, "persistent_workers", False)),
            "prefetch_factor": getattr(loader, "prefetch_factor", None),
            "dataset_len": dataset_len,
            "dataset_class": name,
            "multiprocessing_context": start_method,
            "drop_last": bool(getattr(loader, "drop_last", False)),
            "batches_per_epoch": _batches(loader),
            "epoch_starts": [] if step is None else [step],
        }

    def saw_autocast(self, dtype: str | None, device: Any = None) -> None:
        if dtype and dtype not in self.autocast_dtypes:
            self.autocast_dtypes.append(dtype)

    def saw_compile(self, mode: Any, backend: Any) -> None:
        name = str(mode) if mode else "default"
        if backend not in (None, "inductor") and not callable(backend):
            name = f"{name} (backend={backend})"
        elif callable(backend):
            name = f"{name} (backend={getattr(backend, '__name__', 'custom')})"
        if name not in self.compile_modes:
            self.compile_modes.append(name)

    def saw_optimizer(self, opt: Any) -> None:
        key = id(opt)
        if key in self.optimizers:
            return
        defaults = getattr(opt, "defaults", {}) or {}
        self.optimizers[key] = {
            "class": type(opt).__name__,
            "foreach": defaults.get("foreach"),
            "fused": defaults.get("fused"),
        }

    def sample_flags(self) -> None:
        """cudnn.benchmark and TF32 as they are now (called at step ends)."""
        import torch

        flags = {"cudnn_benchmark": bool(torch.backends.cudnn.benchmark)}
        try:
            flags["tf32_matmul"] = bool(torch.backends.cuda.matmul.allow_tf32)
            flags["tf32_cudnn"] = bool(torch.backends.cudnn.allow_tf32)
        except Exception:  # pragma: no cover - API moved
            flags["tf32_matmul"] = flags["tf32_cudnn"] = None
        try:
            flags["float32_matmul_precision"] = torch.get_float32_matmul_precision()
        except Exception:  # pragma: no cover
            flags["float32_matmul_precision"] = None
        self.flags = flags

    # -- the file ---------------------------------------------------------------------------
    def document(self, *, device_type: str, window: dict[str, int], run: dict[str, Any]) -> dict[str, Any]:
        if not self.flags:
            self.sample_flags()
        f = self.flags
        return {
            "schema": SCHEMA,
            "script": self.script,
            "argv": self.argv,
            "rank": self.rank,
            "world_size": self.world_size,
            "device": device_facts(device_type),
            "versions": version_facts(),
            "cpu_count": cpu_count(),
            "torch_threads": thread_facts(),
            "dataloaders": list(self.dataloaders.values()),
            "autocast": {"used": bool(self.autocast_dtypes), "dtypes": list(self.autocast_dtypes)},
            "grad_scaler": self.grad_scaler,
            "compile": {"used": bool(self.compile_modes), "modes": list(self.compile_modes)},
            "cudnn_benchmark": f.get("cudnn_benchmark"),
            "tf32": {
                "matmul": f.get("tf32_matmul"),
                "cudnn": f.get("tf32_cudnn"),
                "float32_matmul_precision": f.get("float32_matmul_precision"),
            },
            "parallel": dict(self.parallel),
            "optimizers": list(self.optimizers.values()),
            "zero_grad_set_to_none": self.zero_grad_set_to_none,
            "window": dict(window),
            **run,
        }


def device_facts(device_type: str) -> dict[str, Any]:
    import torch

    if device_type == "cuda" and torch.cuda.is_available():
        index = torch.cuda.current_device() if torch.cuda.is_initialized() else 0
        props = torch.cuda.get_device_properties(index)
        used = torch.cuda.is_initialized()
        return {
            "type": "cuda",
            "name": props.name,
            "compute_capability": f"{props.major}.{props.minor}",
            "total_memory_bytes": int(props.total_memory),
            "max_memory_allocated_bytes": int(torch.cuda.max_memory_allocated(index)) if used else None,
            "max_memory_reserved_bytes": int(torch.cuda.max_memory_reserved(index)) if used else None,
        }
    return {
        "type": "cpu",
        "name": cpu_name(),
        "compute_capability": None,
        "total_memory_bytes": _physical_memory(),
        "max_memory_allocated_bytes": None,
        "max_memory_reserved_bytes": None,
    }


def thread_facts() -> dict[str, Any]:
    """torch's intra-/inter-op thread pools (DataLoader workers compete with them for cores)."""
    import torch

    return {
        "intra_op": torch.get_num_threads(),
        "inter_op": torch.get_num_interop_threads(),
        "omp_num_threads_env": os.environ.get("OMP_NUM_THREADS"),
    }


def version_facts() -> dict[str, Any]:
    import torch

    cudnn = None
    try:
        if torch.backends.cudnn.is_available():
            cudnn = torch.backends.cudnn.version()
    except Exception:  # pragma: no cover
        cudnn = None
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": cudnn,
        "python": platform.python_version(),
    }


def write_facts(path: Path, document: dict[str, Any]) -> None:
    """Write the file in one go (temp file + rename), so a reader never sees half of it.

    Strings that are not valid Unicode (a script or argument named with bytes that are not
    UTF-8) are written with those bytes as `\\xNN`."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(orjson.dumps(clean_strings(document), option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS, default=str))
    os.replace(tmp, path)


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
    """advisor/facts/v1 as types (see the module docstring for what each field means)."""

    schema: str
    script: str | None = None
    argv: list[str] | None = None
    rank: Count | None = None
    world_size: PositiveInt | None = None
    device: DeviceFacts | None = None
    versions: VersionFacts | None = None
    cpu_count: PositiveInt | None = None
    torch_threads: ThreadFacts | None = None
    dataloaders: list[DataLoaderFacts] | None = None
    batch_size: PositiveInt | None = None
    autocast: AutocastFacts | None = None
    grad_scaler: bool | None = None
    compile: CompileFacts | None = None
    cudnn_benchmark: bool | None = None
    tf32: Tf32Facts | None = None
    parallel: ParallelFacts | None = None
    optimizers: list[OptimizerFacts] | None = None
    zero_grad_set_to_none: bool | None = None
    window: WindowFacts | None = None
    stopped_early: bool | None = None
    step_times_ms: list[Milliseconds] | None = None
    loader_wait_ms: list[Milliseconds] | None = None
    profiled_steps: list[Count] | None = None
    step_source: str | None = None
    wall_time_s: Annotated[float, msgspec.Meta(ge=0)] | None = None
    outcome: str | None = None
    exit_code: int | None = None
    own_profiler: OwnProfilerFacts | None = None
    profiler: ProfilerFacts | None = None
    notes: list[str] | None = None


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


def read_facts(path: Path) -> dict[str, Any]:
    return orjson.loads(Path(path).read_bytes())


__all__ = ["SCHEMA", "FactsFile", "FactsProblem", "FactsRecorder", "cpu_count", "facts_file_name", "read_facts", "validate_facts", "write_facts"]
