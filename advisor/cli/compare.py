"""`advisor diff` and `advisor view` (registered by advisor.cli only when named)."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from advisor.render.output import write_output


class DiffFormat(str, Enum):
    text = "text"
    json = "json"
    markdown = "markdown"
    html = "html"


def diff(
    before: Path = typer.Argument(..., help="The run before the change: a log dir or trace file."),
    after: Path = typer.Argument(..., help="The run after the change: a log dir or trace file."),
    format: DiffFormat = typer.Option(DiffFormat.text, "--format", "-f", help="text, json, markdown or html."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write to this file instead of stdout (html: advisor_diff.html)."),
    rules_dir: Optional[Path] = typer.Option(None, "--rules", help="Also run the rule files in this folder: every *.py there is imported, i.e. executed as Python with your permissions (use only folders you trust)."),
    config: Optional[Path] = typer.Option(None, "--config", help="advisor.toml or pyproject.toml to use."),
) -> None:
    """Compare two runs: step time, throughput, breakdown, and which findings were resolved or are new."""
    from advisor.analysis import analyze
    from advisor.config import load_config
    from advisor.render.diff import compare, render_diff

    cfg = load_config(config)
    comparison = compare(analyze(before, config=cfg, rules_dir=rules_dir, cache=True), analyze(after, config=cfg, rules_dir=rules_dir, cache=True))
    if format is DiffFormat.text and output is None:
        render_diff(comparison, "text", Console(highlight=False, soft_wrap=False))
        return
    if format is DiffFormat.text:
        console = Console(record=True, width=120, file=open("/dev/null", "w"), color_system=None)
        render_diff(comparison, "text", console)
        write_output(console.export_text(), output)
        return
    text = render_diff(comparison, format.value)
    assert text is not None
    write_output(text, output or (Path("advisor_diff.html") if format is DiffFormat.html else None))


def view(
    path: Path = typer.Argument(..., help="A torch.profiler log dir or trace file."),
    port: int = typer.Option(6006, "--port", help="Port to serve on (the next free one if taken)."),
    host: str = typer.Option("localhost", "--host", help="Interface to listen on."),
) -> None:
    """Open the run in TensorBoard's PyTorch profiler view and print its URL."""
    from advisor.render.tensorboard import launch_tensorboard

    launch_tensorboard(path, host=host, port=port)
