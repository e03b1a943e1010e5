"""Open a run in TensorBoard's PyTorch profiler view (`advisor view`, `report --tensorboard`).

The advisor says what to change; TensorBoard's trace viewer is where a user goes to look at
single kernels. This starts TensorBoard on the run's log dir with the profiler plugin
(`torch-tb-profiler`), waits until it answers, and prints the URL of the profiler tab.
"""

from __future__ import annotations

import importlib.util
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from advisor.errors import InputError
from advisor.load.discover import find_run

DEFAULT_PORT = 6006
INSTALL_HINT = "TensorBoard's profiler view needs `pip install 'torch-advisor[view]'` (tensorboard and torch-tb-profiler)"


@dataclass
class TensorBoardServer:
    process: subprocess.Popen
    url: str  # the profiler tab
    logdir: Path
    log: Path  # TensorBoard's own output

    def wait(self) -> int:
        """Block until TensorBoard exits; Ctrl+C or SIGTERM stop it too (never leave it orphaned)."""

        def on_term(signum, frame):
            raise KeyboardInterrupt

        previous = signal.signal(signal.SIGTERM, on_term) if threading.current_thread() is threading.main_thread() else None
        try:
            return self.process.wait()
        except KeyboardInterrupt:
            self.stop()
            return 0
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def profiler_logdir(path: str | Path) -> Path:
    """The folder to give TensorBoard: a trace file's folder, or the log dir itself.

    The plugin shows every folder holding traces under the log dir as a run, so a run folder
    is passed as it is (not its parent, which would list its neighbours too).
    """
    path = Path(path)
    run = find_run(path)  # raises InputError when there is no trace there
    return path if path.is_dir() else run.directory


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host if host not in ("localhost", "") else "127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(host: str, preferred: int) -> int:
    """`preferred` when it is free; else (or for 0) one the system hands out."""
    if preferred and _port_free(host, preferred):
        return preferred
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _lost_the_port(log: Path) -> bool:
    """TensorBoard exited because another process took the port between our check and its bind."""
    text = log.read_text(errors="replace").lower()
    return "already in use" in text or "could not bind" in text or "address in use" in text


def start_tensorboard(path: str | Path, host: str = "localhost", port: int = DEFAULT_PORT, timeout_s: float = 90.0) -> TensorBoardServer:
    """Start TensorBoard on the run's log dir and return once it answers HTTP (port 0: any free one)."""
    for module in ("tensorboard", "torch_tb_profiler"):
        if importlib.util.find_spec(module) is None:
            raise InputError(None, INSTALL_HINT)
    logdir = profiler_logdir(path).resolve()
    for attempt in range(3):
        try:
            return _start_on(logdir, host, free_port(host, port if attempt == 0 else 0), timeout_s)
        except _PortTaken:
            continue
    raise InputError(logdir, f"TensorBoard could not bind a port on {host}")


class _PortTaken(Exception):
    pass


def _start_on(logdir: Path, host: str, port: int, timeout_s: float) -> TensorBoardServer:
    log = Path(tempfile.mkstemp(prefix="advisor-tensorboard-", suffix=".log")[1])
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--host", host, "--port", str(port)],
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    base = f"http://{host}:{port}"
    server = TensorBoardServer(proc, f"{base}/#pytorch_profiler", logdir, log)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            if _lost_the_port(log):
                raise _PortTaken
            tail = log.read_text(errors="replace").strip().splitlines()[-5:]
            raise InputError(logdir, "TensorBoard exited: " + " | ".join(tail))
        try:
            with urllib.request.urlopen(f"{base}/data/plugins_listing", timeout=2) as r:
                if r.status == 200:
                    return server
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            pass
        time.sleep(0.3)
    server.stop()
    raise InputError(logdir, f"TensorBoard did not answer on {base} within {timeout_s:.0f} s (its log: {log})")


def launch_tensorboard(logdir: str | Path, host: str = "localhost", port: int = DEFAULT_PORT, wait: bool = True) -> TensorBoardServer:
    """Start TensorBoard with the profiler plugin, print the URL, and (by default) serve until Ctrl+C."""
    from rich.text import Text

    from advisor.terminal_text import inert_console

    server = start_tensorboard(logdir, host=host, port=port)
    sys.stdout.write(server.url + "\n")
    sys.stdout.flush()
    inert_console(stderr=True, highlight=False).print(
        Text(f"TensorBoard's PyTorch profiler view of {server.logdir} is at {server.url} (Ctrl+C stops it)")
    )
    if wait:
        server.wait()
    return server
