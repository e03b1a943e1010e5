"""The gate's result for people and for CI: terminal table, JSON, JUnit XML, GitHub Actions.

Every string in a result may come from a trace (a kernel name inside a finding's message, a
device name): it is written as data in every format. Rich gets `Text`, never markup; XML is
built with ElementTree (which escapes) after removing characters XML cannot hold; GitHub
workflow commands get their documented percent-encoding; Markdown cells are HTML-escaped
with table pipes and brackets neutralised.
"""

from __future__ import annotations

import html
import os
import re
import socket
import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Iterable

from rich.console import Console
from rich.table import Table
from rich.text import Text

from advisor.gate.verdict import Check, GateResult
from advisor.files import write_atomically
from advisor.output import refuse_overwriting_inputs, to_json_text
from advisor.terminal_text import inert_lines, multi_line, one_line, valid_unicode

STATUS_STYLE = {"pass": "green", "warn": "yellow", "inconclusive": "yellow", "fail": "bold red"}
STATUS_ICON = {"pass": "✅", "warn": "⚠️", "inconclusive": "❔", "fail": "❌"}
CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
XML_INVALID = re.compile("[^\u0009\u000a\u000d\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


# --- terminal -------------------------------------------------------------------------------
def render_terminal(result: GateResult, console: Console) -> None:
    t = Table(show_edge=False, pad_edge=False, expand=False)
    t.add_column("check")
    t.add_column("status")
    t.add_column("measured", justify="right")
    t.add_column("limit", justify="right")
    t.add_column("why", overflow="fold", ratio=1)
    for c in result.checks:
        status = c.effective_status(result.strict)
        t.add_row(_term(c.title), Text(status.upper(), style=STATUS_STYLE[status]), _term(c.measured), _term(c.limit), _term(c.message))
    _print_table(t, console)
    # Whole lines (soft_wrap): a wrap could start a line with a trace's `::error::`.
    for w in result.warnings:
        console.print(_term(f"warning: {w}", style="yellow"), soft_wrap=True)
    console.print(_term(f"advisor gate: {result.headline()}", style=STATUS_STYLE[result.verdict]), soft_wrap=True)


def _print_table(table: Table, console: Console) -> None:
    """The table; in a pipe or file (laid out unwrapped, each row one line) the rule under the
    header ends where the header does, not under the longest message: hundreds of characters
    of ━ in a CI log otherwise."""
    from advisor.render.console import is_unwrapped

    if not is_unwrapped(console) or console.color_system is not None:
        console.print(table)
        return
    with console.capture() as captured:
        console.print(table)
    lines = captured.get().split("\n")
    if len(lines) > 1:
        lines[1] = lines[1][: len(lines[0].rstrip())]
    console.out("\n".join(lines), end="", highlight=False)


def _term(s: str, style: str = "") -> Text:
    """Terminal text from any string: no markup, no escape sequences, and one line (a CI log
    runs a line that starts `::` or `##[` as a command)."""
    return Text(one_line(s), style=style)


# --- JSON -----------------------------------------------------------------------------------
def to_json(result: GateResult) -> str:
    return to_json_text(result.to_dict())


# --- JUnit XML ------------------------------------------------------------------------------
def _xml_text(s: str) -> str:
    """Text for an XML element: no control character, no line a CI runner reads as a command
    (a JUnit report's system-out is often echoed into the job's log), only characters XML holds."""
    return XML_INVALID.sub("\ufffd", multi_line(s))


def _xml_attr(s: str) -> str:
    return XML_INVALID.sub("\ufffd", one_line(s))


def to_junit(result: GateResult, suite_name: str = "advisor gate", timestamp: datetime | None = None) -> str:
    """One <testcase> per check: failure for fail, skipped for inconclusive, system-out for warn.

    Follows the JUnit XML layout that Jenkins, GitLab, GitHub reporters and Surefire read:
    <testsuites><testsuite name tests failures errors skipped time timestamp hostname>
    <properties/> <testcase classname name time> [<failure message type>text</failure> |
    <skipped message/>] [<system-out>] ... </testsuite></testsuites>.
    """
    checks = result.checks
    failures = sum(1 for c in checks if c.effective_status(result.strict) == "fail")
    skipped = sum(1 for c in checks if c.effective_status(result.strict) == "inconclusive")
    stamp = (timestamp or datetime.now(timezone.utc)).replace(microsecond=0, tzinfo=None).isoformat()
    root = ET.Element("testsuites", {"name": "advisor", "tests": str(len(checks)), "failures": str(failures), "errors": "0", "time": "0"})
    suite = ET.SubElement(
        root,
        "testsuite",
        {
            "name": suite_name,
            "tests": str(len(checks)),
            "failures": str(failures),
            "errors": "0",
            "skipped": str(skipped),
            "time": "0",
            "timestamp": stamp,
            "hostname": _xml_attr(socket.gethostname() or "localhost"),
        },
    )
    props = ET.SubElement(suite, "properties")
    settings = result.settings
    for name, value in (
        ("verdict", result.verdict),
        ("strict", str(result.strict).lower()),
        ("tolerance", str(settings.get("tolerance"))),
        ("candidate", result.candidate.get("source", "")),
        ("baseline", (result.baseline or {}).get("source", "")),
    ):
        ET.SubElement(props, "property", {"name": name, "value": _xml_attr(str(value))})
    for c in checks:
        case = ET.SubElement(suite, "testcase", {"classname": "advisor.gate", "name": _xml_attr(f"{c.title} [{c.id}]"), "time": "0"})
        status = c.effective_status(result.strict)
        body = _xml_text(f"{c.title}: measured {c.measured}, limit {c.limit}\n{c.message}")
        if status == "fail":
            kind = "inconclusive" if c.status == "inconclusive" else c.id
            el = ET.SubElement(case, "failure", {"message": _xml_attr(c.message), "type": _xml_attr(kind)})
            el.text = body
        elif status == "inconclusive":
            ET.SubElement(case, "skipped", {"message": _xml_attr("inconclusive: " + c.message)})
        if status in ("warn", "pass"):
            out = ET.SubElement(case, "system-out")
            out.text = body
    if result.warnings:
        err = ET.SubElement(suite, "system-err")
        err.text = _xml_text("\n".join(result.warnings))
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


# --- GitHub Actions -------------------------------------------------------------------------
def _gh_data(s: str) -> str:
    return inert_lines(CONTROL.sub("", valid_unicode(s))).replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _gh_property(s: str) -> str:
    return _gh_data(s).replace(":", "%3A").replace(",", "%2C")


def github_annotations(result: GateResult) -> list[str]:
    """`::error` for each failed check, `::warning` for inconclusive and warn checks."""
    lines = []
    for c in result.checks:
        status = c.effective_status(result.strict)
        if status == "pass":
            continue
        level = "error" if status == "fail" else "warning"
        title = _gh_property(f"advisor gate: {c.title}")
        lines.append(f"::{level} title={title}::{_gh_data(f'{c.measured} (limit {c.limit}): {c.message}')}")
    return lines


def _md(s: str) -> str:
    """A Markdown table cell from any string: escaped HTML, no pipes, links or line breaks."""
    s = html.escape(one_line(s), quote=False).replace("|", "\\|").replace("[", "\\[").replace("]", "\\]")
    s = s.replace("`", "\\`").replace("*", "\\*").replace("_", "\\_")
    return " ".join(s.split())


def github_summary(result: GateResult) -> str:
    """The Markdown step summary."""
    icon = STATUS_ICON[result.verdict]
    out = [f"## {icon} advisor gate: {result.verdict.upper()}", "", _md(result.headline()), ""]
    out += ["| check | status | measured | limit | why |", "| --- | --- | --- | --- | --- |"]
    for c in result.checks:
        status = c.effective_status(result.strict)
        out.append(f"| {_md(c.title)} | {STATUS_ICON[status]} {status} | {_md(c.measured)} | {_md(c.limit)} | {_md(c.message)} |")
    if result.new_findings:
        out += ["", "**New findings since the baseline**", ""]
        out += [f"- {_md(f['rule'])} ({_md(f['severity'])}): {_md(f['title'])}" for f in result.new_findings]
    if result.warnings:
        out += ["", "**Warnings**", ""] + [f"- {_md(w)}" for w in result.warnings]
    cand = result.candidate
    out += ["", f"Candidate: {_md(str(cand.get('source')))} ({cand.get('steps')} steps)"]
    if result.baseline:
        out.append(f"Baseline: {_md(str(result.baseline.get('source')))} ({result.baseline.get('steps')} steps)")
    return "\n".join(out) + "\n"


def emit_github(result: GateResult, stream: IO[str], environ: dict[str, str] | None = None) -> None:
    """Under GitHub Actions: annotations on `stream` (stdout), the summary appended to its file."""
    env = os.environ if environ is None else environ
    if env.get("GITHUB_ACTIONS") != "true":
        return
    for line in github_annotations(result):
        stream.write(line + "\n")
    summary = env.get("GITHUB_STEP_SUMMARY")
    if summary:
        try:
            with open(summary, "a", encoding="utf-8") as fh:
                fh.write(github_summary(result))
        except OSError as exc:  # the verdict stands; say why the summary is missing
            stream.write(f"::warning title=advisor gate::{_gh_data(f'cannot write the step summary {summary}: {exc.strerror or exc}')}\n")


# --- files ----------------------------------------------------------------------------------
def write_file(path: Path, text: str, inputs: Iterable[Path] = ()) -> None:
    """A gate output file (a baseline, the JSON result, JUnit XML), atomically, never over one
    of the INPUTS it was computed from. Its folder is made as CI tools make theirs (`--junit
    reports/gate.xml`, `-o perf/baseline.json`); a report's is not (advisor.output)."""
    refuse_overwriting_inputs(path, inputs)
    write_atomically(path, text, make_parents=True)


__all__ = ["render_terminal", "to_json", "to_junit", "github_annotations", "github_summary", "emit_github", "write_file", "Check"]
