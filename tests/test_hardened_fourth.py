"""Hostile input, fourth round: each test is built from one reproducer.

- A trace the loader refuses by its size (sparse, too large) is refused before the cache hashes it.
- `advisor fix --verify` ends a run when the script's process ends, whatever it forked.
- `advisor fix` never writes a keyword the call already passes by position, and reads a script
  in the encoding it declares, with its line ends.
- An operator shape no real run has (a negative or non-integer dimension, a rate past the
  device's peak) is not costed.
- The decoder reads a lone surrogate at the end of the document, and an event whose value
  holds msgspec's path syntax, as anywhere else.

Every input is generated here (or is one of this project's own recordings, changed as named).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import SAMPLE_RUNS

CPU_RUN = SAMPLE_RUNS / "resnet18_cifar" / "runs" / "cpu_baseline"


@pytest.fixture(autouse=True)
def private_dirs(tmp_path_factory, monkeypatch):
    """A cache and a user config folder of this test's own."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("xdg-config")))
    for k in ("ADVISOR_CACHE", "ADVISOR_SCHEDULER", "ADVISOR_MAX_TRACE_BYTES"):
        monkeypatch.delenv(k, raising=False)


def _bytes_read_by_this_process() -> int:
    """rchar of /proc/self/io: every byte this process has had from read() so far."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


# --- P1: nothing hashed before it is checked --------------------------------------------------
@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs /proc/self/io to count the bytes read")
@pytest.mark.parametrize("cache", ["on", "off", "dir"])
def test_a_sparse_trace_is_refused_before_the_cache_hashes_it(cli, tmp_path, cache):
    """The reproducer: `truncate -s 6G t.pt.trace.json`, then `advisor report` with the cache on
    (the default) hashed every byte before the loader's sparse check (38 s; 200 GB ~20 min).
    Now it is refused in one line, exit 2, cache on or off, with a few MB read at most (the
    file's 2 GiB of zeros are never read: /proc/self/io's rchar counts every read)."""
    log = tmp_path / "log"
    log.mkdir()
    trace = log / "t.pt.trace.json"
    with open(trace, "wb") as f:
        f.truncate(2 * 2**30)  # 2 GiB of holes: a few blocks on disk
    env = {"ADVISOR_CACHE": str(tmp_path / "cache")} if cache == "dir" else {"ADVISOR_CACHE": cache}
    for target in (trace, log):
        before = _bytes_read_by_this_process()
        code, out, err = cli(["report", str(target), "-f", "json"], env=env)
        read = _bytes_read_by_this_process() - before
        assert code == 2, out + err
        [line] = err.strip().splitlines()
        assert str(trace) in line and "sparse file" in line, line
        assert read < 64 * 2**20, f"{read:,} bytes read: the file was hashed or read"


def test_the_cache_hash_refuses_what_the_loader_refuses_by_size(tmp_path, monkeypatch):
    """The same check sits in front of both: a plain trace over ADVISOR_MAX_TRACE_BYTES is an
    InputError from content_digest with the loader's own words, before a byte is hashed."""
    from advisor.cache.digests import content_digest
    from advisor.errors import InputError
    from advisor.load.decode import read_trace_bytes

    trace = tmp_path / "t.pt.trace.json"
    trace.write_bytes(b'{"traceEvents": []}' + b" " * 2000)
    monkeypatch.setenv("ADVISOR_MAX_TRACE_BYTES", "1000")
    with pytest.raises(InputError) as by_hash:
        content_digest(trace)
    with pytest.raises(InputError) as by_loader:
        read_trace_bytes(trace)
    assert by_hash.value.line() == by_loader.value.line()
    assert str(trace) in by_hash.value.line() and "more than 1000 B of JSON" in by_hash.value.line()
    monkeypatch.delenv("ADVISOR_MAX_TRACE_BYTES")
    import hashlib

    assert content_digest(trace) == hashlib.sha256(trace.read_bytes()).hexdigest()


