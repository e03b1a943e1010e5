"""The `advisor` command line: report, rules, explain (and profile, gate, diff, view).

Any InputError ends in one line on stderr and exit code 2; the user never sees a traceback
for bad input.
"""

from __future__ import annotations

import gc
import os
import sys
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, List, Optional

import typer

from advisor.errors import EXIT_BAD_INPUT, InputError, set_status_if_output_closes, status_if_output_closes
from advisor.terminal_text import OutputClosed
from advisor.output import check_report_file, refuse_terminal_for_html, run_input_files, write_output

if TYPE_CHECKING:
    from rich.console import Console

# The advisor's own failure (a bug: "internal error: ..."): EX_SOFTWARE of sysexits.h, apart
# from any code a profiled script may choose for itself (`advisor profile` passes those through).
EXIT_INTERNAL = 70

app = typer.Typer(
    name="advisor",
    help="Why is my PyTorch training slow, and what should I change first?",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},  # -h as well, as most tools take it
)


class Format(str, Enum):
    text = "text"
    json = "json"
    markdown = "markdown"
    html = "html"
    csv = "csv"  # tables only: `report --ops`
    parquet = "parquet"


# Formats of a table rather than a report: `report --ops` writes them.
TABLE_FORMATS = {"csv", "parquet"}
# `-o report.html` without --format writes HTML: the format follows the file's suffix.
FORMAT_BY_SUFFIX = {".csv": "csv", ".parquet": "parquet", ".html": "html", ".htm": "html", ".json": "json", ".md": "markdown", ".markdown": "markdown", ".txt": "text"}


def format_for(given: Optional[str], output: Optional[Path], default: str = "text") -> str:
    """The format asked for; else the one the output file's suffix names; else `default`."""
    if given is not None:
        return given
    if output is not None:
        return FORMAT_BY_SUFFIX.get(output.suffix.lower(), default)
    return default


FORMAT_ALIASES = {"md": "markdown", "txt": "text", "htm": "html"}


def format_option(value: Optional[str]) -> Optional[str]:
    """--format's value: a format's name or its file suffix (`-f md`), else a usage error."""
    if value is None:
        return None
    name = FORMAT_ALIASES.get(value.lower(), value.lower())
    if name not in {f.value for f in Format} - TABLE_FORMATS:
        raise typer.BadParameter(f"{value!r} is not one of text, json, markdown (md), html")
    return name


def report_format_option(value: Optional[str]) -> Optional[str]:
    """`report --format`: a report's format, or a table's (csv, parquet: with --ops)."""
    if value is not None and value.lower() in TABLE_FORMATS:
        return value.lower()
    try:
        return format_option(value)
    except typer.BadParameter:
        raise typer.BadParameter(f"{value!r} is not one of text, json, markdown (md), html, csv or parquet (with --ops)") from None


def rule_ids(values: List[str]) -> List[str]:
    """Rule ids from repeated options and comma-separated lists (`--select a,b --select c`)."""
    from advisor.rule_selection import selector_list

    return selector_list(values)


def _version_callback(value: bool) -> None:
    if value:
        from advisor.version import __version__

        sys.stdout.write(f"advisor {__version__}\n")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version_callback, is_eager=True, help="Print the version and exit."),
) -> None:
    """Why is my PyTorch training slow, and what should I change first?"""


# rich is imported where it is used: `report --format json` never needs it, and its import
# is a noticeable part of a short command's wall time.
def stdout_console() -> Console:
    from advisor.render.console import output_console

    return output_console()


def stderr_console() -> Console:
    from advisor.terminal_text import inert_console

    return inert_console(stderr=True, highlight=False)


def say(console: Console, line: str) -> None:
    """Print one plain line (no markup, no highlighting)."""
    from rich.text import Text

    from advisor.terminal_text import one_line

    console.print(Text(one_line(line)), soft_wrap=True)


