"""`advisor cache info` and `advisor cache clear`: the one cache of frames and analyses (advisor.cache)."""

from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path
from typing import Optional

import typer

from advisor.sizes import format_bytes


class CacheAction(str, Enum):
    info = "info"
    clear = "clear"


def _roots(path: Optional[Path]) -> list[Path]:
    import advisor.cache as store

    directory = None if path is None else (path if path.is_dir() else path.parent)
    return store.cache_roots(directory)


def cache(
    action: CacheAction = typer.Argument(..., help="info: where the cache is, its entries and their size; clear: remove every entry."),
    path: Optional[Path] = typer.Argument(None, help="A trace or log dir: with ADVISOR_CACHE=beside, its .advisor-cache/ folder too."),
) -> None:
    """Show or clear the cache of parsed frames, finished analyses and their reports."""
    import advisor.cache as store  # here, not on import: `advisor --help` lists this command

    roots = _roots(path)
    out = sys.stdout
    if not roots:
        why = "ADVISOR_CACHE=off" if not store.cache_enabled() else "no user cache folder (no home folder)"
        out.write(f"cache: off ({why}): nothing is cached\n")
        return
    for root in roots:
        found = store.entries(root)
        if action is CacheAction.clear:
            n, size = store.clear(root)
            out.write(f"cache: {root}: removed {n} entr{'y' if n == 1 else 'ies'} ({format_bytes(size, digits=2)})\n")
            continue
        kinds = {k: sum(1 for e in found if e.kind == k) for k in store.KINDS}
        total = sum(e.bytes for e in found)
        reports = sum(len(list(e.path.glob(f"{store.REPORT_PREFIX}*"))) for e in found if e.kind == "analysis")
        out.write(
            f"cache: {root}\n"
            f"  entries: {len(found)} ({kinds['frames']} frames, {kinds['analysis']} analyses), {format_bytes(total, digits=2)} "
            f"of at most {format_bytes(store.max_cache_bytes(), digits=2)} ({store.MAX_BYTES_ENV}); least recently used removed first\n"
            f"  reports kept in the analyses: {reports} (the same report asked for again is written from them)\n"
        )
    if action is CacheAction.info:
        home = store.user_cache_root() or store.cache_dir_setting()
        key = None if home is None else home / store.KEY_FILE
        state = "present" if key is not None and store.secret() is not None else "made on the first write"
        out.write(f"  entries are sealed with the secret in {key} ({state})\n")