# --- P5, P6: the decoder ------------------------------------------------------------------------
def _events(n: int) -> list[dict]:
    """N host ops and their kernels, as a current-schema trace writes them."""
    out = []
    for i in range(n):
        out.append({"ph": "X", "cat": "cpu_op", "name": f"aten::op{i % 7}", "pid": 1, "tid": 1, "ts": 10.0 * i, "dur": 5.0, "args": {"External id": i + 1}})
        out.append({"ph": "X", "cat": "kernel", "name": f"kernel{i % 5}", "pid": 0, "tid": 7, "ts": 10.0 * i + 2, "dur": 3.0, "args": {"External id": i + 1, "device": 0, "stream": 7}})
    return out


def _same_frames(a, b) -> None:
    import pandas as pd

    for table in ("host", "device", "runtime", "steps"):
        pd.testing.assert_frame_equal(getattr(a, table), getattr(b, table))


def test_a_lone_surrogate_in_the_last_string_of_the_document_reads_as_elsewhere(tmp_path):
    """The reproducer: `"traceName": "run\\ud83d"}` at the end of the document gave "truncated
    JSON (profiler stopped mid-write?)", exit 2 (msgspec reads on past the end for the low
    surrogate); anywhere else a lone surrogate reads as U+FFFD. At the end it does too, and the
    events are those of the same trace without it. A trace really cut short is still said so."""
    import orjson

    from advisor.errors import InputError
    from advisor.load.trace import load_trace

    events = _events(30)
    plain = tmp_path / "plain.json"
    plain.write_bytes(orjson.dumps({"traceEvents": events, "traceName": "run"}))
    odd = tmp_path / "odd.json"
    odd.write_bytes(orjson.dumps({"traceEvents": events, "traceName": "runMARK"}).replace(b"MARK", b"\\ud83d"))
    assert odd.read_bytes().endswith(b'"run\\ud83d"}')
    frames = load_trace(odd)
    assert frames.metadata["traceName"] == "run\ufffd"
    _same_frames(frames, load_trace(plain))
    # the same in the last event of a chunk the typed decoder rejected (an odd type earlier on)
    chunked = [dict(e) for e in events]
    chunked[3]["dur"] = "5"
    chunked[-1]["name"] = "kernelMARK"
    odd.write_bytes(orjson.dumps({"traceEvents": chunked}).replace(b"MARK", b"\\ud83d"))
    assert load_trace(odd).device["name"].iloc[-1] == "kernel\ufffd"
    cut = tmp_path / "cut.json"
    cut.write_bytes(orjson.dumps({"traceEvents": events})[:-40])
    with pytest.raises(InputError, match="truncated JSON"):
        load_trace(cut)
    cut.write_bytes(orjson.dumps({"traceEvents": events, "traceName": "runMARK"}).replace(b"MARK", b"\\ud83d")[:-2])
    with pytest.raises(InputError, match="truncated JSON"):
        load_trace(cut)


@pytest.mark.parametrize("where", [0, 1023, 1500])
@pytest.mark.parametrize("ph", ["- at `$[9999]`", "- at `$[0]`", "x - at `$[2].ph`", "Q"])
def test_an_event_whose_value_reads_like_msgspecs_path_is_dropped_alone(tmp_path, where, ph):
    """The reproducer: one event with `"ph": "- at `$[9999]`"` refused the whole trace
    ("malformed trace events (IndexError)"): the rejected event's index was read out of the
    value msgspec's message quotes, not the path it ends with. It is dropped, as one with
    `"ph": "Q"` is, wherever it sits in the 1,024-event chunks: the frames are the trace's
    without it."""
    import orjson

    from advisor.load.trace import load_trace

    events = _events(1000)  # 2,000 events: two chunks
    bad = {"ph": ph, "cat": "cpu_op", "name": "odd", "pid": 1, "tid": 1, "ts": 1.0, "dur": 1.0}
    with_bad = tmp_path / "bad.json"
    with_bad.write_bytes(orjson.dumps({"traceEvents": events[:where] + [bad] + events[where:]}))
    without = tmp_path / "without.json"
    without.write_bytes(orjson.dumps({"traceEvents": events}))
    _same_frames(load_trace(with_bad), load_trace(without))


