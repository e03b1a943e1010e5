"""The gate's table (`[tool.advisor.gate]`, a budget file, the command line): its keys and values, checked.

Below both the configuration (`advisor.config` checks the table where it reads the config
file) and the gate (`advisor.gate.budgets` builds its settings from the checked values), so
that neither imports the other's layer.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from advisor.errors import InputError
from advisor.metrics.breakdown import CATEGORIES
from advisor.sizes import parse_size

SEVERITY_LIMITS = ("none", "low", "medium", "high")

# --- parsing --------------------------------------------------------------------------------
# Each layer's table is decoded into GateTable: a typo, a value of the wrong type or out of
# range is refused by msgspec, and the error becomes one line naming the file and the key
# with what the key must be (MUST_BE). UNSET marks a key the layer does not set.
_FINITE = sys.float_info.max  # NaN and the infinities are no budget
Positive = Annotated[float, msgspec.Meta(gt=0, le=_FINITE)]
Fraction = Annotated[float, msgspec.Meta(ge=0, le=1)]
Maybe = msgspec.UnsetType
UNSET = msgspec.UNSET

# [max_share]: a fraction per breakdown category, nothing else
MaxShare = msgspec.defstruct("MaxShare", [(c, Fraction | Maybe, UNSET) for c in CATEGORIES], forbid_unknown_fields=True, kw_only=True)


class GateTable(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One layer of gate settings, as written ([tool.advisor.gate], a --budget file, the flags)."""

    baseline: Annotated[str, msgspec.Meta(min_length=1)] | Maybe = UNSET  # relative to the file
    tolerance: Annotated[float, msgspec.Meta(ge=0, lt=1)] | Maybe = UNSET
    confidence: Annotated[float, msgspec.Meta(ge=0.5, lt=1)] | Maybe = UNSET
    min_steps: Annotated[int, msgspec.Meta(ge=3)] | Maybe = UNSET
    strict: bool | Maybe = UNSET
    fail_on_new_findings: bool | Maybe = UNSET
    batch_size: Annotated[int, msgspec.Meta(gt=0)] | Maybe = UNSET
    max_step_time_ms: Positive | Maybe = UNSET
    min_gpu_utilization: Fraction | Maybe = UNSET
    max_share: MaxShare | Maybe = UNSET  # type: ignore[valid-type]
    max_peak_memory: int | float | str | Maybe = UNSET  # bytes or a size (advisor.sizes), checked below
    max_severity: Literal[SEVERITY_LIMITS] | Maybe = UNSET  # type: ignore[valid-type]
    forbid_rules: list[str] | Maybe = UNSET
    min_samples_per_s: Positive | Maybe = UNSET
    max_ms_per_sample: Positive | Maybe = UNSET


KNOWN_KEYS = GateTable.__struct_fields__
_FRACTION = "must be a fraction between 0 and 1 (0.05 = 5%)"
_CATEGORIES = f"categories: {', '.join(CATEGORIES)}"
# What each key must be, for the one-line error ("got VALUE" is added where a value was given).
MUST_BE = {
    "baseline": "must be a path",
    "tolerance": _FRACTION,
    "confidence": "must be between 0.5 and 1 (0.95 = 95%)",
    "min_steps": "must be a whole number of at least 3",
    "strict": "must be true or false",
    "fail_on_new_findings": "must be true or false",
    "batch_size": "must be a positive whole number",
    "max_step_time_ms": "must be a positive number",
    "min_gpu_utilization": _FRACTION,
    "max_share": f"must be a table of category = fraction, {_CATEGORIES}",
    "max_share.": _FRACTION,  # each category's share
    "max_peak_memory": 'must be a number of bytes or a size like "16 GiB"',
    "max_severity": f"must be one of {', '.join(SEVERITY_LIMITS)}",
    "forbid_rules": "must be a list of rule ids",
    "min_samples_per_s": "must be a positive number",
    "max_ms_per_sample": "must be a positive number",
}
_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<key>[^`]*)`(?: - at `\$\.(?P<at>[^`]*)`)?$")
_AT = re.compile(r" - at `\$\.(?P<at>[^`\[]*)[^`]*`$")


def parse_gate_table(table: Any, where: str | Path | None, base_dir: Path | None, table_name: str = "[tool.advisor.gate]") -> dict[str, Any]:
    """Validate one layer of gate settings; returns only the keys it sets (budget keys flat)."""
    if not isinstance(table, dict):
        raise InputError(where, f"{table_name} must be a table")
    try:
        typed = msgspec.convert(table, GateTable)
        out = {k: getattr(typed, k) for k in KNOWN_KEYS if getattr(typed, k) is not UNSET}
        if "max_share" in out:
            out["max_share"] = {c: v for c in CATEGORIES if (v := getattr(out["max_share"], c)) is not UNSET}
            if not out["max_share"]:
                raise _Refused("max_share")
        if "max_peak_memory" in out:
            try:
                out["max_peak_memory"] = float(parse_size(out["max_peak_memory"]))
            except ValueError:
                out["max_peak_memory"] = 0
            if out["max_peak_memory"] <= 0:
                raise _Refused("max_peak_memory")
    except msgspec.ValidationError as exc:  # the first mistake, in the table's order
        raise InputError(where, f"{table_name}: {_problem(str(exc), table)}") from None
    except _Refused as exc:
        raise InputError(where, f"{table_name}: {_problem_at(exc.key, table)}") from None
    if "baseline" in out:
        p = Path(out["baseline"])
        out["baseline"] = p if p.is_absolute() or base_dir is None else base_dir / p
    return out


class _Refused(Exception):
    """A value of the right type that is still no setting (an empty max_share, a size of 0)."""

    def __init__(self, key: str):
        self.key = key


def _problem(text: str, table: dict[str, Any]) -> str:
    """msgspec's error as "KEY must be ..., got VALUE" or "KEY is not a gate setting; known: ..."."""
    m = _UNKNOWN.match(text)
    if m and m["at"] == "max_share":
        return f"max_share.{m['key']} is not a breakdown category; {_CATEGORIES}"
    if m:
        return f"{m['key']} is not a gate setting; known: {', '.join(KNOWN_KEYS)}"
    m = _AT.search(text)
    return _problem_at(m["at"], table) if m else text


def _problem_at(key: str, table: dict[str, Any]) -> str:
    top, _, category = key.partition(".")
    value = table.get(top)
    if not category:
        shown = "" if top in ("baseline", "forbid_rules", "max_share") else f", got {value!r}"
        return f"{key} {MUST_BE[top]}{shown}"
    value = value.get(category) if isinstance(value, dict) else None
    return f"{key} {MUST_BE[top + '.']}, got {value!r}"
