"""What every AdvisorBench workload shares: its command line and its step timer.

A workload script times each of its own steps (wall clock between the ends of two steps, so
a step includes the wait for its batch) and prints them as JSON on its last line, without
the warm-up steps. Under `advisor profile` the script is stopped after the profiled window
and prints nothing; the runner measures unprofiled runs only.
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def parse_args(steps: int = 30, warmup: int = 6) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--steps", type=int, default=steps, help="steps timed after warm-up")
    parser.add_argument("--warmup", type=int, default=warmup, help="steps run before timing")
    return parser.parse_args()


class StepTimer:
    """Call `tick()` at the end of every step; `done()` prints the timed steps' milliseconds."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.device = args.device
        self.warmup = args.warmup
        self.total = args.warmup + args.steps
        self.count = 0
        self.step_ms: list[float] = []
        self.last = time.perf_counter()

    def tick(self) -> bool:
        """End a step; True once the script has run all its steps."""
        if self.device == "cuda":
            torch.cuda.synchronize()
        now = time.perf_counter()
        if self.count >= self.warmup:
            self.step_ms.append((now - self.last) * 1e3)
        self.last = now
        self.count += 1
        return self.count >= self.total

    def done(self) -> None:
        print(json.dumps({"step_ms": self.step_ms}), flush=True)