def emit_report(analysis, fmt: Format, output: Optional[Path], verbose: bool) -> None:
    """Render an analysis in the chosen format to stdout or a file (never over one it read)."""
    inputs = run_input_files(analysis)
    if fmt is Format.json:
        from advisor.render.json_report import to_json

        write_output(to_json(analysis), output, inputs)
    elif fmt is Format.markdown:
        from advisor.render.markdown import to_markdown

        write_output(to_markdown(analysis, verbose=verbose), output, inputs)
    elif fmt is Format.html:
        from advisor.render.html import to_html

        write_output(to_html(analysis), output, inputs)  # without -o: stdout, as every format
    else:
        from advisor.render.text import render_text

        from advisor.render.console import output_console

        notes = output_console(stderr=True)  # stdout (or the file) holds the report alone
        if output is None:
            render_text(analysis, stdout_console(), verbose=verbose, notes=notes)
        else:
            from advisor.render.console import UNWRAPPED_WIDTH, trim_lines
            from advisor.terminal_text import inert_console

            console = inert_console(record=True, width=UNWRAPPED_WIDTH, file=open(os.devnull, "w"), color_system=None)
            render_text(analysis, console, verbose=verbose, notes=notes)
            write_output(trim_lines(console.export_text()), output, inputs)


def emit_ops(analysis, fmt: Format, output: Optional[Path]) -> None:
    """`report --ops`: the ops on the roofline, in text, JSON or Markdown."""
    from advisor.render import ops as ops_render

    _emit_view(analysis, fmt, output, ops_render.to_ops_json, ops_render.to_ops_markdown, ops_render.render_ops_text)


def emit_kernels(analysis, fmt: Format, output: Optional[Path]) -> None:
    """`report --kernels`: the kernels as the advisor read them, in text, JSON or Markdown."""
    from advisor.render import kernels as kernels_render

    _emit_view(analysis, fmt, output, kernels_render.to_kernels_json, kernels_render.to_kernels_markdown, kernels_render.render_kernels_text)


def _emit_view(analysis, fmt: Format, output: Optional[Path], to_json, to_markdown, render_text) -> None:
    """One of the report's views (JSON, Markdown, or a rich table: on the terminal, or to a
    file unwrapped)."""
    inputs = run_input_files(analysis)
    if fmt is Format.json:
        write_output(to_json(analysis), output, inputs)
    elif fmt is Format.markdown:
        write_output(to_markdown(analysis), output, inputs)
    elif output is None:
        render_text(analysis, stdout_console())
    else:
        from advisor.render.console import UNWRAPPED_WIDTH, trim_lines
        from advisor.terminal_text import inert_console

        console = inert_console(record=True, width=UNWRAPPED_WIDTH, file=open(os.devnull, "w"), color_system=None)
        render_text(analysis, console)
        write_output(trim_lines(console.export_text()), output, inputs)


def emit_op_table(analysis, fmt: Format, output: Optional[Path]) -> None:
    """`report --ops -f csv|parquet`: every op of the slowest rank by (op, input shapes, input
    dtypes, scalar arguments) with its calls' device-time distribution (Parquet: to a file)."""
    table = analysis.op_table()
    inputs = run_input_files(analysis)
    if fmt is Format.csv:
        write_output(table.to_csv(index=False), output, inputs)
        return
    if output is None:
        raise InputError("--format parquet", "writes a file: name it with -o FILE.parquet")
    import io

    from advisor.files import write_atomically
    from advisor.output import refuse_overwriting_inputs

    refuse_overwriting_inputs(output, inputs)
    buffer = io.BytesIO()
    table.to_parquet(buffer, index=False)
    write_atomically(output, buffer.getvalue())
    sys.stderr.write(f"wrote {output}\n")


def emit_collectives(path: Path, run: Optional[str], fmt: Format, output: Optional[Path], executor) -> None:
    """`report --collectives`: the job's collectives, bandwidth, skew and overlap."""
    from advisor.analysis import collectives_of_run
    from advisor.render import collectives as render

    found, job = collectives_of_run(path, run, executor=executor)
    inputs = list(found.files)
    if fmt is Format.json:
        write_output(render.to_collectives_json(str(path), found.name, job), output, inputs)
    elif fmt is Format.markdown:
        write_output(render.to_collectives_markdown(found.name, job), output, inputs)
    else:
        write_output(render.to_collectives_text(found.name, job), output, inputs)


def emit_launches(analysis, fmt: Format, output: Optional[Path]) -> None:
    """`report --launches`: the slowest rank's launch delays and queue lengths per stream."""
    from advisor.render import launches as render

    table, idle = analysis.launch_table()
    inputs = run_input_files(analysis)
    args = (analysis.run.name, analysis.primary.rank, table, idle)
    if fmt is Format.json:
        write_output(render.to_launches_json(analysis.source, *args), output, inputs)
    elif fmt is Format.markdown:
        write_output(render.to_launches_markdown(*args), output, inputs)
    else:
        write_output(render.to_launches_text(*args), output, inputs)


