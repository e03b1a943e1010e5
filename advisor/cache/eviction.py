"""Size: the entries the advisor made under a cache folder, least recently used removed first."""

from __future__ import annotations

import hmac
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

import orjson

from advisor.files_read import read_regular
from advisor.cache.digests import DIGESTS_DIR, _MEMO_NAME, _digest_mac
from advisor.cache.seal import SEAL_FILE, SMALL_FILE_BYTES, _made_here, secret
from advisor.cache.settings import max_cache_bytes


KINDS = ("frames", "analysis")


@dataclass
class EntryInfo:
    path: Path
    kind: str
    bytes: int
    last_used: float


def entries(root: Path) -> list[EntryInfo]:
    """The entries the advisor made under a cache folder (complete or being written, see
    _made_here), least recently used first."""
    out = []
    try:
        children = list(root.iterdir())
    except OSError:
        return []
    key = secret()
    for child in children:
        kind = child.name.lstrip(".").split("-", 1)[0]
        if kind not in KINDS or not _made_here(child, kind, key):
            continue
        size, used = 0, 0.0
        try:
            for p in child.iterdir():
                st = p.lstat()
                size += st.st_size
                used = max(used, st.st_mtime) if p.name == SEAL_FILE or used == 0.0 else used
        except OSError:
            continue
        out.append(EntryInfo(child, kind, size, used))
    return sorted(out, key=lambda e: e.last_used)


def evict(root: Path, keep: Path | None = None, limit: int | None = None) -> list[Path]:
    """Remove the least recently used entries until the folder's entries fit the cap."""
    limit = max_cache_bytes() if limit is None else limit
    found = entries(root)
    total = sum(e.bytes for e in found)
    removed = []
    for e in found:
        if total <= limit:
            break
        if keep is not None and e.path == keep:
            continue
        if os.path.islink(e.path):
            continue
        shutil.rmtree(e.path, ignore_errors=True)
        total -= e.bytes
        removed.append(e.path)
    return removed


def clear(root: Path) -> tuple[int, int]:
    """Remove every entry the advisor made under a cache folder, and the trace hashes it
    remembered (the secret stays); (entries, bytes) removed."""
    found = entries(root)
    for e in found:
        if not os.path.islink(e.path):
            shutil.rmtree(e.path, ignore_errors=True)
    _clear_digests(root / DIGESTS_DIR)
    return len(found), sum(e.bytes for e in found)


def _clear_digests(folder: Path) -> None:
    """Remove the remembered hashes whose seal verifies (a real folder, never through a link)."""
    key = secret()
    try:
        if key is None or not stat.S_ISDIR(os.lstat(folder).st_mode):
            return
        children = list(folder.iterdir())
    except OSError:
        return
    for p in children:
        m = _MEMO_NAME.match(p.name)
        if not m:
            continue
        try:
            doc = orjson.loads(read_regular(p, SMALL_FILE_BYTES, follow=False))
            if hmac.compare_digest(doc["mac"], _digest_mac(key, folder / m.group(1), doc["stat"], doc["sha256"])):
                p.unlink()
        except (OSError, ValueError, KeyError, TypeError):
            continue
    try:
        folder.rmdir()  # only when empty: what the advisor did not write stays
    except OSError:
        pass
