"""In which precision each matrix kernel ran, whether it ran on Tensor Cores, and how much
faster it would run in another precision.

The kernel name decides first, read by the kernel taxonomy (metrics.kernel_taxonomy: library,
family, precision and matrix-unit use by naming convention; cuBLAS's
`sm80_xmma_gemm_f32f32_f32f32_f32_..._ffma_...` is fp32 on the FMA units whatever its `xmma`).
Where the taxonomy leaves the precision or unit open (cuDNN's bf16 attention kernel is called
`..._wgmma_f16_...`; an Inductor GEMM template names no type), and for names no taxonomy row
reads, the classifier reads, in this order:

1. the launching op's input dtypes (`Input type` in traces recorded with
   `record_shapes=True`: `float`, `c10::BFloat16`, `c10::Half`, `c10::Float8_*`...) and,
   for fp32 ops whose kernel name does not say, the run's TF32 switches (facts file);
2. the kernel name read as tokens: `ffma`, `simt`, `sgemm`, `scudnn`, an all-fp32 type
   string (`f32f32_f32f32`) mean FMA units; `tf32`, `tensorop`, `s1688`/`h1688`/`16816`,
   `hmma`, `wgmma`/`gmma`, `nvjet`, bf16/fp16 type strings mean Tensor Cores;
3. the compute capability: no Tensor Cores before 7.0, TF32 only from 8.0, bf16 from 8.0,
   fp8 from 8.9.

Every kernel gets a `family` (gemm, conv, attention, rnn, or "" for other work), a
`precision` (fp32-fma, tf32, bf16, fp16, fp8, int8, fp64, unknown; "" for kernels that are
not matrix work: elementwise, layout, split-K reductions, workspace set-up) and
`tensor_core` (ran on Tensor Cores). Checked against Nsight Compute's tensor-pipe counters
on the H100 kernel corpus (tests/test_precision.py).

`precision_speedup(kernels, target)` turns that into a per-kernel duration scale factor for
moving the matrix kernels to `tf32`, `bf16` or `fp16`, from ratios measured on an H100
(the same GEMM, convolution, attention and LSTM cases in fp32, TF32, bf16 and fp16) and a
conservative table for GPUs without a measurement.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import orjson
import pandas as pd

from advisor.facts import FactsFile
from advisor.metrics.breakdown import row_groups, text_of, text_or_empty
from advisor.metrics.kernel_taxonomy import MATRIX_FAMILIES, read_kernel

PRECISIONS = ("fp32-fma", "tf32", "bf16", "fp16", "fp8", "fp4", "int8", "fp64", "mixed", "unknown")
FAMILIES = ("gemm", "conv", "attention", "rnn")
TARGETS = ("tf32", "bf16", "fp16")
HALF = ("bf16", "fp16")
# How far along fp32 → TF32 → 16 bit → 8 bit a precision is (a move never goes back).
_LEVEL = {"fp32-fma": 0, "tf32": 1, "bf16": 2, "fp16": 2, "fp8": 3, "int8": 3}
# The first compute capability whose Tensor Cores take each precision.
TENSOR_CORE_MIN_CAPABILITY = {"fp16": 7.0, "int8": 7.2, "tf32": 8.0, "bf16": 8.0, "fp8": 8.9, "fp4": 10.0}

# Where each answer came from (the `precision_source` column).
FROM_OP = "op input types"
FROM_NAME = "kernel name"
FROM_SWITCH = "TF32 switch"
FROM_CAPABILITY = "compute capability"
FROM_NOTHING = "not decided"


# --- the launching op -------------------------------------------------------------------------
FAMILY_OP = {
    "conv": re.compile(r"conv|Conv"),
    "attention": re.compile(r"scaled_dot_product|ScaledDotProduct|flash_attention|efficient_attention|cudnn_attention|fused_attention|FlashAttention|EfficientAttention|CudnnAttention"),
    "rnn": re.compile(r"^(aten::(_cudnn_rnn\w*|lstm|gru|rnn_tanh|rnn_relu|_thnn_fused_gru_cell)|CudnnRnnBackward\d*)$"),
    "gemm": re.compile(
        r"^(aten::(mm|bmm|addmm|_addmm_activation|addmv|mv|matmul|linear|baddbmm|addbmm|addr|dot|vdot|einsum|tensordot|"
        r"chain_matmul|linalg_multi_dot|_int_mm|_scaled_mm|_grouped_mm|_scaled_grouped_mm)|"
        r"(Mm|Bmm|Addmm|Addmv|Mv|Addbmm|Baddbmm|Linear|Matmul|Dot)Backward\d*)$"
    ),
}
# `Input type` spellings of the dtypes that decide a matrix kernel's precision.
DTYPE_OF_INPUT_TYPE = {
    "float": "fp32",
    "c10::complex<float>": "fp32",
    "double": "fp64",
    "c10::complex<double>": "fp64",
    "c10::Half": "fp16",
    "c10::BFloat16": "bf16",
    "signed char": "int8",
    "c10::Float8_e4m3fn": "fp8",
    "c10::Float8_e5m2": "fp8",
    "c10::Float8_e4m3fnuz": "fp8",
    "c10::Float8_e5m2fnuz": "fp8",
    "c10::Float8_e8m0fnu": "fp8",
}
_NARROW_FIRST = ("fp8", "int8", "bf16", "fp16", "fp32", "fp64")


@lru_cache(maxsize=4096)
def op_family(op: str | None) -> str:
    """gemm / conv / attention / rnn for ops whose work is matrix multiplication, else ""."""
    if not op:
        return ""
    for family, pattern in FAMILY_OP.items():
        if pattern.search(op):
            return family
    return ""


@lru_cache(maxsize=4096)
def op_dtype(input_types: str | None) -> str | None:
    """The narrowest floating (or int8) dtype among an op's tensor inputs: under autocast a
    matmul takes bf16 tensors; `_scaled_mm` takes fp8 tensors and fp32 scales."""
    if not input_types:
        return None
    try:
        types = orjson.loads(input_types)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(types, list):
        return None
    found = {DTYPE_OF_INPUT_TYPE.get(t) for t in types if isinstance(t, str)}
    return next((d for d in _NARROW_FIRST if d in found), None)


# --- the kernel name --------------------------------------------------------------------------
# Not matrix work, whichever op launched it: copies, layout changes, split-K reductions,
# workspace and index set-up, RNN and attention pointwise parts, Triton pointwise/reductions.
# The first list wins over every other reading of the name (cuDNN's split-K reduction is
# named like the xmma kernel it finishes); the second only where no unit is named (cutlass
# kernels spell `epilogue` and `Copy` in their template arguments).
HELPER_KERNEL = re.compile(
    r"split_k_kernel|splitKreduce|nchwToNhwc|nhwcToNchw|init_device_workspace|convert|dot_do_o|combine|"
    r"^triton_(?:poi|red|per)_|elementwise|elementWise|elemWise"
)
OTHER_WORK_KERNEL = re.compile(
    r"reduce|Reduce|[Tt]ranspose|_init|init_|RNN_|[Cc]opy|[Ff]ill|scal_kernel|bn_fw|bn_bw|[Ss]oftmax|dropout|"
    r"[Pp]adding|Offsets|precompute|scalePacked|epilogue::|im2col|col2im|conv_depthwise|depthwise|grouped_direct"
)
_T = r"c?(?:tf32|bf16|f16|f32|f64|e4m3|e5m2|s8|u8|i8|s32|i32)"
# cuBLAS/cuDNN xmma type string: {A}{B}_{compute}{accumulate}_{C}, e.g. f32f32_tf32f32_f32.
XMMA_TYPES = re.compile(rf"_({_T})({_T})_({_T})({_T})_")
XMMA_COMPUTE = {"f32": "fp32-fma", "cf32": "fp32-fma", "tf32": "tf32", "ctf32": "tf32", "bf16": "bf16", "f16": "fp16",
                "e4m3": "fp8", "e5m2": "fp8", "s8": "int8", "u8": "int8", "i8": "int8", "f64": "fp64", "cf64": "fp64"}
# PyTorch's memory-efficient attention (cutlass): dtype and the arch it was built for.
FMHA_CUTLASS = re.compile(r"fmha_cutlass[FB]_(f32|f16|bf16)\w*_sm(\d+)")
TENSOR_CORE_NAME = re.compile(
    r"tensorop|TensorOp|hmma|imma|wgmma|gmma|nvjet|tf32|tfloat32|h884|s884|h1688|s1688|c1688|i8816|i8832|16816|161616|"
    r"tensor\d+x\d+x\d+|flash_fwd|flash_bwd|flash_fprop|flash_bprop"
)
FMA_NAME = re.compile(
    r"ffma|simt|sgemm|scudnn|dgemm|gemmSN|gemv|gemmk1|_engine<(?:float|double)|winograd|fft2d|flip_filter|"
    r"pointwise_mult_and_sum_complex|implicit_convolve|explicit_convolve"
)
# Matrix kernels whose name leaves the unit open (precision from the op's dtype, else switches).
MATRIX_NAME = re.compile(r"(?<!fb)gemm|Gemm|lstm|LSTM|gru_|persistRNN|triton_tem_|triton_\w*mm|conv|Conv|fprop|dgrad|wgrad|attention|Attention|sdpa|fmha|flash")
FAMILY_NAME = {
    "conv": re.compile(r"conv|Conv|fprop|dgrad|wgrad|scudnn|winograd|fft2d|flip_filter|pointwise_mult_and_sum_complex|implicit_gemm|nchwkcrs|nhwckrsc"),
    "attention": re.compile(r"fmha|flash|sdpa|[Aa]ttention|_mha"),
    "rnn": re.compile(r"lstm|LSTM|gru_|GRU|RNN|rnn"),
}
NAME_DTYPE = [  # checked in order; the first that matches names the precision
    ("fp8", re.compile(r"e4m3|e5m2|fp8|float8|qgmma")),
    ("int8", re.compile(r"i8816|i8832|i16832|imma|int8|s8s8|_i8_")),
    ("bf16", re.compile(r"bf16|bfloat16|BFloat16")),
    ("tf32", re.compile(r"tf32|tfloat32")),
    ("fp16", re.compile(r"(?<![bt])f16|fp16|half_t|__half|Half|h884|h1688|h16816|hmma|hgemm")),
]
# cuBLASLt nvjet kernels spell their types in three letters after the arch: on the H100
# corpus fp16 GEMMs run nvjet_sm90_hsh_*, bf16 ones nvjet_sm90_tst_*.
NVJET_TYPES = re.compile(r"nvjet_(?:sm\d+_)?([a-z])[a-z]{2}_")
NVJET_DTYPE = {"h": "fp16", "t": "bf16", "q": "fp8", "e": "fp8"}


@dataclass(frozen=True)
class NameReading:
    """What a kernel name says: `unit` is "tensor", "fma", "matrix" (matrix work, unit not
    named), "helper" (not matrix work) or "" (says nothing); `precision` when it names one."""

    unit: str
    precision: str | None
    family: str


def function_part(name: str) -> str:
    """A demangled kernel name without its parameter list: `void ns::k<T, U>(int, fbgemm::X)`
    gives `void ns::k<T, U>`, so the types a kernel takes do not read as what it is."""
    name = name.replace("(anonymous namespace)", "anonymous")
    depth = 0
    for i, c in enumerate(name):
        if c == "<":
            depth += 1
        elif c == ">":
            depth = max(depth - 1, 0)
        elif c == "(" and depth == 0 and i > 0 and not name.startswith("operator", max(i - 8, 0)):
            return name[:i]
    return name


@lru_cache(maxsize=65536)
def read_kernel_name(full_name: str) -> NameReading:
    """The unit, precision and family a kernel name spells (cached per distinct name)."""
    name = function_part(full_name)
    family = next((f for f, p in FAMILY_NAME.items() if p.search(name)), "gemm")
    if HELPER_KERNEL.search(name):
        return NameReading("helper", None, "")
    m = FMHA_CUTLASS.search(name)
    if m:
        dtype = {"f32": "tf32", "f16": "fp16", "bf16": "bf16"}[m.group(1)]
        on_tensor = int(m.group(2)) >= (80 if m.group(1) == "f32" else 70)
        return NameReading("tensor" if on_tensor else "fma", dtype if on_tensor else ("fp32-fma" if dtype == "tf32" else dtype), "attention")
    m = XMMA_TYPES.search(name)
    if m and m.group(3) in XMMA_COMPUTE:
        precision = XMMA_COMPUTE[m.group(3)]
        return NameReading("fma" if precision in ("fp32-fma", "fp64") else "tensor", precision, family)
    if TENSOR_CORE_NAME.search(name):
        m = NVJET_TYPES.search(name)
        dtype = NVJET_DTYPE.get(m.group(1)) if m else None
        dtype = dtype or next((d for d, p in NAME_DTYPE if p.search(name)), None)
        return NameReading("tensor", dtype, family)
    if FMA_NAME.search(name):
        return NameReading("fma", "fp64" if re.search(r"dgemm|<double", name) else None, family)
    if OTHER_WORK_KERNEL.search(name):
        return NameReading("helper", None, "")
    if MATRIX_NAME.search(name):
        return NameReading("matrix", None, family)
    return NameReading("", None, "")


# --- the compute capability from library kernel names -----------------------------------------
ARCH_IN_KERNEL = re.compile(r"(?:^|[^a-z])(volta|turing|ampere|ada|hopper|blackwell)_")
SM_IN_KERNEL = re.compile(r"(?:^|[^a-z0-9])(?:sm_?|cutlass_)(\d)(\d)_")
ARCH_NAMES = {"volta": 7.0, "turing": 7.5, "ampere": 8.0, "ada": 8.9, "hopper": 9.0, "blackwell": 10.0}



def capability_from_kernels(names: pd.Series) -> float | None:
    """Lower bound of the compute capability from library kernel names (volta_sgemm, sm80_xmma...)."""
    found: list[float] = []
    names = pd.Series(names)
    distinct = names.unique() if isinstance(names.dtype, pd.CategoricalDtype) else names.astype(str).unique()  # by code, not by row
    for name in map(str, distinct):
        m = ARCH_IN_KERNEL.search(name)
        if m:
            found.append(ARCH_NAMES[m.group(1)])
        m = SM_IN_KERNEL.search(name)
        if m:
            found.append(int(m.group(1)) + int(m.group(2)) / 10)
    return max(found) if found else None



# --- the TF32 switches ------------------------------------------------------------------------
@dataclass(frozen=True)
class Tf32Switches:
    """PyTorch's two TF32 switches as the facts file recorded them (None: not recorded).

    `matmul` (torch.backends.cuda.matmul.allow_tf32, or float32_matmul_precision high/medium)
    governs cuBLAS GEMMs; `cudnn` (torch.backends.cudnn.allow_tf32) convolutions and cuDNN RNNs.
    """

    matmul: bool | None = None
    cudnn: bool | None = None

    @classmethod
    def from_facts(cls, recorded: FactsFile) -> Tf32Switches:
        tf32 = recorded.tf32
        matmul = True if tf32.float32_matmul_precision in ("high", "medium") else tf32.matmul
        return cls(matmul=matmul, cudnn=tf32.cudnn)

    def for_family(self, family: str) -> bool | None:
        return self.cudnn if family in ("conv", "rnn") else self.matmul


# Which TF32 switch governs each kernel family.
TF32_SWITCH_OF_FAMILY = {"gemm": "matmul", "attention": "matmul", "conv": "cudnn", "rnn": "cudnn"}


def tf32_switches_off(kernels: pd.DataFrame, switches: Tf32Switches) -> dict[str, bool]:
    """The TF32 switches ("matmul", "cudnn") that look off, each with whether TF32 kernels of its
    families ran: fp32 FMA matrix kernels of its families ran, and the facts file says it is
    off, or says nothing and no TF32 kernel of those families ran. PyTorch's fp32
    memory-efficient attention runs TF32 whatever the switch says: no evidence either way."""
    family = text_of(kernels["family"])
    precision = text_of(kernels["precision"])
    dur = kernels["dur"].to_numpy(np.float64)
    switch_of = np.array([TF32_SWITCH_OF_FAMILY.get(f, "") for f in family], dtype=object)
    fp32 = (precision == "fp32-fma") & (switch_of != "")
    tf32 = (precision == "tf32") & (family != "attention")
    off = {}
    for name, switch in (("matmul", switches.matmul), ("cudnn", switches.cudnn)):
        mine = switch_of == name
        if dur[fp32 & mine].sum() <= 0:
            continue
        has_tf32 = bool((tf32 & mine).any())
        if switch is True or (switch is None and has_tf32):
            continue  # TF32 is allowed; the library chose fp32 kernels for these shapes
        off[name] = has_tf32
    return off


# --- the classifier ---------------------------------------------------------------------------
def _runs_on_tensor_cores(precision: str, capability: float | None) -> bool:
    least = TENSOR_CORE_MIN_CAPABILITY.get(precision)
    return least is not None and (capability is None or capability + 1e-9 >= least)


# The taxonomy's precisions in this module's words, and its matrix families as the ratio table's.
_TAXONOMY_PRECISION = {"fp64": "fp64", "fp32": "fp32-fma", "tf32": "tf32", "fp16": "fp16", "bf16": "bf16", "fp8_e4m3": "fp8",
                       "fp8_e5m2": "fp8", "mxfp8": "fp8", "mxfp4": "fp4", "nvfp4": "fp4", "int8": "int8", "mixed": "mixed"}
_TAXONOMY_FAMILY = {"gemm": "gemm", "grouped_gemm": "gemm", "conv": "conv", "attention": "attention"}
_TAXONOMY_UNIT = {"yes": "tensor", "no": "fma", "unknown": "matrix"}
# The op input dtype (op_dtype) a precision runs from: an fp32 op runs fp32 FMA or TF32 kernels.
_OP_DTYPE_OF = {"fp32-fma": "fp32", "tf32": "fp32", "bf16": "bf16", "fp16": "fp16", "fp8": "fp8", "int8": "int8", "fp64": "fp64"}


@lru_cache(maxsize=65536)
def classify_kernel(name: str, op: str | None, input_types: str | None, capability: float | None, switches: Tf32Switches) -> tuple[str, str, bool, str]:
    """(family, precision, on Tensor Cores, where the precision came from) of one kernel.

    The name decides first (metrics.kernel_taxonomy): a kernel of a non-matrix family is not
    matrix work whatever launched it; a precision the name spells is the precision. Only where
    the name leaves the precision or the unit open do the launching op's dtypes, the TF32
    switches and the compute capability decide. Names no taxonomy row reads keep the older token
    reading (read_kernel_name)."""
    reading = read_kernel(name)
    by_op = op_family(op)
    dtype = op_dtype(input_types)
    if not reading.convention:
        return _resolve(read_kernel_name(name), by_op, dtype, capability, switches)
    if reading.family not in MATRIX_FAMILIES:
        return (by_op, "", False, "")
    family = _TAXONOMY_FAMILY[reading.family]
    precision = _TAXONOMY_PRECISION.get(reading.precision)
    if precision is None or (precision == "mixed" and dtype is None and reading.matrix_unit == "unknown"):
        return _resolve(NameReading(_TAXONOMY_UNIT[reading.matrix_unit], None, family), by_op, dtype, capability, switches)
    if reading.matrix_unit == "unknown":
        on_tensor = precision != "mixed" and _runs_on_tensor_cores(precision, capability)
    else:
        on_tensor = reading.matrix_unit == "yes"
    if capability is not None and capability < 7.0:
        on_tensor = False
    # The op's input types, where recorded and saying the same, back the name's reading.
    agrees = dtype is not None and _OP_DTYPE_OF.get(precision) == dtype
    return (by_op or family, precision, on_tensor, FROM_OP if agrees else FROM_NAME)


def _resolve(reading: NameReading, by_op: str, dtype: str | None, capability: float | None, switches: Tf32Switches) -> tuple[str, str, bool, str]:
    """Family, precision, unit and source from a name reading that may leave the precision or
    the unit open, completed by the op's dtype, the switches and the capability."""
    if reading.unit == "helper" or (not by_op and not reading.unit):
        return (by_op, "", False, "")
    family = by_op or reading.family
    no_tensor_cores = capability is not None and capability < 7.0
    if reading.unit == "fma":
        precision = reading.precision or (dtype if dtype and dtype != "fp32" else "fp32-fma")
        return (family, precision, False, FROM_NAME if reading.precision or dtype is None else FROM_OP)
    if reading.unit == "tensor":
        if dtype in ("bf16", "fp16", "fp8", "int8"):
            precision, source = dtype, FROM_OP
        elif reading.precision is not None:
            precision, source = reading.precision, FROM_NAME
        elif dtype == "fp32":
            precision, source = "tf32", FROM_OP  # an fp32 op on Tensor Cores runs TF32
        elif capability is not None:
            # s1688/s884 and the like without a dtype: fp16 before Ampere, TF32 from it on
            precision, source = ("tf32" if capability >= 8.0 else "fp16"), FROM_CAPABILITY
        else:
            precision, source = "unknown", FROM_NOTHING
        if precision == "tf32" and capability is not None and capability < 8.0:
            precision = "fp16"
        return (family, precision, not no_tensor_cores, source)
    # Matrix work whose name does not say which unit ran it: the op's dtype decides.
    if dtype in ("bf16", "fp16", "fp8", "int8"):
        return (family, dtype, _runs_on_tensor_cores(dtype, capability), FROM_OP)
    if dtype == "fp64":
        return (family, "fp64", False, FROM_OP)
    if dtype == "fp32":
        switch = switches.for_family(family)
        if switch is None:
            return (family, "unknown", False, FROM_NOTHING)
        if switch and _runs_on_tensor_cores("tf32", capability):
            return (family, "tf32", True, FROM_SWITCH)
        return (family, "fp32-fma", False, FROM_SWITCH)
    return (family, "unknown", False, FROM_NOTHING)


