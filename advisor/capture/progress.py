"""What `advisor profile` says while the script runs: on stderr, never on the script's stdout.

Each line is one line of plain text (file names and error messages in it may come from the
script: see advisor.terminal_text). One line when each phase of the window starts (warm-up, recording, saved), and on a terminal
a bar that advances with the steps. The bar is redrawn only at step ends (no refresh thread,
so nothing of ours runs while a step is being recorded).
"""

from __future__ import annotations

from rich.text import Text

from advisor.capture.streams import own_streams
from advisor.terminal_text import inert_console, one_line


class Window:
    """The profiler schedule's arithmetic: which phase step k is in."""

    def __init__(self, wait: int, warmup: int, active: int, repeat: int) -> None:
        self.wait, self.warmup, self.active, self.repeat = wait, warmup, active, repeat

    @property
    def cycle(self) -> int:
        return self.wait + self.warmup + self.active

    @property
    def length(self) -> int:
        return self.cycle * self.repeat

    def phase(self, k: int) -> str:
        if k >= self.length:
            return "done"
        m = k % self.cycle
        if m < self.wait:
            return "wait"
        if m < self.wait + self.warmup:
            return "warmup"
        return "record"

    def recorded(self, steps_done: int) -> list[int]:
        """Indices of the complete steps that fell in an active phase."""
        return [k for k in range(min(steps_done, self.length)) if self.phase(k) == "record"]

    def as_dict(self) -> dict[str, int]:
        return {"wait": self.wait, "warmup": self.warmup, "active": self.active, "repeat": self.repeat}


def say_lines(lines: list[str]) -> None:
    """Print the advisor's own lines on its stderr (advisor.capture.streams), each prefixed `advisor: `."""
    console = inert_console(file=own_streams()[1], highlight=False)
    for line in lines:
        console.print(Text("advisor: ", style="bold") + Text(one_line(line)), soft_wrap=True)


def step_span(steps: list[int]) -> str:
    if not steps:
        return "none"
    if len(steps) == 1:
        return f"step {steps[0]}"
    if steps == list(range(steps[0], steps[-1] + 1)):
        return f"steps {steps[0]}–{steps[-1]}"
    return "steps " + ", ".join(map(str, steps))


class Progress:
    """Phase lines (and a bar on a terminal) for one capture."""

    def __init__(self, window: Window, enabled: bool = True) -> None:
        self.window = window
        self.enabled = enabled
        self.console = inert_console(file=own_streams()[1], highlight=False)
        self._bar = None
        self._task = None
        self._phase = None

    def say(self, message: str) -> None:
        if not self.enabled:
            return
        line = Text("advisor: ", style="bold") + Text(one_line(message))
        if self._bar is not None:
            self._bar.console.print(line, soft_wrap=True)
        else:
            self.console.print(line, soft_wrap=True)

    def begin(self, what: str) -> None:
        self.say(what)
        self._phase = self.window.phase(0)
        self._announce(0)
        if self.enabled and self.console.is_terminal:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
            )
            from rich.progress import Progress as Bar

            self._bar = Bar(
                TextColumn("advisor: {task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[last]}"),
                TimeElapsedColumn(),
                console=self.console,
                auto_refresh=False,
                transient=True,
                redirect_stdout=False,
                redirect_stderr=False,
            )
            self._bar.start()
            self._task = self._bar.add_task(self._phase, total=self.window.length, last="")
            self._bar.refresh()

    def step(self, done: int, last_ms: float) -> None:
        """DONE steps have ended; the last took LAST_MS."""
        phase = self.window.phase(done)
        if phase != self._phase:
            self._phase = phase
            self._announce(done)
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, completed=min(done, self.window.length), description=phase, last=f"{last_ms:.0f} ms/step")
            self._bar.refresh()
            if done >= self.window.length:
                self.close()

    def _announce(self, k: int) -> None:
        w = self.window
        if self._phase == "warmup":
            n = w.warmup
            self.say(f"warming up ({n} step{'s' if n != 1 else ''})")
        elif self._phase == "record":
            first = k
            self.say(f"recording {step_span(list(range(first, first + w.active)))}")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
            self._task = None
