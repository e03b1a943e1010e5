"""Bytes of a trace file to typed event batches, without a Python dict per event.

A Kineto trace is one JSON document whose `traceEvents` array holds every event. Decoding
it with a generic JSON parser builds a dict per event and a dict per `args`, most of whose
keys nobody reads; that is where the time and the memory of a naive loader go. Here msgspec
decodes each event straight into a small slotted struct that declares only the keys the
frames need (unknown keys are skipped while scanning) and is not tracked by the cyclic GC.
Values whose type varies between traces are typed `Any`, so odd-but-valid JSON decodes.

Large documents are decoded in two passes so that the events never all exist as Python
objects at once: a first pass splits `traceEvents` into raw byte slices (no objects built),
then slices are decoded a batch at a time and each batch is turned into columns before the
next one is decoded.

Anything msgspec rejects (wrong types, non-UTF-8 bytes, NaN/Infinity literals, numbers out
of range) is retried once through a lenient path (Python's json with replacement of bad
bytes, then a clean-up of each event), so a trace is refused only when it is not JSON at all
or not a Chrome trace; the refusal is an InputError naming the file. A value of an odd type
in valid JSON (a byte count written as text, as AMD's runtime calls write it) sends only the
events around it down that path, a chunk at a time (_decode_chunk): the lenient path costs
about six times the typed decode, and every event of a trace would otherwise pay for one.

It stays one module of about 680 lines: the fast (msgspec) and the lenient path decode the
same event types, and kept side by side they accept the same fields.
"""

from __future__ import annotations

import json
import math
import os
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

import msgspec
import numpy as np

from advisor.errors import InputError
from advisor.sizes import format_bytes, parse_size
from advisor.files_read import open_regular

NAN = math.nan
NULL = msgspec.Raw(b"null")  # default of raw fields; `is NULL` means "key absent"
TRACE_FILE_HINT = "a torch.profiler trace (JSON with 'traceEvents')"

# Documents above this size are decoded batch by batch (bounded memory); below it in one go.
BATCH_THRESHOLD_BYTES = 96 * 2**20
BATCH_BYTES = 32 * 2**20
# The lenient retry holds a text copy and Python objects for the whole input: only below this.
LENIENT_LIMIT_BYTES = 512 * 2**20
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
UTF8_BOM = b"\xef\xbb\xbf"
GZIP_READ_BYTES = 256 * 2**10
GZIP_PIECE_BYTES = 4 * 2**20


def _arg(key: str, default: Any) -> Any:
    return msgspec.field(default=default, name=key)


class EventArgs(msgspec.Struct, gc=False):
    """The `args` keys of spans that any frame reads; every other key is skipped unread."""

    external_id: int = _arg("External id", -1)
    external_id_lower: int = _arg("external id", -1)  # 2021 schema spelling on runtime/device rows
    correlation: int = -1
    device: int = -1
    stream: int = -1
    registers: float = _arg("registers per thread", NAN)
    shared_memory: float = _arg("shared memory", NAN)
    blocks_per_sm: float = _arg("blocks per SM", NAN)
    warps_per_sm: float = _arg("warps per SM", NAN)
    occupancy: float = _arg("est. achieved occupancy %", NAN)
    grid: msgspec.Raw = NULL
    block: msgspec.Raw = NULL
    bytes: float = NAN
    call_stack: str | None = _arg("Call stack", None)
    input_dims: msgspec.Raw = _arg("Input Dims", NULL)
    input_dims_lower: msgspec.Raw = _arg("Input dims", NULL)
    input_types: msgspec.Raw = _arg("Input type", NULL)  # dtypes of an op's inputs (record_shapes=True)
    concrete_inputs: msgspec.Raw = _arg("Concrete Inputs", NULL)  # scalar arguments as text (stride, padding, is_causal)
    sequence: int = _arg("Sequence number", -1)  # autograd's sequence number: the op ran with grad mode on
    msg_nelems: Any = _arg("In msg nelems", None)  # a collective kernel's message: elements and their dtype
    msg_dtype: Any = _arg("dtype", None)
    msg_out_nelems: Any = _arg("Out msg nelems", None)  # the collective's output (an all-gather's gathered buffer)
    group_size: int = _arg("Group size", -1)  # the ranks of the collective's process group
    pg_name: Any = _arg("Process Group Name", None)  # which process group (TP, DP, ...) it ran in
    pg_ranks: Any = _arg("Process Group Ranks", None)  # that group's ranks, as text ("[0, 1]")