def classify_kernels(
    kernels: pd.DataFrame,
    capability: float | None = None,
    switches: Tf32Switches | None = None,
) -> pd.DataFrame:
    """`family`, `precision`, `tensor_core` and `precision_source` for every kernel row.

    Reads `name`, `op` and `op_input_types` (see metrics.kernels.launching_op_table); the
    work is done once per distinct (name, op, input types) triple.
    """
    switches = switches or Tf32Switches()
    cols = ["family", "precision", "tensor_core", "precision_source"]
    if len(kernels) == 0:
        return pd.DataFrame({c: pd.Series(dtype=bool if c == "tensor_core" else object) for c in cols}, index=kernels.index)
    name, op, types = text_of(kernels["name"]), _text(kernels, "op"), _text(kernels, "op_input_types")
    by_name = kernels["name"].array.codes if isinstance(kernels["name"].dtype, pd.CategoricalDtype) else name  # one code per name
    codes = row_groups([by_name, op, types])
    first = np.unique(codes, return_index=True)[1]  # each distinct triple's first row, in code order
    cap = None if capability is None or not np.isfinite(capability) else float(capability)
    answers = [classify_kernel(name[i], op[i] or None, types[i] or None, cap, switches) for i in first.tolist()]
    table = pd.DataFrame(answers, columns=cols, dtype=object)  # object text: see metrics.kernels
    out = table.iloc[codes].set_axis(kernels.index)
    out["tensor_core"] = out["tensor_core"].astype(bool)
    return out


