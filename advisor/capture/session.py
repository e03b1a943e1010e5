"""One capture: run the script under torch.profiler with a step window, then write the facts.

    command.py / launch.py  ->  session.capture()  ->  hooks.Hooks (steps, facts)
                                                   ->  runner.run (the script as __main__)
                                                   ->  facts.write_facts

The profiler is started before the script's first line and advanced at every step end that
the hooks find. Its schedule is `wait / warmup / active / repeat`; when the last active step
ends, torch writes the trace (tensorboard_trace_handler, gzip) and the profiler is stopped;
unless `full`, the run goes on for steps timed without it (at least 5 and 2 s by default, see
`after_done`; they measure the profiler's own cost: advisor.metrics.unprofiled) and is then
stopped on purpose by raising
`StopRun` from the step hook. Whatever way the script ends
(finished, sys.exit, its own exception, Ctrl-C, SIGTERM) the profiler is stopped, which saves
a partly recorded window, the hooks are undone and the facts file is written.

Only the process that started the capture does any of this: a process the script forks runs
the script's code as it would under plain Python (its steps are not counted, and when it
ends, by sys.exit or by running off the end, it exits with Python's exit code; see
runner.run). SIGTERM (a job scheduler's pre-emption) ends the script like Ctrl-C does, so the
recorded steps are kept; one that arrives while torch.profiler writes the trace waits until
the file is complete.

What torch's native code prints on fd 2 while the profiler starts, steps and stops (Kineto's
`USDT: ... profiler_start/stop` lines, the allocator's warning about memory allocated before
the profiler started, which the first free of such a block triggers) goes to
`advisor_profiler.log` (`advisor_profiler.rank<R>.log`) in the log dir instead of the user's terminal. Only those calls of
ours are redirected; the script's own stdout and stderr are never touched. (The allocator
warns again every 1000 such frees; the 1001st in one window reaches the terminal.)

If the script runs its own torch.profiler, ours is stopped without saving when theirs
starts, their trace files are linked (or copied) into the log dir, and the run is not cut.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from advisor.capture.facts import FactsRecorder, facts_file_name, write_facts
from advisor.capture.machine_load import OtherWork
from advisor.capture.progress import Progress, Window, step_span
from advisor.capture.runner import Outcome, Target, Terminated, run
from advisor.capture.streams import own_streams, take_back_streams

# The default stretch timed after the window: at least this many steps and this long, at most
# AFTER_STEPS_MAX steps. The steps right after the trace is written run slower than the run's
# own pace (caches and the allocator settle again): on AdvisorBench's tabular MLP the median of
# the first four was 5% to 23% above that of the 26 that followed, so a short step is timed for
# longer than five of them.
AFTER_STEPS = 5
AFTER_WINDOW_S = 2.0
AFTER_STEPS_MAX = 100


def after_done(after: int, elapsed_s: float, count: int | None, world_size: int) -> bool:
    """Whether `after` steps after the window, `elapsed_s` of step times in all, are enough. With several
    ranks the stretch is a count (every rank must stop at the same step, or one would wait in a
    collective for a rank that has stopped)."""
    if count is not None:
        return after >= count
    if world_size > 1:
        return after >= AFTER_STEPS
    return after >= AFTER_STEPS and (elapsed_s >= AFTER_WINDOW_S or after >= AFTER_STEPS_MAX)


def profiler_log_name(rank: int, world_size: int) -> str:
    return f"advisor_profiler.rank{rank}.log" if world_size > 1 else "advisor_profiler.log"


class StopRun(BaseException):
    """Raised from a step hook once the window is recorded: ends the script on purpose.

    A BaseException, so that the script's `except Exception:` does not swallow it.
    """


@dataclass
class CaptureOptions:
    out_dir: Path
    wait: int = 1
    warmup: int = 3
    active: int = 5
    repeat: int = 1
    full: bool = False
    # steps timed without the profiler after the window before a run that is not `full` is
    # stopped: the first is left out (the trace is written during it), the rest measure the
    # profiler's cost (advisor.metrics.unprofiled needs at least 3). None: at least
    # AFTER_STEPS and AFTER_WINDOW_S (see `after_done`); a count: exactly that many.
    after_steps: int | None = None
    device: str = "cpu"  # resolved: "cpu" | "cuda"
    record_shapes: bool = True
    profile_memory: bool = True
    with_stack: bool | None = None  # None: on, unless the model is compiled before recording starts
    rank: int = 0
    world_size: int = 1
    progress: bool = True

    @property
    def window(self) -> Window:
        return Window(self.wait, self.warmup, self.active, self.repeat)


@dataclass
class CaptureResult:
    target: Target
    options: CaptureOptions
    outcome: Outcome
    steps: int = 0
    step_source: str | None = None
    recorded_steps: list[int] = field(default_factory=list)
    window_complete: bool = False
    traces: list[Path] = field(default_factory=list)
    own_profiler: bool = False
    own_traces: list[str] = field(default_factory=list)
    facts_path: Path | None = None
    wall_time_s: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return self.outcome.exit_code


class _Session:
    def __init__(self, target: Target, options: CaptureOptions) -> None:
        import torch
        from torch.profiler import (
            ProfilerActivity,
            profile,
            schedule,
            tensorboard_trace_handler,
        )

        from advisor.capture.device_clock import DeviceStepClock
        from advisor.capture.hooks import Hooks

        self.torch = torch
        self.target = target
        # Every output path is absolute from here on: the script may os.chdir().
        options.out_dir = Path(os.path.abspath(options.out_dir))
        self.o = options
        self.pid = os.getpid()  # the process that captures; a fork of the script is not it
        self._log_path = options.out_dir / profiler_log_name(options.rank, options.world_size)
        self._in_profiler = 0
        self._pending_terminate = False
        self._allocator_warned = False
        self.window = options.window
        self.facts = FactsRecorder(target.display if target.kind == "module" else target.name, target.argv, options.rank, options.world_size)
        self.hooks = Hooks(self.facts, self.on_step, self.on_profiler_start, self.on_trace_export)
        self.progress = Progress(self.window, enabled=options.progress)
        self.step_times_ms: list[float] = []
        self.loader_wait_ms: list[float] = []  # per step, the time spent in DataLoader.__next__
        self.optimizer_ms: list[float] = []  # per step, the time spent in the optimizer's step
        self.other_work = OtherWork()  # per step, the cores other processes kept busy
        self.device_clock = DeviceStepClock(torch) if options.device == "cuda" else None
        self.window_complete = False
        self.own_profiler = False
        self.own_traces: list[str] = []
        self.our_traces: list[str] = []
        self.notes: list[str] = []
        activities = [ProfilerActivity.CPU]
        if options.device == "cuda":
            activities.append(ProfilerActivity.CUDA)
        worker = f"rank{options.rank}" if options.world_size > 1 else None

        def make_profiler(with_stack: bool, wait: int) -> Any:
            return profile(
                activities=activities,
                schedule=schedule(wait=wait, warmup=options.warmup, active=options.active, repeat=options.repeat),
                on_trace_ready=tensorboard_trace_handler(str(options.out_dir), worker_name=worker, use_gzip=True),
                record_shapes=options.record_shapes,
                profile_memory=options.profile_memory,
                with_stack=with_stack,
            )

        self.make_profiler = make_profiler
        # Whether to record stacks is decided when the wait steps are over, once the script has
        # had the chance to call torch.compile (see _start_late).
        self.start_late = options.with_stack is None and options.wait > 0 and options.repeat == 1
        self.with_stack = True if options.with_stack is None else options.with_stack
        self.prof = None if self.start_late else make_profiler(self.with_stack, options.wait)
        self.profiling = False
        self.profiler_failed = False
        self._last_end = 0.0

    # -- hooks' callbacks -------------------------------------------------------------------
    def on_step(self) -> None:
        if os.getpid() != self.pid:  # a process the script forked: it trains on its own
            return
        now = time.perf_counter()
        self.step_times_ms.append((now - self._last_end) * 1e3)
        self.loader_wait_ms.append(self.hooks.take_loader_wait_ms())
        self.optimizer_ms.append(self.hooks.take_optimizer_ms())
        self.other_work.mark()
        if self.device_clock is not None:
            self.device_clock.mark()
        done = len(self.step_times_ms)
        if done <= self.window.length:
            self.facts.sample_flags()
        if self.start_late and done == self.window.wait and not self.own_profiler:
            self._start_late()
        elif self.profiling:
            try:
                with self._profiler_call():
                    self.prof.step()  # at the window's end this writes the trace
            except Exception as exc:  # ours, not the script's: say it, do not break the run
                self._profiler_failed(exc)
            if self._pending_terminate:
                self._pending_terminate = False
                raise Terminated()
            if done >= self.window.length:
                self.window_complete = True
                if self.o.full or self.o.after_steps != 0:  # nothing more to record: keep only the step clock running
                    self._stop_profiler()
        self.progress.step(done, self.step_times_ms[-1])
        if self.window_complete and not self.o.full and not self.own_profiler:
            after = done - self.window.length
            timed_s = sum(self.step_times_ms[self.window.length:]) / 1e3  # the stretch as the facts record it
            if after_done(after, timed_s, self.o.after_steps, self.o.world_size):
                raise StopRun()
            if after == 0:
                n = self.o.after_steps
                if n is None and self.o.world_size == 1:
                    what = f"at least {AFTER_STEPS} more steps ({AFTER_WINDOW_S:g} s, at most {AFTER_STEPS_MAX})"
                else:
                    n = AFTER_STEPS if n is None else n
                    what = f"{n} more step{'s' if n != 1 else ''}"
                self.progress.say(f"timing {what} without the profiler, to measure its cost")
        self._last_end = time.perf_counter()

    def _start_late(self) -> None:
        """Start the profiler after the wait steps, without Python stacks for a compiled model.

        With torch.compile, every kernel goes through several Python frames of the generated
        wrapper: the stack tracer then costs more than the step itself (a compiled ResNet-18
        step on an H100 measured 2.7x slower with stacks than without the profiler), which
        would make the host look like the bottleneck.
        """
        self.start_late = False
        if self.facts.compile_modes:
            self.with_stack = False
            self.notes.append(
                "Python stacks were not recorded: the script compiled its model (torch.compile), and the stack tracer "
                "would cost more than a compiled step; `advisor profile --stack` records them anyway"
            )
        self.prof = self.make_profiler(self.with_stack, self.window.wait)
        # Go on from where an early start would be, so steps keep their numbers (ProfilerStep#N).
        self.prof.step_num = self.window.wait
        self.prof.current_action = self.prof.schedule(self.prof.step_num)
        try:
            with self._profiler_call():
                self.prof.start()
            self.profiling = True
        except Exception as exc:
            self._profiler_failed(exc)

    def on_profiler_start(self, prof: Any) -> None:
        if prof is self.prof or self.own_profiler or os.getpid() != self.pid:
            return
        if self.window_complete:  # ours is saved already: keep it, leave theirs alone
            self.notes.append("the script started its own profiler after advisor's window; advisor kept its own trace")
            return
        self.own_profiler = True
        if self.profiling:
            self.prof.on_trace_ready = None  # discard what we have: theirs is the profile
            self._stop_profiler()
        self.progress.say(f"{self.target.display} starts its own torch.profiler: advisor does not profile it a second time and will use its trace")
        self.progress.close()
        self.progress.enabled = False

    def on_trace_export(self, prof: Any, path: str) -> None:
        if os.getpid() != self.pid:
            return
        # Absolute now: the script may change its directory before the run ends.
        (self.our_traces if prof is self.prof else self.own_traces).append(os.path.abspath(path))

    # -- what torch prints while our profiler works, and SIGTERM ---------------------------
    @contextmanager
    def _profiler_call(self):
        """Around our own calls into torch.profiler: native output to the log, SIGTERM deferred.

        Kineto prints `USDT: ... profiler_start/stop` on fd 2 while it starts and stops, and
        the CPU allocator warns (on fd 2, the first time and then every 1000th time) when a
        block allocated before recording started is freed during it. fd 2 points at
        the log dir's profiler log for the duration of the call, and one such block is freed inside it, so
        the allocator's first warning is spent here rather than in the middle of the
        script's output.
        """
        self._in_profiler += 1
        enabled = self.torch.autograd._profiler_enabled
        spare = self.torch.empty(4) if self.o.profile_memory and not self._allocator_warned and not enabled() else None
        saved_fd = None
        closed_fd2 = False  # the script closed fd 2: closed again afterwards
        try:
            sys.stderr.flush()
        except Exception:  # a closed or odd stderr: the redirect is only cosmetic
            pass
        try:
            log_fd = os.open(self._log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
        except OSError:
            log_fd = None
        try:
            if log_fd is not None:
                try:
                    saved_fd = os.dup(2)
                except OSError:
                    closed_fd2 = True
                if log_fd != 2:
                    os.dup2(log_fd, 2)
            yield
            if spare is not None and enabled():  # recording started: this free is "of unknown size"
                del spare
                self._allocator_warned = True
        finally:
            if saved_fd is not None:
                os.dup2(saved_fd, 2)
                os.close(saved_fd)
            elif closed_fd2 and log_fd != 2:
                os.close(2)
            if log_fd is not None:
                os.close(log_fd)
            self._in_profiler -= 1

    def on_sigterm(self, signum: int, frame: Any) -> None:
        """SIGTERM ends the script like Ctrl-C, so that the window recorded so far is kept."""
        if os.getpid() != self.pid:  # a forked process of the script: die as it would have
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        if self._in_profiler:  # torch is writing the trace: end once it is complete
            self._pending_terminate = True
            return
        raise Terminated()

    # -- the run ----------------------------------------------------------------------------
    def _stop_profiler(self) -> None:
        if not self.profiling:
            return
        self.profiling = False
        restore = {}
        if threading.current_thread() is threading.main_thread():
            # A 2nd Ctrl-C (or a SIGTERM) while the trace is written must not lose it.
            restore = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            with self._profiler_call():
                self.prof.stop()
        except Exception as exc:
            self._profiler_failed(exc)
        finally:
            for s, handler in restore.items():
                signal.signal(s, handler)

    def _profiler_failed(self, exc: Exception) -> None:
        self.profiling = False
        self.profiler_failed = True
        self.notes.append(f"torch.profiler failed, the trace may be missing: {type(exc).__name__}: {exc}")

    def run(self) -> CaptureResult:
        torch = self.torch
        o = self.o
        if torch.autograd._profiler_enabled():
            self.own_profiler = True
            self.notes.append("a profiler was already running when the script started; advisor did not start another")
        w = self.window
        what = f"profiling {self.target.display} on {o.device}: "
        what += f"skip {w.wait}, warm up {w.warmup}, record {w.active} step{'s' if w.active != 1 else ''}"
        if w.repeat > 1:
            what += f", {w.repeat} times"
        what += f" → {o.out_dir}"
        self.progress.begin(what)
        started = time.perf_counter()
        self.hooks.install()
        on_main_thread = threading.current_thread() is threading.main_thread()
        saved_sigterm = signal.signal(signal.SIGTERM, self.on_sigterm) if on_main_thread else None
        try:
            if not self.own_profiler and self.prof is not None:
                with self._profiler_call():
                    self.prof.start()
                self.profiling = True
            self._last_end = time.perf_counter()
            outcome = run(self.target, on_purpose=(StopRun,), owner_pid=self.pid)
        finally:
            if os.getpid() == self.pid:  # (a forked process of the script leaves by SystemExit)
                self.progress.close()
                try:
                    self._stop_profiler()
                finally:
                    self.hooks.uninstall()
                    if on_main_thread:
                        signal.signal(signal.SIGTERM, saved_sigterm if saved_sigterm is not None else signal.SIG_DFL)
        self._drop_empty_log()
        if outcome.how == "stopped":
            self._release_process_group()
        wall = time.perf_counter() - started
        result = CaptureResult(
            target=self.target,
            options=o,
            outcome=outcome,
            steps=len(self.step_times_ms),
            step_source=self.hooks.source,
            recorded_steps=[] if (self.own_profiler or self.profiler_failed) else w.recorded(len(self.step_times_ms)),
            window_complete=self.window_complete,
            own_profiler=self.own_profiler,
            own_traces=list(dict.fromkeys(self.own_traces)),
            wall_time_s=wall,
            notes=self.notes,
        )
        if self.hooks.switched_source:
            what = {"forward": "model calls", "dataloader": "DataLoader batches", "optimizer": "optimizer steps"}
            first = {"dataloader": "DataLoader batch", "optimizer": "optimizer step"}
            self.notes.append(
                f"steps were counted from {what[self.hooks.switched_from or 'dataloader']} until the first "
                f"{first[self.hooks.source]}, then from {what[self.hooks.source]}"
            )
        if self.hooks.source == "forward":
            self.notes.append(
                "no optimizer and no DataLoader: each step is one iteration of the loop that calls the model "
                "(from one call of the model to the next); the run is recorded as inference"
            )
        result.traces = self._bring_in_own_traces(result) if self.own_profiler else self._our_traces()
        result.facts_path = self._write_facts(result)
        return result

    def _device_step_times(self) -> list[float | None] | None:
        times = self.device_clock.step_times_ms() if self.device_clock is not None else None
        return None if times is None else [None if t is None else round(t, 3) for t in times]

    def _drop_empty_log(self) -> None:
        log = self._log_path
        try:
            if log.stat().st_size == 0:
                log.unlink()
        except OSError:
            pass

    def _release_process_group(self) -> None:
        """We cut the run short: close the script's process group as it would have."""
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # pragma: no cover - best effort
            pass

    def _bring_in_own_traces(self, result: CaptureResult) -> list[Path]:
        """Link the script's last trace into the log dir (earlier cycles would read as extra ranks)."""
        if not result.own_traces:
            self.notes.append("the script's own profiler wrote no trace file (export_chrome_trace / tensorboard_trace_handler)")
            return []
        if len(result.own_traces) > 1:
            self.notes.append(f"the script wrote {len(result.own_traces)} traces; using the last one, {result.own_traces[-1]}")
        src = Path(result.own_traces[-1])
        out = self.o.out_dir.resolve()
        if not src.is_file():
            return []
        if src.resolve().parent == out:
            return [src]
        dest = out / src.name
        if not dest.exists():
            try:
                os.link(src, dest)
            except OSError:
                try:
                    shutil.copy2(src, dest)
                except OSError as exc:
                    self.notes.append(f"could not copy the script's trace {src} into the log dir: {exc.strerror or exc}")
                    return []
        return [dest]

    def _our_traces(self) -> list[Path]:
        return [Path(p) for p in dict.fromkeys(self.our_traces) if Path(p).is_file()]

    def _write_facts(self, result: CaptureResult) -> Path:
        path = self.o.out_dir / facts_file_name(self.o.rank, self.o.world_size)
        run_facts = {
            "stopped_early": result.outcome.how == "stopped",
            "step_times_ms": [round(t, 3) for t in self.step_times_ms],
            "loader_wait_ms": [round(t, 3) for t in self.loader_wait_ms],
            "optimizer_step_ms": [round(t, 3) for t in self.optimizer_ms] if any(self.optimizer_ms) else None,
            "other_cpu_cores": self.other_work.per_step if any(v is not None for v in self.other_work.per_step) else None,
            "device_step_times_ms": self._device_step_times(),
            "profiled_steps": result.recorded_steps,
            "step_source": result.step_source,
            "mode": self.hooks.mode,
            "wall_time_s": round(result.wall_time_s, 3),
            "outcome": result.outcome.how,
            "exit_code": result.outcome.exit_code,
            "own_profiler": {"used": result.own_profiler, "traces": result.own_traces},
            "profiler": {"with_stack": self.with_stack, "record_shapes": self.o.record_shapes, "profile_memory": self.o.profile_memory},
            "notes": list(dict.fromkeys(self.notes)),
        }
        doc = self.facts.document(device_type=self.o.device, window=self.window.as_dict(), run=run_facts)
        write_facts(path, doc)
        return path


