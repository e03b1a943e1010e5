"""Shared test fixtures: where the real traces are, and a skip when they are not there."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED_TRACES = REPO.parent / "shared" / "traces"
SAMPLE_RUNS = REPO / "sample_runs"


def shared_trace(rel: str) -> Path:
    """A trace under ../shared/traces; skips the test (with the reason) when it is absent."""
    p = SHARED_TRACES / rel
    if not p.exists():
        pytest.skip(f"real GPU traces not available: {p} is absent (../shared/traces sits beside the repository)")
    return p


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
