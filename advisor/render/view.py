"""`advisor view`: where the HTML report goes, and handing it to the user's browser.

The report is one self-contained file (no network, no server), so viewing it is writing it
and asking the browser to open it. Nothing is written beside the user's traces: the file
goes to the temporary folder, one per run (a second view of the same run replaces it).
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
    """The report's file for this run: stable per run folder, in the temporary folder."""
    key = hashlib.sha256(str(run.directory.resolve()).encode("utf-8", "surrogateescape")).hexdigest()[:10]
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", run.name)[:60] or "run"
    return Path(tempfile.gettempdir()) / "torch-advisor-view" / f"{name}-{key}.html"


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


def open_in_browser(path: Path) -> bool:
    """Open the file in the browser; False when there is none to open it."""
    if not browser_available():
        return False
    try:
        return bool(webbrowser.open(path.resolve().as_uri()))
    except webbrowser.Error:
        return False