def analyze_with_progress(path: Path, **kwargs):
    """analyze() with a progress bar on stderr when there is more than one rank to analyse."""
    from advisor.analysis import analyze
    from advisor.load.discover import find_run

    files = find_run(path, kwargs.get("run")).files
    if len(files) < 2:
        return analyze(path, **kwargs)
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("analysing ranks"), BarColumn(), TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(), console=stderr_console(), transient=True) as bar:
        task = bar.add_task("load", total=len(files))
        return analyze(path, progress=lambda _p: bar.advance(task), **kwargs)


@app.command()
def report(
    path: Path = typer.Argument(..., help="A torch.profiler log dir or trace file (.json, .json.gz)."),
    format: Optional[str] = typer.Option(None, "--format", "-f", metavar="[text|json|markdown|md|html|csv|parquet]", callback=report_format_option, help="text, json, markdown (md) or html (default: from the -o suffix, else text); csv or parquet with --ops."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write to this file instead of stdout (.html, .json, .md, .txt set the format, .csv and .parquet with --ops; its folder must exist)."),
    run: Optional[str] = typer.Option(None, "--run", help="Which run of a log dir holding several."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show evidence and code for each finding."),
    select: List[str] = typer.Option([], "--select", help="Only these rules: ids, groups (memory, input, ...) or id prefixes (h2d); repeatable, or comma-separated: a,b."),
    ignore: List[str] = typer.Option([], "--ignore", help="Skip these rules: ids, groups or id prefixes; repeatable, or comma-separated: a,b."),
    rules_dir: Optional[Path] = typer.Option(None, "--rules", help="Also run the rule files in this folder: every *.py there is imported, i.e. executed as Python with your permissions (use only folders you trust)."),
    config: Optional[Path] = typer.Option(None, "--config", help="advisor.toml or pyproject.toml to use."),
    show_settings: bool = typer.Option(False, "--show-settings", help="Print the resolved configuration (config file, rules that run, their options, cache) and exit."),
    tensorboard: bool = typer.Option(False, "--tensorboard", help="Then open the run in TensorBoard's profiler view."),
    scheduler: Optional[str] = typer.Option(None, "--scheduler", help="Analyse the ranks on this Dask cluster (tcp://HOST:PORT; also ADVISOR_SCHEDULER, never from a config merely found; needs torch-advisor[cluster])."),
    kernels: bool = typer.Option(False, "--kernels", help="List the kernels by total time as the advisor read them: library, family, precision, matrix units, share (text, json, markdown)."),
    ops: bool = typer.Option(False, "--ops", help="List the ops by device time on the device's roofline: FLOPs, bytes, TFLOP/s, TB/s, share of the ceiling (text, json, markdown; html always draws it); with -f csv or parquet, every op by input shapes and dtypes with count, total, mean, p50, p90, max of its calls' device time."),
    launches: bool = typer.Option(False, "--launches", help="List the slowest rank's launch delays (launch call to device start: p50, p90, max), queue lengths and idle time by cause (host wait, kernel wait, other) per stream (text, json, markdown)."),
    collectives: bool = typer.Option(False, "--collectives", help="List the job's collectives by kind and message size: count, time, algorithm, bus bandwidth against the link's peak; each rank's skew and wait; each rank's overlap of communication and compute (text, json, markdown)."),
) -> None:
    """Analyse an existing torch.profiler log dir or trace file."""
    from contextlib import nullcontext

    from advisor.config import load_config

    cfg = load_config(config, scheduler=scheduler)
    if show_settings:
        from advisor.config import settings_text

        sys.stdout.write(settings_text(cfg, rule_ids(select), rule_ids(ignore), rules_dir, scheduler))
        return
    format = Format(format_for(format, output))
    check_report_file(output, tables=ops)  # `-o out.pdf`, `-o missing/r.html`: refused before the analysis
    if output is not None and str(output) == "-":
        output = None  # `-o -`: stdout, as without -o
    if format is Format.html and output is None:
        refuse_terminal_for_html()
    if format.value in TABLE_FORMATS and not ops:
        raise InputError(f"--format {format.value}", "is a table's format: use it with --ops")
    if collectives and format in (Format.html, *(Format(f) for f in TABLE_FORMATS)):
        raise InputError(f"--format {format.value}", "--collectives writes text, json or markdown")
    if launches and format in (Format.html, *(Format(f) for f in TABLE_FORMATS)):
        raise InputError(f"--format {format.value}", "--launches writes text, json or markdown")
    address = cfg.scheduler
    if address:
        from advisor.cluster import cluster_executor

        engine = cluster_executor(address, note=lambda line: say(stderr_console(), f"advisor: {line}"))
    else:
        engine = nullcontext(None)
    # A report to stdout rendered before for this run and these options is written as it was
    # (advisor.cli.warm); one made now is kept in its analysis entry for the next time.
    warm = (output is None and format is not Format.html and rules_dir is None and not address and not cfg.rule_options and not tensorboard
            and not ops and not kernels and not collectives and not launches)
    if warm:
        from advisor.cli.warm import keep, recording, serve, stored_report

        text = stored_report(path, run, cfg, rule_ids(select), rule_ids(ignore), format.value, verbose)
        if text is not None:
            serve(text)
            return
    if collectives:
        with engine as executor:
            emit_collectives(path, run, format, output, executor)
        return
    with engine as executor:
        # Every format comes from the analysis (the HTML's timeline and top ops too: advisor.rank_view), cached or not.
        analysis = analyze_with_progress(
            path, run=run, config=cfg, rules_dir=rules_dir, select=rule_ids(select), ignore=rule_ids(ignore), cache=True,
            executor=executor, store=warm, draw=format is Format.html,
        )
    if warm:
        with recording() as written:
            emit_report(analysis, format, output, verbose)
        keep(analysis, path, run, format.value, verbose, written[0])
        return
    if kernels and format is not Format.html:
        emit_kernels(analysis, format, output)
    elif launches:
        emit_launches(analysis, format, output)
    elif ops and format.value in TABLE_FORMATS:
        emit_op_table(analysis, format, output)
    elif ops and format is not Format.html:
        emit_ops(analysis, format, output)
    else:
        emit_report(analysis, format, output, verbose)
    if tensorboard:
        from advisor.cli.tensorboard import launch_tensorboard

        launch_tensorboard(analysis.run.directory)


@app.command("rules")
def list_rules(
    rules_dir: Optional[Path] = typer.Option(None, "--rules", help="Also run the rule files in this folder: every *.py there is imported, i.e. executed as Python with your permissions (use only folders you trust)."),
    format: str = typer.Option("text", "--format", "-f", metavar="[text|json]", help="text (a table) or json (one object per rule)."),
    select: List[str] = typer.Option([], "--select", help="Only the rules these ids, groups or prefixes name."),
) -> None:
    """List the rules the advisor checks, with their group (`--select GROUP` runs a group)."""
    from advisor.metrics.vendors import tested_on
    from advisor.rule_catalogue import rule_pages
    from advisor.rule_selection import resolve

    if format not in ("text", "json"):
        raise typer.BadParameter(f"{format!r} is not one of text, json", param_hint="'--format'")
    rules = resolve(rule_pages(rules_dir), select=rule_ids(select))  # read from the rule files, not run
    if format == "json":
        from advisor.output import to_json_text

        doc = [
            {"id": r.id, "title": r.title, "group": r.group or None, "source": r.source, "training_only": r.training_only,
             "scope": r.scope, "options": r.defaults, "docs_url": r.docs_url or None, "tested_on": list(tested_on(r))}
            for r in rules
        ]
        write_output(to_json_text(doc), None)
        return
    from rich.table import Table
    from rich.text import Text

    t = Table(show_edge=False)
    t.add_column("rule")
    t.add_column("group")
    t.add_column("what it finds", overflow="fold")
    t.add_column("tested on")
    t.add_column("source", style="bright_black")
    for r in rules:
        t.add_row(r.id, r.group, Text(r.title), ", ".join(tested_on(r)) or "-", r.source)
    stdout_console().print(t)


@app.command()
def explain(
    rule: str = typer.Argument(..., help="A rule id, e.g. dataloader-stall."),
    rules_dir: Optional[Path] = typer.Option(None, "--rules", help="Also run the rule files in this folder: every *.py there is imported, i.e. executed as Python with your permissions (use only folders you trust)."),
) -> None:
    """Print one rule's page: what it detects, why it is slow, the fix, how the saving is estimated."""
    from advisor.rule_catalogue import rule_page

    r = rule_page(rule, rules_dir)
    page = r.doc or r.title
    if r.docs_url and r.docs_url not in page:
        page += f"\n\nReference: {r.docs_url}"
    if r.training_only:
        page += "\n\nTraining runs only: silent on inference and evaluation runs (no backward pass, no optimizer step)."
    from advisor.metrics.vendors import tested_on_text

    page += f"\n\n{tested_on_text(r)}"
    if r.defaults:
        from advisor.config import rule_options_help

        page += (
            f"\n\n## Options\n\nSet in `[tool.advisor.rules.{r.id}]` of pyproject.toml (or `[rules.{r.id}]` of advisor.toml).\n\n"
            + "\n".join(f"- `{name}` ({tp}, default `{default!r}`)" for name, tp, default in rule_options_help(r.defaults))
        )
    else:
        page += "\n\n## Options\n\nNone."
    page = f"# {r.id}\n\n{page}\n"
    if not sys.stdout.isatty():  # a pipe or file: the page's Markdown as it is, unwrapped
        sys.stdout.write(page)
        return
    from rich.markdown import Markdown

    stdout_console().print(Markdown(page))


# Commands whose modules are optional (profile needs torch) or heavy: registered only when the
# command line may name them, so `advisor report` does not import the gate, capture and diff code.
OPTIONAL_COMMANDS = {
    "profile": ("advisor.cli.profile", {"allow_extra_args": True, "ignore_unknown_options": True, "allow_interspersed_args": False}),
    "gate": ("advisor.cli.gate", None),
    "baseline": ("advisor.cli.gate", None),
    "diff": ("advisor.cli.compare", None),
    "view": ("advisor.cli.compare", None),
    "whatif": ("advisor.cli.whatif", None),
    "fix": ("advisor.cli.fix", {"allow_extra_args": True, "ignore_unknown_options": True}),
    "cache": ("advisor.cli.cache", None),
}


def _register_optional_commands(only: str | None = None) -> None:
    """Add the optional commands to `app` (once; a module that fails to import is skipped):
    the one a command line names (`only`), else all of them (for --help, a misspelt name)."""
    registered = {c.name for c in app.registered_commands}
    for name, (module, settings) in OPTIONAL_COMMANDS.items():
        if name in registered or (only is not None and name != only):
            continue
        try:
            fn = getattr(__import__(module, fromlist=[name]), name, None)
        except ImportError:
            continue
        if fn is not None:
            app.command(name, **({"context_settings": settings} if settings else {}))(fn)


def _optional_command(name: str) -> Callable[..., Any]:
    """The function of an optional command (OPTIONAL_COMMANDS), its module imported."""
    return getattr(__import__(OPTIONAL_COMMANDS[name][0], fromlist=[name]), name)


def _named_command(args: list[str]) -> str | None:
    """The subcommand a command line names (its first word that is not an option)."""
    return next((a for a in args if not a.startswith("-")), None)


def _paths_checked_by_the_stages() -> None:
    """Path arguments are not checked for read permission by the parser: an unreadable file
    is reported by the stage that opens it, as one line and exit 2, not a usage error."""
    import inspect

    from typer.models import ParameterInfo

    from typer.models import ArgumentInfo

    for command in app.registered_commands:
        for param in inspect.signature(command.callback).parameters.values():
            if isinstance(param.default, ParameterInfo):
                param.default.readable = False
            # usage reads `report [OPTIONS] PATH`, as usage lines do (not the parser's `{path}`)
            if isinstance(param.default, ArgumentInfo) and param.default.metavar is None:
                param.default.metavar = param.name.upper()


def _plain_usage_names() -> None:
    """Usage lines name a required argument as `PATH`, an optional one as `[PATH]`, as usage
    lines do (the parser's own way writes `{path}`, which reads as a shell brace expansion)."""
    from typer.core import TyperArgument

    if not hasattr(TyperArgument, "_usage_display_name"):
        return

    def usage_name(self: Any) -> str:
        name = self.display_name_raw if self.required else f"[{self.display_name_raw}]"
        return name + ("..." if self.nargs != 1 else "")

    TyperArgument._usage_display_name = usage_name  # type: ignore[method-assign]


class _ClosedPipeGuard:
    """stdout as it is, with a write into a pipe its reader closed raised as OutputClosed (the
    command line parser would turn a BrokenPipeError into exit status 1)."""

    def __init__(self, stream: object):
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)  # type: ignore[attr-defined,no-any-return]
        except BrokenPipeError:
            raise OutputClosed() from None

    def flush(self) -> None:
        try:
            self._stream.flush()  # type: ignore[attr-defined]
        except BrokenPipeError:
            raise OutputClosed() from None

    def __getattr__(self, name: str) -> object:
        return getattr(self._stream, name)


# Commands that run the user's script in this process: its sys.stdout is left as Python
# makes it (a script may catch BrokenPipeError itself).
RUNS_A_SCRIPT = {"profile", "fix"}


def _output_closed() -> None:
    """`advisor report RUN | head -1`: the reader has what it wanted. What is left unwritten
    goes to /dev/null (no second error when Python flushes stdout at exit), and the command
    ends with its own result: 0, or a verdict reached before the output (a failed gate: 1)."""
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, sys.__stdout__.fileno())  # type: ignore[union-attr]
        os.close(fd)
    except (OSError, AttributeError, ValueError):
        pass
    sys.exit(status_if_output_closes())


