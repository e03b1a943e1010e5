"""Edit real traces for tests: load a trace JSON, change it in a documented way, save it.

A rule test that needs a signal no real trace in reach shows (or needs it removed to see the
rule stay silent) starts from a real trace in `../shared/traces` and changes only what it
names: drop some events, rename them, shift them. Everything else stays as recorded, so the
rest of the run still looks like a real run.

    doc = load_events(trace_path("v100_resnet50_nw0"))
    rename_events(doc, lambda e: e.get("name") == "Memcpy HtoD (Pageable -> Device)",
                  "Memcpy HtoD (Pinned -> Device)")
    path = write_trace(doc, tmp_path / "pinned.pt.trace.json")

Predicates receive the raw event dict (keys: ph, cat, name, ts, dur, args, ...).
"""

from __future__ import annotations

import copy
import gzip
from pathlib import Path
from typing import Any, Callable, Iterable

import orjson
import pytest

from conftest import SHARED_TRACES as TRACES  # the vendored copy, else ../shared/traces

Event = dict[str, Any]
Predicate = Callable[[Event], bool]

# Short names for the traces tests use most (see ../shared/traces/MANIFEST.md).
KNOWN = {
    "v100_resnet50_nw0": "v100_resnet50_nw0",
    "v100_resnet50_nw4": "v100_resnet50_nw4",
    "a100_two_ranks": "a100_two_ranks",
    "a100_80gb_train": "misc/a100_80gb_train.json.gz",
    "a100_nccl": "misc/a100_nccl.json.gz",
    "a100_alexnet": "misc/a100_alexnet.json.gz",
    "a100_triton": "misc/a100_triton.json.gz",
    "v100_ns_resolution": "misc/v100_ns_resolution.pt.trace.json.gz",
    "amd_mi250_minitoy": "misc/amd_mi250_minitoy.json.gz",
    "mtia_inference": "misc/mtia_inference.json.gz",
    "cpu_only": "misc/cpu_only.pt.trace.json.gz",
    "old_schema_inference": "misc/old_schema_inference.json.gz",
}


def traces_dir() -> Path:
    """The shared traces folder; skips the calling test (with the reason) when it is absent."""
    if not TRACES.is_dir():
        pytest.skip(f"real traces not found at {TRACES} (tests/data/shared/traces, or ../shared/traces beside the repository)")
    return TRACES


def trace_path(name: str) -> Path:
    """Path of a real trace by short name (KNOWN) or by path under ../shared/traces.

    A run folder (e.g. `v100_resnet50_nw0`) is returned as the folder; `trace_file(name)`
    gives its single trace file. Skips when the traces are absent.
    """
    p = traces_dir() / KNOWN.get(name, name)
    if not p.exists():
        pytest.skip(f"trace {name!r} not found at {p}")
    return p


def trace_file(name: str) -> Path:
    """The one trace file of a run folder (or the file itself)."""
    p = trace_path(name)
    if p.is_file():
        return p
    files = sorted(f for f in p.iterdir() if f.name.endswith((".json", ".json.gz")))
    if len(files) != 1:
        raise ValueError(f"{p} holds {len(files)} trace files, name one of them")
    return files[0]


_CACHE: dict[Path, bytes] = {}


def load_events(path: str | Path) -> dict[str, Any]:
    """The whole trace document (dict with 'traceEvents'); a run folder means its one file.

    Returns a fresh copy each call, so a test may edit it freely.
    """
    path = Path(path)
    if path.is_dir():
        files = sorted(f for f in path.iterdir() if f.name.endswith((".json", ".json.gz")))
        if len(files) != 1:
            raise ValueError(f"{path} holds {len(files)} trace files, name one of them")
        path = files[0]
    raw = _CACHE.get(path)
    if raw is None:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        _CACHE[path] = raw
    doc = orjson.loads(raw)
    if isinstance(doc, list):
        doc = {"traceEvents": doc}
    return doc


def write_trace(doc: dict[str, Any], path: str | Path) -> Path:
    """Write the document as a trace file (gzip when the name ends in .gz); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = orjson.dumps(doc)
    path.write_bytes(gzip.compress(data, compresslevel=1) if path.name.endswith(".gz") else data)
    return path


def events(doc: dict[str, Any], predicate: Predicate | None = None) -> list[Event]:
    """The events that satisfy the predicate (all events when None); the same dicts, not copies."""
    evs = doc["traceEvents"]
    return [e for e in evs if isinstance(e, dict) and (predicate is None or predicate(e))]


def drop_events(doc: dict[str, Any], predicate: Predicate) -> int:
    """Remove every event the predicate selects; returns how many were removed."""
    before = len(doc["traceEvents"])
    doc["traceEvents"] = [e for e in doc["traceEvents"] if not (isinstance(e, dict) and predicate(e))]
    return before - len(doc["traceEvents"])


def rename_events(doc: dict[str, Any], predicate: Predicate, new_name: str | Callable[[Event], str]) -> int:
    """Give the selected events a new name (a string, or a function of the event)."""
    n = 0
    for e in events(doc, predicate):
        e["name"] = new_name(e) if callable(new_name) else new_name
        n += 1
    return n


def edit_events(doc: dict[str, Any], predicate: Predicate, change: Callable[[Event], None]) -> int:
    """Apply `change` in place to each selected event; returns how many were changed."""
    selected = events(doc, predicate)
    for e in selected:
        change(e)
    return len(selected)


def set_args(doc: dict[str, Any], predicate: Predicate, **args: Any) -> int:
    """Set keys in the `args` of the selected events."""

    def change(e: Event) -> None:
        e.setdefault("args", {}).update(args)

    return edit_events(doc, predicate, change)


def add_events(doc: dict[str, Any], new: Iterable[Event]) -> int:
    """Append events (e.g. copies of existing ones with shifted times)."""
    new = list(new)
    doc["traceEvents"].extend(new)
    return len(new)


def clone(event: Event, **changes: Any) -> Event:
    """A deep copy of an event with top-level keys replaced (ts=..., name=..., args=...)."""
    e = copy.deepcopy(event)
    e.update(changes)
    return e


def by_name(*names: str) -> Predicate:
    """Predicate: the event's name is one of `names`."""
    wanted = set(names)
    return lambda e: e.get("name") in wanted


def name_contains(*parts: str) -> Predicate:
    """Predicate: the event's name contains any of `parts`."""
    return lambda e: isinstance(e.get("name"), str) and any(p in e["name"] for p in parts)


def by_cat(*cats: str) -> Predicate:
    """Predicate: the event's category is one of `cats` (compared case-insensitively)."""
    wanted = {c.lower() for c in cats}
    return lambda e: isinstance(e.get("cat"), str) and e["cat"].lower() in wanted


def ts_within(start_us: float, end_us: float) -> Predicate:
    """Predicate: the event starts in [start_us, end_us) (raw trace microseconds)."""
    return lambda e: isinstance(e.get("ts"), (int, float)) and start_us <= e["ts"] < end_us


__all__ = [
    "TRACES",
    "KNOWN",
    "traces_dir",
    "trace_path",
    "trace_file",
    "load_events",
    "write_trace",
    "events",
    "drop_events",
    "rename_events",
    "edit_events",
    "set_args",
    "add_events",
    "clone",
    "by_name",
    "name_contains",
    "by_cat",
    "ts_within",
]
