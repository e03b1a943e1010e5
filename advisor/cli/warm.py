"""A warm `advisor report`: the report rendered before, served from the analysis entry.

A text, JSON or Markdown report written to stdout is kept in the analysis entry it was rendered
from (advisor.cache.store_report), keyed on everything its text depends on beyond the analysis:
the format and --verbose, the path as given and the run's files as found (the report names
them), and where it is written (stdout a terminal or not, its encoding, the terminal's size, and
the environment variables the console reads: COLUMNS, NO_COLOR, FORCE_COLOR, TERM, ...). The
next report asked for in the same way writes the stored text as it is: no parse, no metrics,
no rules, no rendering, and neither pandas, pyarrow nor rich imported.

`advisor report PATH [-f FORMAT] [-v]` is answered here before the command line parser is
built (building it costs more than serving the report); the option names and the format's
aliases are read from the report command's own declaration in advisor.cli, so the two never
differ. Other options (--select, --ignore, --run, --config) reach the same stored text after
parsing. Anything this module does not recognise, and every miss, takes the full path, which
gives errors their usual messages.

A miss on `advisor report PATH [-f FORMAT] [-o FILE] [-v]` is made without the parser too, and so
is `advisor whatif PATH [--apply RULES]` (`direct_command`): the command's function is called
with the arguments the parser would give it.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

# What the console (rich) reads from the environment when it decides widths and colours.
CONSOLE_ENV = (
    "COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR", "TERM", "COLORTERM", "TTY_COMPATIBLE", "TTY_INTERACTIVE",
    "JUPYTER_COLUMNS", "JUPYTER_LINES", "CLICOLOR", "CLICOLOR_FORCE", "WT_SESSION", "WINDIR",
)
# The report's parameters answered before the parser is built; any other option takes the full path.
ANSWERED_EARLY = ("path", "format", "verbose")


def destination(fmt: str) -> dict[str, Any]:
    """Where the report goes, as far as its text depends on it."""
    out = sys.stdout
    try:
        tty = bool(out.isatty())
    except (AttributeError, ValueError):
        tty = False
    where: dict[str, Any] = {"encoding": getattr(out, "encoding", None), "errors": getattr(out, "errors", None)}
    if fmt == "text":
        sizes = []
        for fd in (0, 1, 2):  # the console takes the first of these that is a terminal
            try:
                sizes.append(list(os.get_terminal_size(fd)))
            except (OSError, ValueError):
                sizes.append(None)
        where.update(tty=tty, env={k: os.environ.get(k) for k in CONSOLE_ENV}, sizes=sizes if tty or os.environ.get("COLUMNS") else None, platform=sys.platform)
    return where


def report_fields(fmt: str, verbose: bool, source: Path, run: Any) -> dict[str, Any]:
    """What a rendered report depends on beyond its analysis (see advisor.cache.read_report)."""
    return {
        "format": fmt,
        "verbose": bool(verbose),
        "source": str(source),
        "run": [run.name, str(run.directory), [str(p) for p in run.files], list(run.other_runs), list(run.notes)],
        "to": destination(fmt),
    }


def stored_report(path: Path, run: str | None, config: Any, select: list[str], ignore: list[str], fmt: str, verbose: bool) -> tuple[str, str] | None:
    """This report as rendered before (its stdout and stderr), or None (then the report is made)."""
    from advisor import cache
    from advisor.load.discover import find_run

    if fmt not in ("text", "json", "markdown") or not cache.cache_enabled():
        return None
    try:
        run_files = find_run(path, run)
        key = cache.AnalysisKey.of(run_files, config.rule_options, select or config.select, [*ignore, *config.ignore], None)
        if key is None:
            return None
        return cache.read_report(run_files, key, report_fields(fmt, verbose, path, run_files))
    except Exception:  # noqa: BLE001 - any doubt: the report is made (and errors told) the usual way
        return None


def serve(stored: tuple[str, str]) -> None:
    """A stored report: its text on stdout, then its notes and warnings on stderr."""
    text, err = stored
    sys.stdout.write(text)
    sys.stdout.flush()
    if err:
        sys.stderr.write(err)
        sys.stderr.flush()


def fast_report(args: list[str], command: Callable[..., Any], format_option: Callable[[str | None], str | None]) -> bool:
    """Answer `report PATH [-f FORMAT | --format FORMAT] [-v | --verbose]` from a stored report
    (True), before the command line parser is built; False: not that command line, or a miss.
    COMMAND: the report command's function (its options are read from its declaration);
    FORMAT_OPTION: its --format callback (the formats and their aliases)."""
    if len(args) < 2 or args[0] != "report":
        return False
    import typer

    given = _arguments(args[1:], command)
    if given is None or "path" not in given or not set(given) <= set(ANSWERED_EARLY):
        return False
    try:
        fmt = format_option(given.get("format")) or "text"
    except typer.BadParameter:
        return False
    path, verbose = given["path"], bool(given.get("verbose"))
    try:
        from advisor.config import load_config

        config = load_config(None)
    except Exception:  # noqa: BLE001 - a bad config file: the full path says what is wrong
        return False
    if config.scheduler or config.rule_options:
        return False  # a cluster to reach, options to check against the rules: the full path
    text = stored_report(Path(path), None, config, [], [], fmt, verbose)
    if text is None:
        return False
    serve(text)
    return True


# The commands made without the parser (direct_command): the parameters each may be given
# with, and the type the parser converts each one's text to (a declared callback then runs on
# it, as the parser runs it). Any other parameter keeps its declared default.
MADE_EARLY = {
    "report": {"path": Path, "format": str, "output": Path, "verbose": bool},
    "whatif": {"path": Path, "apply": str},
}


def early_arguments(args: list[str], command: Callable[..., Any], made_early: dict[str, type]) -> dict[str, Any] | None:
    """Every argument of COMMAND for ARGS (the words after the command's name) when they give
    only the parameters of MADE_EARLY, as its parser would give them (the other parameters at
    their declared defaults); None for any other command line, or a value the parser would
    refuse (it then says so)."""
    import inspect

    import typer

    given = _arguments(args, command)
    if given is None or "path" not in given or not set(given) <= set(made_early):
        return None
    if any(v == "" for v in given.values()):
        return None  # the parser's reading of an empty value is its own
    out: dict[str, Any] = {}
    for name, param in inspect.signature(command).parameters.items():
        info = param.default
        value = made_early[name](given[name]) if name in given else getattr(info, "default", None)
        callback = getattr(info, "callback", None)
        if callback is not None:
            try:
                value = callback(value)
            except typer.BadParameter:
                return None
        out[name] = list(value) if isinstance(value, list) else value
    return out


def direct_command(argv: list[str], commands: dict[str, Callable[[], Callable[..., Any]]]) -> bool:
    """Run the command of a plain command line (`report PATH [-f FORMAT] [-o FILE] [-v]`,
    `whatif PATH [--apply RULES]`) by calling its function with the arguments its parser would
    give it (True), without building the parser: building it, and the validators of every
    parameter, cost about 0.1 s of a short command; False: any other command line, which the
    parser then reads. COMMANDS: name -> a function that returns the command's function."""
    if not argv or argv[0] not in MADE_EARLY or argv[0] not in commands:
        return False
    command = commands[argv[0]]()
    kwargs = early_arguments(argv[1:], command, MADE_EARLY[argv[0]])
    if kwargs is None:
        return False
    command(**kwargs)
    return True


def _options(command: Callable[..., Any]) -> dict[str, tuple[str, bool]]:
    """The command's option strings, from its declaration: the parameter each sets, and
    whether it takes a value (a flag's default is a bool)."""
    import inspect

    options = {}
    for name, param in inspect.signature(command).parameters.items():
        info = param.default
        for decl in getattr(info, "param_decls", None) or ():
            options[decl] = (name, not isinstance(getattr(info, "default", None), bool))
    return options


def _arguments(args: list[str], command: Callable[..., Any]) -> dict[str, Any] | None:
    """{parameter: value} of a command line (the words after the command's name), as its
    parser would read it; None for anything less plain (an option given twice, a value glued
    to a short option, `--`, a second path), which the full parser then reads."""
    options = _options(command)
    given: dict[str, Any] = {}
    rest = iter(args)
    for a in rest:
        if not a.startswith("-"):
            if not a or "path" in given:
                return None
            given["path"] = a
            continue
        decl, eq, value = a.partition("=")
        name, takes_value = options.get(decl, (None, False))
        if name is None or name in given or (eq and (not takes_value or not decl.startswith("--"))):
            return None
        if takes_value and not eq:
            value = next(rest, None)
            if value is None:
                return None
        given[name] = value if takes_value else True
    return given


class _Recorder:
    """stdout as it is, keeping a copy of what is written to it."""

    def __init__(self, stream: Any):
        self._stream = stream
        self.parts: list[str] = []

    def write(self, text: str) -> int:
        n = self._stream.write(text)
        self.parts.append(text)
        return n

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextmanager
def recording() -> Iterator[list[tuple[str, str] | None]]:
    """What a report (rendered from its analysis, made before) writes: (its stdout, its stderr:
    the notes and warnings after it), as a stored report repeats them."""
    out, err = _Recorder(sys.stdout), _Recorder(sys.stderr)
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err  # type: ignore[assignment]
    got: list[tuple[str, str] | None] = [None]
    try:
        yield got
    finally:
        sys.stdout, sys.stderr = saved
    got[0] = ("".join(out.parts), "".join(err.parts))


def keep(analysis: Any, path: Path, run: str | None, fmt: str, verbose: bool, written: tuple[str, str] | None) -> None:
    """Store the report just written in the analysis entry it was rendered from, under the
    fields stored_report will ask for (the run as find_run gives it for this path)."""
    if written is None or analysis.cache_entry is None or analysis.cache_key is None or analysis.rule_options:
        return
    from advisor import cache
    from advisor.load.discover import find_run

    try:
        cache.store_report(analysis.cache_entry, analysis.cache_key, report_fields(fmt, verbose, path, find_run(path, run)), *written)
    except Exception:  # noqa: BLE001 - the cache never fails a report
        pass
