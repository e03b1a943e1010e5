"""User configuration: `[tool.advisor]` in pyproject.toml, or an `advisor.toml`, found the way
linters find theirs (from the current directory upwards).

    [tool.advisor]
    select = ["dataloader-stall", "h2d-pageable-copy"]   # only these rules
    ignore = ["channels-last"]                           # never these
    [tool.advisor.rules.dataloader-stall]
    min_share = 0.10                                     # a rule's thresholds
    [tool.advisor.gate]
    max_step_time_ms = 120                               # budgets for `advisor gate`
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from advisor.errors import InputError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib


@dataclass
class Config:
    select: list[str] = field(default_factory=list)
    ignore: list[str] = field(default_factory=list)
    rule_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    gate: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(path, f"cannot read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise InputError(path, f"invalid TOML: {exc}") from None


def _is_file(path: Path) -> bool:
    """is_file, and False where a folder on the way cannot be searched (no x permission)."""
    try:
        return path.is_file()
    except OSError:
        return False


def find_config_file(start: Path | None = None) -> tuple[Path, dict[str, Any]] | None:
    start = (start or Path.cwd()).resolve()
    for d in [start, *start.parents]:
        own = d / "advisor.toml"
        if _is_file(own):
            return own, _read_toml(own)
        py = d / "pyproject.toml"
        if _is_file(py):
            table = _read_toml(py).get("tool", {}).get("advisor")
            if table is not None:
                return py, table
    return None


def load_config(path: str | Path | None = None, start: Path | None = None) -> Config:
    """The config in PATH (an advisor.toml or pyproject.toml) or the nearest one found."""
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise InputError(path, "config file not found")
        data = _read_toml(path)
        table = data.get("tool", {}).get("advisor", {}) if path.name == "pyproject.toml" else data
        found = (path, table)
    else:
        found = find_config_file(start)
    if found is None:
        return Config()
    where, table = found
    if not isinstance(table, dict):
        raise InputError(where, "[tool.advisor] must be a table")

    def str_list(key: str) -> list[str]:
        v = table.get(key, [])
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise InputError(where, f"{key} must be a list of rule ids")
        return v

    rules = table.get("rules", {})
    if not isinstance(rules, dict) or not all(isinstance(v, dict) for v in rules.values()):
        raise InputError(where, "[tool.advisor.rules.<id>] entries must be tables of thresholds")
    gate = table.get("gate", {})
    if not isinstance(gate, dict):
        raise InputError(where, "[tool.advisor.gate] must be a table")
    return Config(select=str_list("select"), ignore=str_list("ignore"), rule_options=rules, gate=gate, path=where)
