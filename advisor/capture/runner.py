"""Run the user's script or module as `__main__`, the way `python script.py` / `python -m` would.

What the script sees is what plain Python gives it: `__name__ == "__main__"`, `sys.argv`
(`[script, *args]`), its own folder first on `sys.path` (the current directory for `-m`),
and `sys.modules["__main__"]` being its own module, so that multiprocessing's spawn and
forkserver start methods re-import the script (or module) in worker processes and classes
defined in it unpickle there (cProfile leaves `__main__` pointing at itself, which breaks
them). Its stdout and stderr are not touched. Everything changed here is put back afterwards.

When the script fails, its own traceback is printed through `sys.excepthook` with our frames
taken out, and the exit code Python would have given comes back. A process the script forks
(os.fork) that ends the script (sys.exit, an exception, running off its end) leaves right
there with that exit code, as it would under plain Python: only the process that started
the run goes back to the caller (see `_leave_forked_process`). This module knows nothing
about torch; the capture session passes in the exceptions it raises on purpose.
"""

from __future__ import annotations

import builtins
import importlib.machinery
import importlib.util
import os
import runpy
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path

from advisor.errors import InputError
from advisor.leaving import exit_status, flush_streams, leave

_HERE = os.path.dirname(os.path.abspath(__file__))
_RUNPY = os.path.abspath(runpy.__file__)


@dataclass
class Target:
    """What to run: a script path or a module name, and the arguments it gets."""

    kind: str  # "script" | "module"
    name: str
    args: list[str] = field(default_factory=list)
    source: str | None = None  # a script's code from this file instead (a fixed copy run as the script itself)

    @property
    def stem(self) -> str:
        if self.kind == "module":
            parts = [p for p in self.name.split(".") if p != "__main__"]
            return parts[-1] if parts else "module"
        return Path(self.name).stem or "script"

    @property
    def display(self) -> str:
        return f"-m {self.name}" if self.kind == "module" else self.name

    @property
    def argv(self) -> list[str]:
        return [self.name, *self.args]


class Terminated(BaseException):
    """Raised by the capture's SIGTERM handler: ends the script the way Ctrl-C does.

    A BaseException, so that the script's `except Exception:` does not swallow it.
    """


SIGTERM_EXIT = 128 + 15  # what a shell shows for a process ended by SIGTERM


@dataclass
class Outcome:
    """How the run ended: `finished`, `exit` (sys.exit), `error`, `interrupted` (Ctrl-C),
    `terminated` (SIGTERM), or `stopped`."""

    how: str
    exit_code: int


def check_target(target: Target) -> None:
    """Raise InputError for a script or module that cannot be run at all (checked up front)."""
    if target.kind == "script":
        path = Path(target.name)
        if not path.exists():
            raise InputError(path, "no such file")
        if path.is_dir():
            raise InputError(path, "is a directory, not a Python script")
        if not os.access(path, os.R_OK):
            raise InputError(path, "cannot read the script (permission denied)")
        return
    name = target.name
    if not name or any(not part.isidentifier() for part in name.split(".")):
        raise InputError(None, f"{name!r} is not a module name (use -m package.module)")
    added = _put_first_on_path(os.getcwd())
    try:
        spec = _find_spec(name)
        if spec is not None and spec.submodule_search_locations is not None:
            spec = _find_spec(name + ".__main__")
            if spec is None:
                raise InputError(None, f"{name} is a package without a __main__ module; cannot run it with -m")
        if spec is None:
            raise InputError(None, f"no module named {name}")
    finally:
        if added:
            sys.path.remove(os.getcwd())


def _find_spec(name: str):
    try:
        return importlib.util.find_spec(name)
    except ModuleNotFoundError as exc:
        if exc.name and (name == exc.name or name.startswith(exc.name + ".")):
            return None
        raise InputError(None, f"cannot import {name}: {exc}") from None
    except Exception:
        # The package's own code failed while importing: that is the user's bug, and the
        # run itself will show its traceback. Let the run go ahead.
        return importlib.machinery.ModuleSpec(name, None)


def _put_first_on_path(folder: str) -> bool:
    if sys.path and sys.path[0] == folder:
        return False
    sys.path.insert(0, folder)
    return True


