"""Drive headless Chromium over the DevTools protocol, standard library only.

Chromium's `--remote-debugging-pipe` reads protocol commands from file descriptor 3 and
writes replies and events to descriptor 4, each message JSON ending in a NUL byte. That is
all a test needs to open a page, read what its scripts did (console messages, uncaught
exceptions, CSP violations), query the DOM and take a screenshot: no websocket client, no
chromedriver, no selenium.

    with Chromium.launch() as browser:
        page = browser.open(Path("report.html"))
        page.evaluate("document.querySelectorAll('svg').length")
        page.screenshot(Path("report.png"))
        page.errors()   # console errors, uncaught exceptions, CSP violations
"""

from __future__ import annotations

import base64
import json
import os
import queue
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BINARIES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
FLAGS = [
    "--headless",
    "--no-sandbox",  # CI containers run as root
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--no-first-run",
    "--no-default-browser-check",
    "--mute-audio",
    "--remote-debugging-pipe",
]


def find_chromium() -> str | None:
    """The Chromium binary: $CHROMIUM if set, else the first of BINARIES on PATH."""
    env = os.environ.get("CHROMIUM")
    if env:
        return env if Path(env).exists() or shutil.which(env) else None
    for name in BINARIES:
        path = shutil.which(name)
        if path:
            return path
    return None


def _above(fd: int, low: int) -> int:
    """A copy of fd numbered >= low (the original is closed)."""
    import fcntl

    new = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, low)
    os.close(fd)
    return new


class ProtocolError(RuntimeError):
    pass