class MemoryArgs(msgspec.Struct, gc=False):
    """The `args` of a `[memory]` instant event (profile_memory=True)."""

    device_type: int = _arg("Device Type", -1)
    device_id: int = _arg("Device Id", -1)
    bytes: float = _arg("Bytes", NAN)
    total_allocated: float = _arg("Total Allocated", NAN)
    total_reserved: float = _arg("Total Reserved", NAN)


EMPTY_ARGS = EventArgs()
EMPTY_MEMORY_ARGS = MemoryArgs()


class _Phase(msgspec.Struct, gc=False, tag_field="ph"):
    """Base of the event types: msgspec picks the type from the event's phase (`ph`)."""


class Span(_Phase, tag="X"):
    """A complete event: an op, annotation, runtime call, kernel, copy or memset."""

    cat: str | None = None
    name: str | None = ""
    ts: float = NAN
    dur: float = NAN
    tid: int | str | None = None
    args: EventArgs | None = None


class Instant(_Phase, tag="i"):
    """An instant event; the frames keep the `[memory]` ones."""

    cat: str | None = None
    name: str | None = ""
    ts: float = NAN
    args: MemoryArgs | None = None


class LegacyInstant(Instant, tag="I"):
    pass


# Every other phase of the Chrome trace format (flows, metadata, counters, async, ...) is
# decoded as an empty struct: its fields are skipped without building a single object.
OTHER_PHASES = ("B", "E", "C", "b", "n", "e", "s", "t", "f", "P", "N", "O", "D", "M", "V", "v", "R", "c", "(", ")")
_OTHER = tuple(msgspec.defstruct(f"OtherPhase{i}", [], bases=(_Phase,), tag=ph, gc=False) for i, ph in enumerate(OTHER_PHASES))
KNOWN_PHASES = frozenset(("X", "i", "I", *OTHER_PHASES))
INSTANT_TYPES = (Instant, LegacyInstant)
Event = Union[(Span, Instant, LegacyInstant, *_OTHER)]  # built from a tuple: no `|` spelling


# Top-level scalar keys kept as TraceFrames.metadata (msgspec skips keys a struct does not name).
METADATA_KEYS = (
    "schemaVersion",
    "traceName",
    "displayTimeUnit",
    "baseTimeNanoseconds",
    "record_shapes",
    "with_stack",
    "profile_memory",
    "with_flops",
    "with_modules",
    "cupti_version",
    "cuda_runtime_version",
    "cuda_driver_version",
    "hip_runtime_version",
    "hip_driver_version",
    "roctracer_version",
)


class _Header(msgspec.Struct, gc=False):
    deviceProperties: Any = None
    distributedInfo: Any = None
    schemaVersion: Any = None
    traceName: Any = None
    displayTimeUnit: Any = None
    baseTimeNanoseconds: Any = None
    record_shapes: Any = None
    with_stack: Any = None
    profile_memory: Any = None
    with_flops: Any = None
    with_modules: Any = None
    cupti_version: Any = None
    cuda_runtime_version: Any = None
    cuda_driver_version: Any = None
    hip_runtime_version: Any = None
    hip_driver_version: Any = None
    roctracer_version: Any = None


class TraceDoc(_Header):
    traceEvents: list[Event] | None = None


class TraceDocRaw(_Header):
    traceEvents: list[msgspec.Raw] | None = None


_DOC = msgspec.json.Decoder(TraceDoc | list[Event])
_DOC_RAW = msgspec.json.Decoder(TraceDocRaw | list[msgspec.Raw])
_EVENTS = msgspec.json.Decoder(list[Event])


@dataclass
class DecodedTrace:
    """The document's header and its events, as batches decoded on demand."""

    device_properties: Any
    distributed: Any
    metadata: dict[str, Any]
    event_count: int
    batches: Iterator[list[Event]] = field(repr=False)
    notes: list[str] = field(default_factory=list)  # how the document was read, when not as Kineto writes it


# --- bytes ------------------------------------------------------------------------------------
MAX_TRACE_ENV = "ADVISOR_MAX_TRACE_BYTES"
DEFAULT_MAX_TRACE_BYTES = 16 * 2**30


