"""Where entries go (`ADVISOR_CACHE`) and how large the cache may grow (`ADVISOR_CACHE_MAX_BYTES`)."""

from __future__ import annotations

import os
from pathlib import Path


from advisor.sizes import parse_size
from advisor.load.discover import CACHE_DIR_NAME


APP_NAME = "torch-advisor"
OFF_WORDS = ("off", "0", "no", "false")
ON_WORDS = ("on", "", "1", "yes", "true", "user")
BESIDE = "beside"
MAX_BYTES_ENV = "ADVISOR_CACHE_MAX_BYTES"
DEFAULT_MAX_BYTES = 2 * 2**30


def cache_setting() -> str:
    return os.environ.get("ADVISOR_CACHE", "on").strip()


def cache_enabled() -> bool:
    return cache_setting().lower() not in OFF_WORDS


def cache_beside() -> bool:
    """ADVISOR_CACHE=beside: entries beside the traces (only when asked)."""
    return cache_setting().lower() == BESIDE


def expand_home(path: str) -> Path | None:
    """`~` and `~user` expanded; None when the home folder cannot be found (a literal `~`
    folder is never created)."""
    try:
        expanded = os.path.expanduser(path)
    except (RuntimeError, KeyError, OSError):  # Python 3.12+: no HOME and no passwd entry
        return None
    return None if expanded.startswith("~") else Path(expanded)


def cache_dir_setting() -> Path | None:
    """The folder ADVISOR_CACHE=<dir> names, or None (user cache, beside, off, or a `~` path
    with no home to expand it to)."""
    setting = cache_setting()
    if setting.lower() in ON_WORDS + OFF_WORDS + (BESIDE,):
        return None
    return expand_home(setting)


def user_cache_root() -> Path | None:
    """The user cache folder of the platform (platformdirs); None with no usable home (and,
    on Linux, no absolute XDG_CACHE_HOME): then nothing is cached there."""
    import platformdirs

    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(xdg):
        home = expand_home("~")
        if home is None or not home.is_absolute() or home == Path("/"):
            return None
    try:
        return Path(platformdirs.user_cache_dir(APP_NAME, appauthor=False))
    except Exception:  # noqa: BLE001 - a platform with no cache folder: nothing is cached
        return None


def cache_roots(directory: Path | None = None) -> list[Path]:
    """The cache folders an entry for traces in `directory` may live in, in order of preference
    (none when off)."""
    if not cache_enabled():
        return []
    setting = cache_setting().lower()
    if setting not in ON_WORDS and setting != BESIDE:
        chosen = cache_dir_setting()
        return [chosen] if chosen is not None else []
    user = user_cache_root()
    roots = [user] if user is not None else []
    if setting == BESIDE and directory is not None and not os.path.islink(directory / CACHE_DIR_NAME):
        roots.insert(0, directory / CACHE_DIR_NAME)  # a link shipped with a log dir is not followed
    return roots


def max_cache_bytes() -> int:
    """ADVISOR_CACHE_MAX_BYTES (bytes, or 500M, 8G, ...), else 2 GiB; an unreadable value is
    the default (the cache never fails a report)."""
    try:
        return parse_size(os.environ.get(MAX_BYTES_ENV, ""))
    except ValueError:
        return DEFAULT_MAX_BYTES


def writable(folder: Path) -> bool:
    """Writable, and meant to be: a folder with no write bits is left alone even by root."""
    try:
        return os.access(folder, os.W_OK) and bool(folder.stat().st_mode & 0o222)
    except OSError:
        return False


def may_write_under(entry: Path) -> bool:
    """False where the nearest existing folder above an entry is not ours to write."""
    try:
        existing = next((p for p in (entry.parent, entry.parent.parent) if p.exists()), None)
    except OSError:
        return False
    return existing is None or writable(existing)
