"""Columns from sequences of decoded values: numbers converted by numpy in one call per
column, strings factorized into categorical codes; per-value Python work only for values of
odd types."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson
import pandas as pd


# --- columns from sequences of decoded values -----------------------------------------------
def _num(v: Any) -> float:
    """A JSON number as float, or NaN for anything else (strings, bools, null, huge ints)."""
    if type(v) is float:
        return v
    if type(v) is int:
        try:
            return float(v)
        except OverflowError:
            return math.nan
    return math.nan


def floats(values: Sequence[float]) -> np.ndarray:
    """float64 column in one numpy call (the decoder types these fields: every value is a float)."""
    try:
        return np.fromiter(values, dtype=np.float64, count=len(values))
    except (TypeError, ValueError, OverflowError):
        return np.fromiter(map(_num, values), dtype=np.float64, count=len(values))


def ids(values: Sequence[int]) -> np.ndarray:
    """int64 id column, -1 where absent or not an integer that fits (ints up to 2**64 decode)."""
    try:
        return np.fromiter(values, dtype=np.int64, count=len(values))
    except (TypeError, ValueError, OverflowError):
        pass
    vals = np.fromiter(map(_num, values), dtype=np.float64, count=len(values))
    out = np.full(len(vals), -1, dtype=np.int64)
    ok = np.isfinite(vals) & (np.abs(vals) < 2**62)
    out[ok] = vals[ok].astype(np.int64)
    return out


def objects(values: Sequence[Any]) -> np.ndarray:
    """A 1-d object array of the values as they are (np.array would look into each one for a shape)."""
    return np.fromiter(values, dtype=object, count=len(values))


def _first_id(primary: np.ndarray, fallback: np.ndarray) -> np.ndarray:
    return np.where(primary != -1, primary, fallback)


def categorical(codes: np.ndarray, uniques: np.ndarray) -> pd.Categorical:
    """uniques[codes] (-1 = missing) as a Categorical of the used values, sorted like pd.Categorical(values)."""
    codes = np.asarray(codes)
    present = codes >= 0
    used = np.flatnonzero(np.bincount(codes[present], minlength=len(uniques))) if len(uniques) else np.array([], dtype=np.int64)
    cats = np.asarray(uniques, dtype=object)[used]
    order = np.argsort(cats, kind="stable") if len(cats) else np.array([], dtype=np.int64)
    remap = np.full(len(uniques) + 1, -1, dtype=np.int32)  # slot -1 keeps missing missing
    remap[used[order]] = np.arange(len(used), dtype=np.int32)
    return pd.Categorical.from_codes(remap[codes], categories=pd.Index(cats[order], dtype="str"), validate=False)


def str_codes(values: list[Any]) -> tuple[np.ndarray, np.ndarray]:
    """Codes and unique str(v) for mixed values (thread ids are ints in one trace, strings in another)."""
    if (not values or type(values[0]) is int) and set(map(type, values)) <= {int}:  # a first value not an int settles it
        try:
            codes, uniques = pd.factorize(np.fromiter(values, dtype=np.int64, count=len(values)))
            return codes, np.array([str(u) for u in uniques], dtype=object)
        except OverflowError:
            pass
    codes, uniques = pd.factorize(objects(values), use_na_sentinel=False)
    names = np.array([str(u) for u in uniques], dtype=object)
    if len(set(names)) < len(names):  # e.g. 7 and "7": one category
        merged, names = pd.factorize(names)
        codes = merged[codes]
    return codes, np.asarray(names, dtype=object)


def _ids_pair(primary: list[Any], fallback: list[Any]) -> np.ndarray:
    """An id from the first of two spellings of a key that is present (-1 where neither is)."""
    if fallback.count(-1) == len(fallback):  # the usual case: only one spelling in the trace
        return ids(primary)
    return _first_id(ids(primary), ids(fallback))


def object_categorical(values: Sequence[Any]) -> pd.Categorical:
    """Categorical of strings where None is missing."""
    codes, uniques = pd.factorize(objects(values))
    return categorical(codes, uniques)


def _raw_bytes(raws: Sequence[Any]) -> np.ndarray:
    return np.fromiter(map(bytes, raws), dtype=object, count=len(raws))


def _decode_each(uniques: np.ndarray) -> list[Any]:
    out = []
    for b in uniques:
        try:
            out.append(orjson.loads(b))
        except orjson.JSONDecodeError:  # numbers a double cannot hold (1e400) pass msgspec's raw scan
            out.append(None)
    return out


def decoded_raw(raws: Sequence[Any]) -> np.ndarray:
    """Raw JSON values (Input Dims) decoded once per distinct value: object array.

    Equal values share one Python object, so a million ops with a few hundred distinct
    shapes hold a few hundred lists, not a million.
    """
    if len(raws) == 0:
        return np.empty(0, dtype=object)
    codes, uniques = pd.factorize(_raw_bytes(raws))
    decoded = np.empty(len(uniques), dtype=object)
    decoded[:] = _decode_each(uniques)
    return decoded[codes]


def raw_text_categorical(raws: Sequence[Any]) -> pd.Categorical:
    """Raw JSON values (grid, block) as a Categorical of str(value); JSON null is missing."""
    if len(raws) == 0:
        return categorical(np.empty(0, dtype=np.int64), np.empty(0, dtype=object))
    codes, uniques = pd.factorize(_raw_bytes(raws))
    texts = [str(v) if v is not None else None for v in _decode_each(uniques)]
    text_codes, names = pd.factorize(np.array(texts, dtype=object))  # "[1,2]" and "[1, 2]" are one value
    return categorical(np.append(text_codes, -1)[codes], np.asarray(names, dtype=object))


def raw_json_categorical(raws: Sequence[Any]) -> pd.Categorical:
    """Raw JSON values (Input type) as a Categorical of their compact JSON text; JSON null is missing.

    A few dozen distinct dtype lists stand for millions of ops; readers decode the categories."""
    if len(raws) == 0:
        return categorical(np.empty(0, dtype=np.int64), np.empty(0, dtype=object))
    codes, uniques = pd.factorize(_raw_bytes(raws))
    texts = [orjson.dumps(v).decode() if v is not None else None for v in _decode_each(uniques)]
    text_codes, names = pd.factorize(np.array(texts, dtype=object))
    return categorical(np.append(text_codes, -1)[codes], np.asarray(names, dtype=object))
