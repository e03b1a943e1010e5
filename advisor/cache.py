"""The advisor's one cache: parsed frames and finished analyses, bounded, keyed on content.

A second report of an unchanged trace skips the parse (a *frames* entry: one Parquet file per
frame) and, for every report format, `whatif`, `gate`, `baseline` and `diff`, metrics and
rules too (an *analysis* entry: per rank the small scalar figures and per-step tables, a
FramesHeader instead of the frames, the findings and warnings of the run, and the slowest
rank's view that the HTML report, whatif and diff read: advisor.rank_view).

Where entries go (`ADVISOR_CACHE`):

- unset, `on`: the user cache folder `platformdirs.user_cache_dir("torch-advisor")`
  (`$XDG_CACHE_HOME/torch-advisor` else `~/.cache/torch-advisor` on Linux,
  `~/Library/Caches/torch-advisor` on macOS, `%LOCALAPPDATA%\\torch-advisor\\Cache` on
  Windows); nothing is written beside the user's traces. With no usable home (HOME unset
  and no passwd entry) nothing is cached.
- `beside`: `<trace dir>/.advisor-cache/`, else the user cache folder where the trace's
  folder is not writable.
- a folder (`~` is expanded): every entry under it. `off`: no cache.

One keying scheme for both kinds: an entry's folder is named by the digest of its key, and
the key holds the SHA-256 of the trace files' bytes (computed while a trace is read for
parsing, so an entry stands for exactly the bytes that were parsed), never their paths: two
copies of a trace share an entry. The advisor's version and code, the cache format, and for
an analysis the facts files' bytes, the file names, the rules and options are in the key too.

Every entry is sealed: `seal.json`, written last (so it marks a complete entry), lists the
SHA-256 of each file in the entry and the key digest, with an HMAC-SHA256 over them under a
per-installation secret (`secret.key`, 32 random bytes, mode 0600, in the user cache folder).
On read the seal is checked first (a seal the secret did not make, a file that changed, or an
entry written for another key is a miss), then every value with its type (dtypes, times that
are non-negative and add up, categories of the fixed kinds, findings as typed structures). So
an entry shipped along with a log dir, copied from another run, edited or damaged is never
served: the report is made again. Every error in the cache reads as a miss; the cache never
fails a report. Nothing is pickled.

Only what the advisor made is ever removed or written into: eviction and `advisor cache
clear` remove an entry only when its seal verifies under the secret (a folder being written
carries a marker made with the same secret), and the remembered trace hashes only when their
own seal does; a folder named `analysis-*` or `frames-*` that the advisor did not seal is left
alone. No symbolic link is followed: a `.advisor-cache` beside the traces that is a link is
not used at all, an entry that is a link is neither read, replaced nor removed, and the
cache's own files (seals, the secret, the hashes) are opened without following links and
without blocking (a FIFO there is a miss, never a hang).

An analysis entry also keeps the reports rendered from it to stdout (text, JSON, Markdown;
see "rendered reports" below): a second `advisor report` asked for in the same way writes the
stored text before the command line parser is built (advisor.cli.warm), in about 0.1 s at
any trace size, importing neither pandas, pyarrow nor rich; this module imports NumPy,
pandas and the trace loader only where an entry's tables are read or written.

Size: the entries under a cache folder are kept under `ADVISOR_CACHE_MAX_BYTES` (default 2G;
`500M`, `8G`, ...): after each write the least recently used entries (a hit marks an entry
used) are removed first. `advisor cache info` shows the folder, its entries and their size;
`advisor cache clear` removes them.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import importlib.util
import math
import os
import re
import shutil
import stat
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import msgspec
import orjson

from advisor.version import __version__
from advisor.facts import FACTS_FILE
from advisor.files import replace_file
from advisor.files_read import read_regular
from advisor.sizes import parse_size
from advisor.load.discover import CACHE_DIR_NAME, RunFiles

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

    from advisor.engine import Finding
    from advisor.load.trace import TraceFrames
    from advisor.metrics.summary import DeviceInfo, Metrics
    from advisor.whatif.savings import RankWhatIf

APP_NAME = "torch-advisor"
SEAL_FILE = "seal.json"
KEY_FILE = "secret.key"
KEY_BYTES = 32
HASH_READ_BYTES = 1 << 20
OFF_WORDS = ("off", "0", "no", "false")
ON_WORDS = ("on", "", "1", "yes", "true", "user")
BESIDE = "beside"
MAX_BYTES_ENV = "ADVISOR_CACHE_MAX_BYTES"
DEFAULT_MAX_BYTES = 2 * 2**30
KINDS = ("frames", "analysis")
DIGESTS_DIR = "digests"  # per trace path: the hash of its bytes as of its stat (trace_digest)
# A folder being written carries this marker (an HMAC under the secret) until it is sealed:
# a folder left behind by a run that died is recognised as the advisor's, and removed. A
# sealed entry holds no marker (its seal says whose it is).
MAKING_FILE = ".advisor-making"
# The cache's own small files: a seal or a remembered hash larger than this is not one.
SMALL_FILE_BYTES = 4 * 2**20
_MEMO_NAME = re.compile(r"^\.?([0-9a-f]{32})(?:\.\d+)?$")


class BadEntry(Exception):
    """An entry that does not hold what the advisor would build: read as a miss."""


class Unstorable(Exception):
    """A value JSON cannot carry back exactly; the run is not cached."""


class _OnFirstUse:
    """A module imported when one of its names is first read: a warm report (its rendered
    text served from an entry) never imports NumPy, pandas or the trace loader."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        import importlib

        return getattr(importlib.import_module(self._name), attr)


if not TYPE_CHECKING:
    np = _OnFirstUse("numpy")
    pd = _OnFirstUse("pandas")

# Names this module gave from the loader before it imported the loader on first use.
_FROM_LOADER = {"load_trace": "advisor.load.trace", "TraceFrames": "advisor.load.trace", "HOST_KINDS": "advisor.load.trace", "DEVICE_KINDS": "advisor.load.trace"}