# --- P4: shapes no run has, rates no device reaches ----------------------------------------------
H100 = [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85_000_000_000, "computeMajor": 9, "computeMinor": 0, "numSms": 132}]


def _gemm_trace(path: Path, gemms: list[tuple[list, float]]) -> Path:
    """One 10 ms ProfilerStep of bf16 `aten::mm` calls, each (Input Dims, kernel µs), on an H100."""
    ev = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 10_000}]
    t = 10.0
    for i, (dims, us) in enumerate(gemms):
        args = {"External id": i + 1, "Input Dims": dims, "Input type": ["c10::BFloat16", "c10::BFloat16"]}
        ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": t, "dur": 8, "args": args})
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": t + 1, "dur": 5, "args": {"External id": i + 1, "correlation": i + 1}})
        ev.append({"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "pid": 0, "tid": 7, "ts": t + 10, "dur": us,
                   "args": {"External id": i + 1, "correlation": i + 1, "device": 0, "stream": 7}})
        t += 10 + us + 5
    ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::sum", "pid": 1, "tid": 1, "ts": 9_990, "dur": 5})
    import orjson

    path.mkdir(parents=True, exist_ok=True)
    (path / "t.pt.trace.json").write_bytes(orjson.dumps({"traceEvents": ev, "deviceProperties": H100}))
    return path


@pytest.mark.parametrize(
    "dims",
    [
        [[-64, 128], [128, 256]],  # a negative dimension: negative FLOPs
        [[True, True], [True, 256]],  # booleans read as 1
        [[64.0, 128], [128, 256]],  # not a whole number
        [[64, 128], [128, -1]],
    ],
)
def test_a_shape_with_a_negative_or_non_integer_dimension_is_not_costed(dims):
    """The reproducer: `Input Dims` with a negative dimension gave negative FLOPs and TFLOP/s,
    booleans read as 1 (`True×True×256`). No cost for such a shape; a real one beside it is
    costed by hand: mm [2,3]×[3,4] is 2·2·4·3 = 48 FLOPs, (2·3 + 3·4 + 2·4)·4 = 104 bytes."""
    from advisor.metrics.op_cost import op_cost

    assert op_cost("aten::mm", ("float", "float"), dims, None) is None
    cost = op_cost("aten::mm", ("float", "float"), [[2, 3], [3, 4]], None)
    assert (cost.flops, cost.bytes) == (48, 104)
    assert op_cost("aten::_fused_adam_", ("float",), [[[4, 4], [-4, 4]]], None).flops == 12 * 16  # the negative tensor is not counted


@pytest.mark.parametrize("dims", [[True, 4], [-2, 4], [2.0, 4], "[2, 4]", None])
def test_every_shape_reader_refuses_what_is_not_a_shape(dims):
    """Casts (autocast), copies (host_device), attention and elementwise chains read shapes
    through one definition: a bool, a negative or a float dimension is no shape, so no element
    is counted from it (a bool read as 1 made `[True, 4]` four elements)."""
    from advisor.metrics import attention, autocast, elementwise
    from advisor.metrics.shapes import is_shape, numel

    assert not is_shape(dims) and numel(dims) == 0
    assert autocast.numel is numel and elementwise.numel is numel
    assert not attention._sized(dims)
    assert numel([2, 3, 4]) == 24 and numel([]) == 1 and attention._sized([2, 3])


