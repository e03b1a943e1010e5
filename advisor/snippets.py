"""Code snippets built from the run's own values, so a snippet never contradicts its message.

A finding's before/after snippet that shows a `DataLoader(...)` call shows the run's batch size
and worker count (from the facts file's `dataloaders`), changed only where the fix changes
them. Without a facts file the values are unknown: the snippet names them (`batch_size=batch_size`)
rather than inventing numbers.
"""

from __future__ import annotations

from typing import Any

from advisor.facts import DataLoaderFacts, FactsFile


def first_loader(recorded: FactsFile) -> DataLoaderFacts:
    """The first DataLoader the facts file recorded (every field None when there is none)."""
    return recorded.dataloaders[0] if recorded.dataloaders else DataLoaderFacts()


def _value(v: Any) -> str:
    return repr(v) if isinstance(v, (bool, int, float)) and not isinstance(v, str) else str(v)


def dataloader_call(recorded: FactsFile, dataset: str = "train_set", **changes: Any) -> str:
    """`loader = DataLoader(dataset, batch_size=..., ...)` with the run's recorded settings and
    `changes` applied (a change of None drops the argument)."""
    loader = first_loader(recorded)
    args: dict[str, Any] = {}
    args["batch_size"] = loader.batch_size if loader.batch_size is not None else "batch_size"
    if loader.num_workers:
        args["num_workers"] = loader.num_workers
    for key in ("pin_memory", "persistent_workers"):
        if getattr(loader, key) is True:
            args[key] = True
    for key, v in changes.items():
        if v is None:
            args.pop(key, None)
        else:
            args[key] = v
    inner = ", ".join(f"{k}={_value(v)}" for k, v in args.items())
    return f"loader = DataLoader({dataset}, {inner})"


def suggested_workers(recorded: FactsFile, world_size: int = 1) -> int | str:
    """Workers for a loader that stalls: the run's own count when it has some, else about
    (CPU cores / ranks) - 1 from the facts file, else the name `num_workers` (unknown)."""
    workers = first_loader(recorded).num_workers
    if workers:
        return workers
    if recorded.cpu_count is not None:
        return max(1, recorded.cpu_count // max(world_size, 1) - 1)
    return "num_workers"
