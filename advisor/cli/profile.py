"""`advisor profile`: run a training script under torch.profiler, then report on it.

    advisor profile train.py -- --lr 0.1
    advisor profile -m package.module -- ARGS
    advisor profile --nproc-per-node 2 train.py -- ARGS      (through torchrun)

Options of the advisor go before the script, or between the script and `--`, the way
`cargo run` reads them (`advisor profile train.py --out d -- --lr 1`): with a `--`, every
word between the script and it must be one of the options below (anything else is refused
with one line, exit 2); without one, everything after the script is the script's, as with
`python train.py ARGS`.

The script runs like `python train.py ARGS` would run it (see runner.py). Its steps are found
without changing it (hooks.py); after `--wait` skipped and `--warmup` warm-up steps, `--active`
steps are recorded, the run is stopped on purpose (`--full` lets it finish), and the report
is printed. stdout is the script's alone: everything `advisor` says goes to stderr, and so
does the report unless `-o FILE` names a file for it (as with `advisor report`, its suffix
sets the format). The log dir is `--out DIR` (or `--log-dir DIR`).

Exit status: 0 when the advisor stopped the script after the window, as it does by default,
and wrote the report: that is what the command was asked for (the rest of the script did
not run, and its own status is not known: said in one line); the script's own status when it
ended by itself before that, or with `--full` (0 when it finished, its sys.exit status, 1 for
an exception); 1 when it was stopped but left no trace to report on; 143 for a SIGTERM; 2
for bad input.

This module does not import torch at import time (`advisor report` must never load it).
"""

from __future__ import annotations

import os
import sys
import time
from enum import Enum
from pathlib import Path

import typer

from advisor.capture.progress import say_lines
from advisor.cli import format_option
from advisor.capture.runner import SIGTERM_EXIT, end_by_sigterm
from advisor.errors import InputError
from advisor.output import REPORT_SUFFIXES
from advisor.terminal_text import path_text