def run(target: Target, on_purpose: tuple[type[BaseException], ...] = (), owner_pid: int | None = None) -> Outcome:
    """Run TARGET as `__main__` and say how it ended.

    Exceptions of the types in ON_PURPOSE (raised by our own hooks) end the run quietly with
    `how="stopped"`; sys.argv, sys.path and sys.modules["__main__"] are put back either way.
    In a process other than OWNER_PID (a fork of the script), the end of the script ends
    that process with the exit code instead of returning.
    """
    saved_argv = sys.argv
    saved_path = list(sys.path)
    saved_main = sys.modules.get("__main__")
    folder = os.path.dirname(os.path.abspath(target.name)) if target.kind == "script" else os.getcwd()
    sys.argv = target.argv
    sys.path.insert(0, folder)
    try:
        try:
            if target.kind == "script":
                _run_script(target.name, target.source)
            else:
                runpy.run_module(target.name, run_name="__main__", alter_sys=True)
            outcome = Outcome("finished", 0)
        except on_purpose as exc:
            exc.__traceback__ = None  # let the frames (and the script's DataLoader workers) go
            outcome = Outcome("stopped", 0)
        except SystemExit as exc:
            outcome = Outcome("exit", exit_status(exc.code))
        except KeyboardInterrupt:
            outcome = Outcome("interrupted", 130)
        except Terminated:
            outcome = Outcome("terminated", SIGTERM_EXIT)
        except BaseException as exc:  # the script's own failure: its traceback, Python's code
            _print_user_traceback(exc)
            outcome = Outcome("error", 1)
        if owner_pid is not None and os.getpid() != owner_pid:
            _leave_forked_process(outcome.exit_code)
        return outcome
    finally:
        sys.argv = saved_argv
        sys.path[:] = saved_path
        if saved_main is not None:
            sys.modules["__main__"] = saved_main


def _run_script(path: str, source_path: str | None = None) -> None:
    """exec the script in a fresh module registered as __main__, like `python path` does
    (with SOURCE_PATH's code, where given, as the script's own)."""
    filename = os.path.abspath(path)
    with open(source_path or filename, "rb") as fh:  # io.open_code in CPython; same bytes
        source = fh.read()
    code = compile(source, path, "exec", dont_inherit=True)
    module = types.ModuleType("__main__")
    module.__dict__.update(
        __file__=path,
        __builtins__=builtins,
        __spec__=None,  # as for `python path`: spawn then re-runs the file by its path
        __package__=None,
        __cached__=None,
        __loader__=importlib.machinery.SourceFileLoader("__main__", filename),
    )
    sys.modules["__main__"] = module
    exec(code, module.__dict__)


def _leave_forked_process(code: int) -> None:
    """End a process the script forked, as Python would end it, minus native destructors:
    the fork inherited a running torch.profiler whose native threads do not exist in it,
    and the profiler's C++ destructors would wait for them forever at a normal exit."""
    leave(code)


def end_by_sigterm() -> None:
    """Leave the way a process that SIGTERM killed leaves (the status a scheduler expects)."""
    import signal

    flush_streams()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)
    raise SystemExit(SIGTERM_EXIT)  # not reached where the signal is delivered at once


def _ours(tb: types.TracebackType) -> bool:
    filename = os.path.abspath(tb.tb_frame.f_code.co_filename)
    return os.path.dirname(filename) == _HERE


def _strip(tb: types.TracebackType | None, leading: bool) -> types.TracebackType | None:
    """Drop our frames (and leading runpy frames) from a traceback chain."""
    kept = []
    while tb is not None:
        fname = os.path.abspath(tb.tb_frame.f_code.co_filename)
        if not (_ours(tb) or (leading and not kept and fname == _RUNPY)):
            kept.append(tb)
        tb = tb.tb_next
    for a, b in zip(kept, kept[1:] + [None], strict=True):
        a.tb_next = b
    return kept[0] if kept else None


def _print_user_traceback(exc: BaseException) -> None:
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        e.__traceback__ = _strip(e.__traceback__, leading=e is exc)
        todo.extend(x for x in (e.__cause__, e.__context__) if x is not None)
    flush_streams()
    try:  # on the script's stderr, as Python would (nothing, where the script closed it)
        sys.excepthook(type(exc), exc, exc.__traceback__)
    except Exception:
        pass
    flush_streams()
