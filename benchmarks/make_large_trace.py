"""Make large traces for the loader benchmarks by repeating the steps of a real trace.

The output is NOT a new measurement: it is a scaled copy of a real Kineto trace (by default
`../shared/traces/v100_resnet50_nw0`), whose events are repeated back to back with shifted
timestamps, fresh correlation / external / flow ids and renumbered `ProfilerStep#N`, so
the result parses and analyses like a long run of the same job. Every file says so: its
name starts with `scaled_`, and its top-level `advisorScaledCopy` object names the source
and the number of copies (so does `traceName`).

    # one 1 GB single-rank trace
    python benchmarks/make_large_trace.py --size 1GB --out /tmp/advisor-bench/scaled_1GB.pt.trace.json
    # 64 ranks of ~50 MB each (gzip), from the 26 MB A100 trace
    python benchmarks/make_large_trace.py --source misc/a100_80gb_train.json.gz --size 50MB \\
        --ranks 64 --out /tmp/advisor-bench/ranks64
    # a job with a straggler: rank 17 of 64 computes 20 ms longer per step, the others wait
    # for it in their first collective of each step (tests/trace_edit.py delay_first_collective)
    python benchmarks/make_large_trace.py --source a100_two_ranks/rank-0.json.gz --size 50MB \\
        --ranks 64 --slow-rank 17 --delay-ms 20 --gzip --out /tmp/advisor-bench/job64

Write them under /tmp, never into the repository.
"""

from __future__ import annotations

import argparse
import gzip
import math
import re
import sys
import zlib
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import orjson

REPO = Path(__file__).resolve().parents[1]
SHARED_TRACES = REPO.parent / "shared" / "traces"
DEFAULT_SOURCE = "v100_resnet50_nw0"
STEP = re.compile(r"^ProfilerStep#(\d+)$")
# args keys that hold ids which must stay unique across copies
ID_ARGS = ("correlation", "External id", "external id", "Record function id", "Ev Idx")
GAP_US = 1000  # idle time between two copies


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*([\d.]+)\s*([KMG]?)B?\s*", text.upper())
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 50MB, 1GB)")
    return int(float(m.group(1)) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[m.group(2)])


def source_file(name: str) -> Path:
    p = Path(name)
    if not p.exists():
        p = SHARED_TRACES / name
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.name.endswith((".json", ".json.gz")))
        if len(files) != 1:
            sys.exit(f"{p}: holds {len(files)} traces; name one file")
        p = files[0]
    if not p.is_file():
        sys.exit(f"{name}: no such trace (looked in {SHARED_TRACES})")
    return p


def read_doc(path: Path) -> tuple[dict[str, Any], int]:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    doc = orjson.loads(raw)
    if isinstance(doc, list):
        doc = {"traceEvents": doc}
    return doc, len(raw)


class Scaler:
    """The repeatable part of a trace and how to shift it for copy k."""

    def __init__(self, doc: dict[str, Any]):
        events = [e for e in doc["traceEvents"] if isinstance(e, dict)]
        # metadata and the whole-trace span appear once; everything with a time repeats
        self.once = [e for e in events if e.get("ph") == "M" or e.get("cat") == "Trace" or not isinstance(e.get("ts"), (int, float))]
        once_ids = {id(e) for e in self.once}
        self.repeat = [e for e in events if id(e) not in once_ids]
        starts = [e["ts"] for e in self.repeat]
        ends = [e["ts"] + (e.get("dur") or 0) for e in self.repeat if isinstance(e.get("dur"), (int, float))]
        self.t0 = min(starts)
        self.period = math.ceil(max(ends + starts) - self.t0) + GAP_US
        self.id_span = 0  # one offset for every id kind keeps cross-references (op <-> launch <-> kernel) intact
        steps = []
        for e in self.repeat:
            args = e.get("args")
            if isinstance(args, dict):
                for k in ID_ARGS:
                    v = args.get(k)
                    if isinstance(v, int) and not isinstance(v, bool):
                        self.id_span = max(self.id_span, v + 1)
            if isinstance(e.get("id"), int):
                self.id_span = max(self.id_span, e["id"] + 1)
            m = STEP.match(str(e.get("name", "")))
            if m:
                steps.append(int(m.group(1)))
        self.step_span = (max(steps) - min(steps) + 1) if steps else 0

    def copy(self, k: int) -> Iterator[dict[str, Any]]:
        if k == 0:
            yield from self.repeat
            return
        shift = k * self.period
        for e in self.repeat:
            out = dict(e)
            out["ts"] = e["ts"] + shift
            if isinstance(e.get("id"), int):
                out["id"] = e["id"] + k * self.id_span
            args = e.get("args")
            if isinstance(args, dict) and any(key in args for key in ID_ARGS):
                args = dict(args)
                for key in ID_ARGS:
                    v = args.get(key)
                    if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
                        args[key] = v + k * self.id_span
                out["args"] = args
            if self.step_span:
                m = STEP.match(str(e.get("name", "")))
                if m:
                    out["name"] = f"ProfilerStep#{int(m.group(1)) + k * self.step_span}"
            yield out