# Without ADVISOR_MAX_TRACE_BYTES, a gzip trace may inflate to this many times its compressed
# size (torch.profiler traces: 13x to 30x), at least GZIP_RATIO_FLOOR, and to no more than
# half the memory available: a bomb ends in one line, whatever the machine.
GZIP_RATIO = 200
GZIP_RATIO_FLOOR = 256 * 2**20
# Whitespace runs at least this long are kept as one space while inflating (JSON does not
# need them; a bomb is made of them): memory follows the trace's content, not its padding.
SQUEEZE_RUN = 1024
_LONG_WHITESPACE = re.compile(rb"[ \t\r\n]{%d,}" % SQUEEZE_RUN)
_WHITESPACE = b" \t\r\n"
# A run of SQUEEZE_RUN whitespace bytes covers at least 8 consecutive bytes of the piece's
# every SAMPLE_STRIDE-th byte: a piece whose sample holds no 8 in a row holds no such run.
_SAMPLE_STRIDE = SQUEEZE_RUN // 8
_SAMPLED_RUN = re.compile(rb"[ \t\r\n]{8}")
_AS_SPACE = bytes.maketrans(b"\t\r\n", b"   ")
_SPACE_RUN = b" " * SQUEEZE_RUN


def max_trace_bytes() -> int:
    """The ceiling on a trace's decompressed size: `ADVISOR_MAX_TRACE_BYTES` (bytes, or 500M,
    8G, ...), else 16 GiB. A gzip bomb or a lying gzip trailer stops at this many bytes."""
    setting = os.environ.get(MAX_TRACE_ENV, "").strip()
    if not setting:
        return DEFAULT_MAX_TRACE_BYTES
    try:
        limit = parse_size(setting)
    except ValueError:
        limit = 0
    if limit <= 0:
        raise InputError(None, f"{MAX_TRACE_ENV}={setting!r}: expected a size in bytes such as 500M or 8G")
    return limit


def _too_large(path: Path, limit: int, what: str) -> InputError:
    return InputError(path, f"{what} more than {format_bytes(limit)} of JSON (the limit; set {MAX_TRACE_ENV} to raise it)")


def read_trace_bytes(path: Path, limit: int | None = None, digest: Any = None) -> bytes | bytearray:
    """The decompressed bytes of a trace file (gzip is recognised by its magic number).

    Memory follows the data actually read: gzip output grows one buffer piece by piece (a
    large bytearray grows in place, without the 2x peak of `gzip.decompress`'s join), and
    nothing is sized from the gzip trailer, whose size field a truncated or forged file can
    set to anything. More than `limit` bytes (max_trace_bytes()) is refused. `digest` (a
    hashlib object) is fed the file's bytes as they are read: the cache's key is the hash of
    exactly the bytes that were parsed.
    """
    bounded = limit is None and not os.environ.get(MAX_TRACE_ENV, "").strip()
    limit = max_trace_bytes() if limit is None else limit
    try:
        with open_regular(path) as f:  # a FIFO or a link to a device is refused, never read
            if not refuse_before_reading(path, f, limit, bounded):
                return _read_plain(path, f, limit, digest)
            if bounded:
                ratio_limit = max(GZIP_RATIO_FLOOR, GZIP_RATIO * os.fstat(f.fileno()).st_size)
                memory_limit = _available_memory() // 2
                if min(ratio_limit, memory_limit) < limit:
                    return _gunzip(path, f, min(ratio_limit, memory_limit), digest, ratio_limit <= memory_limit)
            return _gunzip(path, f, limit, digest)
    except IsADirectoryError:
        raise InputError(path, "is a directory, expected a trace file") from None
    except MemoryError:
        raise InputError(path, f"not enough memory to read the trace (set {MAX_TRACE_ENV} to refuse traces this large sooner)") from None
    except OSError as exc:
        raise InputError(path, f"cannot read: {exc.strerror or exc}") from None


