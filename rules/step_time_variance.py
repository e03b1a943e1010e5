"""Some steps are slow for a reason the trace shows: a periodic DataLoader stall, a garbage
collection, an epoch boundary, a checkpoint.

## What it detects
At least `min_steps` (3) steps in the window, the slowest more than `min_spread` (25%) above
the median step, and the mean step at least `min_share` (3%) above the median. Each slow step
(over 20% above the median) is broken down against a typical step: which part of the
step-time breakdown (kernel, memcpy, dataloader, runtime, CPU work, ...) grew.

Variance is a finding only with a cause the trace shows: the slow steps' excess is DataLoader
wait, or the slow steps (and no typical step) run a garbage collection (`gc`), start an epoch
(the DataLoader's `__iter__` or its workers' start) or save a checkpoint (`torch.save`,
`state_dict`, `checkpoint`). Without one, step times that differ are a note on the
measurement's quality (another process on a busy machine, frequency scaling: see the metrics'
step note), never a ranked fix.

## What it needs from the trace
At least `min_steps` steps, and a cause the trace shows for the slow ones (DataLoader wait, a
garbage collection, an epoch's start, a checkpoint). Without a cause the spread is a note on
the measurement, not a finding. It is not run where the launches have no kernel records (the
device's activity is missing); where the host's operators are missing (a device-only trace);
where the device's timeline lies outside the host's; where launched work waited with nothing
recorded on the device; on a window whose every step holds first-call work (a single cold
pass): the report's warning or note says why.

## Why it is slow
A mean over a few steps is only a good picture of training when the steps are alike. A slow
first step is warm-up (cuDNN autotuning, allocator growth, lazy initialisation, compilation)
that the profiler schedule did not skip; slow steps later come from something that happens
only now and then — a DataLoader worker falling behind, a checkpoint, an evaluation, a
garbage collection, a recompilation, another process on the GPU. Averaging them in hides them
and blurs every other figure.

## Evidence used
- the step durations (host and device side together, as in the step-time breakdown);
- the median step, the slow steps and by how much each is slower;
- per slow step, the breakdown category that grew most compared with the median step.

## Example
Before:
```python
schedule = torch.profiler.schedule(wait=0, warmup=1, active=5)
```
After:
```python
schedule = torch.profiler.schedule(wait=1, warmup=3, active=10)   # skip warm-up, see more steps
```
Then look at the slow steps in the trace view: if they recur (every N steps), the periodic
work is the thing to make cheaper or asynchronous.

## How the saving is estimated
The mean step minus the median step: what the window would gain if the slow steps ran like
a typical one. It is an upper bound when the slow steps are inherent (an evaluation every N
steps), hence medium confidence.

Reference: https://pytorch.org/docs/stable/profiler.html#torch.profiler.schedule

A stall whose only visible cause is the DataLoader, while the DataLoader's wait reaches
`dataloader-stall`'s `min_share` of the mean step, is left to `dataloader-stall`: throughput
is the mean step, and that finding names the share of steps the stall hits.
"""

from __future__ import annotations

import re

import numpy as np

from advisor.engine import Context
from advisor.metrics.breakdown import CATEGORIES, text_of
from advisor.metrics.steps import step_of

ID = "step-time-variance"
TITLE = "Step times vary too much for the window to be representative"
GROUP = "window"
TESTED_ON = ("nvidia", "amd", "cpu")  # vendors whose real traces the tests run it on (advisor/metrics/vendors.py)
DOCS = "https://pytorch.org/docs/stable/profiler.html#torch.profiler.schedule"
DEFAULTS = {"min_steps": 3, "min_spread": 0.25, "slow_factor": 0.20, "min_share": 0.03}
FIX = "Skip warm-up steps in the profiler schedule and profile more steps; look at what the slow steps do in the trace view."
AFTER = """schedule = torch.profiler.schedule(wait=1, warmup=3, active=10)
"""


# What a slow step can do that a typical step does not, as the trace names it.
CAUSES = (
    ("a garbage collection", re.compile(r"^(gc|gc\.collect|<built-in function collect>)$|gc_collect", re.IGNORECASE)),
    ("an epoch boundary (the DataLoader's iterator starts)", re.compile(r"^enumerate\(DataLoader\)#.*__(iter|init)__|_MultiProcessingDataLoaderIter\.__init__|DataLoader\.__iter__")),
    ("a checkpoint", re.compile(r"torch\.save|^aten::_save|state_dict|checkpoint", re.IGNORECASE)),
)


