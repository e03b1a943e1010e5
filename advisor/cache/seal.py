"""The seal: an HMAC under the installation's secret over an entry's files, written last."""

from __future__ import annotations

import hashlib
import hmac
import os
import stat
import time
from pathlib import Path

import orjson

from advisor.files import replace_file
from advisor.files_read import read_regular
from advisor.cache.settings import DEFAULT_MAX_BYTES, cache_dir_setting, max_cache_bytes, user_cache_root


SEAL_FILE = "seal.json"
KEY_FILE = "secret.key"
KEY_BYTES = 32
# A folder being written carries this marker (an HMAC under the secret) until it is sealed:
# a folder left behind by a run that died is recognised as the advisor's, and removed. A
# sealed entry holds no marker (its seal says whose it is).
MAKING_FILE = ".advisor-making"
# The cache's own small files: a seal or a remembered hash larger than this is not one.
SMALL_FILE_BYTES = 4 * 2**20


class BadEntry(Exception):
    """An entry that does not hold what the advisor would build: read as a miss."""


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


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