def __getattr__(name: str) -> Any:
    if name in _FROM_LOADER:
        import importlib

        return getattr(importlib.import_module(_FROM_LOADER[name]), name)
    if name == "FIELDS":
        return loader_fields()
    if name == "FIXED_CATEGORIES":
        return fixed_categories()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def content_digest(path: Path) -> str:
    """SHA-256 of a file's bytes, read in pieces (about 1.5 GB/s)."""
    from advisor.files_read import open_regular

    h = hashlib.sha256()
    with open_regular(path) as f:  # a FIFO or device is an OSError, never a hang
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


def _write_new(path: Path, data: bytes) -> None:
    """DATA into a new file at PATH (a stale one of ours is replaced; a link is never followed)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags, 0o600)
    except FileExistsError:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            raise
        os.unlink(path)  # left by an earlier process of the same id
        fd = os.open(path, flags, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


# --- where entries go -------------------------------------------------------------------------
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


# --- the seal -----------------------------------------------------------------------------------
def _key_home() -> Path | None:
    """Where the installation's secret lives: the user cache folder, else the ADVISOR_CACHE folder."""
    return user_cache_root() or cache_dir_setting()


def secret(create: bool = False) -> bytes | None:
    """The per-installation HMAC key (32 random bytes in `secret.key`, mode 0600, owned by
    this user), made on first write; None when there is none to trust: no entry is then read
    or written."""
    home = _key_home()
    if home is None:
        return None
    path = home / KEY_FILE
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))  # a FIFO never hangs
    except FileNotFoundError:
        if not create:
            return None
        try:
            home.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(os.urandom(KEY_BYTES))
        except FileExistsError:
            pass  # another report made it just now
        except OSError:
            return None
        return secret(create=False)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        owner_ok = not hasattr(os, "geteuid") or st.st_uid == os.geteuid()
        if not stat.S_ISREG(st.st_mode) or not owner_ok or (os.name == "posix" and st.st_mode & 0o077):
            return None  # a key others can read or write is no secret (nor a folder or a FIFO)
        key = os.read(fd, KEY_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    return key if len(key) == KEY_BYTES else None


def _mac(key: bytes, kind: str, key_digest: str, files: dict[str, str]) -> str:
    body = orjson.dumps({"kind": kind, "key": key_digest, "files": files}, option=orjson.OPT_SORT_KEYS)
    return hmac.new(key, body, hashlib.sha256).hexdigest()


def seal(folder: Path, kind: str, key_digest: str, key: bytes | None = None, files: dict[str, bytes] | None = None) -> None:
    """Write the seal of an entry's files (its last file); `files`: their bytes, when at hand."""
    key = key if key is not None else secret(create=True)
    if key is None:
        raise OSError("no cache secret")
    if files is None:
        files = {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.name != SEAL_FILE and not p.name.startswith(".") and p.is_file()}
    digests = {name: _sha(data) for name, data in sorted(files.items())}
    doc = {"kind": kind, "key": key_digest, "files": digests, "mac": _mac(key, kind, key_digest, digests)}
    replace_file(folder / SEAL_FILE, orjson.dumps(doc), sync=False, mode=0o600)  # a reader sees the old seal or the new one, whole
    now = time.time_ns()
    os.utime(folder / SEAL_FILE, ns=(now, now))  # written now (see _open_entry)


def _open_entry(folder: Path, kind: str, key_digest: str) -> dict[str, bytes] | None:
    """The files of a sealed entry, checked against the seal; None for anything else."""
    key = secret()
    if key is None:
        return None
    try:
        if os.path.islink(folder):
            return None  # an entry is a folder of the cache's own, never a link to one
        doc = orjson.loads(read_regular(folder / SEAL_FILE, SMALL_FILE_BYTES, follow=False))
        files = doc["files"]
        if not (isinstance(files, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in files.items())):
            return None
        if doc.get("kind") != kind or doc.get("key") != key_digest or not isinstance(doc.get("mac"), str):
            return None  # an entry written for another trace or run
        if not hmac.compare_digest(doc["mac"], _mac(key, kind, key_digest, files)):
            return None  # not sealed by this installation
        out = {}
        for name, digest in files.items():
            if "/" in name or "\\" in name or name.startswith("."):
                return None
            data = read_regular(folder / name, max(max_cache_bytes(), DEFAULT_MAX_BYTES), follow=False)  # never GBs of a sparse file
            if not hmac.compare_digest(_sha(data), digest):
                return None  # changed after it was sealed
            out[name] = data
        try:
            now = time.time_ns()  # the clock's, finer than the file system's own stamp
            os.utime(folder / SEAL_FILE, ns=(now, now))  # used now: the last to be evicted
        except OSError:
            pass
        return out
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError):
        return None


def entry_name(kind: str, key_digest: str) -> str:
    return f"{kind}-{key_digest[:40]}"


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


# --- size: least recently used first -----------------------------------------------------------
@dataclass
class EntryInfo:
    path: Path
    kind: str
    bytes: int
    last_used: float


def _making_mark(key: bytes) -> str:
    return hmac.new(key, b"torch-advisor cache entry being written", hashlib.sha256).hexdigest()


def _made_here(folder: Path, kind: str, key: bytes | None) -> bool:
    """FOLDER is a cache entry the advisor made: a real folder (not a link) whose seal verifies
    under the secret (for this kind and the digest in its name), or, being written or left by a
    run that died, whose marker does. Nothing else is ever removed or replaced."""
    if key is None:
        return False
    try:
        if not stat.S_ISDIR(os.lstat(folder).st_mode):
            return False
        being_written = folder.name.startswith(".")
        if being_written and os.path.lexists(folder / MAKING_FILE):
            mark = read_regular(folder / MAKING_FILE, SMALL_FILE_BYTES, follow=False)
            return hmac.compare_digest(mark, _making_mark(key).encode())
        doc = orjson.loads(read_regular(folder / SEAL_FILE, SMALL_FILE_BYTES, follow=False))
        files, digest = doc["files"], doc["key"]
        if doc.get("kind") != kind or not isinstance(digest, str):
            return False
        name = entry_name(kind, digest)
        if not (folder.name.startswith(f".{name}.tmp-") if being_written else folder.name == name):
            return False
        if not (isinstance(files, dict) and isinstance(doc.get("mac"), str)):
            return False
        return hmac.compare_digest(doc["mac"], _mac(key, kind, digest, files))
    except (OSError, ValueError, KeyError, TypeError):
        return False


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