def _text(kernels: pd.DataFrame, column: str) -> np.ndarray:
    if column not in kernels:
        return np.full(len(kernels), "", dtype=object)
    return text_or_empty(kernels[column])


def precision_time_ms(kernels: pd.DataFrame, n_steps: int) -> dict[str, float]:
    """Matrix kernel time per step by precision (ms), largest first; other kernels left out."""
    if len(kernels) == 0 or "precision" not in kernels:
        return {}
    k = kernels[kernels["precision"].astype(str) != ""]
    g = k.groupby(k["precision"].astype(str))["dur"].sum().sort_values(ascending=False)
    return {str(p): round(float(ns) / 1e6 / max(n_steps, 1), 3) for p, ns in g.items() if ns > 0}


# --- how much faster in another precision -----------------------------------------------------
@dataclass(frozen=True)
class ArchSpeedup:
    """Conservative speed-ups of Tensor-Core-eligible kernel time on one architecture."""

    name: str
    min_capability: float
    half_over_fp32: float  # fp16/bf16 Tensor Cores instead of plain fp32
    tf32_over_fp32: float | None  # TF32 Tensor Cores instead of plain fp32 (None: no TF32)
    half_over_tf32: float | None  # fp16/bf16 instead of TF32


# The conservative table, for GPUs with no measurement. Datasheet dense peaks (TFLOPS, fp32 /
# TF32 / fp16-bf16 Tensor Core): V100 15.7 / – / 125; T4 8.1 / – / 65; A100 19.5 / 156 / 312;
# A10 31.2 / 62.5 / 125; H100 SXM 67 / 494 / 989. The factors are far below those: a training
# step also spends time in casts, layout changes and memory-bound work. Volta's 2.0× on the
# eligible kernel time reproduces the ~1.5× throughput autocast gave a GPU-bound ResNet-18 on a
# V100. Consumer cards (GeForce RTX 30/40/50) run TF32 and fp16-with-fp32-accumulate at or
# near their fp32 rate, hence the small factors of the 8.6 and 12.0 rows.
ARCH_SPEEDUPS: list[ArchSpeedup] = [
    ArchSpeedup("Volta", 7.0, half_over_fp32=2.0, tf32_over_fp32=None, half_over_tf32=None),
    ArchSpeedup("Turing", 7.5, half_over_fp32=2.0, tf32_over_fp32=None, half_over_tf32=None),
    ArchSpeedup("Ampere A100/A30", 8.0, half_over_fp32=3.0, tf32_over_fp32=2.0, half_over_tf32=1.5),
    ArchSpeedup("Ampere/Ada A10, L4, L40, RTX 30/40", 8.6, half_over_fp32=1.56, tf32_over_fp32=1.2, half_over_tf32=1.3),
    ArchSpeedup("Hopper", 9.0, half_over_fp32=3.0, tf32_over_fp32=2.0, half_over_tf32=1.5),
    ArchSpeedup("Blackwell", 10.0, half_over_fp32=3.0, tf32_over_fp32=2.0, half_over_tf32=1.5),
    ArchSpeedup("Blackwell RTX 50", 12.0, half_over_fp32=1.56, tf32_over_fp32=1.2, half_over_tf32=1.3),
]


