"""Shared test fixtures: where the real traces are (with a skip when they are not there), and the CLI run in-process."""

from __future__ import annotations

import json
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
# The nw4 ResNet-50 run's mean step. ../shared/ANCHORS.md gives the TensorBoard plugin's,
# 141.07 ms over its 6 steps, the last stretched to the end of its device work; the advisor
# ends that last step no further past its mark than the other steps' work ran past theirs or
# its own first kernel started into it (test_metrics: 8.05 ms past its mark, the others at most
# 3.26 ms, its first kernel 4.37 ms in), 3.69 ms sooner: (6 x 141.07 - 3.69) / 6.
NW4_MEAN_MS = (6 * 141.07 - 3.69) / 6

# The suite reads nothing of the user's and writes nothing of theirs: each pytest process (each
# xdist worker) gets a temporary folder of its own, removed at its end, that holds the advisor's
# cache (ADVISOR_CACHE), the user folders the advisor falls back on (XDG_CACHE_HOME, and
# XDG_CONFIG_HOME and HOME where platformdirs looks for the user's advisor.toml), and a working
# folder per test. The user's ADVISOR_* settings (a scheduler, size limits, workers) are
# dropped. Set when pytest starts, not on import: a worker process that imports this module
# (a process pool's child) inherits the folder instead of leaving one of its own behind.
_TEST_CACHE: list[Path] = []
# The user's own settings that change what the advisor reads or how: never read by the suite.
USER_SETTINGS = ("ADVISOR_SCHEDULER", "ADVISOR_MAX_TRACE_BYTES", "ADVISOR_CACHE_MAX_BYTES", "ADVISOR_WORKERS", "ADVISOR_DEBUG")


def pytest_configure(config):
    folder = Path(tempfile.mkdtemp(prefix="advisor-test-cache-"))
    _TEST_CACHE.append(folder)
    os.environ["ADVISOR_CACHE"] = str(folder / "advisor")
    os.environ["XDG_CACHE_HOME"] = str(folder / "xdg")
    os.environ["XDG_CONFIG_HOME"] = str(folder / "xdg-config")
    (folder / "home").mkdir()
    os.environ["HOME"] = str(folder / "home")
    for name in USER_SETTINGS:
        os.environ.pop(name, None)
    config.addinivalue_line("markers", "invariant(name, minimum, minimum_own): one invariant checked on one trace (see check_invariant_minimum)")
    if getattr(config, "workerinput", None) is None:
        os.environ[_TALLY_ENV] = str(folder / "invariants")
        (folder / "invariants").mkdir()
    config.addinivalue_line("markers", "repo_cwd: the test runs in the repository root, not in a folder of its own")


# --- invariants over traces: on how many traces each one asserted ------------------------------
# A test marked `invariant(NAME, minimum=M, minimum_own=K)` checks one invariant on one trace: it
# passes when its assertion ran and held, skips (with the reason) where the trace does not
# give the invariant anything to check, and never returns early. Each process tallies its
# cases' outcomes; xdist workers write theirs to a folder the controller reads, and the run's
# summary prints, per invariant, on how many traces it asserted. A file's last test checks
# the minimum (M with ../shared/traces present, K without) where every case of the invariant
# ran in its process (-n 0, or xdist's --dist loadfile, which keeps a file on one worker).
INVARIANT_TALLY: dict[str, dict[str, int]] = {}
INVARIANT_CASES: dict[str, int] = {}
INVARIANT_MINIMUM: dict[str, tuple[int, int]] = {}
_TALLY_ENV = "ADVISOR_TEST_INVARIANT_TALLIES"


def _invariant_of(item) -> tuple[str, tuple[int, int]] | None:
    mark = item.get_closest_marker("invariant")
    if mark is None:
        return None
    return mark.args[0], (int(mark.kwargs.get("minimum", 1)), int(mark.kwargs.get("minimum_own", 1)))


def pytest_collection_finish(session):
    for item in session.items:
        found = _invariant_of(item)
        if found is not None:
            INVARIANT_CASES[found[0]] = INVARIANT_CASES.get(found[0], 0) + 1
            INVARIANT_MINIMUM[found[0]] = found[1]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    found = _invariant_of(item)
    if found is not None and (report.when == "call" or (report.when == "setup" and not report.passed)):
        outcome = "xfailed" if hasattr(report, "wasxfail") else report.outcome
        tally = INVARIANT_TALLY.setdefault(found[0], {})
        tally[outcome] = tally.get(outcome, 0) + 1
    return report