# --- frames entries ------------------------------------------------------------------------------
FRAMES_META = "advisor_cache.json"
FRAMES_FORMAT = 6  # 4: one sealed cache, keyed on content alone; 5: the profiler session's end in the metadata; 6: impossible copies, memory figures and shared correlation ids read as unknown
FRAME_TABLES = ("host", "runtime", "device", "memory", "steps", "device_properties", "syncs")
JSON_COLUMNS = {"host": ("input_dims", "concrete_inputs")}
@functools.cache
def fixed_categories() -> dict[tuple[str, str], list[str]]:
    from advisor.load.trace import DEVICE_KINDS, HOST_KINDS

    return {("host", "kind"): HOST_KINDS, ("device", "kind"): DEVICE_KINDS}



DEVICE_PROPERTY_COLUMNS = ["id", "name", "total_memory_bytes", "compute_capability", "num_sms"]
# The trace fields the loader reads: a loader that reads one more (or one less) makes new entries.
@functools.cache
def loader_fields() -> str:
    from advisor.load.decode import EventArgs, MemoryArgs

    return hashlib.sha256(repr((EventArgs.__struct_encode_fields__, MemoryArgs.__struct_encode_fields__)).encode()).hexdigest()[:12]

# Traces that parse faster than this (about 100 MB of JSON) are not worth an entry.
MIN_PARSE_SECONDS = 0.5


@dataclass(frozen=True)
class CacheKey:
    """What must match for a frames entry to stand for the trace file's bytes."""

    sha256: str
    advisor_version: str = __version__
    format: int = FRAMES_FORMAT
    fields: str = field(default_factory=loader_fields)

    @classmethod
    def of_frames(cls, frames: TraceFrames) -> CacheKey | None:
        return cls(sha256=frames.content_sha256) if frames.content_sha256 is not None else None

    def as_dict(self) -> dict[str, Any]:
        return {"sha256": self.sha256, "advisor_version": self.advisor_version, "format": self.format, "fields": self.fields}

    @property
    def digest(self) -> str:
        return _sha(orjson.dumps(self.as_dict(), option=orjson.OPT_SORT_KEYS))


def read_cached(path: Path) -> TraceFrames | None:
    """The cached frames of this trace file if an entry holds its bytes' hash, else None."""
    path = Path(path)
    if not cache_roots(path.parent):
        return None
    try:
        key = CacheKey(sha256=trace_digest(path))
    except OSError:
        return None
    found = read_entry("frames", key.digest, path.parent)
    if found is None:
        return None
    return _frames_of(found[1], key, path)


def frames_entry(path: Path) -> Path | None:
    """The folder of the frames entry this trace would read or write (None: cache off)."""
    roots = cache_roots(Path(path).parent)
    if not roots:
        return None
    return roots[0] / entry_name("frames", CacheKey(sha256=content_digest(Path(path))).digest)


# One event of each kind the loader keeps: the frames built from it give the dtype of every
# column (so a column the loader gains is expected of entries too, without a list to update).
_SAMPLE_TRACE = orjson.dumps({"traceEvents": [
    {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 1, "dur": 9, "tid": 1},
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 2, "dur": 2, "tid": 1, "args": {"External id": 1, "Input Dims": [[2, 2]], "Input type": ["float"]}},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 3, "dur": 1, "tid": 1, "args": {"correlation": 1, "External id": 1}},
    {"ph": "X", "cat": "kernel", "name": "k", "ts": 4, "dur": 1, "tid": 7, "args": {"correlation": 1, "device": 0, "stream": 7}},
    {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "ts": 5, "dur": 1, "tid": 7, "args": {"bytes": 8}},
    {"ph": "X", "cat": "cuda_sync", "name": "Stream Sync", "ts": 6, "dur": 1, "tid": 7},
    {"ph": "i", "name": "[memory]", "ts": 7, "args": {"Bytes": 8, "Total Allocated": 8, "Total Reserved": 8}},
]})


@functools.cache
def frame_dtypes() -> dict[str, dict[str, str]]:
    """The dtype of every column of every frame load_trace builds: an entry must match exactly."""
    from advisor.load.trace import frames_from_bytes

    frames = frames_from_bytes(Path("<dtypes>"), bytearray(_SAMPLE_TRACE))
    return {name: {c: str(t) for c, t in getattr(frames, name).dtypes.items()} for name in FRAME_TABLES if name != "device_properties"}


def _check_table(name: str, df: pd.DataFrame) -> None:
    """Raise BadEntry unless the table has load_trace's columns, dtypes and time invariants."""
    if name == "device_properties":
        if list(df.columns) != DEVICE_PROPERTY_COLUMNS:
            raise BadEntry(name)
        mem = pd.to_numeric(df["total_memory_bytes"], errors="coerce").to_numpy(np.float64)
        if (mem < 0).any():
            raise BadEntry(name)
        return
    expected = frame_dtypes()[name]
    if {c: str(t) for c, t in df.dtypes.items()} != expected:
        raise BadEntry(name)
    for col, kind in expected.items():
        if kind == "category" and len(df[col].cat.categories) and not all(isinstance(c, str) for c in df[col].cat.categories):
            raise BadEntry(f"{name}.{col}")
    fixed = fixed_categories().get((name, "kind"))
    if fixed is not None and list(df["kind"].cat.categories) != fixed:
        raise BadEntry(f"{name}.kind")
    if "dur" in expected:
        ts, dur, end = (df[c].to_numpy(np.int64) for c in ("ts", "dur", "end"))
        if (dur < 0).any() or not np.array_equal(ts + dur, end) or (np.diff(ts) < 0).any():
            raise BadEntry(f"{name} times")
    if name == "steps":
        start, end = df["start"].to_numpy(np.int64), df["end"].to_numpy(np.int64)
        # as the parser leaves them: ordered, none overlapping another (each instant in one step)
        if (end < start).any() or df["step"].duplicated().any() or (start[1:] < end[:-1]).any():
            raise BadEntry("steps")
    if name == "memory" and (np.diff(df["ts"].to_numpy(np.int64)) < 0).any():
        raise BadEntry("memory times")


def _json_scalars(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict) or not all(isinstance(v, (str, int, float, bool)) for v in value.values()):
        raise BadEntry("metadata")
    return value