def arch_speedup(capability: float | None) -> ArchSpeedup | None:
    """The row for a compute capability (the newest row not above it); None below Volta."""
    if capability is None:
        return None
    rows = [a for a in ARCH_SPEEDUPS if a.min_capability <= capability + 1e-9]
    return rows[-1] if rows else None


# Measured on one H100 80GB HBM3 (torch 2.11, cuDNN 9.19, CUDA 13.0): the kernel corpus runs
# the same cases in fp32 (TF32 off), TF32, bf16 and fp16 autocast; each ratio is the kernel
# time of the family's cases (every kernel they launch, casts included) in one precision over
# the other, summed over the cases and both repetitions. `benchmarks/precision_ratios.py`
# recomputes it from the traces. Cases: gemm = linear 8192x4096x4096-class, linear with odd
# sizes, bmm; conv = a 3x3 convolution in NCHW and in channels-last; attention = SDPA;
# rnn = a cuDNN LSTM. Per case fp32 → TF32: linear 5.86, linear_odd 1.44, bmm 2.04,
# conv_nchw 2.00, conv_channels_last 3.14, sdpa 1.00 (fp32 SDPA already runs the TF32
# memory-efficient kernel), lstm 1.14; TF32 → bf16: 1.33, 0.91, 1.42, 1.49, 1.16, 6.06, 3.72.
MEASURED_RATIOS: dict[float, dict[tuple[str, str, str], float]] = {
    9.0: {
        ("gemm", "fp32-fma", "tf32"): 4.63, ("gemm", "tf32", "bf16"): 1.27, ("gemm", "tf32", "fp16"): 1.27,
        ("gemm", "fp32-fma", "bf16"): 5.90, ("gemm", "fp32-fma", "fp16"): 5.88,
        ("conv", "fp32-fma", "tf32"): 2.46, ("conv", "tf32", "bf16"): 1.34, ("conv", "tf32", "fp16"): 1.35,
        ("conv", "fp32-fma", "bf16"): 3.29, ("conv", "fp32-fma", "fp16"): 3.33,
        ("attention", "tf32", "bf16"): 6.06, ("attention", "tf32", "fp16"): 6.02,
        ("rnn", "fp32-fma", "tf32"): 1.14, ("rnn", "tf32", "bf16"): 3.72, ("rnn", "tf32", "fp16"): 3.57,
        ("rnn", "fp32-fma", "bf16"): 4.23, ("rnn", "fp32-fma", "fp16"): 4.06,
    },
}
MEASURED_DEVICE = {9.0: "H100 80GB HBM3"}