def invariant_minimum(name: str) -> int:
    with_public, own_only = INVARIANT_MINIMUM[name]
    return with_public if SHARED_TRACES.is_dir() else own_only


def check_invariant_minimum(name: str) -> None:
    """Fails when the invariant asserted on fewer traces than its minimum; skips, saying why,
    where not every case of it ran in this process."""
    tally = INVARIANT_TALLY.get(name, {})
    ran = sum(tally.values())
    if name not in INVARIANT_CASES or ran < INVARIANT_CASES[name]:
        pytest.skip(f"invariant {name}: {ran} of its {INVARIANT_CASES.get(name, 0)} cases ran in this process (deselected, or spread over workers without --dist loadfile)")
    minimum = invariant_minimum(name)
    asserted = tally.get("passed", 0)
    assert asserted >= minimum, f"invariant {name} asserted on {asserted} traces, fewer than its minimum {minimum} ({tally})"


def pytest_sessionfinish(session, exitstatus):
    folder = os.environ.get(_TALLY_ENV)
    worker = getattr(session.config, "workerinput", None)
    if folder and worker is not None and INVARIANT_TALLY:
        minimum = {name: invariant_minimum(name) for name in INVARIANT_MINIMUM}
        (Path(folder) / f"{worker['workerid']}.json").write_text(json.dumps({"tally": INVARIANT_TALLY, "minimum": minimum}))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    total: dict[str, dict[str, int]] = {}
    parts = [INVARIANT_TALLY]
    minimum: dict[str, int] = {name: invariant_minimum(name) for name in INVARIANT_MINIMUM}
    folder = os.environ.get(_TALLY_ENV)
    if folder and Path(folder).is_dir():
        for p in sorted(Path(folder).glob("*.json")):
            written = json.loads(p.read_text())
            parts.append(written["tally"])
            minimum.update(written["minimum"])
    for part in parts:
        for name, tally in part.items():
            for outcome, n in tally.items():
                total.setdefault(name, {})[outcome] = total.setdefault(name, {}).get(outcome, 0) + n
    if not total:
        return
    terminalreporter.section("invariants over traces")
    for name in sorted(total):
        t = total[name]
        rest = ", ".join(f"{n} {o}" for o, n in sorted(t.items()) if o != "passed")
        terminalreporter.write_line(f"invariant {name} asserted on {t.get('passed', 0)} traces (minimum {minimum.get(name, '?')}){'; ' + rest if rest else ''}")


def pytest_unconfigure(config):
    for folder in _TEST_CACHE:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Each test runs in an empty folder of its own (a file a test or a documented example
    writes in the current folder, a config found "above the current folder", never reaches
    another test), unless it is marked `repo_cwd`. A hook, not a fixture: property-based
    tests take no function-scoped fixture."""
    if item.get_closest_marker("repo_cwd") is not None or not _TEST_CACHE:
        return (yield)
    before = os.getcwd()
    own = Path(tempfile.mkdtemp(prefix="cwd-", dir=_TEST_CACHE[0]))
    os.chdir(own)
    try:
        return (yield)
    finally:
        os.chdir(before)
        shutil.rmtree(own, ignore_errors=True)


def holds_a_trace(folder: Path) -> bool:
    return any(p.name.endswith((".json", ".json.gz")) and p.name != "advisor_facts.json" for p in folder.iterdir())


def shared(rel: str) -> Path:
    """A file or folder of the real data set (`traces/...`, `kernels/h100/...`, `whatif/h100_vit/...`):
    the vendored copy when the repository has it, else ../shared; skips the test, saying why, when neither has it.

    Some what-if runs are vendored with their facts file only (tests/data/shared/NOTICE.md): for a
    folder, the copy that holds a trace wins, and a facts-only copy is the last resort."""
    found = [root / rel for root in (VENDORED, BESIDE) if (root / rel).exists()]
    complete = [p for p in found if p.is_file() or holds_a_trace(p)]
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