def refuse_before_reading(path: Path, f: Any, limit: int | None = None, bounded: bool | None = None) -> bool:
    """Refuse (InputError) a trace file the loader would refuse by its size alone, from its
    first two bytes and its stat: a sparse file, a plain file over the limit or over half the
    memory available. True when it is gzip. The cache calls it before hashing a trace, so a
    file of many GB is refused in the time of a stat, cache on or off. `f` is left at offset 2."""
    if bounded is None:
        bounded = limit is None and not os.environ.get(MAX_TRACE_ENV, "").strip()
    limit = max_trace_bytes() if limit is None else limit
    st = os.fstat(f.fileno())
    if f.read(2) == b"\x1f\x8b":
        _refuse_sparse(path, st)  # zero padding after a gzip member is read to its end
        return True
    if bounded:
        # sized up front: half the memory available at most, before a byte is read
        memory_limit = _available_memory() // 2
        if memory_limit < limit and st.st_size > memory_limit:
            raise InputError(
                path, f"the file holds {format_bytes(st.st_size)}, more than half the memory available ({format_bytes(memory_limit)}); set {MAX_TRACE_ENV} to raise the limit"
            )
    _refuse_sparse(path, st)
    if st.st_size > limit:
        raise _too_large(path, limit, "the file holds")
    return False


# A file this long with under 1/SPARSE_RATIO of it stored on disk is mostly holes (`truncate
# -s 6G`): no profiler writes one, and reading it would fill memory with zeros. (A compressing
# file system stores JSON in a tenth to a thirtieth of its length, far above this.)
SPARSE_MIN_BYTES = 64 * 2**20
SPARSE_RATIO = 256


def _refuse_sparse(path: Path, st: os.stat_result) -> None:
    blocks = getattr(st, "st_blocks", None)
    if blocks is not None and st.st_size >= SPARSE_MIN_BYTES and blocks * 512 * SPARSE_RATIO < st.st_size:
        raise InputError(path, f"a sparse file ({format_bytes(st.st_size)} long, {format_bytes(blocks * 512)} of it on disk): not a trace")


def _read_plain(path: Path, f: Any, limit: int, digest: Any) -> bytearray:
    """The whole file into one buffer sized up front (f.read() grows and copies: 2x peak)."""
    size = os.fstat(f.fileno()).st_size
    if size > limit:
        raise _too_large(path, limit, "the file holds")
    out = bytearray(size)
    view = memoryview(out)
    f.seek(0)
    pos = 0
    while pos < size:
        n = f.readinto(view[pos:])
        if not n:
            break
        pos += n
    view.release()
    if pos < size:  # the file shrank while we read it
        del out[pos:]
    else:  # or grew: take the rest too
        rest = f.read(limit - size + 1)
        if len(out) + len(rest) > limit:
            raise _too_large(path, limit, "the file holds")
        if rest:
            out += rest
    if digest is not None:
        digest.update(out)
    return out


def _available_memory() -> int:
    """MemAvailable of /proc/meminfo (cgroup limits aside), or no bound where it is not there."""
    try:
        with open("/proc/meminfo", "rb") as fh:
            for line in fh:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return DEFAULT_MAX_TRACE_BYTES * 2


def _squeezed(piece: bytes) -> bytes:
    """PIECE with each run of SQUEEZE_RUN or more whitespace bytes as one space. Only pieces
    whose sample of every _SAMPLE_STRIDE-th byte could hold such a run (no real trace's does),
    and that are mostly whitespace (a counting pass in C; a real trace's pieces are a fifth
    whitespace or less), are searched. A run that long inside a JSON string loses its length."""
    if len(piece) < SQUEEZE_RUN or not _SAMPLED_RUN.search(piece[::_SAMPLE_STRIDE]):
        return piece
    # Pretty-printed JSON passes the sample (a third of it is indentation) but holds no run that
    # long: a search in C on the piece with all whitespace as spaces says so before the regex.
    if _SPACE_RUN not in piece.translate(_AS_SPACE):
        return piece
    if 2 * (len(piece) - len(piece.translate(None, _WHITESPACE))) < len(piece):
        return piece
    return _LONG_WHITESPACE.sub(b" ", piece)