def _frames_of(files: dict[str, bytes], key: CacheKey, path: Path) -> TraceFrames | None:
    try:
        meta = orjson.loads(files[FRAMES_META])
    except (KeyError, orjson.JSONDecodeError):
        return None
    if not isinstance(meta, dict) or meta.get("key") != key.as_dict():
        return None
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq

        tables: dict[str, pd.DataFrame | None] = {}
        for name in FRAME_TABLES:
            if name == "syncs" and meta.get("has_syncs") is not True:
                tables[name] = None
                continue
            df = pq.read_table(pa.BufferReader(files[f"{name}.parquet"])).to_pandas()
            for col in JSON_COLUMNS.get(name, ()):
                if col in df.columns:
                    df[col] = _from_json_text(df[col])
            for col in df.columns:  # Parquet cannot tell an empty string dictionary from an empty object one
                if isinstance(df[col].dtype, pd.CategoricalDtype) and len(df[col].cat.categories) == 0:
                    df[col] = df[col].cat.set_categories(pd.Index(fixed_categories().get((name, col), []), dtype="str"))
            _check_table(name, df)
            tables[name] = df
        window = meta["window"]
        schema, base_us = meta["schema"], meta["base_us"]
        if schema not in ("2021", "current") or type(base_us) not in (int, float) or not math.isfinite(base_us):
            raise BadEntry("header")
        if not (isinstance(window, list) and len(window) == 2 and all(type(w) is int for w in window) and window[0] <= window[1]):
            raise BadEntry("window")
        distributed, load_warnings = meta.get("distributed"), meta.get("load_warnings")
        if not isinstance(distributed, dict):
            raise BadEntry("distributed")
        if not (isinstance(load_warnings, list) and all(isinstance(w, str) for w in load_warnings)):
            raise BadEntry("load_warnings")
        from advisor.load.trace import TraceFrames

        return TraceFrames(
            path=path,
            schema=schema,
            base_us=float(base_us),
            host=tables["host"],
            runtime=tables["runtime"],
            device=tables["device"],
            memory=tables["memory"],
            steps=tables["steps"],
            device_properties=tables["device_properties"],
            distributed=distributed,
            window=(window[0], window[1]),
            metadata=_json_scalars(meta.get("metadata")),
            syncs=tables["syncs"],
            content_sha256=key.sha256,
            load_warnings=load_warnings,
        )
    except Exception:  # noqa: BLE001 - a damaged, foreign or forged entry is a miss, never a failed report
        return None


def write_cached(frames: TraceFrames) -> Path | None:
    """Store the frames under the hash of the bytes they were parsed from; the entry's
    folder, or None (cache off, nowhere writable, or frames not read from a file)."""
    key = CacheKey.of_frames(frames)
    if key is None or not cache_roots(frames.path.parent):
        return None
    try:
        for name in FRAME_TABLES:
            if getattr(frames, name) is not None:
                _check_table(name, getattr(frames, name))  # what the reader would refuse is not written
        import pyarrow as pa
        import pyarrow.parquet as pq

        files: dict[str, bytes] = {}
        for name in FRAME_TABLES:
            df = getattr(frames, name)
            if df is None:
                continue
            for col in JSON_COLUMNS.get(name, ()):
                if col in df.columns:
                    df = df.assign(**{col: _to_json_text(df[col])})
            sink = pa.BufferOutputStream()
            pq.write_table(pa.Table.from_pandas(df, preserve_index=False), sink, compression="zstd", compression_level=1)
            files[f"{name}.parquet"] = sink.getvalue().to_pybytes()
        meta = {
            "key": key.as_dict(),
            "written": time.time(),
            "schema": frames.schema,
            "base_us": frames.base_us,
            "window": list(frames.window),
            "distributed": frames.distributed,
            "metadata": frames.metadata,
            "has_syncs": frames.syncs is not None,
            "load_warnings": frames.load_warnings,
        }
        files[FRAMES_META] = orjson.dumps(meta, option=orjson.OPT_SERIALIZE_NUMPY)
    except Exception:  # noqa: BLE001 - odd values: skip caching, keep the report
        return None
    return write_entry("frames", key.digest, frames.path.parent, files)


def _to_json_text(values: pd.Series) -> pd.Categorical:
    """Nested lists as JSON text, encoded once per distinct object (equal shapes share objects)."""
    arr = values.to_numpy(dtype=object)
    codes, _ = pd.factorize(np.fromiter(map(id, arr), dtype=np.int64, count=len(arr)))
    first_row = np.unique(codes, return_index=True)[1]  # codes number objects by first appearance
    texts = np.array([orjson.dumps(arr[i]).decode() for i in first_row], dtype=object)
    return pd.Categorical(texts[codes] if len(arr) else [])


def _from_json_text(values: pd.Series) -> np.ndarray:
    codes, uniques = pd.factorize(values.astype(object).to_numpy())
    decoded = np.empty(len(uniques) + 1, dtype=object)
    for i, text in enumerate(uniques):
        value = orjson.loads(text)
        if value is not None and not isinstance(value, list):
            raise BadEntry("input_dims")
        decoded[i] = value
    return decoded[codes]


def load_cached(path: str | Path, cache: bool = True, min_parse_seconds: float = MIN_PARSE_SECONDS) -> TraceFrames:
    """load_trace through the cache: a hit reads Parquet; a miss parses, and stores the frames
    when parsing took at least min_parse_seconds."""
    path = Path(path)
    if cache:
        hit = read_cached(path)
        if hit is not None:
            return hit
    started = time.perf_counter()
    from advisor.load.trace import load_trace

    frames = load_trace(path)
    if cache and time.perf_counter() - started >= min_parse_seconds:
        write_cached(frames)
    return frames

# --- analysis entries ----------------------------------------------------------------------------
ANALYSIS_META = "analysis.json"
ANALYSIS_FORMAT = 5  # 4: one sealed cache, keyed on the traces' content and names, not paths; 5: steps found without ProfilerStep
# Analyses faster than this are not worth an entry, unless a report rendered from it is kept
# there (`analyze(store=True)`: a report to stdout, which a warm report then writes as it is).
MIN_ANALYSIS_SECONDS = 0.5
TABLES = ("steps", "breakdown", "utilization", "kernels")
COMM_TABLES = ("collectives", "compute")  # a rank's RankComm, when it was measured
TAG = "$t"