def capture(target: Target, options: CaptureOptions) -> CaptureResult:
    """Run TARGET under the profiler into options.out_dir (which must exist); see module doc.
    What the advisor prints never goes through the script's own streams (capture/streams.py)."""
    own_streams(fresh=True)
    try:
        return _Session(target, options).run()
    finally:
        take_back_streams()


def left_nothing(result: CaptureResult) -> bool:
    """The script ended with a status of its own (an exception, `sys.exit(3)`) before any step
    was recorded and wrote no trace: its log dir holds only the facts of a run that did not get
    as far as training, which no report reads (`advisor profile` removes a folder it named)."""
    how = result.outcome.how
    ended_badly = how == "error" or (how == "exit" and result.exit_code != 0)
    return ended_badly and not result.recorded_steps and not result.own_traces and not result.traces


def summary_lines(result: CaptureResult, removed: bool = False) -> list[str]:
    """What to tell the user about how the capture went (one idea per line); `removed`: the
    log dir was removed (left_nothing), so no line points into it."""
    t, o = result.target.display, result.options
    out = o.out_dir
    lines: list[str] = []
    how = result.outcome.how
    recorded = step_span(result.recorded_steps)
    w = o.window
    if result.own_profiler:
        if result.own_traces:
            lines.append(f"used the trace {t} wrote with its own profiler ({result.own_traces[-1]}), linked into {out}")
        else:
            lines.append(f"{t} ran its own profiler but wrote no trace file; only the facts were recorded in {out}")
    elif result.steps == 0 and how in ("finished", "exit") and result.exit_code == 0:
        lines.append(
            f"no steps found: {t} never called optimizer.step(), never took a second batch from a DataLoader "
            f"and never called a model twice from the same line, so nothing was profiled; the facts are in {out}"
        )
    elif how == "stopped":
        after = result.steps - w.length
        timed = f" and {after} step{'s' if after != 1 else ''} timed after it without the profiler" if after > 0 else ""
        lines.append(
            f"stopped {t} on purpose after step {result.steps - 1}, the window recorded ({recorded}){timed}: the rest of it "
            f"did not run, so its own exit status is not known (--full runs it to its end and exits with it)"
        )
    elif how in ("interrupted", "terminated"):
        kept = f"kept the trace of {recorded}" if result.recorded_steps else "no step had been recorded yet"
        by = "terminated (SIGTERM)" if how == "terminated" else "interrupted"
        lines.append(f"{by} during step {result.steps}; {kept} in {out}")
    elif how == "error" or (how == "exit" and result.exit_code != 0):
        # an uncaught exception is a failure; sys.exit(N) is the script's own status, passed on
        ended = f"failed with exit code {result.exit_code}" if how == "error" else f"exited with status {result.exit_code}"
        steps = f"after {result.steps} step{'s' if result.steps != 1 else ''}"
        if result.recorded_steps:
            lines.append(f"{t} {ended} {steps}; kept the trace of {recorded} in {out}")
        elif removed:
            lines.append(f"{t} {ended} {steps}, before any step was recorded: nothing to report, and no log dir kept")
        else:
            lines.append(f"{t} {ended} {steps}; no step had been recorded in {out}")
    elif not result.window_complete:
        if result.recorded_steps:
            lines.append(f"{t} ended after {result.steps} steps, before the window was complete; recorded {recorded} only")
        else:
            lines.append(
                f"{t} ended after {result.steps} step{'s' if result.steps != 1 else ''}, before any step was recorded "
                f"(window: skip {w.wait}, warm up {w.warmup}, record {w.active}); try fewer --wait/--warmup steps"
            )
    else:
        lines.append(f"{t} finished after {result.steps} steps; recorded {recorded}")
    if result.traces:
        lines.append(f"trace: {', '.join(str(p) for p in result.traces)}")
    lines.extend(result.notes)
    return lines