def _gunzip(path: Path, f: Any, limit: int, digest: Any, by_ratio: bool | None = None) -> bytearray:
    """Inflate F (gzip members, then zero padding) into one buffer of at most LIMIT bytes, long
    whitespace squeezed. BY_RATIO: the limit is the default bound (True: GZIP_RATIO times the
    compressed size; False: half the available memory), said so when reached."""
    f.seek(0)
    out = bytearray()
    inflate = zlib.decompressobj(wbits=31)
    pending = b""
    try:
        while True:
            if not pending:
                pending = f.read(GZIP_READ_BYTES)
                if not pending:
                    break
                if digest is not None:
                    digest.update(pending)
            if inflate.eof:  # another gzip member follows (or zero padding)
                if not pending.strip(b"\x00"):
                    pending = b""
                    continue
                inflate = zlib.decompressobj(wbits=31)
            # Bounded pieces: the output buffer is the only large allocation.
            piece = _squeezed(inflate.decompress(pending, GZIP_PIECE_BYTES))
            pending = inflate.unused_data if inflate.eof else inflate.unconsumed_tail
            if len(out) + len(piece) > limit:
                if by_ratio is None:
                    raise _too_large(path, limit, "gzip inflates to")
                why = f"{GZIP_RATIO} times its compressed size (a gzip bomb?)" if by_ratio else "half the memory available"
                raise InputError(path, f"gzip inflates to more than {format_bytes(limit)} of JSON, {why}; set {MAX_TRACE_ENV} to raise the limit")
            out += piece
    except zlib.error as exc:
        raise InputError(path, f"corrupt gzip ({exc})") from None
    if not inflate.eof:
        raise InputError(path, "truncated gzip (file cut short while being written?)")
    return out


# --- JSON -------------------------------------------------------------------------------------
def decode_trace(
    path: Path,
    data: bytes | bytearray | memoryview,
    batch_threshold: int = BATCH_THRESHOLD_BYTES,
    batch_bytes: int = BATCH_BYTES,
) -> DecodedTrace:
    """Decode a trace document; events come as batches of about batch_bytes of JSON once the
    document is larger than batch_threshold (one batch below it)."""
    if data[:3] == UTF8_BOM:  # some editors and Windows tools write one; JSON does not allow it
        if isinstance(data, bytearray):
            del data[:3]  # cheap: a bytearray drops leading bytes without moving the rest
        else:
            data = bytes(data[3:])
    if len(data) == 0 or data.isspace():
        raise InputError(path, "file is empty")
    if bytes(data[:64]).lstrip()[:1] == b"[" and (legacy := _bare_list(path, data)) is not None:
        return legacy
    if len(data) <= batch_threshold:
        try:
            doc = _DOC.decode(data)
        except msgspec.ValidationError as exc:
            # A value of an odd type (AMD's runtime calls give `bytes` as text): the events
            # are split raw and decoded as batches, where only the events the typed decoder
            # rejects are cleaned up (_decode_batch), not the whole document.
            try:
                raw = _DOC_RAW.decode(data)
            except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError):
                doc = _lenient_doc(path, data, exc)
            else:
                return _decoded(path, raw, lambda raws: _raw_batches(path, raws, data, batch_bytes, rejected=True))
        except (msgspec.DecodeError, UnicodeDecodeError) as exc:
            doc = _lenient_doc(path, data, exc)
        return _decoded(path, doc, lambda events: iter([events]))
    try:
        doc = _DOC_RAW.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as exc:
        if len(data) > LENIENT_LIMIT_BYTES:
            raise InputError(path, _json_problem(exc)) from None
        return _decoded(path, _lenient_doc(path, data, exc), lambda events: iter([events]))
    return _decoded(path, doc, lambda raws: _raw_batches(path, raws, data, batch_bytes))


# The autograd profiler's exporter (torch.autograd.profiler, and torch.profiler where Kineto was
# not built in, 2019-2022) wrote a bare JSON list of events: complete events without a `cat`, an
# op's on `"pid": "CPU functions"`, the GPU time of its kernels on `"pid": "CUDA functions"` with
# the device as `tid`, and flow arrows (`cat` "cpu_to_cuda") between them.
LEGACY_PIDS = {"CPU functions": "cpu_op", "CUDA functions": "kernel"}


def _bare_list(path: Path, data: bytes | bytearray | memoryview) -> DecodedTrace | None:
    """A document that is a list of events, read as the autograd profiler's exporter wrote it
    (a span without a category is an op or a kernel by its `pid`); None when it is not valid
    JSON (the usual path then names the problem)."""
    try:
        events = msgspec.json.decode(data)
    except (msgspec.DecodeError, UnicodeDecodeError):
        return None
    if not isinstance(events, list):
        return None
    legacy = 0
    for e in events:
        if type(e) is dict and e.get("ph") == "X" and e.get("cat") is None and (cat := LEGACY_PIDS.get(e.get("pid"))) is not None:  # type: ignore[arg-type]
            e["cat"] = cat
            legacy += 1
            if cat == "kernel" and type(e.get("tid")) is int:
                e["args"] = {**(e.get("args") if type(e.get("args")) is dict else {}), "device": e["tid"]}
    typed = _typed_events(path, events)
    notes = [LEGACY_NOTE % legacy] if legacy else []
    return DecodedTrace(None, None, {}, len(typed), iter([typed]), notes)