def test_a_rate_past_the_device_is_left_out_with_a_note(cli, tmp_path):
    """The reproducer: a 10⁶×10⁶ `mm` in 2 µs showed 400,000,000 TFLOP/s on a 67 TFLOP/s H100
    (fp32; 989 bf16), and booleans and negative dimensions were costed. Now only the real
    512³ GEMM is on the roofline: 2·512³ = 268,435,456 FLOP in 2 µs = 134.2 TFLOP/s; the
    10⁶ one is left out, said in one note naming the op."""
    import json

    run = _gemm_trace(tmp_path / "run", [([[1_000_000, 1_000_000], [1_000_000, 1_000_000]], 2.0), ([[-64, 128], [128, 256]], 2.0), ([[True, True], [True, 256]], 2.0), ([[512, 512], [512, 512]], 2.0)])
    code, out, err = cli(["report", str(run), "--ops", "-f", "json"], env={"ADVISOR_CACHE": "off"})
    assert code == 0, err
    doc = json.loads(out)
    assert [(o["shape"], round(o["tflops"], 1)) for o in doc["ops"]] == [("512×512×512", 134.2)]
    [note] = [n for n in doc["notes"] if "op shape" in n]
    assert note.startswith("left out 1 op shape(s)") and "H100 SXM" in note and "(aten::mm)" in note, note
    code, out, err = cli(["report", str(run), "-f", "json"], env={"ADVISOR_CACHE": "off"})
    assert code == 0 and note in json.loads(out)["notes"], err  # the report says it too, not only --ops


def test_an_impossible_rate_never_sets_tensor_core_tiles_reference(cli, tmp_path):
    """tensor-core-tile sets a misaligned GEMM against the run's aligned GEMMs of its precision
    of about the same FLOPs. An aligned 4096×4096×4104 GEMM recorded in 0.01 µs (13.8 million
    TFLOP/s) was that reference; now it is left out, and the reference is the aligned 4096³ GEMM
    that took 250 µs: 2·4096³ / 250 µs = 549.76 TFLOP/s (the misaligned 4095×4096×4096 took
    1,000 µs)."""
    import json

    gemms = [([[4095, 4096], [4096, 4096]], 1000.0), ([[4096, 4104], [4104, 4096]], 0.01)]
    code, out, err = cli(["report", str(_gemm_trace(tmp_path / "alone", gemms)), "-f", "json", "--select", "tensor-core-tile"], env={"ADVISOR_CACHE": "off"})
    assert code == 0, err
    doc = json.loads(out)
    assert not [f for f in doc["findings"] + doc["considered"] if f["rule"] == "tensor-core-tile"], "no aligned GEMM that ran: no reference"
    gemms.append(([[4096, 4096], [4096, 4096]], 250.0))
    code, out, err = cli(["report", str(_gemm_trace(tmp_path / "beside", gemms)), "-f", "json", "--select", "tensor-core-tile"], env={"ADVISOR_CACHE": "off"})
    assert code == 0, err
    doc = json.loads(out)  # ranked or considered (the host's own work holds this made-up step)
    [finding] = [f for f in doc["findings"] + doc["considered"] if f["rule"] == "tensor-core-tile"]
    assert [s["aligned_tflops"] for s in finding["evidence"]["shapes"]] == [549.76]


# --- P7, P8, P9: scripts as Python reads them -----------------------------------------------------
GPU_RUN = SAMPLE_RUNS / "resnet18_cifar" / "runs" / "gpu_baseline"  # its dataloader-stall finding asks for num_workers=15
LOADER = b"from torch.utils.data import DataLoader\n\nloader = DataLoader(list(range(8)), batch_size=4)\nfor x in loader:\n    pass\n"
FIXED_CALL = b"loader = DataLoader(list(range(8)), batch_size=4, num_workers=15, persistent_workers=True)"


def _fix_write(cli, script: Path) -> tuple[int, str, str]:
    return cli(["fix", str(script), "--from", str(GPU_RUN), "--select", "dataloader-stall", "--write"], cwd=script.parent, env={"ADVISOR_CACHE": "off"})


