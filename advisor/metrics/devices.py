"""Peak compute and memory bandwidth of the devices the roofline knows, from vendors' datasheets.

Every figure is dense (no structured sparsity: a datasheet's "with sparsity" figure is halved)
and per device as PyTorch sees it (one `cuda:N`): an MI250/MI250X module holds two graphics
compute dies that PyTorch shows as two devices, so its module figures are halved. TFLOP/s for
matrix work per precision (`fp32` is the FMA units' fp32 peak, what an fp32 GEMM without
TF32 can reach; on AMD the matrix-core fp32 rate), memory bandwidth in TB/s. A precision the
device has no matrix units for is None: no ceiling is drawn for it. A device not in the table
is unknown: the roofline shows its measured figures without a ceiling, and says so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "fp8", "int8")


@dataclass(frozen=True)
class DeviceCeiling:
    name: str
    fp32: float  # TFLOP/s on the fp32 FMA units (AMD: fp32 matrix)
    tf32: float | None
    fp16: float | None
    bf16: float | None
    fp8: float | None
    int8: float | None  # TOP/s
    memory_tbps: float
    source: str

    def peak_tflops(self, precision: str) -> float | None:
        """The matrix ceiling for a precision (fp32, tf32, fp16, bf16, fp8, int8); None where the device has none."""
        return getattr(self, precision, None) if precision in PRECISIONS else None

    def to_dict(self) -> dict:
        return {"name": self.name, "peak_tflops": {p: self.peak_tflops(p) for p in PRECISIONS}, "memory_tbps": self.memory_tbps, "source": self.source}


# (pattern over the trace's device name, ceiling). First match wins: specific names first.
_TABLE: list[tuple[str, DeviceCeiling]] = [
    # --- NVIDIA Volta: fp16 Tensor Cores only ---
    # NVIDIA Tesla V100 datasheet (SXM2): 15.7 fp32, 125 Tensor TFLOPS, 900 GB/s HBM2.
    (r"V100S", DeviceCeiling("Tesla V100S PCIe", 16.4, None, 130.0, None, None, None, 1.134, "NVIDIA V100S datasheet")),
    (r"V100.*PCIE", DeviceCeiling("Tesla V100 PCIe", 14.0, None, 112.0, None, None, None, 0.900, "NVIDIA Tesla V100 datasheet (PCIe)")),
    (r"V100", DeviceCeiling("Tesla V100 SXM2/DGXS", 15.7, None, 125.0, None, None, None, 0.900, "NVIDIA Tesla V100 datasheet (SXM2)")),
    # --- NVIDIA Turing ---
    # NVIDIA T4 datasheet: 8.1 fp32, 65 fp16 mixed, 130 INT8 TOPS, 320 GB/s.
    (r"\bT4\b", DeviceCeiling("Tesla T4", 8.1, None, 65.0, None, None, 130.0, 0.320, "NVIDIA T4 datasheet")),
    # NVIDIA Turing architecture whitepaper, appendix A (RTX 2080 Ti Founders Edition): 14.2 fp32,
    # 56.9 fp16 Tensor TFLOPS with fp32 accumulate (what PyTorch uses), 227.7 INT8 TOPS, 616 GB/s.
    (r"2080 Ti", DeviceCeiling("GeForce RTX 2080 Ti", 14.2, None, 56.9, None, None, 227.7, 0.616, "NVIDIA Turing GPU architecture whitepaper, appendix A")),
    # Same whitepaper, RTX 2080 FE: 10.6 fp32, 42.4 fp16 (fp32 accumulate), 169.6 INT8, 448 GB/s.
    (r"2080", DeviceCeiling("GeForce RTX 2080", 10.6, None, 42.4, None, None, 169.6, 0.448, "NVIDIA Turing GPU architecture whitepaper, appendix A")),
    # --- NVIDIA Ampere ---
    # NVIDIA A100 datasheet: 19.5 fp32, 156 TF32, 312 fp16/bf16, 624 INT8 (dense);
    # 1,555 GB/s (40 GB), 2,039 GB/s (80 GB SXM), 1,935 GB/s (80 GB PCIe).
    (r"A100.*80GB.*PCIE|A100.*PCIE.*80GB", DeviceCeiling("A100 80GB PCIe", 19.5, 156.0, 312.0, 312.0, None, 624.0, 1.935, "NVIDIA A100 datasheet")),
    (r"A100.*80GB", DeviceCeiling("A100 80GB SXM", 19.5, 156.0, 312.0, 312.0, None, 624.0, 2.039, "NVIDIA A100 datasheet")),
    (r"A100|PG509", DeviceCeiling("A100 40GB", 19.5, 156.0, 312.0, 312.0, None, 624.0, 1.555, "NVIDIA A100 datasheet")),
    # NVIDIA A10 datasheet: 31.2 fp32, 62.5 TF32, 125 bf16/fp16, 250 INT8 (dense), 600 GB/s.
    (r"\bA10\b", DeviceCeiling("A10", 31.2, 62.5, 125.0, 125.0, None, 250.0, 0.600, "NVIDIA A10 datasheet")),
    # NVIDIA Ampere GA102 whitepaper, appendix A (RTX 3090 FE): 35.6 fp32, 35.6 TF32, 71 fp16/bf16
    # with fp32 accumulate, 284 INT8, 936 GB/s.
    (r"3090", DeviceCeiling("GeForce RTX 3090", 35.6, 35.6, 71.0, 71.0, None, 284.0, 0.936, "NVIDIA Ampere GA102 GPU architecture whitepaper, appendix A")),
    # Same whitepaper, RTX 3080 FE: 29.8 fp32, 29.8 TF32, 59.5 fp16/bf16 (fp32 accumulate), 238 INT8, 760 GB/s.
    (r"3080", DeviceCeiling("GeForce RTX 3080", 29.8, 29.8, 59.5, 59.5, None, 238.0, 0.760, "NVIDIA Ampere GA102 GPU architecture whitepaper, appendix A")),
    # --- NVIDIA Ada Lovelace ---
    # NVIDIA L4 datasheet: 30.3 fp32, 120 TF32*, 242 fp16/bf16*, 485 fp8*, 485 INT8* (* sparse: halved), 300 GB/s.
    (r"\bL4\b", DeviceCeiling("L4", 30.3, 60.0, 121.0, 121.0, 242.5, 242.5, 0.300, "NVIDIA L4 datasheet")),
    # NVIDIA L40S datasheet: 91.6 fp32, 366 TF32*, 733 bf16/fp16*, 1,466 fp8*, 1,466 INT8* (* sparse: halved), 864 GB/s.
    (r"L40S", DeviceCeiling("L40S", 91.6, 183.0, 366.0, 366.0, 733.0, 733.0, 0.864, "NVIDIA L40S datasheet")),
    # NVIDIA Ada Lovelace GPU architecture whitepaper, appendix A (RTX 4090): 82.6 fp32, 82.6 TF32,
    # 165.2 fp16/bf16 with fp32 accumulate, 330.3 fp8 (fp32 accumulate), 660.6 INT8, 1,008 GB/s.
    (r"4090", DeviceCeiling("GeForce RTX 4090", 82.6, 82.6, 165.2, 165.2, 330.3, 660.6, 1.008, "NVIDIA Ada Lovelace GPU architecture whitepaper, appendix A")),
    # --- NVIDIA Hopper ---
    # NVIDIA H200 datasheet (SXM): the H100 SXM's compute, 4.8 TB/s HBM3e.
    (r"H200", DeviceCeiling("H200 SXM", 67.0, 494.7, 989.4, 989.4, 1978.9, 1978.9, 4.8, "NVIDIA H200 datasheet")),
    # NVIDIA H100 datasheet (PCIe): 51 fp32, 756 TF32*, 1,513 bf16/fp16*, 3,026 fp8/INT8* (* sparse: halved), 2 TB/s.
    (r"H100.*PCIE", DeviceCeiling("H100 PCIe", 51.0, 378.0, 756.0, 756.0, 1513.0, 1513.0, 2.0, "NVIDIA H100 datasheet (PCIe)")),
    # NVIDIA H100 datasheet (SXM): 67 fp32, 989 TF32*, 1,979 bf16/fp16*, 3,958 fp8/INT8* (* sparse: halved), 3.35 TB/s.
    (r"H100|GH200", DeviceCeiling("H100 SXM", 67.0, 494.7, 989.4, 989.4, 1978.9, 1978.9, 3.35, "NVIDIA H100 datasheet (SXM)")),
    # --- NVIDIA Blackwell: platform figures per GPU (eight GPUs), sparse halved ---
    # NVIDIA HGX B300 datasheet: 18 PF TF32*, 36 PF fp16/bf16*, 72 PF fp8*, 600 TF fp32, 64 TB/s per 8 GPUs; INT8 not given.
    (r"B300", DeviceCeiling("B300", 75.0, 1125.0, 2250.0, 2250.0, 4500.0, None, 8.0, "NVIDIA HGX B300 datasheet (per GPU of eight)")),
    # NVIDIA HGX B200 datasheet: 18 PF TF32*, 36 PF fp16/bf16*, 72 PF fp8*, 72 POPS INT8*, 600 TF fp32, 64 TB/s per 8 GPUs.
    (r"B200", DeviceCeiling("B200", 75.0, 1125.0, 2250.0, 2250.0, 4500.0, 4500.0, 8.0, "NVIDIA HGX B200 datasheet (per GPU of eight)")),
    # --- AMD CDNA 2 (per graphics compute die: half a module) ---
    # AMD Instinct MI250X datasheet (module): 95.7 fp32 matrix, 383 fp16/bf16, 383 INT8, 3.2 TB/s.
    (r"MI250X", DeviceCeiling("Instinct MI250X (one GCD)", 47.85, None, 191.5, 191.5, None, 191.5, 1.6, "AMD Instinct MI250X datasheet (module halved)")),
    # AMD Instinct MI250 datasheet (module): 90.5 fp32 matrix, 362.1 fp16/bf16, 362.1 INT8, 3.2 TB/s.
    (r"MI250|gfx90a.*250", DeviceCeiling("Instinct MI250 (one GCD)", 45.25, None, 181.05, 181.05, None, 181.05, 1.6, "AMD Instinct MI250 datasheet (module halved)")),
    # AMD Instinct MI210 datasheet: 45.3 fp32 matrix, 181 fp16/bf16, 181 INT8, 1.6 TB/s.
    (r"MI210", DeviceCeiling("Instinct MI210", 45.3, None, 181.0, 181.0, None, 181.0, 1.6, "AMD Instinct MI210 datasheet")),
    # --- AMD CDNA 3 ---
    # AMD Instinct MI300X datasheet: 163.4 fp32 matrix, 653.7 TF32, 1,307.4 fp16/bf16, 2,614.9 fp8/INT8 (dense), 5.3 TB/s.
    (r"MI300X", DeviceCeiling("Instinct MI300X", 163.4, 653.7, 1307.4, 1307.4, 2614.9, 2614.9, 5.3, "AMD Instinct MI300X datasheet")),
]
_COMPILED = [(re.compile(p, re.IGNORECASE), c) for p, c in _TABLE]


def device_ceiling(name: str | None) -> DeviceCeiling | None:
    """The ceiling of the device the trace names; None for a device not in the table."""
    if not name:
        return None
    for pattern, ceiling in _COMPILED:
        if pattern.search(name):
            return ceiling
    return None


def known_devices() -> list[DeviceCeiling]:
    return [c for _, c in _TABLE]


__all__ = ["DeviceCeiling", "PRECISIONS", "device_ceiling", "known_devices"]