# The libraries whose versions can change an analysis or how a report is written.
LIBRARIES = ("numpy", "pandas", "pyarrow", "rich", "orjson", "msgspec")


def _libraries() -> str:
    """The installed libraries that make or write an analysis, read from their files (their
    distributions' names and versions, and their top module's size and mtime) rather than
    imported: the key of a warm report is made without importing them."""
    out, listed = [], {}
    for name in LIBRARIES:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            out.append(f"{name} -")
            continue
        origin = Path(spec.origin)
        site = origin.parent.parent if origin.name == "__init__.py" else origin.parent
        try:
            if site not in listed:
                listed[site] = sorted(os.listdir(site))
            st = origin.stat()
        except OSError:
            out.append(f"{name} {origin} ?")
            continue
        dists = [n for n in listed[site] if n.lower().startswith(f"{name}-") and n.endswith((".dist-info", ".egg-info"))]
        out.append(f"{name} {origin} {dists} {st.st_size} {st.st_mtime_ns}")
    return "; ".join(out)


def _code_fingerprint() -> str:
    """The advisor's source as installed: an edited rule or metric must not read an old answer."""
    roots = [Path(__file__).resolve().parent]
    spec = importlib.util.find_spec("advisor.rules")
    roots += [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []
    h = hashlib.sha256(f"{__version__} {sys.version} {_libraries()}".encode())
    for root in roots:
        for p in sorted(root.rglob("*.py")):
            st = p.stat()
            h.update(f"{p}\0{st.st_size}\0{st.st_mtime_ns}\n".encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def _folder_files(folder: Path, keep) -> list[list[str]]:
    """[name, sha256 of bytes] of the files in a folder that `keep` accepts, by name."""
    if not folder.is_dir():
        return []
    from advisor.facts import read_facts_bytes

    out = []
    for p in sorted(folder.iterdir()):
        if keep(p.name) and p.is_file():
            try:
                out.append([p.name, _sha(read_facts_bytes(p))])
            except OSError as exc:  # too large: ignored by the analysis too, with a warning
                out.append([p.name, f"unread: {exc}"])
    return out


@dataclass(frozen=True)
class AnalysisKey:
    """What must match for an entry to stand for the analysis asked for now: the traces' bytes
    and names (a copy of the run elsewhere has the same key), not where they are."""

    fields: dict[str, Any]
    paths: tuple[str, ...] = ()  # the run's files as keyed (resolved), in the order of fields["files"]

    @property
    def digest(self) -> str:
        return _sha(orjson.dumps(self.fields, option=orjson.OPT_SORT_KEYS, default=str))

    @classmethod
    def of(
        cls,
        run: RunFiles,
        rule_options: dict[str, dict[str, Any]],
        select: list[str],
        ignore: list[str],
        rules_dir: str | Path | None,
    ) -> AnalysisKey | None:
        """The key of the run as its files are now; None when one cannot be read."""
        try:
            files = [[p.name, trace_digest(p)] for p in run.files]
            user_rules = None
            if rules_dir is not None:
                folder = Path(rules_dir).resolve()
                user_rules = [folder.is_dir(), _folder_files(folder, lambda n: n.endswith(".py"))]
            return cls(
                {
                    "format": ANALYSIS_FORMAT,
                    "advisor_version": __version__,
                    "code": _code_fingerprint(),
                    "files": files,
                    "facts": _folder_files(run.directory, lambda n: bool(FACTS_FILE.match(n))),
                    "select": list(select),
                    "ignore": list(ignore),
                    "rule_options": rule_options,
                    "user_rules": user_rules,
                },
                tuple(str(p.resolve()) for p in run.files),
            )
        except (OSError, ValueError, RuntimeError):
            return None

    def parsed_as_keyed(self, frames: list[Any]) -> bool:
        """True when every trace the analysis read had the bytes this key hashed (the hashes
        computed while the frames were read): an answer is never stored under other bytes."""
        keyed = {path: sha for path, (_, sha) in zip(self.paths, self.fields["files"], strict=True)}
        try:
            return all(f.content_sha256 is not None and keyed.get(str(Path(f.path).resolve())) == f.content_sha256 for f in frames)
        except (OSError, RuntimeError):
            return False


# --- values as JSON, exactly ------------------------------------------------------------------
def to_plain(v: Any) -> Any:
    """A value as JSON that from_plain turns back into an equal value of the same type."""
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, int):
        return int(v)
    if isinstance(v, float):
        f = float(v)
        return f if math.isfinite(f) else {TAG: "float", "v": repr(f)}
    if isinstance(v, np.bool_):
        return bool(v)
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, tuple):
        return {TAG: "tuple", "v": [to_plain(x) for x in v]}
    if isinstance(v, list):
        return [to_plain(x) for x in v]
    if isinstance(v, dict):
        if all(isinstance(k, str) for k in v) and TAG not in v:
            return {k: to_plain(x) for k, x in v.items()}
        if all(isinstance(k, (str, int)) and not isinstance(k, bool) for k in v):
            return {TAG: "dict", "v": [[k, to_plain(x)] for k, x in v.items()]}
    raise Unstorable(type(v).__name__)


def from_plain(v: Any) -> Any:
    if isinstance(v, list):
        return [from_plain(x) for x in v]
    if not isinstance(v, dict):
        return v
    tag = v.get(TAG)
    if tag is None:
        return {k: from_plain(x) for k, x in v.items()}
    if tag == "float":
        return float(v["v"])
    if tag == "tuple":
        return tuple(from_plain(x) for x in v["v"])
    if tag == "dict":
        return {k: from_plain(x) for k, x in v["v"]}
    raise ValueError(f"unknown tag {tag!r}")


# --- writing --------------------------------------------------------------------------------
@dataclass
class CachedRun:
    """What an entry gives back: enough for Analysis without frames."""

    ranks: list[Metrics]
    findings: list[Finding]
    warnings: list[str]
    whatif: list[RankWhatIf]
    folder: Path | None = None  # the entry it came from
    extra: dict[str, bytes] = field(default_factory=dict)  # the entry's "view." files (advisor.rank_view)
    split_job: bool = False  # the run's files held several jobs: its ranks are the chosen job's


