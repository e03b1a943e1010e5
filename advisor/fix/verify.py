"""`advisor fix --verify`: run the original script and the fixed copies without the profiler,
alternating, and compare the step times with what each finding promised.

Each variant (the original, each placed fix alone, and all of them together when there are
several) runs `rounds` times (2 by default), in turn: original, fix 1, ..., original, fix 1,
... so that a machine that gets busier or quieter during the measurement shifts every variant
alike. The fixed copies are kept in a temp folder and each runs as the script itself (its
`__file__`, folder on sys.path and working directory), so a script that reads files beside
itself runs fixed as it runs unfixed, and nothing is written beside it. A run is timed by advisor.fix.clock: `warmup` steps are dropped, the next `steps` are
kept; its figure is their median. A fix's saving is the original's median step minus the
fixed copy's, over all the kept steps of their runs; its spread is the range of the saving
round by round (each round's original run against the same round's fixed run).

A promise is judged as a share of the step: the finding's saving was measured on the
profiled window, whose steps are longer than unprofiled ones (the profiler's own cost), so
`promised_share` is set against the measured saving over the original's step. Kept: the
measured share is at least half the promised one and every round saved time; else missed.

The record written with it is an `advisor/baseline/v1` document for the fixed script (its
unprofiled step times; the findings the fixes did not address; the run's device and
versions), which `advisor gate --baseline FILE` reads like any baseline, with the
verification itself under `verify` (schema docs/schemas/verify.schema.json).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from advisor.version import __version__
from advisor.errors import InputError
from advisor.fix import FixResult, Plan
from advisor.gate.record import Environment, FindingRecord, RunRecord

KEPT_SHARE = 0.5  # a promise is kept when at least this share of it is measured
ALL = "all fixes"
# `advisor fix --verify`'s exit status: every promise kept; a fix missed its promise (every
# run ran); a run failed (the original or a fixed copy did not run its steps).
EXIT_KEPT, EXIT_MISSED, EXIT_FAILED = 0, 1, 4


@dataclass
class Timed:
    variant: str
    round: int
    step_times_ms: list[float]  # the kept steps (after the warm-up)
    wall_s: float
    error: str = ""

    @property
    def median_ms(self) -> float:
        return statistics.median(self.step_times_ms) if self.step_times_ms else math.nan


@dataclass
class FixVerdict:
    rule: str
    fix: str
    safety: str
    promised_ms: float | None
    promised_share: float | None
    original_ms: float
    fixed_ms: float
    saving_ms: float
    saving_share: float
    round_savings_ms: list[float]
    verdict: str  # kept | missed | failed
    why: str = ""

    @property
    def spread_ms(self) -> float:
        return (max(self.round_savings_ms) - min(self.round_savings_ms)) / 2 if self.round_savings_ms else math.nan


@dataclass
class Verification:
    script: str
    steps: int
    warmup: int
    rounds: int
    runs: list[Timed] = field(default_factory=list)
    fixes: list[FixVerdict] = field(default_factory=list)

    def steps_of(self, variant: str) -> list[float]:
        return [t for r in self.runs if r.variant == variant for t in r.step_times_ms]

    def to_dict(self) -> dict[str, Any]:
        return {
            "script": self.script,
            "steps": self.steps,
            "warmup": self.warmup,
            "rounds": self.rounds,
            "kept_share": KEPT_SHARE,
            "runs": [{"variant": r.variant, "round": r.round, "median_ms": _num(r.median_ms), "step_times_ms": r.step_times_ms, "wall_s": round(r.wall_s, 3), "error": r.error} for r in self.runs],
            "fixes": [{**{k: _num(v) if isinstance(v, float) else v for k, v in asdict(f).items()}, "spread_ms": _num(f.spread_ms)} for f in self.fixes],
        }


def _num(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else round(float(x), 4)


def time_script(path: Path, args: list[str], warmup: int, steps: int, source: Path | None, timeout_s: float) -> tuple[list[float], float, str]:
    """One run of the script under the step clock: (kept step times, wall seconds, error or "").
    SOURCE, where given, is the code that runs as the script (a fixed copy kept elsewhere): it
    runs as PATH itself, with PATH's `__file__`, folder on sys.path and `sys.argv[0]`.

    The run ends when the script's process ends: its stderr goes to a file, not a pipe (a
    process it forked, a logger or a watchdog, would hold a pipe open until the timeout), and
    it runs in a session of its own, whose processes still there then are ended (they would
    share the machine with the next run), as are those that left it (`setsid`, a daemon's double
    fork): on Linux the advisor adopts them while the run lasts (`_adopting_orphans`)."""
    with tempfile.TemporaryDirectory(prefix="advisor-clock-") as tmp, _adopting_orphans() as adopted:
        result = Path(tmp) / "clock.json"
        cmd = [sys.executable, "-m", "advisor.fix.clock", str(result), str(warmup), str(steps), str(source or "-"), str(path), *args]
        started = time.perf_counter()
        with open(Path(tmp) / "stderr.txt", "w+b") as err_file:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err_file, start_new_session=True)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                return [], time.perf_counter() - started, f"did not finish {warmup + steps} steps in {timeout_s:g} s (--timeout)"
            finally:
                _end_session(proc)
                adopted.end()
            wall = time.perf_counter() - started
            err_file.seek(0, 2)
            err_file.seek(max(0, err_file.tell() - 64 * 1024))
            stderr = err_file.read().decode("utf-8", "replace")
        if not result.exists():
            tail = stderr.strip().splitlines()[-1:] or [f"exit code {proc.returncode}"]
            return [], wall, tail[0][:300]
        doc = json.loads(result.read_text())
    times = [float(t) for t in doc.get("step_times_ms") or []][warmup:]
    if proc.returncode != 0 or len(times) < steps:
        tail = stderr.strip().splitlines()[-1:] or [f"exit code {proc.returncode}"]
        why = tail[0][:300] if proc.returncode else f"the script ended after {len(times) + warmup} steps, fewer than the {warmup + steps} asked for"
        return times, wall, why
    return times, wall, ""


# prctl(2): a process marked so adopts its orphaned descendants (they would go to init).
PR_SET_CHILD_SUBREAPER = 36


class _Adopted:
    """The run's descendants that outlived it and came to the advisor (see `_adopting_orphans`)."""

    def __init__(self, active: bool) -> None:
        self.active = active
        self.before = _children() if active else set()  # the advisor's own children, left alone

    def end(self) -> None:
        """Kills and reaps each adopted process; a killed one's own children come next, until
        none is left (a bounded number of passes: a fork bomb is not chased forever)."""
        for _ in range(64):
            strays = _children() - self.before if self.active else set()
            if not strays:
                return
            for pid in strays:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            for pid in strays:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)


