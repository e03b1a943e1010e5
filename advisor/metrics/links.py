"""The links GPUs of one job talk over, and their peak bandwidth per direction (GB/s).

NCCL's bus bandwidth is comparable with the bandwidth of one link direction of the slowest
hop (NCCL's PERFORMANCE.md), so the table holds per-direction figures:

- NVLink: links per GPU x 25 GB/s per direction (NVLink 2, 3, 4 and 5; NVLink 1 was 20):
  P100 4 links (80), V100 SXM2 6 (150), A100 SXM 12 (300), H100/H200 SXM 18 (450), B200 18 at
  50 (900). NVIDIA's data sheets give the sum of both directions (300, 600, 900, 1800 GB/s).
- PCIe x16: 15.75 GB/s per direction for gen3, 31.5 gen4, 63 gen5 (after 128b/130b coding).
- xGMI (AMD Infinity Fabric), per GPU as AMD quotes it: MI250X 400, MI300X 7 links x 64 = 448.
- InfiniBand per port: HDR 25 GB/s (200 Gb/s), NDR 50 GB/s (400 Gb/s). A trace never names
  the network, so these are never inferred: a group larger than one node's GPUs is "link
  unknown".

The link is inferred only where the trace says enough: the group fits in the GPUs the trace
lists (one node) and the device's name says its form (SXM: NVLink; PCIe cards and GeForce
cards without NVLink: PCIe of the card's generation, an upper bound as the host's slot may be
slower). Anything else is unknown, and said so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

LINK_GBPS: dict[str, float] = {
    "NVLink 1": 80.0, "NVLink 2": 150.0, "NVLink 3": 300.0, "NVLink 4": 450.0, "NVLink 5": 900.0,
    "PCIe gen3 x16": 15.75, "PCIe gen4 x16": 31.5, "PCIe gen5 x16": 63.0,
    "xGMI (MI250X)": 400.0, "xGMI (MI300X)": 448.0,
    "InfiniBand HDR": 25.0, "InfiniBand NDR": 50.0,
}

# A device name's words -> its link to the other GPUs of its node (first match wins).
DEVICE_LINKS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("p100", "sxm"), "NVLink 1"),
    (("v100", "sxm"), "NVLink 2"),
    (("a100", "sxm"), "NVLink 3"),
    (("h100", "sxm"), "NVLink 4"),
    (("h100", "hbm3"), "NVLink 4"),
    (("h200",), "NVLink 4"),
    (("b200",), "NVLink 5"),
    (("v100", "pcie"), "PCIe gen3 x16"),
    (("a100", "pcie"), "PCIe gen4 x16"),
    (("h100", "pcie"), "PCIe gen5 x16"),
    (("rtx 4090",), "PCIe gen4 x16"),
    (("rtx 4080",), "PCIe gen4 x16"),
    (("l40",), "PCIe gen4 x16"),
    (("l4",), "PCIe gen4 x16"),
    (("a10",), "PCIe gen4 x16"),
    (("t4",), "PCIe gen3 x16"),
    (("mi250x",), "xGMI (MI250X)"),
    (("mi300x",), "xGMI (MI300X)"),
)


@dataclass(frozen=True)
class Link:
    """The link a job's collectives ran over: its name and peak (None: unknown, and why)."""

    name: str | None
    peak_gbps: float | None
    why: str

    def to_dict(self) -> dict:
        return {"name": self.name, "peak_gbps": self.peak_gbps, "why": self.why}


def device_link(device_name: str | None) -> str | None:
    """The intra-node link of a GPU model, by its name; None where the name does not say."""
    if not device_name:
        return None
    words = device_name.lower()
    for needles, link in DEVICE_LINKS:
        # a needle is a whole word or model number: "a10" is not the start of "a100", nor "l4" of "l40"
        if all(re.search(rf"(?<![a-z0-9]){re.escape(n)}" + ("(?![0-9])" if n[-1].isdigit() else ""), words) for n in needles):
            return link
    return None


def infer_link(device_name: str | None, devices_in_trace: int, group_size: int | None) -> Link:
    """The link of a group of `group_size` ranks whose trace lists `devices_in_trace` GPUs."""
    if not device_name:
        return Link(None, None, "link unknown: the trace names no device")
    if not group_size or group_size < 2:
        return Link(None, None, "link unknown: the group size is not recorded")
    if devices_in_trace < group_size:
        return Link(None, None, f"link unknown: {group_size} ranks, {devices_in_trace} GPUs in the trace's node (the network is not recorded)")
    link = device_link(device_name)
    if link is None:
        return Link(None, None, f"link unknown: {device_name} is not in the link table")
    bound = " (the card's own link; the host's slot may be slower)" if link.startswith("PCIe") else ""
    return Link(link, LINK_GBPS[link], f"{device_name}, {group_size} ranks within one node: {link}{bound}")
