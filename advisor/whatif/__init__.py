"""What-if replay: the step as a dependency graph, and fixes as transformations of it.

`graph.build_graph` turns one rank's frames into a `StepGraph` (host calls in issue order,
device work in stream order, the waits between them); `replay.replay_graph` simulates it, with or
without a `Change`, and returns the replayed step times. Savings are replayed, not summed.
"""

from advisor.whatif.graph import StepGraph, build_graph
from advisor.whatif.replay import Change, ReplayResult, replay_graph

__all__ = ["StepGraph", "build_graph", "Change", "ReplayResult", "replay_graph"]