def _children() -> set[int]:
    """This process's children, from /proc (their parent id is the 4th field of stat)."""
    me, out = os.getpid(), set()
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as f:
                    if int(f.read().rsplit(b")", 1)[1].split()[1]) == me:
                        out.add(int(entry.name))
            except (OSError, ValueError, IndexError):
                continue
    return out


@contextlib.contextmanager
def _adopting_orphans():
    """Linux: the advisor adopts what a run leaves behind, even a process that left the run's
    session, for as long as the run lasts, so it can end it. Elsewhere (or where prctl is
    refused) only the session is ended."""
    libc = None
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
                libc = None
        except (OSError, AttributeError):
            libc = None
    try:
        yield _Adopted(libc is not None)
    finally:
        if libc is not None:
            libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def _end_session(proc: subprocess.Popen) -> None:
    """End every process of the run's session (the script, and what it forked that is still
    there); the script itself is waited for, so no zombie is left."""
    if hasattr(os, "killpg"):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    elif proc.poll() is None:
        proc.kill()
    proc.wait()


def verify(
    plan: Plan,
    args: list[str],
    steps: int,
    warmup: int,
    rounds: int = 2,
    timeout_s: float = 900,
    say: Callable[[str], None] = lambda line: None,
) -> Verification:
    placed = plan.placed
    if not placed:
        raise InputError(plan.script.path, "nothing to verify: no fix was placed in the script")
    path = plan.script.path
    variants: dict[str, bytes] = {r.rule: plan.fixed_bytes([r.rule]) for r in placed}  # each compiles, or InputError
    if len(placed) > 1:
        variants[ALL] = plan.fixed_bytes()
    out = Verification(str(path), steps, warmup, rounds)
    # The fixed copies are kept in a temp folder (nothing is written beside the script) and
    # each runs as the script itself: its `__file__`, its folder first on sys.path.
    with tempfile.TemporaryDirectory(prefix="advisor-fix-") as tmp:
        copies: dict[str, Path] = {}
        for i, (name, data) in enumerate(variants.items()):
            copies[name] = Path(tmp) / f"v{i}.py"
            copies[name].write_bytes(data)
        for k in range(rounds):
            for name in ["original", *variants]:
                times, wall, error = time_script(path, args, warmup, steps, None if name == "original" else copies[name], timeout_s)
                run = Timed(name, k + 1, times, wall, error)
                out.runs.append(run)
                say(f"round {k + 1}/{rounds} {name}: " + (f"median step {run.median_ms:.1f} ms over {len(times)} steps ({wall:.0f} s)" if not error else f"failed: {error}"))
    for r in placed:
        out.fixes.append(judge(out, r))
    return out


