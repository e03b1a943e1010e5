"""The machine's other work while the script runs: CPU time that other processes took from
the cores the script may use (Linux: /proc; elsewhere nothing is recorded).

At each step's end `OtherWork.mark()` reads the busy time of the process's cores
(/proc/stat, the CPUs in its affinity mask: user, nice, system, irq, softirq and steal, the
hypervisor's time for other guests) and the CPU time of the script's own process tree
(/proc/self/stat with its reaped children, and its live children: DataLoader workers). The
difference, over the step's wall time, is how many cores other work kept busy during that
step (`other_cpu_cores` in the facts file). A step timed while other work held the cores is
inflated, and the more so the more threads the training runs on them: the rules say so
rather than take such a window at its word.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def cpu_busy_ticks(stat_text: str, cpus: set[int] | None) -> int:
    """Busy clock ticks of the CPUs `cpus` (all when None) from /proc/stat's text: user, nice,
    system, irq, softirq and steal, not idle and iowait."""
    total = 0
    for line in stat_text.splitlines():
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu":
            continue
        try:
            n = int(name[3:])
        except ValueError:
            continue
        if cpus is not None and n not in cpus:
            continue
        v = [int(x) for x in rest.split()[:8]]
        v += [0] * (8 - len(v))
        total += v[0] + v[1] + v[2] + v[5] + v[6] + v[7]
    return total


def process_ticks(stat_text: str, with_reaped_children: bool = True) -> int:
    """utime + stime (and the reaped children's cutime + cstime) of /proc/PID/stat's text."""
    fields = stat_text.rpartition(")")[2].split()  # after the command name, which may hold spaces
    # fields[0] is the state (field 3 of proc(5)); utime, stime, cutime, cstime are fields 14-17
    ticks = int(fields[11]) + int(fields[12])
    if with_reaped_children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks


def other_cores(busy_ticks: int, own_ticks: int, wall_s: float, ticks_per_s: float) -> float | None:
    """Cores other work kept busy over `wall_s`: the cores' busy time less the script's own."""
    if wall_s <= 0 or ticks_per_s <= 0:
        return None
    return max((busy_ticks - own_ticks) / ticks_per_s / wall_s, 0.0)


class OtherWork:
    """Per step, the cores other processes kept busy (None where /proc cannot tell)."""

    def __init__(self) -> None:
        try:
            self.cpus: set[int] | None = set(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            self.cpus = None
        try:
            self.hz = float(os.sysconf("SC_CLK_TCK"))
        except (AttributeError, ValueError, OSError):
            self.hz = 0.0
        self.per_step: list[float | None] = []
        self._last = self._sample()

    def _own_ticks(self) -> int:
        ticks = process_ticks(Path("/proc/self/stat").read_text())
        for children in Path("/proc/self/task").glob("*/children"):
            for pid in children.read_text().split():
                try:
                    ticks += process_ticks(Path(f"/proc/{pid}/stat").read_text())
                except (OSError, ValueError, IndexError):
                    pass  # ended meanwhile: its time is in cutime once reaped
        return ticks

    def _sample(self) -> tuple[float, int, int] | None:
        if not self.hz:
            return None
        try:
            return time.perf_counter(), cpu_busy_ticks(Path("/proc/stat").read_text(), self.cpus), self._own_ticks()
        except (OSError, ValueError, IndexError):
            return None

    def mark(self) -> None:
        """A step ended: the cores other work used since the last mark."""
        now = self._sample()
        got = None
        if now is not None and self._last is not None:
            got = other_cores(now[1] - self._last[1], now[2] - self._last[2], now[0] - self._last[0], self.hz)
        self.per_step.append(None if got is None else round(got, 2))
        self._last = now
