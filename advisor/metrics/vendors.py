"""Whose device a trace comes from, and which vendors' traces each rule has been tested on.

A rule file declares `TESTED_ON`, a tuple of the vendors in VENDORS whose real traces the
project's tests run it on and assert on (a label naming it, or it firing or staying silent
there; `tests/test_rule_vendors.py` checks every claim). `advisor rules` lists them and
`advisor explain RULE` states them. A trace's vendor is read from the trace itself: MTIA by
its event categories, AMD by HIP runtime calls or the device's name, NVIDIA otherwise, and
`cpu` when it holds no device activity.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from advisor.load.trace import TraceFrames

VENDORS = ("nvidia", "amd", "mtia", "cpu")
VENDOR_NAMES = {"nvidia": "NVIDIA (CUDA)", "amd": "AMD (ROCm/HIP)", "mtia": "Meta MTIA", "cpu": "CPU-only"}


def trace_vendor(frames: TraceFrames) -> str:
    """The vendor of one trace: nvidia, amd, mtia, or cpu (no device activity)."""
    from advisor.metrics.summary import _device_properties, device_vendor  # here: `advisor rules` lists TESTED_ON without the frames

    return device_vendor(frames, _device_properties(frames).name) or "cpu"


def tested_on(rule: Any) -> tuple[str, ...]:
    """The vendors a rule declares it has been tested on (its module's TESTED_ON; () if none)."""
    return tuple(getattr(getattr(rule, "module", None), "TESTED_ON", ()) or ())


def tested_on_text(rule: Any) -> str:
    """One line for a rule's page: the vendors' traces it has been tested on."""
    names = [VENDOR_NAMES.get(v, v) for v in tested_on(rule)]
    if not names:
        return "Tested on: not stated (a rule file of your own, or one that declares no TESTED_ON)."
    return f"Tested on: {', '.join(names)} traces."
