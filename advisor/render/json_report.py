"""The versioned JSON report (schema `advisor/report/v1`, documented in README.md)."""

from __future__ import annotations

import math
from typing import Any

import orjson

from advisor.analysis import Analysis


def _clean(obj: Any) -> Any:
    """NaN/inf are not JSON: a figure we cannot give is null."""
    if isinstance(obj, float):  # numpy floats too: orjson takes plain floats only
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, bool) or obj is None or isinstance(obj, str):
        return obj
    if isinstance(obj, int):
        return int(obj)
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalars
        return _clean(obj.item())
    return obj


def to_json(analysis: Analysis) -> str:
    return orjson.dumps(_clean(analysis.to_dict()), option=orjson.OPT_INDENT_2).decode()