def _rank_meta(m: Metrics, run: RunFiles) -> dict[str, Any]:
    file_index = next(i for i, p in enumerate(run.files) if p == m.frames.path)
    return {
        "rank": int(m.rank),
        "file_index": file_index,
        "metadata": to_plain(m.frames.metadata),
        "distributed": to_plain(m.frames.distributed),
        "has_device": bool(m.has_device),
        "device": to_plain(asdict(m.device)),
        "tensor_core_kernel_share": to_plain(m.tensor_core_kernel_share),
        "tensor_core_eligible_share": to_plain(m.tensor_core_eligible_share),
        "kernel_time_by_precision_ms": to_plain(m.kernel_time_by_precision_ms),
        "h2d": to_plain(m.h2d),
        "d2h": to_plain(m.d2h),
        "peak_memory": to_plain(m.peak_memory),
        "notes": to_plain(m.notes),
        "comm": m.comm is not None,
        "roofline": _roofline_meta(m),
    }


def _roofline_meta(m: Metrics) -> dict[str, Any] | None:
    r = m.roofline
    if r is None:
        return None
    return to_plain({"device_name": r.device_name, "shapes_recorded": bool(r.shapes_recorded), "modelled_ms": float(r.modelled_ms),
                     "kernel_ms": float(r.kernel_ms), "bandwidth_tbps": r.bandwidth_tbps, "sm_count": r.sm_count, "notes": list(r.notes)})


def _roofline_of(meta: dict[str, Any] | None, table: pd.DataFrame | None):
    from advisor.metrics.devices import device_ceiling
    from advisor.metrics.roofline import ROOFLINE_COLUMNS, Roofline

    if meta is None or table is None:
        return None
    if list(table.columns) != ROOFLINE_COLUMNS:
        raise BadEntry("roofline")
    return Roofline(table, device_ceiling(meta.get("device_name")), meta.get("device_name"), bool(meta.get("shapes_recorded")),
                    float(meta.get("modelled_ms") or 0.0), float(meta.get("kernel_ms") or 0.0), meta.get("bandwidth_tbps"), meta.get("sm_count"),
                    list(meta.get("notes") or []))


def _tables(m: Metrics) -> dict[str, pd.DataFrame]:
    from advisor.metrics.kernels import kernel_totals

    tables = {
        "steps": m.steps,
        "breakdown": m.breakdown,
        "utilization": m.utilization.to_frame("utilization"),
        "kernels": kernel_totals(m.kernels),
    }
    if m.comm is not None:
        tables.update(collectives=m.comm.collectives, compute=m.comm.compute)
    if m.roofline is not None:
        tables["roofline"] = m.roofline.ops
    return tables


def write_analysis(
    run: RunFiles,
    key: AnalysisKey,
    ranks: list[Metrics],
    findings: list[Finding],
    warnings: list[str],
    whatif: list[RankWhatIf] | None = None,
    extra: dict[str, bytes] | None = None,
    split_job: bool = False,
) -> Path | None:
    """Store a finished analysis; the entry's folder, or None where it could not be stored.
    `extra`: more files of the entry, named "view.*" (the slowest rank's view, advisor.rank_view)."""
    if not cache_enabled():
        return None
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq

        meta = {
            "key": key.fields,
            "key_digest": key.digest,
            "written": time.time(),
            "ranks": [_rank_meta(m, run) for m in ranks],
            "findings": [to_plain(f.to_dict()) for f in findings],
            "warnings": to_plain(list(warnings)),
            "whatif": [to_plain(w.to_dict()) for w in whatif or []],
            "split_job": bool(split_job),
        }
        meta_bytes = orjson.dumps(meta, default=str)
        # What the reader would refuse is not written: the same types, the same tables.
        for r in msgspec.convert(from_plain(orjson.loads(meta_bytes)), EntryMeta).ranks:
            _device(r.device)
        files = {ANALYSIS_META: meta_bytes}
        for i, m in enumerate(ranks):
            tables = _tables(m)
            check_tables(tables)
            for name, df in tables.items():
                sink = pa.BufferOutputStream()
                pq.write_table(pa.Table.from_pandas(df), sink, compression="zstd", compression_level=1)
                files[f"{i}.{name}.parquet"] = sink.getvalue().to_pybytes()
        files.update({k: v for k, v in (extra or {}).items() if k.startswith("view.")})
    except Exception:  # noqa: BLE001 - an odd value in a finding: this run is not cached
        return None
    return write_entry("analysis", key.digest, run.directory, files)


def read_analysis(run: RunFiles, key: AnalysisKey) -> CachedRun | None:
    """The stored analysis of this run if a sealed entry matches the key, else None."""
    found = read_entry("analysis", key.digest, run.directory)
    if found is None:
        return None
    hit = _analysis_of(found[1], key, run)
    if hit is not None:
        hit.folder = found[0]
        hit.extra = {k: v for k, v in found[1].items() if k.startswith("view.")}
    return hit


def read_analysis_entry(folder: Path, key: AnalysisKey, run: RunFiles) -> CachedRun | None:
    """The analysis in one entry folder, if its seal and values hold (see read_analysis)."""
    files = _open_entry(folder, "analysis", key.digest)
    return None if files is None else _analysis_of(files, key, run)


def analysis_entry(run: RunFiles, key: AnalysisKey) -> Path | None:
    """The folder of the analysis entry this run would read or write (None: cache off)."""
    roots = cache_roots(run.directory)
    return roots[0] / entry_name("analysis", key.digest) if roots else None


# --- rendered reports ---------------------------------------------------------------------------
# An analysis entry also keeps the reports rendered from it (text, JSON, Markdown to stdout), one
# file each, under the entry's seal: a second `advisor report` of an unchanged run writes the
# stored text without importing pandas, pyarrow or the rules. A report's file is named by the
# digest of what its text depends on beyond the analysis (`fields`: format, options, the path as
# given and the files found, where it is written) and of the entry's analysis files (so a
# report never outlives the analysis it was rendered from), and carries its own HMAC over that
# name and its text: an entry sealed again around an edited report still does not serve it.
REPORT_PREFIX = "report-"
MAX_REPORTS = 16  # per entry (a terminal of each new size adds one): the least recently written go first


