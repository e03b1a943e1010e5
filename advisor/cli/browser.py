"""`advisor view`: where the HTML report goes, and handing it to the user's browser.

The report is one self-contained file (no network, no server), so viewing it is writing it
and asking the browser to open it. Nothing is written beside the user's traces: the file
goes to a private folder of the user's own in the temporary folder (`torch-advisor-view-UID`,
mode 0700, owned by the user, checked each time without following a link), one file per run
(a second view of the same run replaces it). When that folder is not the user's own (another
user made it first, or it is a link), a fresh private folder is made instead: nobody else can
plant a link the report would be written through.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
import tempfile
import webbrowser
from pathlib import Path

from advisor.load.discover import RunFiles


def view_file(run: RunFiles) -> Path:
    """The report's file for this run: stable per run folder, in the user's private folder."""
    key = hashlib.sha256(str(run.directory.resolve()).encode("utf-8", "surrogateescape")).hexdigest()[:10]
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", run.name)[:60] or "run"
    return private_folder() / f"{name}-{key}.html"


def private_folder() -> Path:
    """`<tmp>/torch-advisor-view-UID`, made 0700; used only when it is a real folder (not a
    link), owned by this user and closed to others. Otherwise a fresh `mkdtemp` folder."""
    uid = os.geteuid()
    folder = Path(tempfile.gettempdir()) / f"torch-advisor-view-{uid}"
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return Path(tempfile.mkdtemp(prefix="torch-advisor-view-"))
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:  # a link, or not a folder
        return Path(tempfile.mkdtemp(prefix="torch-advisor-view-"))
    try:
        st = os.fstat(fd)
        if st.st_uid != uid:
            return Path(tempfile.mkdtemp(prefix="torch-advisor-view-"))
        if st.st_mode & 0o077:
            os.fchmod(fd, 0o700)
    finally:
        os.close(fd)
    return folder


def browser_available() -> bool:
    """Whether asking for a browser can show anything: $BROWSER, a desktop, or macOS/Windows.

    On a Linux machine without a display (SSH, containers) Python would fall back to a text
    browser that takes over the terminal; the path is more useful there.
    """
    if os.environ.get("BROWSER"):
        return True
    if sys.platform in ("darwin", "win32"):
        return True
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def no_browser_reason() -> str:
    """Why no browser opened the report, in a few words."""
    if not browser_available():
        return "no browser found (no display, and $BROWSER is not set)"
    return "the browser did not open it"


def open_in_browser(path: Path) -> bool:
    """Open the file in the browser; False when there is none to open it."""
    if not browser_available():
        return False
    try:
        return bool(webbrowser.open(path.resolve().as_uri()))
    except webbrowser.Error:
        return False
