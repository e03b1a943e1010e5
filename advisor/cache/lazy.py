"""NumPy and pandas imported when first used: a warm report (its rendered text served from an
entry) never imports them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any


if TYPE_CHECKING:
    import numpy as np
    import pandas as pd


class _OnFirstUse:
    """A module imported when one of its names is first read: a warm report (its rendered
    text served from an entry) never imports NumPy, pandas or the trace loader."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        import importlib

        return getattr(importlib.import_module(self._name), attr)


if not TYPE_CHECKING:
    np = _OnFirstUse("numpy")
    pd = _OnFirstUse("pandas")
