"""User configuration: `[tool.advisor]` in pyproject.toml, or an `advisor.toml`, found the way
linters find theirs (from the current directory upwards).

    [tool.advisor]
    select = ["dataloader-stall", "h2d-pageable-copy"]   # only these rules
    ignore = ["channels-last"]                           # never these
    scheduler = "tcp://10.0.0.5:8786"                    # analyse the ranks on this Dask cluster
    [tool.advisor.rules.dataloader-stall]
    min_share = 0.10                                     # a rule's thresholds
    [tool.advisor.gate]
    max_step_time_ms = 120                               # budgets for `advisor gate`

A setting that reaches or runs something (`scheduler`: a Dask cluster whose results the
advisor reads back) is taken from the command line (`--scheduler`), the environment
(`ADVISOR_SCHEDULER`), a config named with `--config`, or the user's own config
(`advisor.toml` in the platform's user config folder, `~/.config/torch-advisor/` on Linux);
never from a config merely found in the current folder or above it (a cloned repository's
pyproject.toml): there it is refused in one line that names the file and the ways to pass it
(exit 2). The user's own config is also the config where no project config is found.

The table and every rule's options are typed structures that refuse what they do not know: a
misspelt key, an option a rule does not have, a rule that does not exist or a value of the
wrong type ends in one line naming the file, the key and what was expected (exit code 2),
never in a silently ignored setting. A rule's options are derived from its `DEFAULTS`: each
option's type is its default value's type.

`settings_text` prints the configuration a report would run with, resolved
(`advisor report PATH --show-settings`).
"""

from __future__ import annotations

import math
import os
import re
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, get_args, get_origin

import msgspec
import orjson

from advisor.errors import InputError, did_you_mean
from advisor.files_read import remember

if TYPE_CHECKING:
    from advisor.engine import Rule