@pytest.mark.parametrize(
    "encoding, line",
    [("latin-1", 'name = "café"  # naïve\n'), ("shift_jis", 'name = "日本"\n'), ("cp1252", 'euro = "€"\n')],
)
def test_a_script_in_its_declared_encoding_is_fixed_in_it(cli, tmp_path, encoding, line):
    """The reproducer: `advisor fix` on a script with `# -*- coding: latin-1 -*-` (or shift_jis)
    said "'utf-8' codec can't decode" although Python runs it. It is read and written in the
    encoding it declares (PEP 263): the written file is the original's bytes with only the
    DataLoader line changed, and Python compiles it."""
    script = tmp_path / "train.py"
    original = f"# -*- coding: {encoding} -*-\n{line}".encode(encoding) + LOADER
    script.write_bytes(original)
    code, out, err = _fix_write(cli, script)
    assert code == 0, err
    want = original.replace(b"loader = DataLoader(list(range(8)), batch_size=4)", FIXED_CALL)
    assert script.read_bytes() == want
    assert (tmp_path / "train.py.orig").read_bytes() == original
    compile(script.read_bytes(), str(script), "exec")


def test_an_encoding_python_does_not_know_is_one_line(cli, tmp_path):
    script = tmp_path / "train.py"
    script.write_bytes(b"# -*- coding: no-such-codec -*-\n" + LOADER)
    code, out, err = _fix_write(cli, script)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "no-such-codec" in err and str(script) in err, err
    assert script.read_bytes() == b"# -*- coding: no-such-codec -*-\n" + LOADER and not (tmp_path / "train.py.orig").exists()


@pytest.mark.parametrize("end", [b"\r", b"\r\n", b"\n"])
def test_a_script_keeps_its_line_ends_to_the_last(cli, tmp_path, end):
    """The reproducer: `fix --write` on a script with CR-only line ends dropped the final CR.
    Every line end of the written file is the script's own, the last one included."""
    script = tmp_path / "train.py"
    original = LOADER.replace(b"\n", end)
    script.write_bytes(original)
    code, out, err = _fix_write(cli, script)
    assert code == 0, err
    assert script.read_bytes() == original.replace(b"loader = DataLoader(list(range(8)), batch_size=4)", FIXED_CALL)


def test_a_nul_byte_is_named_with_its_line(cli, tmp_path):
    """The reproducer: a NUL byte in a script said "does not compile as Python (… (line None))".
    The line of the first NUL is named (here 2), in one line, and nothing is written."""
    script = tmp_path / "train.py"
    original = b"import os\nx = 'a\x00b'\n" + LOADER
    script.write_bytes(original)
    code, out, err = _fix_write(cli, script)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "line None" not in err and "null bytes (line 2)" in err, err
    assert script.read_bytes() == original and not (tmp_path / "train.py.orig").exists()


# --- N19: a report file that cannot be written is refused before the script runs -----------------
@pytest.mark.parametrize("where", ["under-a-file", "socket", "unwritable"])
def test_profile_refuses_a_report_file_it_could_not_write_before_running(cli, tmp_path, where):
    """The reproducer: a bad `-o` for `advisor profile` was refused only after the whole
    measurement (10.3 s). Now it is one line (exit 2) before the script starts: the script,
    which would leave a file behind at its first line, never runs, and no log dir is made."""
    import socket

    script = tmp_path / "train.py"
    script.write_text("from pathlib import Path\nPath(__file__).with_name('ran').write_text('')\n")
    if where == "under-a-file":
        (tmp_path / "notes.txt").write_text("mine")
        output, said = tmp_path / "notes.txt" / "r.json", "is not a folder"
    elif where == "socket":
        output, said = tmp_path / "r.json", "is a socket"
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(output))
    else:
        if os.geteuid() == 0:
            pytest.skip("root writes into any folder: an unwritable one cannot be made here")
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        output, said = locked / "r.json", "is not writable"
    code, out, err = cli(["profile", "--out", str(tmp_path / "logs"), "-o", str(output), str(script)], cwd=tmp_path)
    assert code == 2 and len(err.strip().splitlines()) == 1 and said in err and str(output) in err, err
    assert not (tmp_path / "ran").exists() and not (tmp_path / "logs").exists() and not (tmp_path / "advisor_runs").exists()