@dataclass(frozen=True)
class RatioTable:
    """Speed-ups for one compute capability: measured where the corpus has them, else the
    conservative architecture row."""

    capability: float | None
    arch: ArchSpeedup | None
    measured: dict[tuple[str, str, str], float]
    measured_on: str | None

    def ratio(self, family: str, source: str, target: str) -> tuple[float, str]:
        """(speed-up of `family` kernels moved from `source` to `target`, "measured"/"conservative")."""
        if _LEVEL.get(source, 9) >= _LEVEL.get(target, -1):
            return 1.0, "none"
        key = (family, source, target)
        if key in self.measured:
            return self.measured[key], "measured"
        arch = self.arch
        if arch is None or not _runs_on_tensor_cores(target, self.capability):
            return 1.0, "none"
        if target == "tf32":
            return (arch.tf32_over_fp32 or 1.0), "conservative"
        if source == "tf32":
            return (arch.half_over_tf32 or 1.0), "conservative"
        return arch.half_over_fp32, "conservative"


def ratio_table(capability: float | None) -> RatioTable:
    """The speed-up table for a device (measured rows for its architecture where there are any)."""
    arch = arch_speedup(capability)
    measured: dict[tuple[str, str, str], float] = {}
    measured_on = None
    for cap, table in MEASURED_RATIOS.items():
        if arch is not None and arch is arch_speedup(cap):  # the same architecture row
            measured, measured_on = table, MEASURED_DEVICE[cap]
    return RatioTable(capability=capability, arch=arch, measured=measured, measured_on=measured_on)


