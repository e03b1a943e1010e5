"""What the reports show of a rank beyond its figures, made once while its frames are loaded.

The HTML report draws the slowest rank's median step, its replayed steps, its memory over
the window and its top ops and kernels; `whatif` and `diff` replay its fixes in other
combinations. All of that is computed here, in the same pass that analyses the rank
(`advisor.analysis.analyze_rank`), and carried in the analysis: no renderer, command or API
call loads a trace again or runs a rule again. A rank's view is a few tables and the
replayable step graph of its replayed block (a few MB at most), without its frames.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from advisor.metrics.kernels import top_ops, top_self_ops
from advisor.metrics.summary import Metrics
from advisor.render.timeline import StepTimeline, replayed_timeline, step_timeline
from advisor.whatif.replay import Change, replay_step
from advisor.whatif.savings import RankReplay, RankWhatIf, rank_replay

# Rows of a CPU-only run's top ops by self time (the text report's table).
CPU_OPS_ROWS = 8


@dataclass
class RankView:
    """One rank's drawn and replayable data (see the module docstring)."""

    rank: int
    timeline: StepTimeline | None  # the median step's lanes
    replayed: list[tuple[str, StepTimeline, str]]  # (heading, lanes, note) of the replayed steps
    memory: pd.DataFrame  # the memory events of the window (frames.memory)
    window_end_ns: int  # the window's end, ns from the trace's origin
    kernels: pd.DataFrame  # every kernel (metrics.kernels, before per-name totals)
    ops: pd.DataFrame  # host ops by total time, all of them (metrics.kernels.top_ops)
    cpu_ops: pd.DataFrame  # host ops by self time per step, CPU_OPS_ROWS of them
    replay: RankReplay | None  # the rank's replay, without frames (None: no steps to replay)
    stated: dict[str, Change] = field(default_factory=dict)  # rule -> its fix as a graph change


def rank_view(m: Metrics, facts: dict[str, Any] | None, head: RankWhatIf | None, stated: dict[str, Change]) -> RankView:
    """The view of a rank whose metrics still hold its frames."""
    replay = rank_replay(m, facts)
    timeline = step_timeline(m)
    replayed = replayed_steps(m, replay, head, stated) if timeline is not None and timeline.has_device else []
    detached = replay.detached() if replay.available else None
    return RankView(
        rank=m.rank,
        timeline=timeline,
        replayed=replayed,
        memory=m.frames.memory,
        window_end_ns=int(m.frames.window[1]),
        kernels=m.kernels,
        ops=top_ops(m.frames, n=1_000_000),
        cpu_ops=top_self_ops(m.frames, m.steps, CPU_OPS_ROWS) if not m.has_device else pd.DataFrame(),
        replay=detached,
        stated=stated,
    )


def replayed_steps(m: Metrics, replay: RankReplay, head: RankWhatIf | None, modelled: dict[str, Change]) -> list[tuple[str, StepTimeline, str]]:
    """The replayed median step of the rank, as measured (the replay's baseline) and with every
    fix of its headline: (heading, lanes, note) each. Empty where nothing replays."""
    if head is None or not replay.available:
        return []
    out = []
    base = replay_step(replay.graph, replay.base)
    if base is None:
        return []
    base = dataclasses.replace(base, index=base.index + replay.first_step)  # a row of the rank's steps
    scaled = f", host time ×{replay.host_scale:.2f} to match the unprofiled steps" if replay.host_scale < 1.0 else ""
    rest = f"; {replay.remainder_ms:.2f} ms per step that neither the host nor the device in the trace explains is not drawn" if replay.remainder_ms > 0.005 else ""
    if replay.step_host_ms > 0.005:
        rest += f"; {replay.step_host_ms:.2f} ms per step of host time the trace does not show is drawn as a gap after the step's longest wait"
    out.append(("Replayed step", replayed_timeline(m, base, "the replayed median step"), f"The step graph replayed with no fix{scaled}: {base.duration_ns / 1e6:.2f} ms{rest}."))
    if head.fixes:
        rules = [r for r in head.fixes if r in modelled]
        changes = [modelled[r] for r in rules]
        if changes:
            fixed = replay_step(replay.graph, replay.with_base(Change.merge(changes)))
            if fixed is not None:
                fixed = dataclasses.replace(fixed, index=fixed.index + replay.first_step)
                batch = f" One replayed step processes {fixed.per_sample:g} current steps' samples (a larger batch)." if fixed.per_sample != 1.0 else ""
                names = ", ".join(sorted(set(rules)))
                out.append(
                    (
                        "Replayed step with every fix",
                        replayed_timeline(m, fixed, "the replayed median step with every fix"),
                        f"The same graph with the fixes of {names} applied together: {fixed.duration_ns / 1e6:.2f} ms"
                        + (f" for {fixed.per_sample:g}× the samples, {fixed.duration_ns / 1e6 / fixed.per_sample:.2f} ms per current step." if fixed.per_sample != 1.0 else ".")
                        + batch,
                    )
                )
    return out
