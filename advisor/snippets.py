"""Code snippets built from the run's own values, so a snippet never contradicts its message.

A finding's before/after snippet that shows a `DataLoader(...)` call shows the run's batch size
and worker count (from the facts file's `dataloaders`), changed only where the fix changes
them. Without a facts file the values are unknown: the snippet names them (`batch_size=batch_size`)
rather than inventing numbers.
"""

from __future__ import annotations

from typing import Any


def first_loader(facts: dict[str, Any] | None) -> dict[str, Any]:
    """The first DataLoader the facts file recorded, or {}."""
    loaders = (facts or {}).get("dataloaders")
    if isinstance(loaders, list) and loaders and isinstance(loaders[0], dict):
        return loaders[0]
    return {}


def _value(v: Any) -> str:
    return repr(v) if isinstance(v, (bool, int, float)) and not isinstance(v, str) else str(v)


def dataloader_call(facts: dict[str, Any] | None, dataset: str = "train_set", **changes: Any) -> str:
    """`loader = DataLoader(dataset, batch_size=..., ...)` with the run's recorded settings and
    `changes` applied (a change of None drops the argument)."""
    loader = first_loader(facts)
    args: dict[str, Any] = {}
    batch = loader.get("batch_size")
    args["batch_size"] = batch if isinstance(batch, int) and not isinstance(batch, bool) else "batch_size"
    workers = loader.get("num_workers")
    if isinstance(workers, int) and not isinstance(workers, bool) and workers > 0:
        args["num_workers"] = workers
    for key in ("pin_memory", "persistent_workers"):
        if loader.get(key) is True:
            args[key] = True
    for key, v in changes.items():
        if v is None:
            args.pop(key, None)
        else:
            args[key] = v
    inner = ", ".join(f"{k}={_value(v)}" for k, v in args.items())
    return f"loader = DataLoader({dataset}, {inner})"


def suggested_workers(facts: dict[str, Any] | None, world_size: int = 1) -> int | str:
    """Workers for a loader that stalls: the run's own count when it has some, else about
    (CPU cores / ranks) - 1 from the facts file, else the name `num_workers` (unknown)."""
    workers = first_loader(facts).get("num_workers")
    if isinstance(workers, int) and not isinstance(workers, bool) and workers > 0:
        return workers
    cores = (facts or {}).get("cpu_count")
    if isinstance(cores, int) and not isinstance(cores, bool) and cores > 0:
        return max(1, cores // max(world_size, 1) - 1)
    return "num_workers"
