"""Where a rendered report goes: stdout, or a file (with a note on stderr)."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any, Optional

import orjson

from advisor.errors import InputError


def write_output(text: str, output: Optional[Path]) -> None:
    if output is None:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        return
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise InputError(output, f"cannot write output: {exc.strerror or exc}") from None
    from rich.console import Console  # only here: writing stdout needs no rich
    from rich.text import Text

    Console(stderr=True, highlight=False).print(Text(f"wrote {output}"))


def jsonable(obj: Any) -> Any:
    """Plain JSON values: NaN/inf become null (a figure we cannot give), numpy scalars plain."""
    if isinstance(obj, float):  # numpy floats too (np.float64 subclasses float)
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, bool) or obj is None or isinstance(obj, str):
        return obj
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalars
        return jsonable(obj.item())
    return obj


def to_json_text(obj: Any) -> str:
    return orjson.dumps(jsonable(obj), option=orjson.OPT_INDENT_2).decode()
