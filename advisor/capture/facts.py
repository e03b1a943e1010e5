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
`cpu_features` {capability (torch's CPU kernels' instruction set: `torch.backends.cpu.
get_cpu_capability()`, "AVX512", "AVX2", ...), flags (the host CPU's flags among
`CPU_FLAGS`, from /proc/cpuinfo: Linux only, else null)},
`outcome` (finished | stopped | exit | error | interrupted), `exit_code`, `mode` (training
once a backward pass or an optimizer step ran, inference when steps were found without
either, else null; training-only rules stay silent on inference runs),
`own_profiler` {used, traces} and `notes` (lines for the reader).

`epoch_starts` lists, per DataLoader, the step index at which each iteration over it began
(each epoch): the step then running takes the epoch's first batch; `batches_per_epoch` is
`len(loader)` (null for an iterable dataset without a length).

`other_cpu_cores[k]` (Linux; null elsewhere) is how many of the cores the script may use
other processes kept busy during step k, on average (advisor.capture.machine_load): a window
timed beside other work is inflated, and the rules say so.

`step_times_ms[k]` is the wall time of step k (ProfilerStep#k in the trace); step 0 also
holds the script's start-up (imports, building the model and data) because a step starts
where the previous one ended. `device_step_times_ms[k]` (CUDA runs; null elsewhere, and null
for a step it could not time) is step k as the device ran it: the interval between CUDA events
recorded at the ends of steps k-1 and k (advisor.capture.device_clock). Flags that can change
while the script runs (cudnn.benchmark, TF32) are sampled at every step end up to the end of the profiled window, so they say what
was in force while it was recorded. This module imports torch only inside functions.
"""

from __future__ import annotations

import os
import platform
from typing import Any

from advisor.facts import SCHEMA, FactsFile, FactsProblem, facts_file_name, read_facts, validate_facts, write_facts


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
            "cpu_features": cpu_feature_facts(),
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


# The CPU flags a rule may read: the 16-bit matrix instructions and the vector widths.
CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_fp16")


def cpu_flags(path: str = "/proc/cpuinfo") -> list[str] | None:
    """The host CPU's flags among CPU_FLAGS (the first processor's), or None where the file is absent."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.lower().startswith("flags"):
                    have = set(line.split(":", 1)[1].split())
                    return [f for f in CPU_FLAGS if f in have]
    except OSError:
        return None
    return None


def cpu_feature_facts() -> dict[str, Any]:
    """What the CPU's kernels can use: torch's dispatch capability and the CPU's own flags."""
    import torch

    try:
        capability = str(torch.backends.cpu.get_cpu_capability())
    except Exception:  # pragma: no cover - older torch
        capability = None
    return {"capability": capability, "flags": cpu_flags()}


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


__all__ = ["SCHEMA", "FactsFile", "FactsProblem", "FactsRecorder", "cpu_count", "facts_file_name", "read_facts", "validate_facts", "write_facts"]