def _report_name(files: dict[str, bytes], fields: dict[str, Any]) -> str:
    analysis = sorted((n, _sha(b)) for n, b in files.items() if not n.startswith(REPORT_PREFIX))
    body = orjson.dumps({"analysis": analysis, "report": fields}, option=orjson.OPT_SORT_KEYS, default=str)
    return f"{REPORT_PREFIX}{_sha(body)[:40]}.json"


def _report_mac(key: bytes, name: str, text: str) -> str:
    return hmac.new(key, orjson.dumps(["report", name, text]), hashlib.sha256).hexdigest()


def read_report(run: RunFiles, key: AnalysisKey, fields: dict[str, Any]) -> str | None:
    """The report rendered before for this analysis key and these fields, from a sealed entry
    whose every file still matches its seal; None otherwise."""
    found = read_entry("analysis", key.digest, run.directory)
    secret_key = secret()
    if found is None or secret_key is None or ANALYSIS_META not in found[1]:
        return None
    name = _report_name(found[1], fields)
    try:
        doc = orjson.loads(found[1][name])
        text, mac = doc["text"], doc["mac"]
        if doc.get("name") != name or not isinstance(text, str) or not isinstance(mac, str):
            return None
        return text if hmac.compare_digest(mac, _report_mac(secret_key, name, text)) else None
    except (KeyError, TypeError, orjson.JSONDecodeError):
        return None


def store_report(folder: Path, key: AnalysisKey, fields: dict[str, Any], text: str) -> Path | None:
    """Add a rendered report to the analysis entry in `folder` (the one the report was rendered
    from) and seal it again over the files as verified now; the report's file, or None."""
    secret_key = secret()
    files = _open_entry(folder, "analysis", key.digest) if secret_key is not None else None
    if files is None or ANALYSIS_META not in files:
        return None
    name = _report_name(files, fields)
    data = orjson.dumps({"name": name, "text": text, "mac": _report_mac(secret_key, name, text)})
    try:
        reports = sorted((n for n in files if n.startswith(REPORT_PREFIX) and n != name), key=lambda n: (folder / n).stat().st_mtime_ns)
        dropped = reports[: max(0, len(reports) + 1 - MAX_REPORTS)]
        replace_file(folder / name, data, sync=False, mode=0o600)
        seal(folder, "analysis", key.digest, secret_key, {**{n: b for n, b in files.items() if n not in dropped}, name: data})
        for n in dropped:
            (folder / n).unlink(missing_ok=True)
    except OSError:
        return None
    evict(folder.parent, keep=folder)
    return folder / name


# What analysis.json holds, as types: an entry whose values do not fit is a miss.
NonNegative = Annotated[float, msgspec.Meta(ge=0)]
Share = Annotated[float, msgspec.Meta(ge=0, le=1)]


class _Entry(msgspec.Struct, forbid_unknown_fields=True):
    pass


class FixEntry(_Entry):
    text: str
    snippet: str = ""


class FindingEntry(_Entry):
    rule: str
    severity: Literal["low", "medium", "high"]
    title: str
    message: str
    saving_ms: NonNegative | None
    saving_pct: NonNegative | None
    confidence: str
    evidence: dict[str, Any]
    fix: FixEntry
    causes: list[str]
    rank: int | None
    no_gain: str | None = None
    saving_alone_ms: NonNegative | None = None


class CopyEntry(_Entry):
    """A rank's copy totals (metrics.copies.copy_summary): the reports read every field."""

    count: Annotated[int, msgspec.Meta(ge=0)]
    bytes: Annotated[int, msgspec.Meta(ge=0)] | None
    time_ms: NonNegative
    pageable_count: Annotated[int, msgspec.Meta(ge=0)]
    pinned_count: Annotated[int, msgspec.Meta(ge=0)]
    bandwidth_gbps: NonNegative | None
    per_step_time_ms: NonNegative
    per_step_bytes: NonNegative | None


class RankEntry(_Entry):
    rank: int
    file_index: Annotated[int, msgspec.Meta(ge=0)]
    metadata: dict[str, str | int | float | bool]
    distributed: dict[str, Any]
    has_device: bool
    device: dict[str, Any]  # DeviceInfo's fields, converted to it (with their types) on read
    tensor_core_kernel_share: Share | None
    tensor_core_eligible_share: Share | None
    kernel_time_by_precision_ms: dict[str, NonNegative]
    h2d: CopyEntry
    d2h: CopyEntry
    peak_memory: dict[int, dict[str, NonNegative | None]]
    notes: list[str]
    comm: bool = False  # the rank's collectives and compute tables are stored
    roofline: dict[str, Any] | None = None  # the roofline's figures (its ops are the `roofline` table)


class WhatIfEntry(_Entry):
    """A rank's replay summary (whatif.savings.RankWhatIf)."""

    rank: int
    measured_ms: NonNegative
    baseline_ms: NonNegative
    host_scale: NonNegative
    loader_scale: NonNegative
    remainder_ms: NonNegative
    untimed_host_ms: NonNegative
    unprofiled_ms: NonNegative | None
    all_fixes_ms: NonNegative | None
    fixes: list[str]
    savings: dict[str, NonNegative]
    scale_range: list[NonNegative] | None = None
    baseline_range_ms: list[NonNegative] | None = None
    statistic: Literal["median", "mean"] = "median"


def _within_replay(w: WhatIfEntry) -> bool:
    """What the types cannot say: finite times, and neither the step with every fix nor a
    saving beyond the replayed step (savings are rounded to the µs)."""
    times = [w.measured_ms, w.baseline_ms, w.host_scale, w.loader_scale, w.remainder_ms, w.untimed_host_ms, w.unprofiled_ms or 0.0, w.all_fixes_ms or 0.0]
    return (
        all(math.isfinite(t) for t in times)
        and (w.all_fixes_ms is None or w.all_fixes_ms <= w.baseline_ms * (1 + 1e-6) + 1e-6)
        and all(v <= w.baseline_ms + 1e-3 for v in w.savings.values())
    )


