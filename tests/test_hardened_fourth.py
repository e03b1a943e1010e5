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
