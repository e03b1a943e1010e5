"""`advisor fix`: write the change each finding asks for, and measure it on the user's own run.

    advisor fix train.py                          # the diff of the safe fixes, on stdout
    advisor fix train.py --select dataloader-stall --write
    advisor fix train.py --unsafe-fixes           # also TF32, bf16 autocast, torch.compile, ...
    advisor fix train.py --verify --steps 30 -o fix.json -- --lr 0.1
    advisor fix train.py --verify --timeout 120     # a run still going after 120 s has failed

The findings come from the script's last `advisor profile` in this folder (the newest
advisor_runs/<script>-<time>/ whose facts name the same script, run with the same
OMP_NUM_THREADS and, where arguments are given after `--`, the same arguments), from
`--from LOGDIR`, or from a new profile when there is none. What each fix did goes to stderr; the diff, or the
verification table, to stdout. A fix promises what applying it alone saves (the finding's
saving alone, else its ranked saving). A finding whose fix gains nothing on the run (listed
as considered in the report) is fixed only when --select names it, and the result says so.

Exit status: 0 done (a diff, a write, nothing to change, every verified fix kept); with
--verify, 1 when a fix missed its promise and 4 when a run failed; 2 bad input, a refused
write, or a fixed script that would not compile (one line).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path
from typing import List, Optional

import typer

from advisor.errors import InputError
from advisor.terminal_text import path_text

VERIFY_TIMEOUT_S = 900.0  # --verify: a run still going after this long is stopped (--timeout)


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
    timeout: Optional[float] = typer.Option(
        None, "--timeout", help=f"--verify: seconds a run may take before it is stopped and counted as failed (default {VERIFY_TIMEOUT_S:g})."
    ),
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
    if timeout is not None and not verify:
        raise InputError(None, "--timeout limits each run of --verify; add --verify")
    if timeout is not None and not (math.isfinite(timeout) and timeout > 0):
        raise InputError(None, f"--timeout {timeout:g}: expected a number of seconds above 0")
    if not script.exists():
        raise InputError(script, "no such file")
    if not script.is_file():
        raise InputError(script, "not a Python script")
    chosen = rule_ids(select)
    _check_rules(chosen)
    err = stderr_console()
    note = lambda line: say(err, f"advisor: {line}")  # noqa: E731

    if write and not force and from_run is None and last_profile(script, args) is None:
        refuse_unsafe_write(script)  # before profiling it: the answer is the same either way
    analysis, where = findings_source(script, from_run, args, note)
    report = analysis.to_dict()
    findings = report["findings"]
    if output is not None:
        from advisor.output import refuse_overwriting_inputs

        refuse_overwriting_inputs(output, [script])  # before the measurement, not after it

    from advisor.fix import baseline_step_ms, plan_fixes

    plan = plan_fixes(
        script, findings, select=chosen or None, unsafe=unsafe_fixes, considered=report.get("considered") or [], step_ms=baseline_step_ms(report)
    )
    fixed = plan.fixed_bytes() if plan.changed else None  # compiles, or one line and exit 2: never broken code
    if write and not force and plan.changed:
        refuse_unsafe_write(script)  # one line, before anything else is said
    say(err, f"advisor: findings from {path_text(where)}")
    for line in result_lines(plan):
        say(err, line)
    if verify:
        code = _verify(plan, findings, analysis, args, steps, warmup, rounds, timeout or VERIFY_TIMEOUT_S, output, note)
        if code:
            raise SystemExit(code)  # SystemExit: typer.Exit is swallowed by a non-standalone app
        return
    from advisor.fix.files import orig_path

    if not plan.changed:
        said = f"nothing to change: {_why_unchanged(plan)}"
        if write:
            kept = f"; {path_text(orig_path(script))} is left as it is" if os.path.lexists(orig_path(script)) else ""
            said += f"; {path_text(script)} is not written{kept}"
        note(said)
        return
    assert fixed is not None
    if write:
        write_fixed(plan, fixed, force)
        note(f"wrote {path_text(script)} (the original is {path_text(orig_path(script))})")
        return
    sys.stdout.write(plan.diff())


def _why_unchanged(plan) -> str:
    """Why a plan changes nothing: the script already has the fixes (a fixed script fixed
    again), or none could be written (each result above says why)."""
    from advisor.fix import DONE

    done = [r.rule for r in plan.results if r.status == DONE]
    others = [r for r in plan.results if r.status != DONE]
    if done and not others:
        return f"the script already has every fix asked for ({', '.join(done)})"
    if done:
        return f"the script already has {', '.join(done)}; no other fix is written (each says why above)"
    return "no fix is written (each says why above)" if plan.results else "no finding of the run has a fix to write"


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


def write_fixed(plan, fixed: bytes, force: bool) -> None:
    """Edit in place, keeping SCRIPT.orig (advisor.fix.files); refuse a file git shows as
    changed, or a script changed on disk since it was read, unless forced."""
    from advisor.fix.files import keep_original, write_script

    script = plan.script.path
    if not force:
        refuse_unsafe_write(script)
    original = plan.script.encode(plan.script.text)
    try:
        now = script.read_bytes()
    except OSError as exc:
        raise InputError(script, f"cannot read the script: {exc.strerror or exc}") from None
    if now != original:
        raise InputError(script, "changed on disk while it was being fixed; run the command again")
    keep_original(script, original, force)
    write_script(script, fixed)  # whole or not at all, with the file's own permissions


def refuse_unsafe_write(script: Path) -> None:
    from advisor.fix.files import git_dirty, orig_path

    if git_dirty(script):
        raise InputError(script, "has uncommitted changes (git status); commit them first, or pass --force")
    if os.path.lexists(orig_path(script)):
        raise InputError(orig_path(script), "already exists; move it away, or pass --force to replace it")


def last_profile(script: Path, args: list[str] | None = None, runs_dir: Path | None = None, passed_over: list[str] | None = None) -> Path | None:
    """The newest log dir of `advisor profile` (./advisor_runs/<stem>-<time>/) for this script,
    run as now: with the same script arguments where any are given, and the same
    OMP_NUM_THREADS (the thread count the findings about cores were made for). The newest
    profile of the script that is passed over for that is said, with why, in PASSED_OVER.

    A facts file is read only when it is a small regular file (advisor.fix.files): a FIFO or
    a device in a run folder is passed over, never opened for reading."""
    from advisor.cli.profile import RUNS_DIR
    from advisor.facts import read_facts

    base = runs_dir or RUNS_DIR
    if not base.is_dir():
        return None
    mine = script.resolve()
    threads_now = os.environ.get("OMP_NUM_THREADS")
    found, other = [], []
    for d in base.glob(f"{script.stem}-*"):
        facts = d / "advisor_facts.json"
        try:
            doc = read_facts(facts)  # never a FIFO, a device or gigabytes
            recorded, argv = doc.get("script"), doc.get("argv")
            threads = (doc.get("torch_threads") or {}).get("omp_num_threads_env")
            mtime = facts.stat().st_mtime
            traced = any(p.name.endswith((".pt.trace.json", ".pt.trace.json.gz")) for p in d.iterdir())
        except (OSError, ValueError, AttributeError, TypeError):
            continue
        if not (isinstance(recorded, str) and Path(recorded).resolve() == mine) or not traced:
            continue
        if args and not (isinstance(argv, list) and argv[1:] == args):
            shown = " ".join(map(str, argv[1:])) if isinstance(argv, list) else "unknown"
            other.append((0, mtime, d, f"with the arguments `{shown or '(none)'}`, not `{' '.join(args)}`"))
        elif threads != threads_now:  # the same arguments: the closer one, said first
            other.append((1, mtime, d, f"with OMP_NUM_THREADS={_shown(threads)}, and it is {_shown(threads_now)} now"))
        else:
            found.append((mtime, d))
    if not found and other and passed_over is not None:
        *_, d, why = max(other, key=lambda o: (o[0], o[1]))
        passed_over.append(f"{path_text(d)} was profiled {why}")
    return max(found)[1] if found else None


def _shown(threads: object) -> str:
    return "unset" if threads is None else str(threads)


def findings_source(script: Path, from_run: Optional[Path], args: list[str], note):
    """(analysis, where): the run whose findings are fixed."""
    from advisor.analysis import analyze

    passed_over: list[str] = []
    where = from_run or last_profile(script, args, passed_over=passed_over)
    if where is None:
        where = new_profile(script, args, note, passed_over[0] if passed_over else None)
    return analyze(where), where


def new_profile(script: Path, args: list[str], note, why: str | None = None) -> Path:
    """A new `advisor profile` of the script, into ./advisor_runs/<script>-<time>/ (its report
    is advisor_report.json there). The run is stopped after the recorded window, as `advisor
    profile` stops it (exit 0: the findings need no more of it), or ends by itself (its own status).
    WHY: the earlier profile passed over, and why, said on the same line."""
    from advisor.cli.profile import EXIT_STOPPED, has_traces, prepare_out_dir

    out = prepare_out_dir(None, script.stem)
    if why:
        note(f"profiling {path_text(script)} again, since {why} → {path_text(out)}")
    else:
        note(f"no earlier profile of {path_text(script)} here: profiling it now → {path_text(out)}")
    cmd = [sys.executable, "-m", "advisor.cli.profile_main", "--out", str(out), "-o", str(out / "advisor_report.json"), str(script), "--", *args]
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if proc.returncode not in (0, EXIT_STOPPED) or not has_traces(out):
        last = (proc.stderr or "").strip().splitlines()[-1:] or [f"exit code {proc.returncode}"]
        raise InputError(script, f"the profile run failed ({last[0][:200]}); run `advisor profile {script}` to see why")
    return out


def _verify(plan, findings, analysis, args, steps, warmup, rounds, timeout_s, output, note) -> int:
    """Measure, print the table, write the record where asked; the exit status
    (advisor.fix.verify.exit_status: 0 every promise kept, 1 one missed, 4 a run failed)."""
    from advisor.fix.verify import exit_status, record, record_gap, table_lines, verify
    from advisor.gate.record import environment_of
    from advisor.output import to_json_text

    v = verify(plan, args, steps=steps, warmup=warmup, rounds=rounds, timeout_s=timeout_s, say=note)
    sys.stdout.write("\n".join(table_lines(v)) + "\n")
    if output is not None:
        from advisor.files import write_atomically
        from advisor.output import refuse_overwriting_inputs

        gap = record_gap(v)
        if gap:
            note(f"no record written to {path_text(output)}: {gap}")
        else:
            doc = record(v, plan, findings, environment_of(analysis))
            refuse_overwriting_inputs(output, [plan.script.path])
            try:
                write_atomically(output, to_json_text(doc), make_parents=True)  # a record, made as the gate's are
            except OSError as exc:
                raise InputError(output, f"cannot write: {exc.strerror or exc}") from None
            note(f"wrote {path_text(output)} (a baseline for `advisor gate --baseline {path_text(output)}`)")
    return exit_status(v)