class EntryMeta(_Entry):
    key: dict[str, Any]
    key_digest: str
    written: float
    ranks: Annotated[list[RankEntry], msgspec.Meta(min_length=1)]  # an analysis has a rank at least
    findings: list[FindingEntry]
    warnings: list[str]
    whatif: list[WhatIfEntry] = []  # each rank's replay summary
    split_job: bool = False  # the run's files held several jobs (advisor.analysis._reduce)


BREAKDOWN_COLUMNS = ["kernel", "memcpy", "memset", "communication", "runtime", "dataloader", "cpu_exec", "other"]
KERNEL_TOTAL_COLUMNS = ["name", "count", "total_ns", "tensor_core", "precision"]  # kernel_totals
STEP_DTYPES = {"step": "int64", "name": "str", "host_start": "int64", "host_end": "int64", "start": "int64", "end": "int64", "device_ops": "int64", "duration": "int64"}


def check_tables(t: dict[str, pd.DataFrame]) -> None:
    """Raise BadEntry unless the rank's tables have their dtypes and add up: durations are
    end - start and non-negative, and each step's breakdown sums to its duration."""
    steps, bd, util, kernels = t["steps"], t["breakdown"], t["utilization"], t["kernels"]
    if {c: str(d) for c, d in steps.dtypes.items()} != STEP_DTYPES:
        raise BadEntry("steps")
    duration = steps["duration"].to_numpy(np.int64)
    if (duration < 0).any() or not np.array_equal(steps["end"].to_numpy(np.int64) - steps["start"].to_numpy(np.int64), duration):
        raise BadEntry("step times")
    if list(bd.columns) != BREAKDOWN_COLUMNS or any(str(d) != "int64" for d in bd.dtypes) or len(bd) != len(steps):
        raise BadEntry("breakdown")
    values = bd.to_numpy(np.int64)
    if (values < 0).any() or not np.array_equal(values.sum(axis=1), duration):
        raise BadEntry("breakdown does not add up")
    u = util["utilization"].to_numpy(np.float64) if list(util.columns) == ["utilization"] else None
    if u is None or len(u) != len(steps) or ((u < 0) | (u > 1)).any():
        raise BadEntry("utilization")
    if list(kernels.columns) != KERNEL_TOTAL_COLUMNS or any(str(kernels[c].dtype) != "int64" for c in ("count", "total_ns")) or str(kernels["tensor_core"].dtype) != "bool":
        raise BadEntry("kernels")
    if (kernels["total_ns"].to_numpy() < 0).any() or (kernels["count"].to_numpy() < 1).any():
        raise BadEntry("kernel times")


def _device(fields: dict[str, Any]) -> DeviceInfo:
    """DeviceInfo from an entry: its own field types (strict), and no negative memory."""
    from advisor.metrics.summary import DeviceInfo

    device = msgspec.convert(fields, DeviceInfo, strict=True)
    if device.total_memory_bytes is not None and not (math.isfinite(device.total_memory_bytes) and device.total_memory_bytes >= 0):
        raise BadEntry("device memory")
    return device


def _analysis_of(files: dict[str, bytes], key: AnalysisKey, run: RunFiles) -> CachedRun | None:
    from advisor.engine import Finding, Fix
    from advisor.metrics.collectives import RankComm
    from advisor.metrics.summary import FramesHeader, Metrics
    from advisor.whatif.savings import RankWhatIf

    try:
        raw = orjson.loads(files[ANALYSIS_META])
    except (KeyError, orjson.JSONDecodeError):
        return None
    try:
        if not isinstance(raw, dict) or raw.get("key_digest") != key.digest:
            return None
        meta = msgspec.convert(from_plain(raw), EntryMeta)
        import pyarrow as pa
        import pyarrow.parquet as pq

        if len({r.rank for r in meta.ranks}) != len(meta.ranks) or any(r.file_index >= len(run.files) for r in meta.ranks):
            return None  # ranks twice, or files the run does not have
        ranks = []
        for i, r in enumerate(meta.ranks):
            names = TABLES + (COMM_TABLES if r.comm else ()) + (("roofline",) if r.roofline is not None else ())
            t = {name: pq.read_table(pa.BufferReader(files[f"{i}.{name}.parquet"])).to_pandas() for name in names}
            check_tables(t)
            ranks.append(
                Metrics(
                    rank=r.rank,
                    frames=FramesHeader(path=run.files[r.file_index], metadata=r.metadata, distributed=r.distributed, has_device=r.has_device),
                    steps=t["steps"],
                    breakdown=t["breakdown"],
                    utilization=t["utilization"]["utilization"].rename(None),
                    kernels=t["kernels"],
                    device=_device(r.device),
                    tensor_core_kernel_share=r.tensor_core_kernel_share,
                    tensor_core_eligible_share=r.tensor_core_eligible_share,
                    kernel_time_by_precision_ms=r.kernel_time_by_precision_ms,
                    h2d=msgspec.structs.asdict(r.h2d),
                    d2h=msgspec.structs.asdict(r.d2h),
                    peak_memory=r.peak_memory,
                    notes=r.notes,
                    comm=RankComm(t["collectives"], t["compute"]) if r.comm else None,
                    roofline=_roofline_of(r.roofline, t.get("roofline")),
                )
            )
        findings = []
        if not all(_within_replay(w) for w in meta.whatif):
            return None
        whatif = [RankWhatIf(**msgspec.structs.asdict(w)) for w in meta.whatif]
        # A saving is a finite, non-negative time no longer than the longest step, measured or replayed.
        longest_ms = max([float(m.steps["duration"].max()) / 1e6 for m in ranks if len(m.steps)] + [w.baseline_ms for w in whatif] + [0.0])
        for f in meta.findings:
            if f.saving_ms is not None and not (math.isfinite(f.saving_ms) and 0 <= f.saving_ms <= longest_ms * (1 + 1e-6) + 1e-6):
                return None
            d = msgspec.structs.asdict(f)
            findings.append(Finding(**{**d, "fix": Fix(**msgspec.structs.asdict(f.fix))}))
        return CachedRun(ranks=ranks, findings=findings, warnings=meta.warnings, whatif=whatif, split_job=meta.split_job)
    except Exception:  # noqa: BLE001 - a damaged, foreign or forged entry is a miss, never a failed report
        return None