LEGACY_NOTE = (
    "read as the autograd profiler's exporter wrote it (a bare list of events, %d without a category): "
    "ops and the GPU time of their kernels, no runtime calls, copies or device properties"
)


def _decoded(path: Path, doc: Any, batches: Any) -> DecodedTrace:
    if isinstance(doc, list):
        return DecodedTrace(None, None, {}, len(doc), batches(doc))
    events = doc.traceEvents
    if events is None:
        raise InputError(path, f"not a Chrome trace: expected {TRACE_FILE_HINT}")
    meta = {k: v for k in METADATA_KEYS if isinstance(v := getattr(doc, k), (str, int, float, bool))}
    return DecodedTrace(doc.deviceProperties, doc.distributedInfo, meta, len(events), batches(events))


def _raw_batches(path: Path, raws: list[msgspec.Raw], buffer: Any, batch_bytes: int, rejected: bool = False) -> Iterator[list[Event]]:
    """Decode raw event slices about batch_bytes at a time; each batch replaces the last, and
    the slices of a batch decoded are let go (the list keeps None in their place). `rejected`:
    the typed decoder has rejected an event of these, so each batch goes chunk by chunk."""
    if not raws:
        return
    sizes = np.fromiter(map(len, raws), dtype=np.int64, count=len(raws))
    cuts = np.searchsorted(np.cumsum(sizes), np.arange(batch_bytes, int(sizes.sum()) + batch_bytes, batch_bytes), side="left") + 1
    bounds = np.unique(np.clip(np.concatenate(([0], cuts, [len(raws)])), 0, len(raws)))
    for start, stop in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        batch = _decode_batch(path, raws, buffer, start, stop, rejected)
        raws[start:stop] = [None] * (stop - start)  # decoded: the slices' objects go (a large trace holds millions)
        yield batch


def _address(obj: Any) -> int:
    return np.frombuffer(obj, dtype=np.uint8).__array_interface__["data"][0]


def _decode_batch(path: Path, raws: list[msgspec.Raw], buffer: Any, start: int, stop: int, rejected: bool = False) -> list[Event]:
    """Decode raws[start:stop] as one JSON array; where the typed decoder rejects an event (or
    has: `rejected`), chunk by chunk (_decode_chunk), so one odd event costs its chunk."""
    if not rejected:
        try:
            return _typed(raws, buffer, start, stop)
        except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError):
            pass
    out: list[Event] = []
    for lo in range(start, stop, CHUNK_EVENTS):
        out += _decode_chunk(path, raws, buffer, lo, min(lo + CHUNK_EVENTS, stop))
    return out


# A batch the typed decoder rejects is decoded again CHUNK_EVENTS events at a time. In a
# chunk, each rejected event is cleaned up alone and the typed decode resumes after it, up to
# REJECTED_ALONE times; past that the rest of the chunk is cleaned up as one (a trace whose
# every event is odd costs what the lenient path costs, not a retry per event).
CHUNK_EVENTS = 1024
REJECTED_ALONE = 8
# The event msgspec rejected: the index of the path its message ends with (`... - at `$[12].ph``).
# Greedy: a value the message quotes before it (a "ph" of "- at `$[9999]`") is not the path.
_REJECTED_AT = re.compile(r".*- at `\$\[(\d+)\][^`]*`$", re.S)


def _decode_chunk(path: Path, raws: list[msgspec.Raw], buffer: Any, start: int, stop: int) -> list[Event]:
    out: list[Event] = []
    for _ in range(REJECTED_ALONE):
        try:
            return out + _typed(raws, buffer, start, stop)
        except msgspec.ValidationError as exc:
            m = _REJECTED_AT.match(str(exc))
            if m is None or int(m.group(1)) >= stop - start:
                return out + _cleaned(path, raws, start, stop, exc)
            at = start + int(m.group(1))  # the events before it passed: msgspec validates in order
            if at > start:
                out += _typed(raws, buffer, start, at)
            out += _cleaned(path, raws, at, at + 1, exc)
            start = at + 1
        except (msgspec.DecodeError, UnicodeDecodeError) as exc:
            return out + _cleaned(path, raws, start, stop, exc)
        if start >= stop:
            return out
    return out + _cleaned(path, raws, start, stop, None)


