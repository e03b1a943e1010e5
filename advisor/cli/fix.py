"""`advisor fix`: write the change each finding asks for, and measure it on the user's own run.

    advisor fix train.py                          # the diff of the safe fixes, on stdout
    advisor fix train.py --select dataloader-stall --write
    advisor fix train.py --unsafe-fixes           # also TF32, bf16 autocast, torch.compile, ...
    advisor fix train.py --verify --steps 30 -o fix.json -- --lr 0.1

The findings come from the script's last `advisor profile` in this folder (the newest
advisor_runs/<script>-<time>/ whose facts name the same script, run with the same
OMP_NUM_THREADS and, where arguments are given after `--`, the same arguments), from
`--from LOGDIR`, or from a new profile when there is none. What each fix did goes to stderr; the diff, or the
verification table, to stdout. A fix promises what applying it alone saves (the finding's
saving alone, else its ranked saving). A finding whose fix gains nothing on the run (listed
as considered in the report) is fixed only when --select names it, and the result says so.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import List, Optional

import typer

from advisor.errors import InputError
from advisor.terminal_text import path_text


def fix(
    ctx: typer.Context,
    script: Path = typer.Argument(..., help="The training script to fix (its own arguments go after `--`)."),
    select: List[str] = typer.Option([], "--select", help="Only these rules' fixes (repeatable, or comma-separated: a,b); also a finding whose fix gains nothing on the run."),
    diff: bool = typer.Option(False, "--diff", help="Print the unified diff (the default)."),
    write: bool = typer.Option(False, "--write", help="Edit the script in place, keeping the original as SCRIPT.orig."),
    unsafe_fixes: bool = typer.Option(False, "--unsafe-fixes", help="Also the fixes that change numerics: TF32, bf16 autocast, torch.compile, channels-last, a larger batch."),
    force: bool = typer.Option(False, "--force", help="--write even when git shows uncommitted changes in the script, or SCRIPT.orig exists."),
    from_run: Optional[Path] = typer.Option(None, "--from", help="The log dir (or trace) whose findings to fix (default: the script's last `advisor profile`, else a new one)."),
    verify: bool = typer.Option(False, "--verify", help="Run the original and the fixed copy without the profiler, alternating, and compare with each promise."),
    steps: int = typer.Option(20, "--steps", min=1, help="--verify: steps timed per run, after the warm-up."),
    warmup: int = typer.Option(5, "--warmup", min=0, help="--verify: steps dropped at the start of each run."),
    rounds: int = typer.Option(2, "--rounds", min=1, help="--verify: runs of each variant."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="--verify: write the record (a baseline `advisor gate` reads) to this file."),
) -> None:
    """Write the code change each finding asks for (a diff by default), and --verify it."""
    from advisor.cli import rule_ids, say, stderr_console

    args = list(ctx.args) if ctx is not None else []
    if args[:1] == ["--"]:
        args = args[1:]
    if diff and write:
        raise InputError(None, "--diff and --write: choose one")
    if verify and write:
        raise InputError(None, "--verify measures fixed copies and leaves the script as it is; run --write once it has measured")
    if output is not None and not verify:
        raise InputError(output, "-o writes the record of --verify; add --verify (the diff goes to stdout, --write edits the script)")
    if not script.exists():
        raise InputError(script, "no such file")
    if not script.is_file():
        raise InputError(script, "not a Python script")
    chosen = rule_ids(select)
    _check_rules(chosen)
    if write and not force:
        refuse_unsafe_write(script)  # before any work: the answer is the same either way
    err = stderr_console()

    analysis, where = findings_source(script, from_run, args, lambda line: say(err, f"advisor: {line}"))
    report = analysis.to_dict()
    findings = report["findings"]
    say(err, f"advisor: findings from {path_text(where)}")

    from advisor.fix import baseline_step_ms, plan_fixes

    plan = plan_fixes(
        script, findings, select=chosen or None, unsafe=unsafe_fixes, considered=report.get("considered") or [], step_ms=baseline_step_ms(report)
    )
    for line in result_lines(plan):
        say(err, line)
    if verify:
        _verify(plan, findings, analysis, args, steps, warmup, rounds, output, lambda line: say(err, f"advisor: {line}"))
        return
    if not plan.changed:
        say(err, "advisor: nothing to change")
        return
    if write:
        write_fixed(script, plan.fixed_text(), force)
        say(err, f"advisor: wrote {path_text(script)} (the original is {path_text(orig_path(script))})")
        return
    sys.stdout.write(plan.diff())


def _check_rules(chosen: list[str]) -> None:
    if not chosen:
        return
    from advisor.engine import all_rules

    known = {r.id for r in all_rules(None)}
    unknown = [c for c in chosen if c not in known]
    if unknown:
        raise InputError(None, f"--select: no rule {unknown[0]!r} (see `advisor rules`)")


def result_lines(plan) -> list[str]:
    out = []
    for r in plan.results:
        promise = f" (promised {r.promised_ms:.1f} ms/step)" if isinstance(r.promised_ms, (int, float)) else ""
        safety = f" [{r.safety}]" if r.safety else ""
        out.append(f"{r.rule}{safety}: {r.status}: {r.detail}{promise}")
        if r.note:
            out.append(f"    note: {r.note}")
    return out


def orig_path(script: Path) -> Path:
    return script.with_name(script.name + ".orig")


def write_fixed(script: Path, text: str, force: bool) -> None:
    """Edit in place, keeping SCRIPT.orig; refuse a file git shows as changed, unless forced."""
    if not force:
        refuse_unsafe_write(script)
    from advisor.render.output import write_atomically

    original = script.read_bytes()
    try:
        orig_path(script).write_bytes(original)
        write_atomically(script, text)  # whole or not at all, with the file's own permissions
    except OSError as exc:
        raise InputError(script, f"cannot write: {exc.strerror or exc}") from None


def refuse_unsafe_write(script: Path) -> None:
    if _git_dirty(script):
        raise InputError(script, "has uncommitted changes (git status); commit them first, or pass --force")
    if orig_path(script).exists():
        raise InputError(orig_path(script), "already exists; move it away, or pass --force to replace it")


def _git_dirty(script: Path) -> bool:
    try:
        proc = subprocess.run(
            ["git", "status", "--porcelain", "--", script.name], cwd=script.resolve().parent, capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return False  # no git: nothing to protect beyond SCRIPT.orig
    return proc.returncode == 0 and bool(proc.stdout.strip())


def last_profile(script: Path, args: list[str] | None = None, runs_dir: Path | None = None) -> Path | None:
    """The newest log dir of `advisor profile` (./advisor_runs/<stem>-<time>/) for this script,
    run as now: with the same script arguments where any are given, and the same
    OMP_NUM_THREADS (the thread count the findings about cores were made for)."""
    import os

    from advisor.cli.profile import RUNS_DIR
    from advisor.facts import read_facts

    base = runs_dir or RUNS_DIR
    if not base.is_dir():
        return None
    mine = script.resolve()
    threads_now = os.environ.get("OMP_NUM_THREADS")
    found = []
    for d in base.glob(f"{script.stem}-*"):
        facts = d / "advisor_facts.json"
        try:
            doc = read_facts(facts)  # never a FIFO, a device or gigabytes
            recorded, argv = doc.get("script"), doc.get("argv")
            threads = (doc.get("torch_threads") or {}).get("omp_num_threads_env")
        except (OSError, ValueError, AttributeError):
            continue
        if not (isinstance(recorded, str) and Path(recorded).resolve() == mine):
            continue
        if args and not (isinstance(argv, list) and argv[1:] == args):
            continue
        if threads != threads_now:
            continue
        if any(p.name.endswith((".pt.trace.json", ".pt.trace.json.gz")) for p in d.iterdir()):
            found.append((facts.stat().st_mtime, d))
    return max(found)[1] if found else None


def findings_source(script: Path, from_run: Optional[Path], args: list[str], note):
    """(analysis, where): the run whose findings are fixed."""
    from advisor.analysis import analyze

    where = from_run or last_profile(script, args)
    if where is None:
        where = new_profile(script, args, note)
    return analyze(where), where


def new_profile(script: Path, args: list[str], note) -> Path:
    """A new `advisor profile` of the script, into ./advisor_runs/<script>-<time>/ (its report
    is advisor_report.json there). The run is stopped after the recorded window, as `advisor
    profile` stops it (exit 124: the findings need no more of it), or ends by itself (exit 0)."""
    from advisor.cli.profile import EXIT_STOPPED, has_traces, prepare_out_dir

    out = prepare_out_dir(None, script.stem)
    note(f"no earlier profile of {path_text(script)} here: profiling it now → {path_text(out)}")
    cmd = [sys.executable, "-m", "advisor.cli.profile_main", "--out", str(out), "-o", str(out / "advisor_report.json"), str(script), "--", *args]
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if proc.returncode not in (0, EXIT_STOPPED) or not has_traces(out):
        last = (proc.stderr or "").strip().splitlines()[-1:] or [f"exit code {proc.returncode}"]
        raise InputError(script, f"the profile run failed ({last[0][:200]}); run `advisor profile {script}` to see why")
    return out


def _verify(plan, findings, analysis, args, steps, warmup, rounds, output, note) -> None:
    from advisor.fix.verify import record, table_lines, verify
    from advisor.gate.record import environment_of
    from advisor.render.output import to_json_text

    v = verify(plan, args, steps=steps, warmup=warmup, rounds=rounds, say=note)
    sys.stdout.write("\n".join(table_lines(v)) + "\n")
    if output is not None:
        from advisor.render.output import refuse_overwriting_inputs, write_atomically

        doc = record(v, plan, findings, environment_of(analysis))
        refuse_overwriting_inputs(output, [plan.script.path])
        try:
            write_atomically(output, to_json_text(doc))
        except OSError as exc:
            raise InputError(output, f"cannot write: {exc.strerror or exc}") from None
        note(f"wrote {path_text(output)} (a baseline for `advisor gate --baseline {path_text(output)}`)")
