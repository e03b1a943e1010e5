"""Every real trace the tests can reach, each analysed once per test process.

The public traces beside the repository (../shared/traces, with its corpus/) and this
project's own recordings (sample_runs/, tests/data/). Invariant and label tests iterate over
`public_traces()` and `own_runs()` and share `analysis_of`, so a trace is read once however
many checks look at it.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
from conftest import BESIDE, REPO, SAMPLE_RUNS, SHARED_TRACES, VENDORED, shared

from advisor.analysis import Analysis, analyze
from advisor.config import Config

TRACE_SUFFIXES = (".json", ".json.gz")


def _is_trace(p: Path) -> bool:
    return p.is_file() and p.name.endswith(TRACE_SUFFIXES) and p.name != "advisor_facts.json"


def _holds_traces(p: Path) -> bool:
    return p.is_dir() and any(_is_trace(c) for c in p.rglob("*"))


def _runs_under(root: Path) -> list[Path]:
    """The trace files and trace folders directly under root (a folder of ranks is one run)."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if _is_trace(p) or _holds_traces(p))


# The one name public_traces() gives where ../shared/traces is absent: its cases show as one
# skip that names the missing folder, instead of vanishing from the run.
PUBLIC_ABSENT = "public-traces-absent"


def public_traces() -> list[str]:
    """Paths relative to ../shared/traces: every top-level run, misc/*, corpus/*; where the
    folder is absent, PUBLIC_ABSENT alone (resolve() skips it with the reason)."""
    if not SHARED_TRACES.is_dir():
        return [PUBLIC_ABSENT]
    out: list[str] = []
    for p in _runs_under(SHARED_TRACES):
        if p.name in ("misc", "corpus"):
            out += [f"{p.name}/{c.name}" for c in _runs_under(p)]
        else:
            out.append(p.name)
    return out


def own_runs() -> list[str]:
    """Paths relative to the repository: every folder of this project's recordings that holds a trace."""
    roots = [SAMPLE_RUNS, *(REPO / "tests" / "data").glob("*/runs")]
    folders = {t.parent for root in roots for t in root.rglob("*") if _is_trace(t)}
    return sorted(str(p.relative_to(REPO)) for p in folders)


# This project's recordings in the data set (../shared, a trimmed copy in tests/data/shared):
# the ViT what-if runs and the H100 kernel corpus.
DATA_SET_RUNS = ("whatif/h100_vit", "kernels/h100")


def data_set_runs() -> list[str]:
    """Paths relative to the data set: each ViT run and each kernel-corpus trace that the vendored
    copy or the data set beside the repository holds a trace of."""
    out: set[str] = set()
    for root in (VENDORED, BESIDE):
        for rel in DATA_SET_RUNS:
            folder = root / rel
            if folder.is_dir():
                out |= {f"{rel}/{p.name}" for p in folder.iterdir() if _holds_traces(p) or (_is_trace(p) and ".trace." in p.name)}
    return sorted(out)


def resolve(name: str) -> Path:
    """A name from public_traces() or own_runs(); skips, saying why, when the public data is absent."""
    if name == PUBLIC_ABSENT:
        pytest.skip(f"the public traces are not available: {SHARED_TRACES} is absent (each of its runs is checked here where it is present)")
    own = REPO / name
    if own.exists():
        return own
    if name.startswith(DATA_SET_RUNS):
        path = shared(name)
        if path.is_dir() and not _holds_traces(path):
            pytest.skip(f"recording not available: {path} holds the run's facts file only (its trace is in {BESIDE})")
        return path
    path = SHARED_TRACES / name
    if not path.exists():
        pytest.skip(f"real recording not available: {name} is not in {SHARED_TRACES}")
    return path


@functools.cache
def analysis_of(name: str) -> Analysis:
    """The default analysis (built-in rules, default configuration) of one run, once per process."""
    return analyze(resolve(name), config=Config())
