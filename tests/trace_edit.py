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

from conftest import SHARED_TRACES as TRACES  # ../shared/traces: public traces are never copied into the repository

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
        pytest.skip(f"public traces not found: {TRACES} (the data set beside the repository) is absent")
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


def insert_time(doc: dict[str, Any], at_us: float, delta_us: float) -> None:
    """Make the run `delta_us` longer at `at_us`: events that start at or after it start later,
    events running across it last longer (a kernel that takes longer, the step around it)."""
    for e in events(doc, lambda e: isinstance(e.get("ts"), (int, float))):
        if e["ts"] >= at_us:
            e["ts"] += delta_us
        elif isinstance(e.get("dur"), (int, float)) and e["ts"] + e["dur"] > at_us:
            e["dur"] += delta_us


COLLECTIVE = ("nccl", "rccl")


def _is_collective(e: Event) -> bool:
    return isinstance(e.get("cat"), str) and e["cat"].lower() == "kernel" and any(p in str(e.get("name", "")).lower() for p in COLLECTIVE)


def _is_compute_kernel(e: Event) -> bool:
    return isinstance(e.get("cat"), str) and e["cat"].lower() == "kernel" and not _is_collective(e)


def delay_first_collective(doc: dict[str, Any], delay_us: float, slow: bool) -> list[float]:
    """One rank of a job made slower by `delay_us` in every step, documented edit:

    - slow=True (the straggler): the last compute kernel that ends before each step's first
      collective runs `delay_us` longer, and everything after it starts that much later;
    - slow=False (every other rank): that first collective lasts `delay_us` longer (the rank
      waits in it for the straggler), and everything after it starts that much later.

    Both make every step `delay_us` longer, as the whole job would be. Returns the insertion
    points (raw trace µs)."""
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in events(doc, lambda e: str(e.get("name", "")).startswith("ProfilerStep#") and isinstance(e.get("dur"), (int, float))))
    kernels = events(doc, lambda e: isinstance(e.get("ts"), (int, float)) and isinstance(e.get("dur"), (int, float)))
    points = []
    for i, (start, _end) in enumerate(steps):
        nxt = steps[i + 1][0] if i + 1 < len(steps) else float("inf")
        firsts = sorted(e["ts"] for e in kernels if _is_collective(e) and start <= e["ts"] < nxt)
        if not firsts:
            continue
        c = firsts[0]
        if slow:
            before = [e for e in kernels if _is_compute_kernel(e) and e["ts"] + e["dur"] <= c and e["dur"] > 0]
            if not before:
                continue
            k = max(before, key=lambda e: e["ts"] + e["dur"])
            points.append(k["ts"] + k["dur"] - min(0.5, k["dur"] / 2))  # inside that kernel: it runs longer
        else:
            first = min((e for e in kernels if _is_collective(e) and e["ts"] == c), key=lambda e: e["dur"])
            points.append(c + min(0.5, first["dur"] / 2))  # inside the collective: it lasts longer
    for at in sorted(points, reverse=True):  # the latest first: earlier points do not move
        insert_time(doc, at, delay_us)
    return points


def straggler_job(source: str | Path, out: str | Path, ranks: int, slow_rank: int, delay_ms: float) -> list[Path]:
    """A job of `ranks` copies of one real rank's trace (`rank-<r>.json.gz` in `out`, each with
    its distributedInfo rank), `slow_rank` made slower by `delay_ms` per step and the others
    waiting for it (see delay_first_collective)."""
    out = Path(out)
    paths = []
    for r in range(ranks):
        doc = load_events(source)
        delay_first_collective(doc, delay_ms * 1000.0, slow=r == slow_rank)
        doc["distributedInfo"] = {**(doc.get("distributedInfo") or {}), "rank": r, "world_size": ranks}
        paths.append(write_trace(doc, out / f"rank-{r}.json.gz"))
    return paths


__all__ = [
    "insert_time",
    "delay_first_collective",
    "straggler_job",
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