@dataclass
class Page:
    browser: "Chromium"
    session: str
    events: list[dict[str, Any]] = field(default_factory=list)

    def call(self, method: str, params: dict[str, Any] | None = None, timeout: float = 120.0) -> dict[str, Any]:
        return self.browser.call(method, params, session=self.session, timeout=timeout)

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (JSON-serialisable results only)."""
        reply = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in reply:
            raise ProtocolError(f"evaluate failed: {reply['exceptionDetails'].get('text')}")
        return reply["result"].get("value")

    def errors(self) -> list[str]:
        """Console errors, uncaught exceptions and browser log errors (CSP violations among them)."""
        out = []
        for e in self.browser.drain(self.session):
            self.events.append(e)
        for e in self.events:
            m, p = e["method"], e.get("params", {})
            if m == "Runtime.exceptionThrown":
                d = p.get("exceptionDetails", {})
                out.append(f"exception: {d.get('exception', {}).get('description') or d.get('text')}")
            elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append("console.error: " + " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
            elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                out.append(f"log: {p['entry'].get('text')}")
        return out

    def screenshot(self, path: Path, full_page: bool = True) -> Path:
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            metrics = self.call("Page.getLayoutMetrics")
            size = metrics.get("cssContentSize") or metrics["contentSize"]
            params["clip"] = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
            params["captureBeyondViewport"] = True
        data = self.call("Page.captureScreenshot", params, timeout=60)["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path


class Chromium:
    """One headless Chromium process, spoken to over its debugging pipe."""

    def __init__(self, binary: str, width: int = 1280, height: int = 900):
        self.width, self.height = width, height
        self._profile = tempfile.mkdtemp(prefix="advisor-chromium-")
        cmd_r, cmd_w = os.pipe()  # we write commands, Chromium reads them on fd 3
        out_r, out_w = os.pipe()  # Chromium writes on fd 4, we read

        # Move our ends clear of 3 and 4 first, so the dup2 below cannot overwrite one with the other.
        cmd_r, out_w = _above(cmd_r, 10), _above(out_w, 10)

        def wire_pipes() -> None:  # runs in the child before exec
            os.dup2(cmd_r, 3)
            os.dup2(out_w, 4)
            os.set_inheritable(3, True)
            os.set_inheritable(4, True)

        self.proc = subprocess.Popen(
            [binary, *FLAGS, f"--user-data-dir={self._profile}", f"--window-size={width},{height}", "about:blank"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            preexec_fn=wire_pipes,
            close_fds=False,  # fds 3 and 4 must survive; Python's own fds are not inheritable
        )
        os.close(cmd_r)
        os.close(out_w)
        self._out = os.fdopen(cmd_w, "wb", buffering=0)
        self._in = os.fdopen(out_r, "rb", buffering=0)
        self._next_id = 0
        self._replies: dict[int, dict[str, Any]] = {}
        self._events: list[dict[str, Any]] = []
        self._inbox: queue.Queue = queue.Queue()
        self._stderr: list[bytes] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()

    @classmethod
    def launch(cls, binary: str | None = None, width: int = 1280, height: int = 900) -> "Chromium":
        binary = binary or find_chromium()
        if binary is None:
            raise FileNotFoundError("chromium not found")
        return cls(binary, width, height)

    # --- transport ----------------------------------------------------------------------
    def _read(self) -> None:
        buf = b""
        while True:
            chunk = self._in.read(65536)
            if not chunk:
                self._inbox.put(None)
                return
            buf += chunk
            while b"\0" in buf:
                msg, buf = buf.split(b"\0", 1)
                self._inbox.put(json.loads(msg))

    def _read_stderr(self) -> None:
        for line in self.proc.stderr:  # type: ignore[union-attr]
            self._stderr.append(line)

    def _pump(self, timeout: float) -> bool:
        try:
            msg = self._inbox.get(timeout=timeout)
        except queue.Empty:
            return True
        if msg is None:
            raise ProtocolError("chromium closed its pipe; stderr:\n" + b"".join(self._stderr[-20:]).decode(errors="replace"))
        if "id" in msg:
            self._replies[msg["id"]] = msg
        else:
            self._events.append(msg)
        return True

    def call(self, method: str, params: dict[str, Any] | None = None, session: str | None = None, timeout: float = 120.0) -> dict[str, Any]:
        self._next_id += 1
        cid = self._next_id
        msg: dict[str, Any] = {"id": cid, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        self._out.write(json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while cid not in self._replies:
            if time.monotonic() > deadline:
                raise ProtocolError(f"no reply to {method} within {timeout} s")
            self._pump(0.1)
        reply = self._replies.pop(cid)
        if "error" in reply:
            raise ProtocolError(f"{method}: {reply['error'].get('message')}")
        return reply.get("result", {})

    def drain(self, session: str | None = None) -> list[dict[str, Any]]:
        """Events received so far for a session (removed from the browser's list)."""
        while not self._inbox.empty():
            self._pump(0)
        mine = [e for e in self._events if e.get("sessionId") == session]
        self._events = [e for e in self._events if e.get("sessionId") != session]
        return mine

    def wait_event(self, session: str, method: str, timeout: float = 120.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        seen: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            for e in self.drain(session):
                seen.append(e)
                if e["method"] == method:
                    self._events = seen + self._events  # keep them for Page.errors()
                    return e
            self._pump(0.1)
        self._events = seen + self._events
        raise ProtocolError(f"no {method} within {timeout} s")

    # --- pages --------------------------------------------------------------------------
    def open(self, path: Path, timeout: float = 120.0, width: int | None = None) -> Page:
        """Open a local file in a fresh tab (`width` CSS pixels wide, else the browser's) and
        wait for its load event (scripts have run)."""
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable", session=session)
        self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width or self.width, "height": self.height, "deviceScaleFactor": 1, "mobile": False},
            session=session,
        )
        self.call("Page.navigate", {"url": Path(path).resolve().as_uri()}, session=session)
        self.wait_event(session, "Page.loadEventFired", timeout)
        page = Page(self, session)
        page.events.extend(self.drain(session))
        return page

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                self.call("Browser.close", timeout=5)
        except (ProtocolError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for f in (self._out, self._in):
            try:
                f.close()
            except OSError:
                pass
        shutil.rmtree(self._profile, ignore_errors=True)

    def __enter__(self) -> "Chromium":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