def precision_speedup(kernels: pd.DataFrame, target: str, capability: float | None = None) -> pd.Series:
    """Per kernel, the factor its duration is multiplied by when its matrix work moves to
    `target` ("tf32", "bf16" or "fp16"): in (0, 1], and 1 where nothing changes.

    `kernels` carries `family` and `precision` (kernel_table adds them). Only fp32-fma and
    tf32 matrix kernels move, never backwards (a bf16 kernel asked to go to tf32 stays 1);
    kernels of unknown precision, helpers and other work stay 1. The capability picks the
    ratio table (measured on an H100 for 9.x, conservative elsewhere); without it, the one
    kernel_table recorded in `kernels.attrs["compute_capability"]` is used.
    """
    if target not in TARGETS:
        raise ValueError(f"target must be one of {', '.join(TARGETS)}, not {target!r}")
    if capability is None:
        capability = kernels.attrs.get("compute_capability")
    table = ratio_table(capability)
    if len(kernels) == 0:
        return pd.Series(np.ones(0), index=kernels.index, dtype=np.float64)
    family = text_of(kernels["family"])
    precision = text_of(kernels["precision"])
    factor = np.ones(len(kernels), dtype=np.float64)
    movable = np.isin(precision, ("fp32-fma", "tf32")) & (family != "")
    if movable.any():
        fam, prec = family[movable], precision[movable]
        codes = row_groups([fam, prec])  # numbered as a MultiIndex of the pairs would number them
        first = np.unique(codes, return_index=True)[1]
        per_pair = np.array([1.0 / table.ratio(fam[i], prec[i], target)[0] for i in first.tolist()], dtype=np.float64)
        factor[movable] = per_pair[codes]
    return pd.Series(factor, index=kernels.index, name=f"scale_to_{target}")