def main() -> None:
    from advisor.files_read import forget_all

    forget_all()  # one command's inputs (tests run several in one process)
    if sys.argv[1:] == ["--version"]:  # answered before any command's module is imported
        from advisor.version import __version__

        sys.stdout.write(f"advisor {__version__}\n")
        return
    set_status_if_output_closes(0)
    stdout = sys.stdout
    if _named_command(sys.argv[1:]) not in RUNS_A_SCRIPT:  # a script's stdout stays the one Python gives it
        sys.stdout = _ClosedPipeGuard(stdout)  # type: ignore[assignment]
    try:
        _main()
    except (OutputClosed, BrokenPipeError):
        _output_closed()
    finally:
        if isinstance(sys.stdout, _ClosedPipeGuard):
            sys.stdout = stdout


def _main() -> None:
    try:
        from advisor.cli.warm import direct_command, fast_report

        if fast_report(sys.argv[1:], report, format_option):  # a report rendered before: written before the parser is built
            return
        if direct_command(sys.argv[1:], {"report": lambda: report, "whatif": lambda: _optional_command("whatif")}):  # a plain line: run without the parser
            return
        core = {c.name or c.callback.__name__ for c in app.registered_commands}
        named = _named_command(sys.argv[1:])
        if named not in core:
            # `advisor whatif RUN` imports the whatif command's module, not the gate's or fix's
            _register_optional_commands(named if named in OPTIONAL_COMMANDS and not {"-h", "--help"} & set(sys.argv[1:2]) else None)
        _paths_checked_by_the_stages()
        _plain_usage_names()
        code = app(standalone_mode=False)
        if isinstance(code, int) and code:
            sys.exit(code)
    except InputError as exc:
        say(stderr_console(), f"advisor: error: {exc.line()}")
        sys.exit(EXIT_BAD_INPUT)
    except (typer.Abort, KeyboardInterrupt):
        say(stderr_console(), "advisor: interrupted")
        sys.exit(130)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except SystemExit:
        raise
    except (OutputClosed, BrokenPipeError):
        raise
    except Exception as exc:
        if hasattr(exc, "show") and hasattr(exc, "exit_code"):  # usage errors from the CLI parser
            if isinstance(getattr(exc, "message", None), str):
                # the parser's validation library prefixes its own words ("Value error, 'x' is not one of ...")
                exc.message = exc.message.replace("Value error, ", "")
            exc.show()
            sys.exit(EXIT_BAD_INPUT if exc.exit_code == 2 else exc.exit_code)
        if os.environ.get("ADVISOR_DEBUG"):
            raise
        say(stderr_console(), f"advisor: internal error: {type(exc).__name__}: {exc} (set ADVISOR_DEBUG=1 for the traceback)")
        sys.exit(EXIT_INTERNAL)


# Commands that analyse traces and exit run without the cyclic garbage collector: their
# imports (pandas, pyarrow, typer) make ~10^5 objects that live as long as the process, and
# collecting while they appear costs 30-40 ms of a short command, while a whole analysis
# leaves only a few thousand objects in reference cycles. They end without the interpreter's
# teardown (advisor.leaving): freeing the imports' and the analysis's objects one by one at
# exit costs ~20 ms more. (`profile` runs the user's own script, which gets the usual
# collector and exit.)
WITHOUT_COLLECTOR = {"report", "gate", "baseline", "diff", "whatif"}


def program() -> None:
    """The `advisor` program (console script and `python -m advisor`); for the analysis
    commands it ends the process itself and does not return. Tests call main() itself, so a
    long-lived process keeps collecting and exits as usual."""
    if _named_command(sys.argv[1:]) not in WITHOUT_COLLECTOR:
        try:
            main()
        finally:
            gc.freeze()  # the exit's collection skips the objects made so far
        return
    from advisor.leaving import exit_status, leave

    gc.disable()
    try:
        main()
    except SystemExit as exc:
        leave(exit_status(exc.code))
    leave(0)


if __name__ == "__main__":
    program()