class Device(str, Enum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


RUNS_DIR = Path("advisor_runs")
EXIT_STOPPED = 0  # stopped on purpose after the window and reported on: what was asked for
EXIT_NOTHING_REPORTED = 1  # stopped after the window, but no trace was written to report on


def profile(
    ctx: typer.Context,
    script: str | None = typer.Argument(
        None, metavar="SCRIPT [-- ARGS...]", show_default=False,
        help="The training script, run as `python SCRIPT ARGS` would run it. Put `--` before the script's own options; the advisor's options may stand before SCRIPT or between SCRIPT and `--`.",
    ),
    module: str | None = typer.Option(None, "-m", "--module", help="Run a module instead, like `python -m MODULE ARGS`."),
    wait: int = typer.Option(1, "--wait", min=0, help="Steps to skip before the profiler warms up (the first step holds start-up)."),
    warmup: int = typer.Option(3, "--warmup", min=0, help="Steps the profiler runs without keeping them."),
    active: int = typer.Option(5, "--active", min=1, help="Steps recorded."),
    repeat: int = typer.Option(1, "--repeat", min=1, help="How many wait/warmup/active cycles (one trace file each)."),
    full: bool = typer.Option(False, "--full", help="Let the script run to its end instead of stopping it after the window."),
    after_steps: int | None = typer.Option(
        None, "--after-steps", min=0, show_default=False,
        help="Steps timed without the profiler after the window before the script is stopped: they measure the profiler's own cost, which every saving is figured without. Default: at least 5 steps and 2 s (at most 100 steps; 5 on every rank of a multi-process run). 0: stop right after the window.",
    ),
    device: Device = typer.Option(Device.auto, "--device", help="What to profile: cuda when available, else cpu."),
    out: Path | None = typer.Option(None, "--out", "--log-dir", help="Log dir to create (default ./advisor_runs/<script>-<time>/); never an existing non-empty one."),
    output: Path | None = typer.Option(None, "--output", "-o", help="Write the report to this file (.txt, .json, .md, .html set the format, as in `advisor report`); without it the report goes to stderr, so stdout stays the script's."),
    stack: bool | None = typer.Option(
        None, "--stack/--no-stack",
        help="Record Python stacks. Default: yes, unless the script compiled its model (torch.compile) before the window, where the stack tracer would cost more than the step.",
        show_default=False,
    ),
    no_shapes: bool = typer.Option(False, "--no-shapes", help="Do not record operator input shapes."),
    no_memory: bool = typer.Option(False, "--no-memory", help="Do not record memory allocations."),
    nproc_per_node: int | None = typer.Option(None, "--nproc-per-node", min=1, help="Launch N processes through torchrun (torch.distributed.run), all into the same log dir."),
    format: str | None = typer.Option(None, "--format", "-f", metavar="[text|json|markdown|md|html]", callback=format_option, help="Report format: text, json, markdown (md) or html (default: from the -o suffix, else text)."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show evidence and code for each finding."),
    select: list[str] = typer.Option([], "--select", metavar="RULE", help="Only these rules, prefixes or groups (repeatable, or comma-separated: a,b)."),
    ignore: list[str] = typer.Option([], "--ignore", metavar="RULE", help="Skip these rules, prefixes or groups (repeatable, or comma-separated: a,b)."),
    rules_dir: Path | None = typer.Option(None, "--rules", help="Also run the rule files in this folder: every *.py there is imported, i.e. executed as Python with your permissions (use only folders you trust)."),
    config: Path | None = typer.Option(None, "--config", help="advisor.toml or pyproject.toml to use."),
) -> None:
    """Run a training script under torch.profiler and report why it is slow.

    Options go before SCRIPT, or between SCRIPT and `--` (advisor profile train.py --out d
    -- --lr 1); everything after `--` is the script's. Without `--`, everything after
    SCRIPT is the script's, as with `python SCRIPT ARGS`.
    """
    extra = list(ctx.args) if ctx is not None else []
    if extra[:1] == ["--"]:  # kept by click when options stop at the script (allow_interspersed_args=False)
        extra = extra[1:]
    elif "--" in extra and ctx is not None:  # options between the script and `--`: the advisor's
        options, extra = _options_before_double_dash(ctx, ([script] if module else []) + extra[: extra.index("--")]), extra[extra.index("--") + 1 :]
        if module:
            script = None
        values = {**ctx.params, **options, "script": script}
        wait, warmup, active, repeat, full = values["wait"], values["warmup"], values["active"], values["repeat"], values["full"]
        after_steps = values["after_steps"]
        device, out, stack, no_shapes, no_memory = values["device"], values["out"], values["stack"], values["no_shapes"], values["no_memory"]
        nproc_per_node, format, verbose, module = values["nproc_per_node"], values["format"], values["verbose"], values["module"]
        output, select, ignore, rules_dir, config = values["output"], values["select"], values["ignore"], values["rules_dir"], values["config"]
    fmt = check_report_output(output, format.value if isinstance(format, Enum) else format)
    from advisor.cli import rule_ids
    from advisor.config import load_config

    cfg = load_config(config)  # before the run: a mistake in it is said at once
    report_options = {"config": cfg, "rules_dir": rules_dir, "select": rule_ids(select), "ignore": rule_ids(ignore)}
    if select or ignore or rules_dir is not None:  # a selector that names no rule: said before the run
        from advisor.engine import all_rules, select_rules

        select_rules(all_rules(rules_dir), select=report_options["select"] or cfg.select, ignore=[*report_options["ignore"], *cfg.ignore])
    require_torch()
    from advisor.capture.runner import Target, check_target

    if module:
        target = Target("module", module, ([script] if script else []) + extra)
    elif script:
        target = Target("script", script, extra)
    else:
        raise InputError(None, "nothing to profile: give a script (advisor profile train.py) or a module (advisor profile -m package.module)")
    check_target(target)
    if out is not None:
        check_out_dir(out)  # before importing torch: a wrong --out is said at once
    resolved = resolve_device(device.value if isinstance(device, Device) else str(device))
    out_dir = prepare_out_dir(Path(out) if out is not None else None, target.stem)

    from advisor.capture.session import CaptureOptions

    options = CaptureOptions(
        out_dir=out_dir,
        wait=wait,
        warmup=warmup,
        active=active,
        repeat=repeat,
        full=full,
        after_steps=after_steps,
        device=resolved,
        record_shapes=not no_shapes,
        profile_memory=not no_memory,
        with_stack=stack,
    )
    if nproc_per_node is not None:
        from advisor.capture.launch import launch

        exit_code = launch(target, options, nproc_per_node)
        stopped = False  # each rank's own status: 0 when stopped on purpose
        terminated = exit_code == SIGTERM_EXIT
        report_wanted = not terminated
    else:
        from advisor.capture.session import capture, left_nothing, summary_lines

        result = capture(target, options)
        removed = out is None and left_nothing(result) and remove_empty_run(out_dir)
        say_lines(summary_lines(result, removed))
        stopped = result.outcome.how == "stopped"
        exit_code = EXIT_STOPPED if stopped else result.exit_code
        terminated = result.outcome.how == "terminated"
        report_wanted = bool(result.recorded_steps or result.own_traces) and not terminated
    sys.stdout.flush()
    if terminated:  # pre-empted: keep the grace period for saving, report later
        say_lines([f"analyse the run with: advisor report {path_text(out_dir)}"])
        end_by_sigterm()
    if report_wanted and has_traces(out_dir):
        print_report(out_dir, fmt, verbose, output, **report_options)
    elif stopped:
        say_lines([f"no trace was written to {path_text(out_dir)}, so there is no report"])
        exit_code = EXIT_NOTHING_REPORTED
    if exit_code:
        raise SystemExit(exit_code)  # SystemExit: typer.Exit is swallowed by a non-standalone app


def _options_before_double_dash(ctx: typer.Context, words: list[str]) -> dict:
    """The advisor's options given between the script and `--`, parsed as if given before it."""
    if not words:
        return {}
    sub = ctx.command.make_context(ctx.info_name, list(words), parent=ctx.parent, resilient_parsing=False)
    stray = ([sub.params["script"]] if sub.params.get("script") else []) + [w for w in sub.args if w != "--"]
    if stray:
        raise InputError(
            None,
            f"{stray[0]!r} stands between the script and `--`, where only advisor profile's own options go; "
            "put the script's arguments after `--` (advisor profile train.py --out DIR -- --lr 0.1)",
        )
    given = {}
    for name, value in sub.params.items():
        if _from_command_line(sub, name):
            if _from_command_line(ctx, name):
                raise InputError(None, f"the option for {name!r} is given both before and after the script; give it once")
            given[name] = value
    return given


def _from_command_line(ctx: typer.Context, name: str) -> bool:
    """Whether the command line gave this parameter (by the source's name: the enum's class
    lives in click, which typer has vendored in some versions and not in others)."""
    source = ctx.get_parameter_source(name)
    return getattr(source, "name", None) == "COMMANDLINE"


def check_report_output(output: Path | None, given: str | None) -> str:
    """The report's format; `-o` must name a report file (it named the log dir before)."""
    from advisor.cli import format_for

    if output is not None and (output.is_dir() or output.suffix.lower() not in REPORT_SUFFIXES):
        raise InputError(
            output,
            "-o names the report file (as in `advisor report`), with a suffix for its format "
            f"({', '.join(REPORT_SUFFIXES[:4])}, .html); the log dir is --out {path_text(output)}",
        )
    if output is not None:
        _check_report_file(output)
    return format_for(given, output)


def _check_report_file(output: Path) -> None:
    """Refuse, before the script runs, a report file that could not be written after it: one
    that is a block device or a socket, or under a path whose nearest existing folder is a
    file or cannot be written (`advisor.files.write_atomically` would refuse it only then)."""
    import stat

    try:
        st = os.stat(output)
    except OSError:
        st = None
    if st is not None and (stat.S_ISBLK(st.st_mode) or stat.S_ISSOCK(st.st_mode)):
        kind = "a block device" if stat.S_ISBLK(st.st_mode) else "a socket"
        raise InputError(output, f"is {kind}; the advisor writes only files, character devices and pipes")
    if st is not None:
        return  # a file (replaced, as by `advisor report -o`), a character device or a FIFO (written into)
    folder = next((p for p in output.absolute().parents if os.path.lexists(p)), None)
    if folder is None:
        return
    if not folder.is_dir():
        raise InputError(output, f"cannot write the report there: {path_text(folder)} is not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise InputError(output, f"cannot write the report there: {path_text(folder)} is not writable")


def require_torch() -> None:
    """`advisor profile` runs the script under torch.profiler: say how to get torch, in one line."""
    import importlib.util

    try:
        found = importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise InputError(
            None,
            f"advisor profile needs PyTorch, which this Python ({sys.executable}) cannot import; "
            "install it with: pip install torch (or pip install 'torch-advisor[profile]')",
        )


def resolve_device(device: str) -> str:
    if device == "cpu":
        return "cpu"
    import torch

    available = torch.cuda.is_available()
    if device == "cuda" and not available:
        raise InputError(None, "--device cuda: no CUDA device is available to this process (use --device cpu)")
    return "cuda" if available else "cpu"


def prepare_out_dir(out: Path | None, stem: str) -> Path:
    """Create the log dir; never reuse one that holds anything."""
    if out is None:
        base = RUNS_DIR / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}"
        for n in range(1, 1000):
            candidate = base if n == 1 else base.with_name(f"{base.name}-{n}")
            try:
                candidate.mkdir(parents=True, exist_ok=False)
            except FileExistsError:
                continue
            except OSError as exc:
                raise InputError(candidate, f"cannot create the log directory: {exc.strerror or exc}") from None
            return _writable(candidate).absolute()
        raise InputError(base, "too many runs with this name in the same second")
    check_out_dir(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(out, f"cannot create the log directory: {exc.strerror or exc}") from None
    return _writable(out).absolute()  # resolved once: the script may os.chdir()


def remove_empty_run(out_dir: Path) -> bool:
    """Remove a log dir `prepare_out_dir` named when it holds only the facts files of a run that
    recorded nothing, and advisor_runs/ with it when that is left empty; whether it was removed."""
    from advisor.facts import FACTS_FILE

    try:
        found = list(out_dir.iterdir())
        if not all(p.is_file() and not p.is_symlink() and FACTS_FILE.match(p.name) for p in found):
            return False
        for p in found:
            p.unlink()
        out_dir.rmdir()
    except OSError:
        return False
    try:
        out_dir.parent.rmdir()  # advisor_runs/, only when nothing else is in it
    except OSError:
        pass
    return True


def check_out_dir(out: Path) -> None:
    if out.exists():
        if not out.is_dir():
            raise InputError(out, "exists and is not a directory; choose another --out")
        if any(out.iterdir()):
            raise InputError(out, "already exists and is not empty; advisor never writes into an earlier run (choose another --out)")
    else:
        parent = next((p for p in out.absolute().parents if p.exists()), None)
        if parent is not None and not parent.is_dir():
            raise InputError(out, f"cannot create the log directory: {parent} is not a directory")


def _writable(path: Path) -> Path:
    if not os.access(path, os.W_OK | os.X_OK):
        raise InputError(path, "the log directory is not writable")
    return path


def has_traces(out_dir: Path) -> bool:
    from advisor.load.discover import is_trace_name

    return any(p.is_file() and is_trace_name(p) for p in out_dir.iterdir())


def print_report(out_dir: Path, fmt: str, verbose: bool, output: Path | None = None, **analysis_options) -> None:
    """The report `advisor report OUT_DIR` gives: to the file `output`, else to stderr (stdout
    is the script's: a JSON report there would be mixed with what the script printed)."""
    try:
        from advisor.analysis import analyze
    except ImportError:  # the analysis is not there (partial install): say where the logs are
        say_lines([f"logs in {out_dir}; analyse them with: advisor report {out_dir}"])
        return
    analysis = analyze(out_dir, **analysis_options)
    if output is not None:
        from advisor.cli import Format as ReportFormat
        from advisor.cli import emit_report

        emit_report(analysis, ReportFormat(fmt), output, verbose)
        return
    if fmt == "json":
        from advisor.render.json_report import to_json

        text = to_json(analysis)
        sys.stderr.write(text if text.endswith("\n") else text + "\n")
    elif fmt == "markdown":
        from advisor.render.markdown import to_markdown

        text = to_markdown(analysis, verbose=verbose)
        sys.stderr.write(text if text.endswith("\n") else text + "\n")
    elif fmt == "html":
        from advisor.cli import Format as ReportFormat
        from advisor.cli import emit_report

        from advisor.output import unused_default_name

        # its stdout is the script's: ./advisor_report.html, or a numbered name beside it (an earlier report is kept)
        emit_report(analysis, ReportFormat.html, unused_default_name("advisor_report.html"), verbose)
    else:
        from advisor.render.console import output_console
        from advisor.render.text import render_text

        render_text(analysis, output_console(stderr=True), verbose=verbose)
    sys.stderr.flush()
