"""advisor: why is my PyTorch training slow, and what should I change first.

`advisor.analyze(path)` is the Python API (see advisor/api.py); importing `advisor` loads
nothing else (no pandas, no torch) until it is called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from advisor.version import __version__

if TYPE_CHECKING:
    from advisor.api import RunAnalysis

__all__ = ["__version__", "analyze"]


def analyze(path: Any, **options: Any) -> "RunAnalysis":
    """Analyse a torch.profiler log dir or trace file; the result's findings, breakdown,
    steps, kernels and ops are DataFrames (see advisor.api.analyze for the options)."""
    from advisor.api import analyze as _analyze

    return _analyze(path, **options)
