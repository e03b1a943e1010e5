"""`advisor diff` and `advisor view` (registered by advisor.cli only when named)."""

from __future__ import annotations

import os
import sys
from enum import Enum
from pathlib import Path
from typing import Optional

import typer

from advisor.cli import format_option
from advisor.render.console import UNWRAPPED_WIDTH, output_console, trim_lines
from advisor.output import check_report_file, refuse_terminal_for_html, run_input_files, write_output
from advisor.terminal_text import inert_console, path_text


class DiffFormat(str, Enum):
    text = "text"
    json = "json"
    markdown = "markdown"
    html = "html"


def diff(
    before: Path = typer.Argument(..., help="The run before the change: a log dir or trace file."),
    after: Path = typer.Argument(..., help="The run after the change: a log dir or trace file."),
    format: Optional[str] = typer.Option(None, "--format", "-f", metavar="[text|json|markdown|md|html]", callback=format_option, help="text, json, markdown (md) or html (default: from the -o suffix, else text)."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write to this file instead of stdout (.html, .json, .md, .txt set the format; its folder must exist)."),
    rules_dir: Optional[Path] = typer.Option(None, "--rules", help="Also run the rule files in this folder: every *.py there is imported, i.e. executed as Python with your permissions (use only folders you trust)."),
    config: Optional[Path] = typer.Option(None, "--config", help="advisor.toml or pyproject.toml to use."),
    ops: bool = typer.Option(False, "--ops", help="Line up the ops of the two runs by (op, input shapes, input dtypes, scalar inputs) and rank the changes in device time per step against the steps' noise (text, json, markdown)."),
) -> None:
    """Compare two runs: step time, throughput, breakdown, and which findings were resolved or are new."""
    from advisor.analysis import analyze
    from advisor.config import load_config
    from advisor.render.diff import compare, render_diff

    from advisor.cli import format_for

    cfg = load_config(config)
    format = DiffFormat(format_for(format, output))
    check_report_file(output)
    if output is not None and str(output) == "-":
        output = None
    if format is DiffFormat.html and output is None:
        refuse_terminal_for_html("diff")
    first, second = analyze(before, config=cfg, rules_dir=rules_dir, cache=True), analyze(after, config=cfg, rules_dir=rules_dir, cache=True)
    if ops:
        _emit_op_diff(first, second, format, output)
        return
    comparison = compare(first, second, cfg.rule_options)
    inputs = run_input_files(first) + run_input_files(second)
    notes = output_console(stderr=True)  # warnings on stderr: stdout (or the file) holds the comparison alone
    if format is DiffFormat.text and output is None:
        render_diff(comparison, "text", output_console(), notes)
        return
    if format is DiffFormat.text:
        console = inert_console(record=True, width=UNWRAPPED_WIDTH, file=open(os.devnull, "w"), color_system=None)
        render_diff(comparison, "text", console, notes)
        write_output(trim_lines(console.export_text()), output, inputs)
        return
    text = render_diff(comparison, format.value)
    assert text is not None
    write_output(text, output, inputs)


def _emit_op_diff(first, second, format: DiffFormat, output: Optional[Path]) -> None:
    """`diff --ops`: the two runs' op tables lined up (advisor.metrics.op_table.op_diff)."""
    from advisor.errors import InputError
    from advisor.metrics.op_table import op_diff
    from advisor.render import ops as ops_render

    if format is DiffFormat.html:
        raise InputError("--format html", "diff --ops writes text, json or markdown")
    table = op_diff(first.op_table(), second.op_table())
    names = (first.run.name, second.run.name)
    inputs = run_input_files(first) + run_input_files(second)
    if format is DiffFormat.json:
        write_output(ops_render.to_op_diff_json(*names, table), output, inputs)
    elif format is DiffFormat.markdown:
        write_output(ops_render.to_op_diff_markdown(*names, table), output, inputs)
    else:
        write_output(ops_render.to_op_diff_text(*names, table), output, inputs)


def view(
    path: Path = typer.Argument(..., help="A torch.profiler log dir or trace file."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write the HTML report here (default: a file in the temporary folder, one per run)."),
    browser: bool = typer.Option(True, "--browser/--no-browser", help="Open the report in the browser, or only print its path."),
    run: Optional[str] = typer.Option(None, "--run", help="Which run of a log dir holding several."),
    rules_dir: Optional[Path] = typer.Option(None, "--rules", help="Also run the rule files in this folder: every *.py there is imported, i.e. executed as Python with your permissions (use only folders you trust)."),
    config: Optional[Path] = typer.Option(None, "--config", help="advisor.toml or pyproject.toml to use."),
    tensorboard: bool = typer.Option(
        False, "--tensorboard", help="Open TensorBoard's profiler view instead (the view extra; unmaintained upstream: trace files named *.pt.trace.json only, needs the network)."
    ),
    port: int = typer.Option(6006, "--port", help="--tensorboard: port to serve on (the next free one if taken)."),
    host: str = typer.Option("localhost", "--host", help="--tensorboard: interface to listen on."),
) -> None:
    """Open the run's HTML report in the browser (its path is printed when there is no browser)."""
    if tensorboard:
        from advisor.cli.tensorboard import launch_tensorboard

        launch_tensorboard(path, host=host, port=port)
        return
    from advisor.cli import analyze_with_progress
    from advisor.config import load_config
    from advisor.render.html import to_html
    from advisor.cli.browser import no_browser_reason, open_in_browser, view_file

    check_report_file(output, html_only=True)  # `-o report.txt` would hold HTML under a text name
    analysis = analyze_with_progress(path, run=run, config=load_config(config), rules_dir=rules_dir, cache=False)
    target = output or view_file(analysis.run)
    write_output(to_html(analysis), target, run_input_files(analysis), note=False)
    if browser and open_in_browser(target):
        sys.stderr.write(f"wrote {path_text(target)}, opened in the browser\n")
        return
    # no browser to hand the file to: its path once, on stdout, for the user (or a script) to open
    sys.stdout.write(f"{path_text(target.resolve())}\n")
    if browser:
        sys.stdout.flush()
        sys.stderr.write(f"advisor view: {no_browser_reason()}: open the report at the path above\n")