def _typed(raws: list[msgspec.Raw], buffer: Any, start: int, stop: int) -> list[Event]:
    """raws[start:stop] through the typed decoder (its errors raised).

    The raw slices are views into the document, separated by commas and whitespace, so when
    the document is a bytearray the array is decoded in place: the separator before the first
    event becomes '[' and the one after the last becomes ']' for the duration of the decode.
    """
    if isinstance(buffer, bytearray):
        base = _address(buffer)
        first = _address(raws[start]) - base
        last = _address(raws[stop - 1]) - base + len(raws[stop - 1])
        if 0 < first and last < len(buffer):
            before, after = buffer[first - 1], buffer[last]
            buffer[first - 1], buffer[last] = 0x5B, 0x5D  # "[" and "]"
            try:
                # No explicit release: raw values decoded from the view (Input Dims) point into it.
                return _EVENTS.decode(memoryview(buffer)[first - 1 : last + 1])
            finally:
                buffer[first - 1], buffer[last] = before, after
    return _EVENTS.decode(b"[" + b",".join(raws[start:stop]) + b"]")


def _cleaned(path: Path, raws: list[msgspec.Raw], start: int, stop: int, first: Exception | None) -> list[Event]:
    """raws[start:stop] through the lenient path (Python's json, then each event cleaned up);
    `first`: what the typed decoder said of them, for the error should the JSON be bad."""
    data = b"[" + b",".join(raws[start:stop]) + b"]"
    events = _lenient_json(path, data, first)
    return _typed_events(path, events if isinstance(events, list) else [])


def _json_problem(exc: Exception) -> str:
    msg = str(exc)
    if isinstance(exc, msgspec.DecodeError) and "truncated" in msg:
        return "truncated JSON (profiler stopped mid-write?)"
    if isinstance(exc, UnicodeDecodeError):
        return f"invalid UTF-8 at byte {exc.start}"
    if isinstance(exc, msgspec.ValidationError):
        return f"not a Chrome trace ({msg}): expected {TRACE_FILE_HINT}"
    msg = msg.replace("JSON is malformed: ", "")
    return f"invalid JSON: {msg}"


# A `\uD800`-`\uDBFF` escape: msgspec reads on for the low surrogate after it, so one in the
# document's last string (`"traceName": "run\ud83d"}`) reads to it as truncated.
_HIGH_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abAB][0-9a-fA-F]{2}")


def _truncated(exc: Exception | None, data: bytes | bytearray | memoryview) -> bool:
    """msgspec says the input ends early, and no lone surrogate escape at its end says so instead."""
    return isinstance(exc, msgspec.DecodeError) and "truncated" in str(exc) and not _HIGH_SURROGATE_ESCAPE.search(bytes(data[-16:]))


def _lenient_json(path: Path, data: bytes | bytearray | memoryview, first: Exception | None) -> Any:
    """Python's json on the text with bad bytes replaced: accepts NaN, Infinity, 1e400, big ints,
    and lone surrogate escapes (made U+FFFD by _clean)."""
    if _truncated(first, data):
        raise InputError(path, _json_problem(first)) from None
    text = bytes(data).decode("utf-8", errors="replace")
    try:
        return json.loads(text)
    except RecursionError:
        raise InputError(path, "invalid JSON: nested too deeply") from None
    except ValueError as exc:
        if isinstance(first, msgspec.ValidationError):
            # The typed decode stopped at a value of an odd type (which the lenient path
            # accepts); the JSON itself is broken somewhere else: name that place instead.
            raise InputError(path, _syntax_problem(data) or f"invalid JSON: {exc}") from None
        if isinstance(first, msgspec.DecodeError):
            raise InputError(path, _json_problem(first)) from None
        raise InputError(path, f"invalid JSON: {exc}") from None


