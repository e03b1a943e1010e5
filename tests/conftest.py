"""Shared test fixtures: where the real traces are (with a skip when they are not there), and the CLI run in-process."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# Real recordings. This project's own (the kernel corpus, the ViT what-if runs) are kept, trimmed,
# in tests/data/shared (see its NOTICE) so that a fresh clone tests itself; public traces taken
# from other repositories are never copied into the repository and are read from the data set
# beside it (../shared/traces), with a skip that names the missing file where it is absent.
VENDORED = REPO / "tests" / "data" / "shared"
BESIDE = REPO.parent / "shared"
SHARED_TRACES = BESIDE / "traces"
SAMPLE_RUNS = REPO / "sample_runs"

# The suite never writes into the user's own cache folder (nor into one ADVISOR_CACHE names):
# each pytest process (each xdist worker) caches in a temporary folder of its own, removed at
# its end, and the user cache folder the advisor falls back on (XDG_CACHE_HOME) is a temporary
# one too. Set when pytest starts, not on import: a worker process that imports this module
# (a process pool's child) inherits the folder instead of leaving one of its own behind.
_TEST_CACHE: list[Path] = []


def pytest_configure(config):
    folder = Path(tempfile.mkdtemp(prefix="advisor-test-cache-"))
    _TEST_CACHE.append(folder)
    os.environ["ADVISOR_CACHE"] = str(folder / "advisor")
    os.environ["XDG_CACHE_HOME"] = str(folder / "xdg")


def pytest_unconfigure(config):
    for folder in _TEST_CACHE:
        shutil.rmtree(folder, ignore_errors=True)


def _holds_a_trace(folder: Path) -> bool:
    return any(p.name.endswith((".json", ".json.gz")) and p.name != "advisor_facts.json" for p in folder.iterdir())


def shared(rel: str) -> Path:
    """A file or folder of the real data set (`traces/...`, `kernels/h100/...`, `whatif/h100_vit/...`):
    the vendored copy when the repository has it, else ../shared; skips the test, saying why, when neither has it.

    Some what-if runs are vendored with their facts file only (tests/data/shared/NOTICE.md): for a
    folder, the copy that holds a trace wins, and a facts-only copy is the last resort."""
    found = [root / rel for root in (VENDORED, BESIDE) if (root / rel).exists()]
    complete = [p for p in found if p.is_file() or _holds_a_trace(p)]
    if complete or found:
        return (complete or found)[0]
    pytest.skip(f"real recording not available: {rel} is neither in {VENDORED} nor in {BESIDE}")


def shared_trace(rel: str) -> Path:
    """A trace under traces/ of the real data set (see `shared`)."""
    return shared(f"traces/{rel}")


def single_file(directory: Path) -> Path:
    files = sorted(p for p in directory.iterdir() if p.name.endswith((".json", ".json.gz")))
    assert len(files) == 1, files
    return files[0]


@pytest.fixture
def nw0() -> Path:
    return shared_trace("v100_resnet50_nw0")


@pytest.fixture
def nw4() -> Path:
    return shared_trace("v100_resnet50_nw4")


@pytest.fixture
def cli(monkeypatch, capsys):
    """`advisor.cli.main` in this process (no interpreter start-up): (exit code, stdout, stderr).

    A wide terminal, and no GITHUB_* variables (they switch the gate's annotations on).
    """
    from advisor.cli import main

    def run(args: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> tuple[int, str, str]:
        with monkeypatch.context() as m:
            if cwd is not None:
                m.chdir(cwd)
            for k in [k for k in os.environ if k.startswith("GITHUB_")]:
                m.delenv(k)
            for k, v in {"COLUMNS": "200", **(env or {})}.items():
                m.setenv(k, v)
            m.setattr(sys, "argv", ["advisor", *args])
            capsys.readouterr()
            try:
                main()
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            out, err = capsys.readouterr()
        return code, out, err

    return run


class CallCounter:
    """How many times a patched function ran; `forbid()` makes a call fail with `message`."""

    def __init__(self, message: str) -> None:
        self.n = 0
        self.forbidden = False
        self.message = message

    def forbid(self, on: bool = True) -> None:
        self.forbidden = on


def count_calls(monkeypatch, module, name: str, message: str) -> CallCounter:
    """Patch `module.name` to count its calls (and fail them once forbidden)."""
    counter = CallCounter(message)
    real = getattr(module, name)

    def counted(*args, **kwargs):
        assert not counter.forbidden, counter.message
        counter.n += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return counter
