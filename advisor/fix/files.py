"""The files `advisor fix --write` touches: the git check, the kept original, the fixed script.

- `git_dirty`: whether git shows changes to the script that are not committed. git runs with
  nothing from the repository that executes: no system config, `core.fsmonitor` and
  `core.hooksPath` emptied, no pager, no optional locks, and only commands that never run a
  filter, a diff driver or a textconv (`rev-parse`, `check-ignore`); the file's content is
  hashed here, as git hashes a blob, and compared with the committed one. A script reached
  through a symbolic link is checked where the link leads.
- `keep_original`: SCRIPT.orig, written whole or not at all (a temp file beside it, synced,
  then linked to its name, which fails where anything is there already, a dangling link
  included; with --force, renamed over what is there, which replaces a link and never writes
  where it leads), with the script's own permissions.
- `write_script`: the fixed script, checked to compile first, written whole or not at all.
- `read_small_file`: a bounded read of a regular file (a facts file of a run folder): a FIFO,
  a device or a link to one is skipped, never opened for reading.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import subprocess
import tempfile
from pathlib import Path

from advisor.errors import InputError

# git with nothing of the repository's configuration that runs a command
GIT_SAFE = ["-c", "core.fsmonitor=", "-c", "core.hooksPath=/dev/null", "-c", "core.pager=cat", "-c", "diff.external=", "--no-pager", "--no-optional-locks"]
SMALL_FILE = 16 * 2**20  # a facts file is a few KiB


def _git_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_CONFIG_NOSYSTEM="1", GIT_TERMINAL_PROMPT="0", GIT_OPTIONAL_LOCKS="0", GIT_PAGER="cat", GIT_EXTERNAL_DIFF="", LC_ALL="C")
    return env


def _git(folder: Path, *args: str) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(["git", *GIT_SAFE, *args], cwd=folder, capture_output=True, timeout=30, env=_git_env(), stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None


def git_dirty(script: Path) -> bool:
    """Whether the file the script path leads to differs from its last commit, or is new to
    git (untracked and not ignored), in a git work tree; False outside one or without git."""
    real = Path(os.path.realpath(script))
    folder, name = real.parent, real.name
    top = _git(folder, "rev-parse", "--is-inside-work-tree", "--show-object-format")
    if top is None or top.returncode != 0:
        return False  # no git, or not a work tree: nothing to protect beyond SCRIPT.orig
    lines = top.stdout.decode(errors="replace").split()
    if not lines or lines[0] != "true":
        return False
    object_format = lines[1] if len(lines) > 1 and lines[1] in ("sha1", "sha256") else "sha1"
    committed = _git(folder, "rev-parse", "-q", "--verify", f"HEAD:./{name}")
    if committed is None or committed.returncode != 0:
        ignored = _git(folder, "check-ignore", "-q", "--", name)
        return not (ignored is not None and ignored.returncode == 0)
    blob = committed.stdout.decode(errors="replace").strip()
    try:
        data = real.read_bytes()
    except OSError:
        return True
    # the file as it is, and with CRLF line ends made LF (what core.autocrlf commits)
    candidates = {data, data.replace(b"\r\n", b"\n")}
    return not any(_blob_id(d, object_format) == blob for d in candidates)


def _blob_id(data: bytes, object_format: str) -> str:
    return hashlib.new(object_format, b"blob %d\0" % len(data) + data).hexdigest()


def orig_path(script: Path) -> Path:
    return script.with_name(script.name + ".orig")


def keep_original(script: Path, data: bytes, force: bool) -> Path:
    """Write DATA (the script's bytes) to SCRIPT.orig with the script's permissions; refuse
    where SCRIPT.orig exists (as anything: a file, a link, a dangling link) unless `force`."""
    orig = orig_path(script)
    if not force and os.path.lexists(orig):
        raise InputError(orig, "already exists; move it away, or pass --force to replace it")
    if force and os.path.isdir(orig) and not os.path.islink(orig):
        raise InputError(orig, "is a directory; move it away")
    try:
        mode = stat.S_IMODE(os.stat(script).st_mode)
    except OSError:
        mode = 0o600
    tmp = _write_temp(orig.parent, data, mode, orig)
    try:
        if force:
            os.replace(tmp, orig)  # replaces a link itself, never the file it leads to
        else:
            _link_new(tmp, orig)
    except OSError as exc:
        raise InputError(orig, f"cannot write: {exc.strerror or exc}") from None
    finally:
        _remove(tmp)
    return orig


def write_script(script: Path, data: bytes) -> None:
    """Replace the script's content with DATA, whole or not at all, keeping its permissions;
    through a symbolic link, the file it leads to is written (the link stays a link)."""
    real = Path(os.path.realpath(script))
    try:
        mode = stat.S_IMODE(os.stat(real).st_mode)
    except OSError as exc:
        raise InputError(script, f"cannot write: {exc.strerror or exc}") from None
    tmp = _write_temp(real.parent, data, mode, script)
    try:
        os.replace(tmp, real)
    except OSError as exc:
        raise InputError(script, f"cannot write: {exc.strerror or exc}") from None
    finally:
        _remove(tmp)


def _write_temp(folder: Path, data: bytes, mode: int, named: Path) -> str:
    """A hidden temp file in FOLDER holding DATA, synced to disk, with MODE; removed again
    (nothing left behind) when any of it fails."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=".advisor-", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise InputError(named, f"cannot write: {exc.strerror or exc}") from None
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fchmod(fd, mode)
        os.fsync(fd)
    except OSError as exc:
        os.close(fd)
        _remove(tmp)
        raise InputError(named, f"cannot write: {exc.strerror or exc}") from None
    os.close(fd)
    return tmp


def _link_new(tmp: str, dest: Path) -> None:
    """TMP under the name DEST, only where nothing (not even a dangling link) is there."""
    try:
        os.link(tmp, dest, follow_symlinks=False)
        return
    except FileExistsError:
        raise InputError(dest, "already exists; move it away, or pass --force to replace it") from None
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK, errno.EXDEV, errno.ENOSYS):
            raise
    # a file system without hard links: a new file that refuses to exist already or be a link
    with open(tmp, "rb") as fh:
        data = fh.read()
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), stat.S_IMODE(os.stat(tmp).st_mode))
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    except OSError:
        os.close(fd)
        _remove(str(dest))
        raise
    os.close(fd)


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def read_small_file(path: Path, limit: int = SMALL_FILE) -> bytes | None:
    """The bytes of PATH when it is a regular file (through links) of at most LIMIT bytes;
    None for anything else (a FIFO, a device, a folder, too large, unreadable)."""
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
            return None
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks) if size <= limit else None
    except OSError:
        return None
    finally:
        os.close(fd)