def visible_causes(ctx: Context, slow: np.ndarray, typical: np.ndarray, grew: list[str]) -> list[str]:
    """The causes of the slow steps the trace shows: DataLoader wait that grew, or work that
    only the slow steps do (a GC, an epoch start, a checkpoint)."""
    out = []
    if grew and sum(g == "dataloader" for g in grew) * 2 >= len(grew):
        out.append("a DataLoader stall")
    host = ctx.events.host
    if len(host) == 0:
        return out
    steps = ctx.metrics.steps
    where = step_of(steps["start"].to_numpy(np.int64), steps["end"].to_numpy(np.int64), host["ts"].to_numpy(np.int64))
    names = text_of(host["name"])
    for label, pattern in CAUSES:
        hit = np.fromiter((bool(pattern.search(n)) for n in names), dtype=bool, count=len(names))
        in_steps = set(where[hit & (where >= 0)].tolist())
        if in_steps & set(slow.tolist()) and not in_steps & set(typical.tolist()):
            out.append(label)
    return out


def check(ctx: Context):
    m = ctx.metrics
    opts = ctx.options
    ms = m.step_ms
    if len(ms) < opts["min_steps"]:
        return None
    median = float(np.median(ms))
    mean = float(ms.mean())
    if median <= 0:
        return None
    spread = float(ms.max()) / median - 1
    saving_ms = mean - median
    if spread < opts["min_spread"] or saving_ms / mean < opts["min_share"]:
        return None

    steps = m.steps["step"].to_numpy()
    slow = np.nonzero(ms > median * (1 + opts["slow_factor"]))[0]
    bd = m.breakdown.to_numpy(np.float64) / 1e6
    typical = np.median(bd[ms <= median * (1 + opts["slow_factor"])], axis=0)
    slow_steps = []
    for i in slow:
        excess = bd[i] - typical
        j = int(np.argmax(excess))
        slow_steps.append(
            {
                "step": int(steps[i]),
                "ms": round(float(ms[i]), 3),
                "over_median_pct": round(100 * (ms[i] / median - 1), 1),
                "grew_most": CATEGORIES[j],
                "grew_by_ms": round(float(excess[j]), 3),
            }
        )
    causes = visible_causes(ctx, slow, np.nonzero(ms <= median * (1 + opts["slow_factor"]))[0], [s["grew_most"] for s in slow_steps])
    if not causes:
        return None  # noise, or a cause the trace does not show: a note on the measurement, not a fix
    if causes == ["a DataLoader stall"] and m.breakdown_mean_ms["dataloader"] / mean >= ctx.options_of("dataloader-stall").get("min_share", 0.05):
        # a recurring DataLoader stall is the DataLoader's finding, with the share of steps it hits
        return None
    first_is_slow = bool(len(slow) and slow[0] == 0)
    evidence = {
        "step_ms": [round(float(x), 3) for x in ms],
        "steps": steps.tolist(),
        "median_ms": round(median, 3),
        "mean_ms": round(mean, 3),
        "slowest_over_median_pct": round(100 * spread, 1),
        "slow_steps": slow_steps,
        "causes": causes,
    }
    parts = [f"step {s['step']} +{s['over_median_pct']:.0f}% ({s['grew_most']} +{s['grew_by_ms']:.1f} ms)" for s in slow_steps[:3]]
    message = (
        f"Steps range {ms.min():.1f}–{ms.max():.1f} ms around a median of {median:.1f} ms ({', '.join(parts)}): "
        f"the mean is {saving_ms:.1f} ms above the median; the slow steps show {' and '.join(causes)}."
    )
    fixes = []
    if first_is_slow:
        fixes.append("The first profiled step is still warm-up: skip more steps before recording (schedule wait/warmup).")
    if len(slow) > int(first_is_slow):
        fixes.append(
            "Look at the other slow steps in the trace view: find the work only they do (DataLoader hiccup, checkpoint, "
            "evaluation, GC, recompilation) and make it cheaper or asynchronous."
        )
    fixes.append("Record more active steps.")
    fix = " ".join(fixes)
    message += " " + fixes[0]
    return ctx.finding(message, saving_ms, confidence="medium", evidence=evidence, fix=fix)