__all__ = [
    "PRECISIONS",
    "FAMILIES",
    "TARGETS",
    "Tf32Switches",
    "TF32_SWITCH_OF_FAMILY",
    "tf32_switches_off",
    "NameReading",
    "read_kernel_name",
    "function_part",
    "op_family",
    "op_dtype",
    "classify_kernel",
    "classify_kernels",
    "precision_time_ms",
    "ArchSpeedup",
    "ARCH_SPEEDUPS",
    "arch_speedup",
    "MEASURED_RATIOS",
    "RatioTable",
    "ratio_table",
    "precision_speedup",
    "precision_page",
    "with_precision_page",
]


# --- the page section the precision rules share ------------------------------------------------
def record_shapes_in_trace(m) -> bool:
    """Whether the rank's trace was recorded with record_shapes: its header says so, or its ops
    carry input shapes or types (what a message may then never call record_shapes=False)."""
    flag = m.frames.metadata.get("record_shapes")
    if flag in (1, True, "1", "true", "True"):
        return True
    return bool(m.roofline is not None and m.roofline.shapes_recorded)


def names_only_sentence(record_shapes: bool) -> str:
    """What a precision finding read from kernel names alone says of why, as the evidence's
    `record_shapes` holds it."""
    if record_shapes:
        return (
            " The precision is read from kernel names alone: the trace holds input types (record_shapes=True), "
            "but not on the ops that launched these kernels."
        )
    return " The precision is read from kernel names alone (the trace has no input types: record_shapes=False)."


