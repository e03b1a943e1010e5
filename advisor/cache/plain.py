"""Values as JSON, exactly: a value JSON cannot carry back is Unstorable (the run is not cached)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import msgspec

if TYPE_CHECKING:
    import numpy as np

else:
    from advisor.cache.lazy import np

TAG = "$t"


class Unstorable(Exception):
    """A value JSON cannot carry back exactly; the run is not cached."""


def to_plain(v: Any) -> Any:
    """A value as JSON that from_plain turns back into an equal value of the same type."""
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, int):
        return int(v)
    if isinstance(v, float):
        f = float(v)
        return f if math.isfinite(f) else {TAG: "float", "v": repr(f)}
    if isinstance(v, np.bool_):
        return bool(v)
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, tuple):
        return {TAG: "tuple", "v": [to_plain(x) for x in v]}
    if isinstance(v, list):
        return [to_plain(x) for x in v]
    if isinstance(v, msgspec.Struct):  # a finding, a replay summary: its fields, as the type reads them back
        # under the names msgspec reads back (a field renamed for the JSON, Finding.saving_pct as saving_share)
        return {key: to_plain(getattr(v, name)) for name, key in zip(v.__struct_fields__, v.__struct_encode_fields__, strict=True)}
    if isinstance(v, dict):
        if all(isinstance(k, str) for k in v) and TAG not in v:
            return {k: to_plain(x) for k, x in v.items()}
        if all(isinstance(k, (str, int)) and not isinstance(k, bool) for k in v):
            return {TAG: "dict", "v": [[k, to_plain(x)] for k, x in v.items()]}
    raise Unstorable(type(v).__name__)


def from_plain(v: Any) -> Any:
    if isinstance(v, list):
        return [from_plain(x) for x in v]
    if not isinstance(v, dict):
        return v
    tag = v.get(TAG)
    if tag is None:
        return {k: from_plain(x) for k, x in v.items()}
    if tag == "float":
        return float(v["v"])
    if tag == "tuple":
        return tuple(from_plain(x) for x in v["v"])
    if tag == "dict":
        return {k: from_plain(x) for k, x in v["v"]}
    raise ValueError(f"unknown tag {tag!r}")
