"""Sealed entries read from and written to the first cache folder that takes them."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


from advisor.cache.eviction import evict
from advisor.cache.seal import MAKING_FILE, _made_here, _making_mark, _open_entry, _write_new, entry_name, seal, secret
from advisor.cache.settings import cache_enabled, cache_roots, may_write_under


def read_entry(kind: str, key_digest: str, directory: Path | None) -> tuple[Path, dict[str, bytes]] | None:
    """The first sealed entry for this key in the cache folders, with its files' bytes."""
    for root in cache_roots(directory):
        folder = root / entry_name(kind, key_digest)
        files = _open_entry(folder, kind, key_digest)
        if files is not None:
            return folder, files
    return None


def write_entry(kind: str, key_digest: str, directory: Path | None, files: dict[str, bytes]) -> Path | None:
    """Store an entry's files, sealed, in the first cache folder that takes it; then keep that
    folder under its size cap. The entry's folder, or None where nothing could be stored."""
    key = secret(create=True) if cache_enabled() else None
    if key is None:
        return None
    for root in cache_roots(directory):
        entry = root / entry_name(kind, key_digest)
        if not may_write_under(entry):
            continue
        if os.path.lexists(entry) and not _made_here(entry, kind, key):
            continue  # a folder (or link) the advisor did not seal: never replaced
        tmp = root / f".{entry.name}.tmp-{os.getpid()}-{os.urandom(4).hex()}"
        made = False
        try:
            root.mkdir(parents=True, exist_ok=True)
            tmp.mkdir()  # new: never an existing folder or a link planted at its name
            made = True
            _write_new(tmp / MAKING_FILE, _making_mark(key).encode())
            for name, data in files.items():
                (tmp / name).write_bytes(data)
            seal(tmp, kind, key_digest, key, files)
            os.unlink(tmp / MAKING_FILE)  # sealed now: the seal says whose it is
            if os.path.lexists(entry):
                shutil.rmtree(entry, ignore_errors=True)
            os.replace(tmp, entry)
        except Exception:  # noqa: BLE001 - read-only folder, full disk: skip caching, keep the report
            if made:
                shutil.rmtree(tmp, ignore_errors=True)
            continue
        evict(root, keep=entry)
        return entry
    return None
