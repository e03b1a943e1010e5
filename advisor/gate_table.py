"""The gate's table (`[tool.advisor.gate]`, a budget file): its keys and values, checked.

Below both the configuration (`advisor.config` checks the table where it reads the config
file) and the gate (`advisor.gate.budgets` builds its settings from the checked values), so
that neither imports the other's layer.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from advisor.errors import InputError

SEVERITY_LIMITS = ("none", "low", "medium", "high")
SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgt]i?b|b)?\s*$", re.IGNORECASE)
SIZE_UNITS = {"b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


# --- parsing --------------------------------------------------------------------------------
def parse_size(value: Any) -> float | None:
    """Bytes from a number of bytes or a string like "12 GiB" / "800MB"; None if neither."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value) if 0 < value < math.inf else None
    if isinstance(value, str):
        m = SIZE.match(value)
        if m:
            n = float(m.group(1)) * SIZE_UNITS[(m.group(2) or "b").lower()]
            return n if 0 < n < math.inf else None
    return None


def _number(value: Any) -> float | None:
    """A finite number (NaN and the infinities are no budget), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        n = float(value)
    except OverflowError:  # an integer beyond any float
        return None
    return n if math.isfinite(n) else None


class _Reader:
    """Validates one layer's table; errors name the file and the key."""

    def __init__(self, where: str | Path, table_name: str):
        self.where = where
        self.table_name = table_name

    def fail(self, key: str, problem: str) -> InputError:
        return InputError(self.where, f"{self.table_name}: {key} {problem}")

    def positive(self, key: str, value: Any) -> float:
        n = _number(value)
        if n is None or not n > 0:
            raise self.fail(key, f"must be a positive number, got {value!r}")
        return n

    def fraction(self, key: str, value: Any, *, upper_open: bool = False) -> float:
        n = _number(value)
        ok = n is not None and 0 <= n and (n < 1 if upper_open else n <= 1)
        if not ok:
            raise self.fail(key, f"must be a fraction between 0 and 1 (0.05 = 5%), got {value!r}")
        return n  # type: ignore[return-value]

    def boolean(self, key: str, value: Any) -> bool:
        if not isinstance(value, bool):
            raise self.fail(key, f"must be true or false, got {value!r}")
        return value


def parse_gate_table(table: Any, where: str | Path, base_dir: Path | None, table_name: str = "[tool.advisor.gate]") -> dict[str, Any]:
    """Validate one layer of gate settings; returns only the keys it sets (budget keys flat)."""
    from advisor.metrics.breakdown import CATEGORIES

    r = _Reader(where, table_name)
    if not isinstance(table, dict):
        raise InputError(where, f"{table_name} must be a table")
    out: dict[str, Any] = {}
    for key, value in table.items():
        if key == "max_step_time_ms":
            out[key] = r.positive(key, value)
        elif key == "min_gpu_utilization":
            out[key] = r.fraction(key, value)
        elif key == "max_share":
            if not isinstance(value, dict) or not value:
                raise r.fail(key, f"must be a table of category = fraction, categories: {', '.join(CATEGORIES)}")
            shares = {}
            for cat, frac in value.items():
                if cat not in CATEGORIES:
                    raise r.fail(f"{key}.{cat}", f"is not a breakdown category; categories: {', '.join(CATEGORIES)}")
                shares[cat] = r.fraction(f"{key}.{cat}", frac)
            out[key] = shares
        elif key == "max_peak_memory":
            size = parse_size(value)
            if size is None:
                raise r.fail(key, f"must be a number of bytes or a size like \"16 GiB\", got {value!r}")
            out[key] = size
        elif key == "max_severity":
            if value not in SEVERITY_LIMITS:
                raise r.fail(key, f"must be one of {', '.join(SEVERITY_LIMITS)}, got {value!r}")
            out[key] = value
        elif key == "forbid_rules":
            if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
                raise r.fail(key, "must be a list of rule ids")
            out[key] = list(value)
        elif key in ("min_samples_per_s", "max_ms_per_sample"):
            out[key] = r.positive(key, value)
        elif key == "baseline":
            if not isinstance(value, str) or not value:
                raise r.fail(key, "must be a path")
            p = Path(value)
            out[key] = p if p.is_absolute() or base_dir is None else base_dir / p
        elif key == "tolerance":
            out[key] = r.fraction(key, value, upper_open=True)
        elif key == "confidence":
            n = _number(value)
            if n is None or not 0.5 <= n < 1:
                raise r.fail(key, f"must be between 0.5 and 1 (0.95 = 95%), got {value!r}")
            out[key] = n
        elif key == "min_steps":
            if isinstance(value, bool) or not isinstance(value, int) or value < 3:
                raise r.fail(key, f"must be a whole number of at least 3, got {value!r}")
            out[key] = value
        elif key in ("strict", "fail_on_new_findings"):
            out[key] = r.boolean(key, value)
        elif key == "batch_size":
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise r.fail(key, f"must be a positive whole number, got {value!r}")
            out[key] = value
        else:
            raise r.fail(key, "is not a gate setting; known: " + ", ".join(KNOWN_KEYS))
    return out


KNOWN_KEYS = (
    "baseline",
    "tolerance",
    "confidence",
    "min_steps",
    "strict",
    "fail_on_new_findings",
    "batch_size",
    "max_step_time_ms",
    "min_gpu_utilization",
    "max_share",
    "max_peak_memory",
    "max_severity",
    "forbid_rules",
    "min_samples_per_s",
    "max_ms_per_sample",
)