class AdvisorTable(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """`[tool.advisor]` (or the top of an advisor.toml)."""

    select: list[str] = []  # only these rules
    ignore: list[str] = []  # never these
    rules: dict[str, dict[str, Any]] = {}  # [tool.advisor.rules.<id>]: that rule's options
    gate: dict[str, Any] = {}  # [tool.advisor.gate]: checked key by key by advisor.gate_table
    scheduler: str | None = None  # a Dask scheduler (tcp://HOST:PORT) to analyse the ranks on


@dataclass
class Config:
    select: list[str] = field(default_factory=list)
    ignore: list[str] = field(default_factory=list)
    rule_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    gate: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None
    # A Dask scheduler (tcp://HOST:PORT) to analyse the ranks on; None: a local process pool.
    # Only ever from the command line, ADVISOR_SCHEDULER, a --config file or the user's config.
    scheduler: str | None = None

    def table_name(self, sub: str = "") -> str:
        """How the user wrote a table, for messages: [tool.advisor.rules.x] or [rules.x]."""
        inner = ".".join(p for p in ("tool.advisor" if self.path is None or self.path.name != "advisor.toml" else "", sub) if p)
        return f"[{inner}]" if inner else ""


# --- reading ------------------------------------------------------------------------------
def _read_toml(path: Path) -> dict[str, Any]:
    if sys.version_info >= (3, 11):  # imported here: most runs have no config file to read
        import tomllib
    else:  # pragma: no cover - exercised on 3.10 only
        import tomli as tomllib

    remember(path)
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(path, f"cannot read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise InputError(path, f"invalid TOML: {exc}") from None
    except RecursionError:
        raise InputError(path, "invalid TOML: values nested too deeply") from None


def _tool_advisor(data: dict[str, Any], path: Path) -> Any:
    """`[tool.advisor]` of a pyproject.toml (None when absent); `tool` that is not a table is refused."""
    tool = data.get("tool", {})
    if not isinstance(tool, dict):
        raise InputError(path, f"tool must be a table ([tool.advisor]), got {_WORDS.get(_kind(tool), _kind(tool))}")
    return tool.get("advisor")


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
            table = _tool_advisor(_read_toml(py), py)
            if table is not None:
                return py, table
    return None


SCHEDULER_ENV = "ADVISOR_SCHEDULER"
USER_CONFIG_NAME = "advisor.toml"
# Keys that reach or run something: never read from a config that was merely found.
REACHING_KEYS = ("scheduler",)


def user_config_path() -> Path | None:
    """The user's own config: advisor.toml in the platform's user config folder (platformdirs)."""
    try:
        import platformdirs

        return Path(platformdirs.user_config_dir("torch-advisor", appauthor=False)) / USER_CONFIG_NAME
    except Exception:  # noqa: BLE001 - no home folder: no user config
        return None


def _user_config() -> tuple[Path, Any] | None:
    where = user_config_path()
    if where is None or not _is_file(where):
        return None
    return where, _read_toml(where)


def load_config(path: str | Path | None = None, start: Path | None = None, scheduler: str | None = None) -> Config:
    """The config in PATH (an advisor.toml or pyproject.toml), else the nearest one found, else
    the user's own; `scheduler`: the command line's --scheduler, which wins over every other."""
    explicit = path is not None
    user = _user_config()
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise InputError(path, "config file not found")
        data = _read_toml(path)
        table = (_tool_advisor(data, path) or {}) if path.name == "pyproject.toml" else data
        found = (path, table)
    else:
        found = find_config_file(start)
        if found is None:
            found, explicit = user, True  # the user's own config: trusted like --config
    given = scheduler or os.environ.get(SCHEDULER_ENV, "").strip() or None
    if found is None:
        return Config(scheduler=given)
    config = _typed_config(*found)
    if not explicit:
        reaching = [k for k in REACHING_KEYS if isinstance(found[1], dict) and k in found[1]]
        if reaching and given is None:
            where = user_config_path()
            raise InputError(
                found[0],
                f"{_at(config.table_name(), reaching[0])}: not read from a config found in this folder or above (it reaches another machine); "
                f"pass --{reaching[0]} ADDRESS, set {SCHEDULER_ENV}, name this file with --config, or put it in your own config"
                + (f" ({where})" if where is not None else ""),
            )
        config = replace(config, scheduler=None)
        if given is None and user is not None and user[0] != found[0]:
            given = _typed_config(*user).scheduler  # the user's own choice of cluster, in every folder
    return replace(config, scheduler=given or config.scheduler)


def _typed_config(where: Path, table: Any) -> Config:
    """The table of WHERE checked and typed (InputError naming the file and key on a mistake)."""
    shell = Config(path=where)
    if not isinstance(table, dict):
        raise InputError(where, f"{shell.table_name()} must be a table")
    rules = table.get("rules")
    for rule_id, options in (rules.items() if isinstance(rules, dict) else ()):
        if not isinstance(options, dict):
            raise InputError(where, f"{shell.table_name('rules')} {rule_id}: expected a table of the rule's options, got {_WORDS.get(_kind(options), _kind(options))}")
    try:
        typed = msgspec.convert(table, AdvisorTable)
    except msgspec.ValidationError as exc:
        raise InputError(where, _problem(exc, shell.table_name(), _fields(AdvisorTable), table)) from None
    if typed.gate:
        # the gate's budgets are checked key by key (sizes, fractions, severities) where they are defined
        from advisor.gate_table import parse_gate_table

        parse_gate_table(typed.gate, where, where.parent, shell.table_name("gate") or "[gate]")
    if typed.scheduler is not None and not typed.scheduler.strip():
        raise InputError(where, f"{shell.table_name()} scheduler: expected a scheduler address such as \"tcp://HOST:8786\"")
    return Config(select=typed.select, ignore=typed.ignore, rule_options=typed.rules, gate=typed.gate, path=where, scheduler=typed.scheduler)


# --- rule options -------------------------------------------------------------------------
_STRUCTS: dict[tuple[str, tuple], type[msgspec.Struct]] = {}


def option_type(default: Any) -> Any:
    """The type an option takes, from its default value (an int default takes whole numbers)."""
    if isinstance(default, bool):
        return bool
    if isinstance(default, (int, float, str)):
        return type(default)
    if isinstance(default, (list, tuple)):
        inner = {option_type(v) for v in default}
        return list[inner.pop()] if len(inner) == 1 else list[Any]
    return Any


def type_name(tp: Any) -> str:
    """A type as a user reads it in `advisor explain` and in error messages."""
    simple = {bool: "bool", int: "int", float: "float", str: "str"}
    if tp in simple:
        return simple[tp]
    origin, args = get_origin(tp), get_args(tp)
    if origin is list:
        return f"list of {type_name(args[0])}" if args and args[0] is not Any else "list"
    if origin is dict:
        return "table"
    return "any" if tp is Any else getattr(tp, "__name__", str(tp))


def options_struct(rule_id: str, defaults: dict[str, Any]) -> type[msgspec.Struct]:
    """The typed structure of one rule's options, built from its DEFAULTS (names, types, defaults)."""
    key = (rule_id, tuple((k, repr(v)) for k, v in defaults.items()))
    struct = _STRUCTS.get(key)
    if struct is None:
        name = "".join(p.capitalize() for p in re.split(r"[^A-Za-z0-9]+", rule_id) if p) + "Options"
        fields = [(k, option_type(v), v) for k, v in defaults.items()]
        struct = msgspec.defstruct(name, fields, forbid_unknown_fields=True, kw_only=True)
        _STRUCTS[key] = struct
    return struct


def rule_options_help(defaults: dict[str, Any]) -> list[tuple[str, str, Any]]:
    """(name, type, default) for each of a rule's options, as `advisor explain` lists them."""
    return [(k, type_name(option_type(v)), v) for k, v in defaults.items()]


def check_rule_options(config: Config, rules: Iterable[Rule]) -> Config:
    """The config with each [rules.<id>] table checked against that rule's options and typed
    (an int written for a float option becomes a float); InputError on the first mistake."""
    if not config.rule_options:
        return config
    by_id = {r.id: r for r in rules}
    typed: dict[str, dict[str, Any]] = {}
    for rule_id, options in config.rule_options.items():
        rule = by_id.get(rule_id)
        if rule is None:
            hint = did_you_mean(rule_id, by_id)
            raise InputError(
                config.path,
                f"{config.table_name('rules.' + rule_id)}: unknown rule {rule_id!r}{hint}; run `advisor rules` to list them",
            )
        table = config.table_name(f"rules.{rule_id}")
        if not rule.defaults and options:
            raise InputError(config.path, f"{table}: rule {rule_id} has no options")
        struct = options_struct(rule.id, rule.defaults)
        try:
            value = msgspec.convert(options, struct)
        except msgspec.ValidationError as exc:
            raise InputError(config.path, _problem(exc, table, rule_options_help(rule.defaults), options)) from None
        typed[rule_id] = {k: getattr(value, k) for k in options}
        for key, v in typed[rule_id].items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and not (math.isfinite(v) and v >= 0):
                raise InputError(config.path, f"{table} {key}: expected a finite number of at least 0, got {v!r}")
    return replace(config, rule_options=typed)


# --- messages -----------------------------------------------------------------------------
_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<key>[^`]*)`(?: - at `\$(?P<at>[^`]*)`)?$")
_EXPECTED = re.compile(r"^Expected `(?P<want>[^`]*)`, got `(?P<got>[^`]*)`(?: - at `\$(?P<at>[^`]*)`)?$")
_WORDS = {"float": "a number", "int": "a whole number", "str": "a string", "bool": "true or false", "array": "a list", "object": "a table"}


def _fields(struct: type[msgspec.Struct]) -> list[tuple[str, str, Any]]:
    return [(f.name, type_name(f.type), f.default) for f in msgspec.structs.fields(struct)]


def _kind(value: Any) -> str:
    return {bool: "bool", int: "int", float: "float", str: "str", list: "array", dict: "object"}.get(type(value), type(value).__name__)


def _problem(exc: msgspec.ValidationError, table: str, known: list[tuple[str, str, Any]], given: dict[str, Any]) -> str:
    """One line from msgspec's error: the table, the key, and what was expected."""
    text = str(exc)
    listing = ", ".join(f"{name} ({tp})" for name, tp, _ in known) or "none"
    m = _UNKNOWN.match(text)
    if m:
        key = ((m["at"] or "").lstrip(".") + "." + m["key"]).lstrip(".")
        return f"{_at(table, key)}: unknown key{did_you_mean(m['key'], [n for n, _, _ in known])}; expected one of: {listing}"
    m = _EXPECTED.match(text)
    if m:
        at = (m["at"] or "").lstrip(".")
        key = re.sub(r"\[\d+\]$", "", at)
        want = _WORDS.get(m["want"], m["want"])
        got_value = given.get(key, None) if isinstance(given, dict) else None
        shown = f" {got_value!r}" if got_value is not None and not isinstance(got_value, (dict, list)) else ""
        what = f"expected {want} ({m['want']})" + (" in each item" if at != key else "")
        return f"{_at(table, key)}: {what}, got {_WORDS.get(m['got'], m['got'])}{shown}"
    return f"{_at(table, '')}: {text}"


def _at(table: str, key: str) -> str:
    """Where a mistake is: "[tool.advisor.rules.x] min_share", or the bare key at the top of advisor.toml."""
    return " ".join(p for p in (table, key) if p) or "the top table"


# --- `advisor report PATH --show-settings` ---------------------------------------------------
# The configuration a report would run with, resolved, printed as TOML the way it would be
# written in `[tool.advisor]`: where it came from, the selectors and the rules they leave (groups
# and prefixes expanded), and every option of each rule that runs, with the configuration's
# values over the rule's defaults (a comment marks which is which).
def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return orjson.dumps(str(v)).decode()  # a basic TOML string: JSON's escapes are TOML's


def settings_text(config: Any, select: list[str], ignore: list[str], rules_dir: Path | None, scheduler: str | None) -> str:
    from advisor.engine import all_rules, select_rules

    rules = all_rules(rules_dir)
    if config.rule_options:
        config = check_rule_options(config, rules)
    chosen = select_rules(rules, select=select or config.select, ignore=[*ignore, *config.ignore])
    lines = [
        f"# config file: {config.path if config.path else 'none found (defaults)'}",
        "# command line: " + (" ".join([*(f"--select {s}" for s in select), *(f"--ignore {s}" for s in ignore)]) or "no --select/--ignore"),
        "[tool.advisor]",
        f"select = {_toml_value(select or config.select)}",
        f"ignore = {_toml_value([*ignore, *config.ignore])}",
        f"scheduler = {_toml_value(scheduler or config.scheduler or '')}  # empty: a local process pool",
        f"# ADVISOR_CACHE = {_toml_value(os.environ.get('ADVISOR_CACHE', 'on'))}",
        f"# rules that run ({len(chosen)} of {len(rules)}): " + ", ".join(r.id for r in chosen),
    ]
    for r in chosen:
        given = config.rule_options.get(r.id, {})
        lines.append("")
        lines.append(f"[tool.advisor.rules.{r.id}]  # group: {r.group or 'none'}, source: {r.source}")
        if not r.defaults:
            lines.append("# no options")
        for name, default in r.defaults.items():
            value = given.get(name, default)
            lines.append(f"{name} = {_toml_value(value)}  # " + ("from the config file" if name in given else "default"))
    return "\n".join(lines) + "\n"
