"""Sizes in bytes: the one parser of what a user writes, the one formatter of what we print.

Read (`parse_size`): a number of bytes, or a number and a unit, case and spaces ignored.
The letters alone and the IEC names are binary, the SI names decimal, as GNU coreutils
reads them:

    K, M, G, T   KiB, MiB, GiB, TiB    1024, 1024**2, ...   "2G" = "2 GiB" = 2**31 bytes
    KB, MB, GB, TB                     1000, 1000**2, ...   "800MB" = 800,000,000 bytes
    B (or nothing)                     1                    "1.5 KiB" = 1536 bytes

Printed (`format_bytes`): memory sizes in binary units (KiB, MiB, GiB, TiB), the way the
device and the allocator count them. Rates (GB/s) and per-step copy sizes are decimal and are
formatted where they are printed.

Like errors.py, this module imports no stage: every stage may use it.
"""

from __future__ import annotations

import math
import re
from typing import Any

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?|\.\d+)\s*(?:([kmgt])(i?b)?|(b))?\s*$", re.IGNORECASE)
_POWER = {"k": 1, "m": 2, "g": 3, "t": 4}
# no size we read or print comes near this (an int64 of bytes)
LARGEST = 2**63
EXAMPLES = "such as 500M, 2 GiB or 800MB"


def parse_size(value: Any) -> int:
    """Bytes from a number of bytes or a size such as "2G", "1.5 GiB", "800MB" (see the module's
    table of units); ValueError, one line naming the value, for anything else (a negative or
    non-finite number, an unknown unit, a bool)."""
    if isinstance(value, bool):
        raise ValueError(f"expected a number of bytes or a size {EXAMPLES}, got {value!r}")
    if isinstance(value, (int, float)):
        number, scale = value, 1
        if not (isinstance(value, int) or math.isfinite(value)) or value < 0:
            raise ValueError(f"expected a number of bytes or a size {EXAMPLES}, got {value!r}")
    elif isinstance(value, str) and (m := _SIZE.match(value)):
        letter, suffix = (m.group(2) or "").lower(), (m.group(3) or "").lower()
        base = 1000 if suffix == "b" else 1024  # KB, MB: decimal; K, KiB: binary
        number, scale = float(m.group(1)), base ** _POWER[letter] if letter else 1
    else:
        raise ValueError(f"expected a number of bytes or a size {EXAMPLES}, got {value!r}")
    n = number * scale
    if n >= LARGEST:
        raise ValueError(f"{value!r} is more bytes than any size the advisor reads (2**63)")
    return int(n)


def format_bytes(n: float | None, digits: int = 1) -> str:
    """A memory size in binary units: "512 B", "1.5 KiB", "79.2 GiB" (DIGITS after the point);
    "n/a" for an unknown (None, NaN) size. Negative sizes (a change) keep their sign."""
    if n is None or (isinstance(n, float) and not math.isfinite(n)):
        return "n/a"
    sign = "-" if n < 0 else ""
    n = abs(float(n))
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{sign}{int(n)} B" if unit == "B" else f"{sign}{n:.{digits}f} {unit}"
        n /= 1024
    return f"{sign}{n:.{digits}f} TiB"
