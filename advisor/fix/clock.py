"""`python -m advisor.fix.clock RESULT.json WARMUP STEPS SOURCE SCRIPT [ARGS...]`: time a
script's steps without the profiler.

The script runs as `python SCRIPT ARGS` would run it (advisor.capture.runner), with the step
detection of `advisor profile` (advisor.capture.hooks: a step ends when the optimizer steps)
and nothing else: no profiler, no stacks, no shapes. After WARMUP + STEPS steps the run is
stopped; the step times go to RESULT.json, each the device's where the script ran on a CUDA
device (advisor.capture.device_clock: the host's clock runs ahead of a device-bound step).
SOURCE (or "-" for SCRIPT's own) is the file whose code runs as SCRIPT: a fixed copy, kept in
a temp folder, runs as the script itself (its `__file__`, its folder first on sys.path, its
`sys.argv[0]`), so it imports its neighbours and reads the files beside it as the script does.
"""

from __future__ import annotations

import json
import os
import sys
import time


class Enough(BaseException):
    """Raised at the last step wanted: ends the script quietly."""


def main(argv: list[str]) -> int:
    result_path, warmup, steps, source, script, *args = argv
    total = int(warmup) + int(steps)
    import torch

    from advisor.capture.device_clock import DeviceStepClock
    from advisor.capture.facts import FactsRecorder
    from advisor.capture.hooks import Hooks
    from advisor.capture.runner import Target, run
    from advisor.facts import steps_as_run

    times: list[float] = []
    last = [time.perf_counter()]
    pid = os.getpid()
    device_clock = DeviceStepClock(torch)

    def on_step() -> None:
        if os.getpid() != pid:
            return
        now = time.perf_counter()
        times.append((now - last[0]) * 1e3)
        device_clock.mark()
        last[0] = time.perf_counter()
        if len(times) >= total:
            raise Enough()

    hooks = Hooks(FactsRecorder(script, [script, *args]), on_step)
    started = time.perf_counter()
    hooks.install()
    try:
        last[0] = time.perf_counter()
        outcome = run(Target("script", script, list(args), source=None if source == "-" else source), on_purpose=(Enough,), owner_pid=pid)
    finally:
        hooks.uninstall()
    wall = time.perf_counter() - started
    device = device_clock.step_times_ms()
    times = steps_as_run(times, device)
    with open(result_path, "w", encoding="utf-8") as fh:
        json.dump({"step_times_ms": times, "clock": "host" if device is None else "device", "warmup": int(warmup), "outcome": outcome.how, "exit_code": outcome.exit_code, "wall_s": wall, "step_source": hooks.source}, fh)
    return 0 if outcome.how in ("stopped", "finished") else (outcome.exit_code or 1)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