def _syntax_problem(data: bytes | bytearray | memoryview) -> str | None:
    """What is wrong with the JSON as JSON (no types): trailing characters at byte N, ..."""
    try:
        msgspec.json.decode(data)
    except msgspec.DecodeError as exc:
        return _json_problem(exc)
    except UnicodeDecodeError as exc:
        return _json_problem(exc)
    return None


def _lenient_doc(path: Path, data: bytes | bytearray | memoryview, first: Exception) -> Any:
    obj = _lenient_json(path, data, first)
    if isinstance(obj, list):
        return _typed_events(path, obj)
    if not isinstance(obj, dict) or not isinstance(obj.get("traceEvents"), list):
        raise InputError(path, f"not a Chrome trace: expected {TRACE_FILE_HINT}")
    header = {k: _clean(obj.get(k)) for k in ("deviceProperties", "distributedInfo", *METADATA_KEYS)}
    doc = msgspec.convert(header, TraceDoc)
    doc.traceEvents = _typed_events(path, obj["traceEvents"])
    return doc


# --- clean-up of odd events (the slow path) ---------------------------------------------------
def _float_or_none(v: Any) -> float | None:
    """A finite number as float (None drops the key: the field reads as missing)."""
    if type(v) is float:
        return v if math.isfinite(v) else None
    if type(v) is int:
        return float(v) if abs(v) < 2**1023 else None
    return None


def _int_or_none(v: Any) -> int | None:
    if type(v) is int:
        return v if INT64_MIN <= v <= INT64_MAX else None
    if type(v) is float and math.isfinite(v) and v == int(v) and abs(v) < 2**63:
        return int(v)
    return None


def _arg_kind(t: Any) -> str:
    return "int" if t is int else "float" if t is float else "str" if t == (str | None) else "raw"


_ARG_KINDS = {f.encode_name: _arg_kind(f.type) for t in (EventArgs, MemoryArgs) for f in msgspec.structs.fields(t)}


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _text(s: str) -> str:
    """A string msgspec can encode: a lone surrogate (`"\\ud800"` in the JSON, which Python's
    parser accepts) becomes U+FFFD, and the rest of the name and of the trace is kept."""
    if not _LONE_SURROGATE.search(s):
        return s
    return s.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _clean(v: Any) -> Any:
    """A JSON value msgspec can encode and decode back: out-of-range numbers become null,
    lone surrogates U+FFFD."""
    t = type(v)
    if t is str:
        return _text(v)
    if t is int:
        return v if INT64_MIN <= v <= INT64_MAX else (float(v) if abs(v) < 2**1023 else None)
    if t is float:
        return v if math.isfinite(v) else None
    if t is list:
        return [_clean(x) for x in v]
    if t is dict:
        return {_text(str(k)): _clean(x) for k, x in v.items()}
    return v


_CLEAN_ARG = {
    "int": _int_or_none,
    "float": _float_or_none,
    "str": lambda v: _text(v) if type(v) is str else None,
    "raw": _clean,
}


def _clean_event(e: Any) -> dict[str, Any] | None:
    if type(e) is not dict:
        return None
    ph = e.get("ph")
    if type(ph) is not str or ph not in KNOWN_PHASES:
        return None  # not an event the Chrome trace format defines
    out: dict[str, Any] = {"ph": ph}
    if type(v := e.get("cat")) is str:
        out["cat"] = _text(v)
    name = e.get("name")
    if name is not None:
        out["name"] = _text(name if type(name) is str else str(name))
    for key in ("ts", "dur"):
        if (v := _float_or_none(e.get(key))) is not None:
            out[key] = v
    tid = e.get("tid")
    if tid is not None:
        out["tid"] = _text(tid) if type(tid) is str else tid if type(tid) is int and INT64_MIN <= tid <= INT64_MAX else _text(str(tid))
    args = e.get("args")
    if type(args) is dict:
        clean_args = {}
        for key, v in args.items():
            kind = _ARG_KINDS.get(key)
            if kind is None:
                continue
            v = _CLEAN_ARG[kind](v)
            if v is not None:
                clean_args[key] = v
        out["args"] = clean_args
    return out


def _typed_events(path: Path, events: list[Any]) -> list[Event]:
    cleaned = [c for e in events if (c := _clean_event(e)) is not None]
    try:
        return _EVENTS.decode(msgspec.json.encode(cleaned))
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeError) as exc:  # pragma: no cover - clean-up covers the types
        raise InputError(path, f"malformed trace events ({exc})") from None