def header(doc: dict[str, Any], source: Path, copies: int, rank: int | None, world: int | None) -> dict[str, Any]:
    head = {k: v for k, v in doc.items() if k != "traceEvents"}
    head["advisorScaledCopy"] = {
        "note": "NOT a real trace: a real trace's events repeated with shifted timestamps and fresh ids, for benchmarks",
        "source": source.name,
        "copies": copies,
    }
    head["traceName"] = f"scaled copy ({copies}x) of {source.name}"
    if rank is not None:
        dist = dict(doc.get("distributedInfo") or {})
        dist.update({"rank": rank, "world_size": world})
        head["distributedInfo"] = dist
    return head


def event_chunks(scaler: Scaler, copies: int) -> Iterator[bytes]:
    """The traceEvents array body, one serialized copy at a time."""
    yield orjson.dumps(scaler.once)[1:-1]
    for k in range(copies):
        body = orjson.dumps(list(scaler.copy(k)))[1:-1]
        if body:
            yield b",\n" + body


def write_trace(out: Path, head: dict[str, Any], chunks: Iterator[bytes] | list[bytes]) -> int:
    """Write header + events; gzip (level 1) when the name ends in .gz. Returns uncompressed bytes."""
    out.parent.mkdir(parents=True, exist_ok=True)
    opening = orjson.dumps(head)[:-1] + b', "traceEvents": [\n'
    closing = b"\n]}\n"
    total = 0
    tmp = out.with_name(out.name + ".part")
    with open(tmp, "wb") as f:
        compressor = zlib.compressobj(1, zlib.DEFLATED, 31) if out.name.endswith(".gz") else None
        for piece in (opening, *chunks, closing):
            total += len(piece)
            f.write(compressor.compress(piece) if compressor else piece)
        if compressor:
            f.write(compressor.flush())
    tmp.replace(out)
    return total


def _write_rank(args: tuple[Path, dict[str, Any], list[bytes]]) -> int:
    out, head, chunks = args
    return write_trace(out, head, chunks)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", default=DEFAULT_SOURCE, help="a trace file or run folder (path, or relative to ../shared/traces)")
    ap.add_argument("--size", type=parse_size, default=parse_size("1GB"), help="target uncompressed size per file (whole copies of the source)")
    ap.add_argument("--out", type=Path, required=True, help="output file (.json or .json.gz); with --ranks, a folder")
    ap.add_argument("--ranks", type=int, default=0, help="write this many rank files (rank-<r>.pt.trace.json[.gz]) into --out")
    ap.add_argument("--gzip", action="store_true", help="with --ranks: gzip the rank files")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--slow-rank", type=int, default=None, help="with --ranks: this rank arrives late at every step's first collective")
    ap.add_argument("--delay-ms", type=float, default=20.0, help="with --slow-rank: how much later, per step")
    args = ap.parse_args(argv)

    src = source_file(args.source)
    doc, src_bytes = read_doc(src)
    slow_chunks = None
    if args.ranks and args.slow_rank is not None:
        # The documented edit of the tests, applied to the source before it is repeated: the slow
        # rank's last kernel before each step's first collective runs longer, the others wait
        # that long in the collective.
        sys.path.insert(0, str(REPO / "tests"))
        from trace_edit import delay_first_collective

        slow_doc = orjson.loads(orjson.dumps(doc))
        delay_first_collective(slow_doc, args.delay_ms * 1000.0, slow=True)
        delay_first_collective(doc, args.delay_ms * 1000.0, slow=False)
        slow_scaler = Scaler(slow_doc)
    scaler = Scaler(doc)
    per_copy = len(orjson.dumps(scaler.repeat))  # compact JSON: smaller than the pretty-printed source
    copies = max(1, round(args.size / per_copy))
    if args.ranks:
        chunks = list(event_chunks(scaler, copies))  # shared by every rank: only the header differs
        if args.slow_rank is not None:
            slow_chunks = list(event_chunks(slow_scaler, copies))
        suffix = ".pt.trace.json.gz" if args.gzip else ".pt.trace.json"
        jobs = [(args.out / f"rank-{r}{suffix}", header(doc, src, copies, r, args.ranks), slow_chunks if r == args.slow_rank else chunks) for r in range(args.ranks)]
        with ProcessPoolExecutor(max_workers=max(1, args.workers)) as pool:
            sizes = list(pool.map(_write_rank, jobs))
        print(f"wrote {args.ranks} ranks of {sizes[0] / 2**20:.1f} MB ({copies} copies of {src.name}) to {args.out}")
    else:
        size = write_trace(args.out, header(doc, src, copies, None, None), event_chunks(scaler, copies))
        print(f"wrote {args.out}: {size / 2**20:.1f} MB uncompressed, {copies} copies of {src.name} ({src_bytes / 2**20:.1f} MB)")


if __name__ == "__main__":
    main()
