"""What the advisor prints and writes, when the trace, the facts or the file names are hostile.

Built from the recorded H100 run in sample_runs/ (a real trace and its facts file), with only
the strings named here changed: a kernel name carrying an OSC 8 hyperlink, a clear-screen
sequence and a newline followed by GitHub Actions' `::set-output`; a device name with a
window-title sequence, a newline, `::error::` and U+202E. Nothing of theirs may act on a
terminal or a CI log: no escape character, no line that starts with a workflow command, no
bidirectional control; errors stay one line whatever the file name; outputs never replace
an input and are written whole or not at all.
"""

from __future__ import annotations

import gzip
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from conftest import REPO, SAMPLE_RUNS

GPU_RUN = SAMPLE_RUNS / "resnet18_cifar" / "runs" / "gpu_baseline"
CPU_RUN = SAMPLE_RUNS / "resnet18_cifar" / "runs" / "cpu_baseline"
KERNEL = "\x1b]8;;https://evil.example\x07click\x1b]8;;\x07\x1b[2J\n::set-output name=x::y\r##[error]kernel"
DEVICE = "H100\x1b]0;pwned\x07\n::error::forged device\u202e"
RLO = "\u202e"


def hostile_run(dest: Path) -> Path:
    """The recorded H100 run, with its busiest kernel and its device renamed."""
    dest.mkdir(parents=True)
    [trace] = GPU_RUN.glob("*.pt.trace.json.gz")
    doc = orjson.loads(gzip.decompress(trace.read_bytes()))
    renamed = 0
    for e in doc["traceEvents"]:
        if e.get("cat") == "kernel" and e.get("name", "").startswith("void cudnn::engines_precompiled::nchwToNh"):
            e["name"] = KERNEL
            renamed += 1
    for d in doc["deviceProperties"]:
        d["name"] = DEVICE
    assert renamed > 100  # the kernel the report lists first
    (dest / trace.name).write_bytes(gzip.compress(orjson.dumps(doc)))
    shutil.copy(GPU_RUN / "advisor_facts.json", dest)
    return dest


CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def assert_inert(text: str) -> None:
    """Nothing in TEXT acts on a terminal or a CI runner (our own annotations aside): no
    control character, no line whose first visible characters are `::`, no `##[` anywhere
    (GitHub's runner reads it anywhere in a line)."""
    assert not CONTROLS.search(text.replace("\n", "")) and RLO not in text, CONTROLS.findall(text)
    for line in text.splitlines():
        assert "##[" not in line, line
        if line.startswith(("::error title=advisor gate", "::warning title=advisor gate")):
            continue
        assert not line.lstrip().startswith("::"), line


def test_text_and_markdown_reports_keep_trace_strings_inert(cli, tmp_path: Path):
    run = hostile_run(tmp_path / "run")
    for args in ([], ["-v"], ["--format", "markdown"], ["--format", "markdown", "-v"]):
        code, out, err = cli(["report", str(run), *args])
        assert code == 0, err
        assert_inert(out)
        assert_inert(err)
        assert "forged device" in out  # shown, as data
    code, out, _ = cli(["report", str(run)])
    assert "click ::set-output name=x::y #\u2060#[error]" in out  # the kernel's name, on its table row (`##[` broken by a word joiner)