def with_precision_page(doc: str) -> str:
    """A rule page with the precision section added before its closing reference line."""
    section = precision_page()
    if "\nReference: " in doc:
        head, _, tail = doc.rpartition("\nReference: ")
        return f"{head.rstrip()}\n\n{section}\nReference: {tail}"
    return f"{doc.rstrip()}\n\n{section}"


def precision_page() -> str:
    """Markdown for `advisor explain`: how a kernel's precision is decided, and the measured
    speed-up table (rendered from MEASURED_RATIOS, so the page cannot drift from the code)."""
    rows = []
    for cap, table in MEASURED_RATIOS.items():
        for family in FAMILIES:
            cells = []
            for source, target in (("fp32-fma", "tf32"), ("tf32", "bf16"), ("tf32", "fp16"), ("fp32-fma", "bf16")):
                value = table.get((family, source, target))
                cells.append(f"{value:.2f}×" if value is not None else "–")
            rows.append(f"| {MEASURED_DEVICE[cap]} | {family} | " + " | ".join(cells) + " |")
    return (
        "## How the precision is decided\n"
        "Every GEMM, convolution, attention and RNN kernel gets a precision (`fp32-fma`, `tf32`, `bf16`, "
        "`fp16`, `fp8`, `fp4`, `int8`, `fp64`, `mixed`, `unknown`) and whether it ran on Tensor Cores. The kernel name "
        "decides first where its library's naming convention spells the types and the unit (the kernel taxonomy: "
        "`advisor report --kernels` shows each kernel's reading); where it does not, from, in this order:\n"
        "1. the launching op's input dtypes (`Input type`, recorded with `record_shapes=True`: `float`, "
        "`c10::BFloat16`, `c10::Half`, `c10::Float8_*`); a 16-bit or 8-bit op runs in that precision; an fp32 op "
        "whose kernel name does not say which unit ran it follows the run's TF32 switch for its family "
        "(facts file: `tf32.matmul` / `float32_matmul_precision` for GEMMs and attention, `tf32.cudnn` for "
        "convolutions and cuDNN RNNs);\n"
        "2. the kernel name read as tokens, not substrings: `ffma`, `simt`, `sgemm`, `scudnn`, an all-fp32 type "
        "string (`f32f32_f32f32`) mean the FMA units; `tf32`, `tensorop`, `s1688`/`h1688`/`16816`, `hmma`, "
        "`wgmma`/`gmma`, `nvjet`, bf16/fp16 type strings mean Tensor Cores (cuBLAS's "
        "`sm80_xmma_gemm_f32f32_f32f32_f32_..._ffma` is an fp32 FMA kernel whatever its `xmma`); layout, "
        "split-K, copy and pointwise kernels that matrix ops launch are not matrix work;\n"
        "3. the compute capability: no Tensor Cores before 7.0, TF32 and bf16 only from 8.0, fp8 from 8.9.\n\n"
        "Checked against Nsight Compute's tensor-pipe counters on an H100 kernel corpus (fp32, TF32, bf16, "
        "fp16, defaults): 0.0% of kernel cycles misclassified (`tests/test_precision.py`). Where the trace has no input types "
        "(`record_shapes=False`) and there is no facts file, the kernel names decide alone and the finding "
        "says so, at lower confidence.\n\n"
        "Speed-ups measured on an H100 (same cases in each precision; kernel time of each family's cases, "
        "casts and layout changes included; `benchmarks/precision_ratios.py` recomputes them). Other GPUs, "
        "and pairs not measured, use the conservative architecture table.\n\n"
        "| measured on | family | fp32 → TF32 | TF32 → bf16 | TF32 → fp16 | fp32 → bf16 |\n"
        "| --- | --- | --- | --- | --- | --- |\n" + "\n".join(rows) + "\n"
    )
