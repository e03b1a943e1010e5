"""Where a rendered report goes: stdout, or a file (with a note on stderr)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

from rich.console import Console
from rich.text import Text

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
    Console(stderr=True, highlight=False).print(Text(f"wrote {output}"))
