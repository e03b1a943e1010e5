"""The SHA-256 of a trace's bytes, remembered per path as of its stat (under its own seal)."""

from __future__ import annotations

import hashlib
import hmac
import os
import re
from pathlib import Path

import orjson

from advisor.files import replace_file
from advisor.files_read import read_regular
from advisor.cache.seal import SMALL_FILE_BYTES, _sha, secret
from advisor.cache.settings import cache_dir_setting, cache_enabled, user_cache_root


HASH_READ_BYTES = 1 << 20
DIGESTS_DIR = "digests"  # per trace path: the hash of its bytes as of its stat (trace_digest)
_MEMO_NAME = re.compile(r"^\.?([0-9a-f]{32})(?:\.\d+)?$")


def content_digest(path: Path) -> str:
    """SHA-256 of a trace file's bytes, read in pieces (about 1.5 GB/s), once the loader's
    checks by size have passed: a sparse or too-large file is refused (InputError) before a
    byte of it is hashed, as it would be by the loader with the cache off."""
    from advisor.files_read import open_regular
    from advisor.load.decode import refuse_before_reading

    h = hashlib.sha256()
    with open_regular(path) as f:  # a FIFO or device is an OSError, never a hang
        refuse_before_reading(Path(path), f)
        f.seek(0)
        while chunk := f.read(HASH_READ_BYTES):
            h.update(chunk)
    return h.hexdigest()


def _stat_of(path: Path) -> list[int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _digest_memo(path: Path) -> Path | None:
    home = user_cache_root() or cache_dir_setting()
    if home is None:
        return None
    try:
        where = str(Path(path).resolve())
    except (OSError, RuntimeError):
        return None
    return home / DIGESTS_DIR / _sha(where.encode("utf-8", "surrogateescape"))[:32]


def _digest_mac(key: bytes, path: Path, stat_: list[int], sha: str) -> str:
    return hmac.new(key, orjson.dumps([str(path), stat_, sha]), hashlib.sha256).hexdigest()


def trace_digest(path: Path) -> str:
    """content_digest of a trace, remembered per file: a file whose device, inode, size, mtime
    and ctime are those it had when its bytes were hashed is not read again (ctime changes with
    every write and cannot be set back, and a copy is another inode). The memo is sealed with
    the cache's secret; without one, or on any doubt, the bytes are hashed."""
    path = Path(path)
    memo, key = _digest_memo(path), secret()
    before = _stat_of(path)
    if memo is not None and key is not None and before is not None:
        try:
            doc = orjson.loads(read_regular(memo, SMALL_FILE_BYTES, follow=False))
            if doc["stat"] == before and hmac.compare_digest(doc["mac"], _digest_mac(key, memo, before, doc["sha256"])):
                return doc["sha256"]
        except (OSError, orjson.JSONDecodeError, KeyError, TypeError):
            pass
    sha = content_digest(path)
    remember_digest(path, sha, before)
    return sha


def remember_digest(path: Path, sha: str, before: list[int] | None) -> None:
    """Note the hash of a file's bytes, read while it had stat `before` (kept only if it still has)."""
    if before is None or _stat_of(path) != before or not cache_enabled():
        return
    memo, key = _digest_memo(path), secret(create=True)
    if memo is None or key is None:
        return
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        if memo.parent.is_symlink():
            return  # never written through a link
        replace_file(memo, orjson.dumps({"stat": before, "sha256": sha, "mac": _digest_mac(key, memo, before, sha)}), sync=False, mode=0o600)
    except OSError:
        pass