def test_gate_terminal_and_annotations_keep_trace_strings_inert(cli, tmp_path: Path):
    run = hostile_run(tmp_path / "run")
    code, _, err = cli(["baseline", str(GPU_RUN), "-o", str(tmp_path / "base.json")])
    assert code == 0, err
    summary = tmp_path / "summary.md"
    code, out, err = cli(
        ["gate", str(run), "-b", str(tmp_path / "base.json"), "--max-share", "dataloader=0.05"],
        env={"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary)},
    )
    assert code == 1, err
    assert_inert(out)
    assert_inert(err)
    assert any("device differs" in line and "forged device" in line for line in out.splitlines())  # the warning, whole
    assert "::error title=advisor gate%3A dataloader share of step::" in out
    assert_inert(summary.read_text())


def test_html_header_holds_no_bidi_control_and_isolates_names(cli, tmp_path: Path):
    run = hostile_run(tmp_path / f"exe.{RLO}lmth.run")
    out = tmp_path / "report.html"
    code, _, err = cli(["report", str(run), "--format", "html", "-o", str(out)])
    assert code == 0, err
    page = out.read_text(encoding="utf-8")
    assert not re.search("[\u202a-\u202e\u2066-\u2069\u200e\u200f]", page)
    header = page[page.index("<h1>") : page.index("</p>", page.index("<h1>"))]
    assert '<bdi class="mono">exe.lmth.run</bdi>' in header
    assert "<bdi>H100" in header and "forged device" in header


def test_one_line_errors_whatever_the_file_name(cli, tmp_path: Path):
    for name in ("a\n::error::forged.json", "b\x1b]0;title\x07.json", f"c{RLO}nosj.json"):
        code, out, err = cli(["report", str(tmp_path / name)])
        assert code == 2
        [line] = err.strip().splitlines()
        assert line.startswith("advisor: error: ") and line.endswith(": no such file or directory")
        assert "\x1b" not in line and RLO not in line
    assert "a\\n::error::forged.json" in cli(["report", str(tmp_path / "a\n::error::forged.json")])[2]


def run_advisor(args: list[str], cwd: Path, limits: list[str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "ADVISOR_CACHE": "off", "COLUMNS": "200"}
    cmd = [*(["prlimit", *limits, "--"] if limits else []), sys.executable, "-m", "advisor", *args]
    return subprocess.run([os.fsencode(a) if isinstance(a, bytes) else a for a in cmd], cwd=cwd, env=env, capture_output=True, timeout=300)


def test_every_writer_takes_a_file_name_that_is_not_utf8(tmp_path: Path):
    base = os.fsencode(tmp_path)
    run = base + b"/run\xff\xfe"
    shutil.copytree(os.fsencode(CPU_RUN), run)
    shown = "run\\xff\\xfe"
    r = run_advisor([b"report", run], tmp_path)
    assert r.returncode == 0, r.stderr
    assert shown.encode() in r.stdout
    for fmt, name in (("json", b"r\xff.json"), ("markdown", b"r\xff.md"), ("html", b"r\xff.html"), ("text", b"r\xff.txt")):
        r = run_advisor([b"report", run, b"--format", fmt.encode(), b"-o", base + b"/" + name], tmp_path)
        assert r.returncode == 0, r.stderr
        suffix = name.decode("ascii", "ignore")  # ".json", ...
        assert r.stderr.decode().strip().splitlines()[-1] == f"wrote {tmp_path}/r\\xff{suffix[1:]}"
        with open(base + b"/" + name, "rb") as fh:
            data = fh.read().decode("utf-8")  # valid UTF-8 throughout
        if fmt == "json":
            assert orjson.loads(data)["source"].endswith(shown)
        else:  # Markdown escapes the backslashes (they render as one)
            assert (shown.replace("\\", "\\\\") if fmt == "markdown" else shown) in data
    r = run_advisor([b"baseline", run, b"-o", base + b"/b\xff.json"], tmp_path)
    assert r.returncode == 0, r.stderr
    r = run_advisor([b"gate", run, b"-b", base + b"/b\xff.json", b"--json", base + b"/g\xff.json", b"--junit", base + b"/g\xff.xml"], tmp_path)
    assert r.returncode in (0, 1), r.stderr
    assert orjson.loads(open(base + b"/g\xff.json", "rb").read())["candidate"]["source"].endswith(shown)
    r = run_advisor([b"report", base + b"/missing\xff.json"], tmp_path)
    assert r.returncode == 2
    assert r.stderr.decode() == f"advisor: error: {tmp_path}/missing\\xff.json: no such file or directory\n"


def test_an_input_is_never_overwritten(cli, tmp_path: Path):
    [trace] = CPU_RUN.glob("*.pt.trace.json.gz")
    mine = tmp_path / "t.pt.trace.json.gz"
    shutil.copy(trace, mine)
    before = mine.read_bytes()
    # a report file's name ends in a format's suffix (`-o t.json.gz` is refused for that alone):
    # the same trace, uncompressed, is an input such a name can hit
    plain = tmp_path / "t.json"
    plain.write_bytes(gzip.decompress(before))
    plain_before = plain.read_bytes()
    for args in (
        ["report", str(plain), "-o", str(plain)],
        ["report", str(plain), "--format", "json", "-o", str(tmp_path / "." / plain.name)],
        ["gate", str(mine), "--max-step-time-ms", "1e6", "--json", str(mine)],
        ["gate", str(mine), "--max-step-time-ms", "1e6", "--junit", str(tmp_path / "t.pt.trace.json.gz")],
        ["baseline", str(mine), "-o", str(mine)],
    ):
        code, _, err = cli(args)
        assert code == 2, (args, err)
        [line] = err.strip().splitlines()
        assert "is one of the files this command reads" in line
        assert mine.read_bytes() == before and plain.read_bytes() == plain_before
    os.link(plain, tmp_path / "hardlink.json")  # the same file under another name
    code, _, err = cli(["report", str(plain), "-o", str(tmp_path / "hardlink.json")])
    assert code == 2 and plain.read_bytes() == plain_before
    run = tmp_path / "run"
    shutil.copytree(CPU_RUN, run)
    code, _, err = cli(["report", str(run), "--format", "json", "-o", str(run / "advisor_facts.json")])
    assert code == 2 and (run / "advisor_facts.json").read_bytes() == (CPU_RUN / "advisor_facts.json").read_bytes()


@pytest.mark.skipif(shutil.which("prlimit") is None, reason="prlimit (util-linux) is needed to cap the file size")
def test_a_write_that_fails_leaves_the_earlier_report_whole(tmp_path: Path):
    report = tmp_path / "report.json"
    r = run_advisor(["report", str(CPU_RUN), "--format", "json", "-o", str(report)], tmp_path)
    assert r.returncode == 0, r.stderr
    good = report.read_bytes()
    report.chmod(0o640)
    # the HTML report (with its styles and script, well over 8 KiB) with files capped at 8 KiB:
    # the write fails half-way (EFBIG, as a full disk would)
    r = run_advisor(["report", str(CPU_RUN), "--format", "html", "-o", str(report)], tmp_path, limits=["--fsize=8192"])
    assert r.returncode == 2
    [line] = r.stderr.decode().strip().splitlines()
    assert line.startswith(f"advisor: error: {report}: cannot write output")
    assert report.read_bytes() == good  # the earlier report, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]  # no temp file left
    r = run_advisor(["report", str(CPU_RUN), "--format", "markdown", "-o", str(report)], tmp_path)
    assert r.returncode == 0 and report.read_text().startswith("#")
    assert report.stat().st_mode & 0o777 == 0o640  # a replaced file keeps its permissions


# --- devices and FIFOs are written into, never replaced -------------------------------------------
def test_a_character_device_or_fifo_output_is_written_into_never_replaced(tmp_path: Path):
    """`-o /dev/null` as root once renamed a temp file over the device. A FIFO (anyone can
    make one) and, as root, a copy of /dev/null's device node stand in for the real ones."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    outputs = [fifo]
    if os.geteuid() == 0:
        os.mknod(tmp_path / "null", 0o666 | 0o020000, os.makedev(1, 3))  # /dev/null's numbers
        outputs.append(tmp_path / "null")
    base = tmp_path / "base.json"
    assert run_advisor(["baseline", str(CPU_RUN), "-o", str(base)], tmp_path).returncode == 0
    for out in outputs:
        for args in (["report", str(CPU_RUN), "--format", "json", "-o", str(out)], ["gate", str(CPU_RUN), "-b", str(base), "--json", str(out)], ["gate", str(CPU_RUN), "-b", str(base), "--junit", str(out)]):
            reader = subprocess.Popen(["cat", str(out)], stdout=subprocess.PIPE) if out == fifo else None
            r = run_advisor(args, tmp_path)
            got = reader.communicate(timeout=60)[0] if reader else b""
            assert r.returncode in (0, 1), r.stderr
            assert not out.is_file() and (out.is_fifo() or out.is_char_device()), args
            if reader:
                assert got.lstrip().startswith((b"{", b"<?xml")), got[:100]
    # a FIFO nobody reads: one line, exit 2, not a hang
    r = run_advisor(["report", str(CPU_RUN), "--format", "json", "-o", str(fifo)], tmp_path)
    assert r.returncode == 2 and r.stderr.decode().strip() == f"advisor: error: {fifo}: is a FIFO with no reader; start the reader first"
    assert fifo.is_fifo()


def test_dev_stdout_into_a_pipe_is_written():
    env = {**os.environ, "PYTHONPATH": str(REPO), "ADVISOR_CACHE": "off"}
    r = subprocess.run([sys.executable, "-m", "advisor", "report", str(CPU_RUN), "--format", "json", "-o", "/dev/stdout"], env=env, capture_output=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert orjson.loads(r.stdout)["schema"] == "advisor/report/v1"


def test_no_output_ever_replaces_a_file_the_command_read(cli, tmp_path: Path):
    """Every file read is an input: the default baseline, a baseline named in pyproject.toml,
    the config, the baseline log dir's facts, the chosen run's own facts, a budget file.
    Each write is refused in one line, exit 2, and the file stays byte for byte."""
    work = tmp_path / "work"
    (work / "perf").mkdir(parents=True)
    run = work / "run"
    shutil.copytree(CPU_RUN, run)
    other = work / "other"
    shutil.copytree(CPU_RUN, other)
    multi = work / "multi"
    shutil.copytree(CPU_RUN, multi / "r1")
    shutil.copytree(CPU_RUN, multi / "r2")
    code, _, err = cli(["baseline", str(run), "-o", str(work / "perf" / "baseline.json")], work)
    assert code == 0, err
    shutil.copy(work / "perf" / "baseline.json", work / "b2.json")
    budget = work / "budget.toml"
    budget.write_text("max_step_time_ms = 100000\n")

    def refused(args: list[str], victim: Path, pyproject: str | None = None) -> None:
        (work / "pyproject.toml").unlink(missing_ok=True)
        if pyproject is not None:
            (work / "pyproject.toml").write_text(pyproject)
        before = victim.read_bytes()
        code, _, err = cli(args, work)
        assert code == 2, (args, err)
        lines = [line for line in err.strip().splitlines() if not line.startswith("advisor gate: comparing with")]
        assert lines == [f"advisor: error: {args[-1]}: is one of the files this command reads; it is never overwritten: choose another output file"], args
        assert victim.read_bytes() == before, args

    refused(["gate", "run", "--json", "perf/baseline.json"], work / "perf" / "baseline.json")
    refused(["gate", "run", "--junit", "b2.json"], work / "b2.json", '[tool.advisor.gate]\nbaseline = "b2.json"\n')
    # the configuration is never a report file's name: refused for its suffix before it is read
    (work / "pyproject.toml").write_text("[tool.advisor]\nignore = []\n")
    code, _, err = cli(["report", "run", "-o", "pyproject.toml"], work)
    assert (code, err) == (2, "advisor: error: pyproject.toml: suffix '.toml': a report file is named for its format (.txt, .json, .md, .markdown, .html)\n")
    assert (work / "pyproject.toml").read_text() == "[tool.advisor]\nignore = []\n"
    refused(["gate", "run", "-b", "other", "--json", "other/advisor_facts.json"], other / "advisor_facts.json")
    refused(["gate", "multi", "--run", "r1", "--max-step-time-ms", "1e6", "--json", "multi/r1/advisor_facts.json"], multi / "r1" / "advisor_facts.json")
    (work / "perf" / "baseline.json").unlink()
    refused(["gate", "run", "--budget", "budget.toml", "--junit", "budget.toml"], budget)


def test_html_without_output_goes_to_stdout_and_writes_no_file(cli, tmp_path: Path):
    earlier = tmp_path / "advisor_report.html"
    earlier.write_text("my earlier report")
    code, out, err = cli(["report", str(CPU_RUN), "--format", "html"], tmp_path)
    assert code == 0, err
    assert out.startswith("<!DOCTYPE html>")
    assert earlier.read_text() == "my earlier report"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["advisor_report.html"]


# --- CI commands and control characters from trace and facts strings, at any width -----------------
WRAPPED_KERNEL = "x" * 25 + " ::error::wrapped\x00\x07\x1b\x9b31m \x85##[warning]mid-line\x90dcs"


def wrapped_hostile_run(dest: Path) -> Path:
    """The recorded H100 run with a kernel name that a 40-column wrap would cut right before
    `::error::`, and facts strings (device, optimizer, notes) that carry commands too."""
    hostile_run(dest)
    trace = next(dest.glob("*.pt.trace.json.gz"))
    doc = orjson.loads(gzip.decompress(trace.read_bytes()))
    for e in doc["traceEvents"]:
        if e.get("name") == KERNEL:
            e["name"] = WRAPPED_KERNEL
    trace.write_bytes(gzip.compress(orjson.dumps(doc)))
    facts = orjson.loads((dest / "advisor_facts.json").read_bytes())
    facts["device"]["name"] = "H100 ##[error]forged\x9b2J\x00"
    facts["optimizers"][0]["class"] = "SGD\n::error::optimizer\x07"
    facts["notes"] = ["note\n  ::error::from the facts\n##[group]x"]
    (dest / "advisor_facts.json").write_bytes(orjson.dumps(facts))
    return dest


def test_no_width_lets_a_trace_or_facts_string_issue_a_ci_command(cli, tmp_path: Path):
    run = wrapped_hostile_run(tmp_path / "run")
    base = tmp_path / "base.json"
    assert cli(["baseline", str(GPU_RUN), "-o", str(base)])[0] == 0
    for columns in ("40", "200"):
        for args in (["report", str(run), "-v"], ["gate", str(run), "-b", str(base), "--max-share", "dataloader=0.05"], ["diff", str(GPU_RUN), str(run)]):
            code, out, err = cli(args, env={"COLUMNS": columns, "GITHUB_ACTIONS": "true"})
            assert code in (0, 1), err
            assert_inert(out)
            assert_inert(err)
    wrapped_before_a_command = 0
    for columns in range(30, 61):  # some width puts the device name's `::error::` first on a line
        code, out, err = cli(["report", str(run)], env={"COLUMNS": str(columns)})
        assert code == 0, err
        assert_inert(out)
        wrapped_before_a_command += any(line.lstrip().startswith(":\u2060:error::forged") for line in out.splitlines())
    assert wrapped_before_a_command  # shown, as data, and no runner reads it


def test_junit_json_and_html_carry_no_command_line_and_no_control_character(cli, tmp_path: Path):
    run = wrapped_hostile_run(tmp_path / "run")
    base = tmp_path / "base.json"
    assert cli(["baseline", str(GPU_RUN), "-o", str(base)])[0] == 0
    code, _, err = cli(["gate", str(run), "-b", str(base), "--max-share", "dataloader=0.05", "--junit", str(tmp_path / "g.xml")])
    assert code == 1, err
    junit = (tmp_path / "g.xml").read_text(encoding="utf-8")
    assert_inert(junit)
    code, _, err = cli(["report", str(run), "--format", "html", "-o", str(tmp_path / "r.html")])
    assert code == 0, err
    page = (tmp_path / "r.html").read_text(encoding="utf-8")
    assert not CONTROLS.search(page.replace("\n", "")), CONTROLS.findall(page)[:5]
    assert "wrapped" in page