# --- where the advisor writes (docs/files.md) ---------------------------------------------------
def _tree(folder: Path) -> dict[str, tuple[int, int]]:
    """Every path under FOLDER with its size and mtime (ns)."""
    return {p.relative_to(folder).as_posix(): (p.lstat().st_size, p.lstat().st_mtime_ns) for p in sorted(folder.rglob("*"))}


@pytest.mark.parametrize("cache", ["default", "off", "dir"])
def test_a_report_writes_nothing_beside_the_trace(cli, tmp_path, cache):
    """docs/files.md: `advisor report` leaves the log dir as it was, in every format and with
    the cache on (its entries, secret and remembered hashes in the user cache folder only),
    off (nothing anywhere), or in a folder of its own (entries there, secret and hashes in the
    user cache folder). The working folder gets nothing either, unless -o names a file."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(CPU_RUN, run)
    work = tmp_path / "work"
    work.mkdir()
    xdg = Path(os.environ["XDG_CACHE_HOME"])
    own = tmp_path / "own-cache"
    env = {"default": {}, "off": {"ADVISOR_CACHE": "off"}, "dir": {"ADVISOR_CACHE": str(own)}}[cache]
    before = _tree(run)
    trace = next(p for p in run.iterdir() if ".pt.trace.json" in p.name)
    for target in (run, trace):
        for fmt in ("text", "json", "md"):
            code, out, err = cli(["report", str(target), "-f", fmt], cwd=work, env=env)
            assert code == 0 and out, err
    assert _tree(run) == before, "nothing written, changed or touched in the log dir"
    assert not list(work.iterdir())
    cached = sorted(p.relative_to(xdg).parts[1] for p in xdg.rglob("*") if len(p.relative_to(xdg).parts) == 2)
    if cache == "off":
        assert cached == [] and not own.exists()
    elif cache == "dir":
        assert set(cached) == {"secret.key", "digests"}, cached
        entries = [p.name for p in own.iterdir()]  # a frames entry only where the parse took long enough to keep
        assert all(n.startswith(("frames-", "analysis-")) for n in entries) and any(n.startswith("analysis-") for n in entries), entries
    else:
        entries = set(cached) - {"secret.key", "digests"}
        assert {"secret.key", "digests"} <= set(cached) and all(n.startswith(("frames-", "analysis-")) for n in entries), cached
        assert any(n.startswith("analysis-") for n in entries), cached
    code, out, err = cli(["report", str(run), "-f", "html", "-o", str(work / "r.html")], cwd=work, env=env)
    assert code == 0, err
    assert [p.name for p in work.iterdir()] == ["r.html"] and _tree(run) == before


def test_a_convolution_whose_shapes_give_no_output_is_not_costed():
    """Found by the roofline's fuzz harness: a kernel larger than its padded input (x 2×2, w
    64×64) gave an output of -61×-61 and 30 MFLOP (two negatives make a positive), and a
    negative stride or padding a size no run has. Not costed now; a real 3×3 convolution of
    an 8×8 input, stride 1, padding 1, is: output 8×8, 2·(1·3·3) FLOP per output element,
    18·64 = 1,152 FLOP."""
    from advisor.metrics.op_cost import op_cost

    args = lambda stride, padding, transposed="False": ["", "", "", stride, padding, "[1, 1]", transposed, "[0, 0]", "1"]  # noqa: E731
    types = ("float", "float", "float")
    assert op_cost("aten::convolution", types, [[1, 1, 2, 2], [1, 1, 64, 64], []], args("[1, 1]", "[0, 0]")) is None
    assert op_cost("aten::convolution", types, [[1, 1, 8, 8], [1, 1, 3, 3], []], args("[-1, -1]", "[0, 0]")) is None
    assert op_cost("aten::convolution", types, [[1, 1, 8, 8], [1, 1, 3, 3], []], args("[1, 1]", "[-5, -5]", "True")) is None
    cost = op_cost("aten::convolution", types, [[1, 1, 8, 8], [1, 1, 3, 3], []], args("[1, 1]", "[1, 1]"))
    assert cost.flops == 1152 and cost.shape.endswith("→ [1,1,8,8]")