def judge(v: Verification, r: FixResult) -> FixVerdict:
    base_runs = [x for x in v.runs if x.variant == "original"]
    fixed_runs = [x for x in v.runs if x.variant == r.rule]
    failed = next((x.error for x in base_runs + fixed_runs if x.error), "")
    original = statistics.median(v.steps_of("original")) if v.steps_of("original") else math.nan
    fixed = statistics.median(v.steps_of(r.rule)) if v.steps_of(r.rule) else math.nan
    saving = original - fixed
    share = saving / original if original > 0 else math.nan
    rounds = [b.median_ms - f.median_ms for b, f in zip(base_runs, fixed_runs, strict=False) if math.isfinite(b.median_ms - f.median_ms)]
    verdict_args = dict(rule=r.rule, fix=r.fix, safety=r.safety, promised_ms=r.promised_ms, promised_share=r.promised_share, original_ms=original, fixed_ms=fixed, saving_ms=saving, saving_share=share, round_savings_ms=rounds)
    if failed:
        return FixVerdict(**verdict_args, verdict="failed", why=failed)
    promised = r.promised_share if r.promised_share is not None else math.nan
    if not math.isfinite(promised) or promised <= 0:
        ok = bool(rounds) and min(rounds) > 0
        return FixVerdict(**verdict_args, verdict="kept" if ok else "missed", why="no promised share: judged on whether every round saved time")
    ok = math.isfinite(share) and share >= KEPT_SHARE * promised and bool(rounds) and min(rounds) > 0
    why = f"measured {100 * share:.0f}% of the step against {100 * promised:.0f}% promised" if math.isfinite(share) else "no steps measured"
    if math.isfinite(share) and share >= KEPT_SHARE * promised and rounds and min(rounds) <= 0:
        why += "; a round saved nothing"
    return FixVerdict(**verdict_args, verdict="kept" if ok else "missed", why=why)


def table_lines(v: Verification) -> list[str]:
    rows = [("fix", "safety", "promised", "original ms", "fixed ms", "measured saving", "verdict")]
    for f in v.fixes:
        promised = "-" if f.promised_ms is None else f"{f.promised_ms:.1f} ms ({100 * (f.promised_share or 0):.0f}%)"
        measured = "-" if not math.isfinite(f.saving_ms) else f"{f.saving_ms:.1f} ± {f.spread_ms:.1f} ms ({100 * f.saving_share:.0f}%)"
        rows.append((f.rule, f.safety, promised, _ms(f.original_ms), _ms(f.fixed_ms), measured, f.verdict))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(widths[i]) for i, c in enumerate(row)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for f in v.fixes:
        if f.why:
            lines.append(f"{f.rule}: {f.verdict}: {f.why}")
    return lines


def _ms(x: float) -> str:
    return "-" if not math.isfinite(x) else f"{x:.1f}"


def exit_status(v: Verification) -> int:
    """EXIT_FAILED where any run failed, else EXIT_MISSED where a fix missed, else EXIT_KEPT."""
    if any(r.error for r in v.runs) or any(f.verdict == "failed" for f in v.fixes):
        return EXIT_FAILED
    return EXIT_MISSED if any(f.verdict != "kept" for f in v.fixes) else EXIT_KEPT


def _recorded_variant(v: Verification) -> str:
    return ALL if any(r.variant == ALL for r in v.runs) else v.fixes[0].rule


def record_gap(v: Verification) -> str:
    """Why no record can be written (the fixed copy it is of has no clean runs), or ""."""
    variant = _recorded_variant(v)
    runs = [r for r in v.runs if r.variant == variant]
    bad = next((r for r in runs if r.error or not r.step_times_ms), None)
    if bad is None and runs:
        return ""
    what = "the fixed copy" if variant != ALL else "the copy with all the fixes"
    return f"{what} did not run its steps ({bad.error if bad is not None and bad.error else 'no steps measured'})"


def record(v: Verification, plan: Plan, findings: list[dict], environment: Environment) -> dict[str, Any]:
    """The baseline document of the fixed script, with the verification under `verify`."""
    fixed = {f.rule for f in v.fixes}
    variant = _recorded_variant(v)
    if record_gap(v):
        raise ValueError(f"no record of a verification whose fixed copy did not run: {record_gap(v)}")
    open_findings = [
        FindingRecord(rule=str(f.get("rule")), severity=str(f.get("severity") or "low"), title=str(f.get("title") or ""), saving_ms=f.get("saving_ms"), saving_share=f.get("saving_share", f.get("saving_pct")), message=str(f.get("message") or ""))
        for f in findings
        if f.get("rule") not in fixed
    ]
    rec = RunRecord(
        source=str(plan.script.path),
        run=f"{plan.script.path.stem} fixed ({', '.join(sorted(fixed))})",
        step_times_ms=v.steps_of(variant) or None,
        breakdown_ms={},
        gpu_utilization=None,
        peak_memory_bytes=None,
        findings=open_findings,
        environment=environment,
        advisor_version=__version__,
        kind="baseline",
    )
    doc = rec.to_baseline()
    doc["verify"] = v.to_dict()
    return doc
