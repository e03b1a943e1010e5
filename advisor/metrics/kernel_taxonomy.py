"""What a kernel's name says: its library, its family of work, its math precision and whether
it runs on the matrix units (Tensor Cores, AMD Matrix Cores), read from the name alone.

The readings are data: `TAXONOMY` below is a table of name patterns, each row naming the
library, family, precision and matrix-unit use its names stand for, and the naming convention it
follows. The first row whose pattern the name contains decides (rows are ordered from the most
specific to the most generic); each row is searched only in names holding one of the plain
substrings its pattern requires (`_hints`), so a name costs a few substring tests per row. A precision or matrix-unit cell that starts with `@` is read from
the name by the reader of that name (`_PRECISION_READERS`, `_UNIT_READERS`): the types spelled in
a cuBLAS `xmma` type string, a Tensile `Cijk_` problem type, template arguments, and so on.

Families: gemm, grouped_gemm, conv, attention, elementwise, reduction, norm, softmax, copy,
optimizer, embedding, sort, communication:{all_reduce, all_gather, reduce_scatter, all_to_all,
send_recv, other}, other. Precisions: fp64, fp32, tf32, fp16, bf16, fp8_e4m3, fp8_e5m2, mxfp8,
mxfp4, nvfp4, int8, mixed, unknown. Matrix units: yes, no, unknown.

A name is read once (cached per distinct name; metrics.kernels.read_kernel_names reads a
column of names once per distinct name). Where the name says nothing (`unknown`), metrics.precision falls back
to the launching op's dtypes and the device.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

FAMILIES = (
    "gemm", "grouped_gemm", "conv", "attention", "elementwise", "reduction", "norm", "softmax", "copy",
    "optimizer", "embedding", "sort", "communication:all_reduce", "communication:all_gather",
    "communication:reduce_scatter", "communication:all_to_all", "communication:send_recv",
    "communication:other", "other",
)
MATRIX_FAMILIES = ("gemm", "grouped_gemm", "conv", "attention")
PRECISIONS = ("fp64", "fp32", "tf32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2", "mxfp8", "mxfp4", "nvfp4", "int8", "mixed", "unknown")
UNITS = ("yes", "no", "unknown")


@dataclass(frozen=True)
class KernelReading:
    """What one kernel name says (see the module docstring for the vocabularies)."""

    library: str
    family: str
    precision: str
    matrix_unit: str
    convention: str  # the naming convention of the row that read it ("" when no row matched)

    @property
    def communication(self) -> bool:
        return self.family.startswith("communication")


UNREAD = KernelReading("unknown", "other", "unknown", "unknown", "")

# --- readers of the precision a name spells ---------------------------------------------------
_DTYPE_TOKENS = (
    (r"c10::BFloat16|__nv_bfloat16|__hip_bfloat16|bfloat16_t|\bBFloat16\b|DF16b|\bbf16\b", "bf16"),
    (r"c10::Half|\b__half\b|half_t|DF16_|\bhalf\b|\bHalf\b", "fp16"),
    (r"Float8_e4m3|float_e4m3", "fp8_e4m3"),
    (r"Float8_e5m2|float_e5m2", "fp8_e5m2"),
    (r"\bfloat2?\b", "fp32"),
    (r"\bdouble\b", "fp64"),
    # integers, opaque bytes and scale types: no math precision
    (r"\b(?:long|int|short|bool|unsigned|int64_t|int32_t|uint8_t|int8_t|Float8_e8m0fnu|OpaqueType)\b", "unknown"),
)
_DTYPE = re.compile("|".join(f"(?P<d{i}>{p})" for i, (p, _) in enumerate(_DTYPE_TOKENS)))


def _first_dtype(name: str) -> str:
    """The first element type a demangled (or Itanium-mangled) name spells in its template
    arguments: `reduce_kernel<..., ReduceOp<c10::BFloat16, ...>>` is bf16 work; an integer or
    opaque type first says nothing about math precision."""
    m = _DTYPE.search(name)
    if not m:
        return "unknown"
    return _DTYPE_TOKENS[int(m.lastgroup[1:])][1]


_T = r"c?(?:tf32|bf16|f16|f32|f64|e4m3|e5m2|s8|u8|i8|s32|i32)"
_XMMA_TYPES = re.compile(rf"_({_T})({_T})_({_T})({_T})_")
_XMMA_COMPUTE = {"f32": "fp32", "cf32": "fp32", "tf32": "tf32", "ctf32": "tf32", "bf16": "bf16", "f16": "fp16", "e4m3": "fp8_e4m3",
                 "e5m2": "fp8_e5m2", "s8": "int8", "u8": "int8", "i8": "int8", "f64": "fp64", "cf64": "fp64"}


def _xmma(name: str) -> str:
    """cuBLAS/cuDNN xmma: `{A}{B}_{compute}{accumulate}_{C}`; the compute type is the math."""
    m = _XMMA_TYPES.search(name)
    return _XMMA_COMPUTE.get(m.group(3), "unknown") if m else "unknown"


_NVJET = re.compile(r"nvjet_(?:sm\d+_)?([a-z]+?)(?:_|\d)")
_NVJET_FIRST = {"h": "fp16", "t": "bf16", "q": "fp8_e4m3", "e": "fp8_e5m2"}


def _nvjet(name: str) -> str:
    """cuBLASLt nvjet: three type letters after the arch, A's first (hsh fp16, tst bf16)."""
    m = _NVJET.search(name)
    return _NVJET_FIRST.get(m.group(1)[:1], "unknown") if m else "unknown"


_CUTLASS2 = re.compile(r"cutlass_(?:\d+_)?(tensorop|wmma_tensorop|simt)_(?:(bf16|f16|tf32)_)?([shcdzi])(\d*)(?:gemm|fprop|dgrad|wgrad)(?:_optimized)?_?(bf16|f16|tf32)?")


def _cutlass2(name: str) -> str:
    """CUTLASS 2.x (as cuBLAS/cuDNN ship it): `cutlass_80_tensorop_bf16_s16816gemm_bf16`:
    element type before or after the instruction; a bare `s1688` Tensor Core op is TF32."""
    m = _CUTLASS2.search(name)
    if not m:
        return "unknown"
    unit, t_in, acc, shape, t_out = m.groups()
    if unit == "simt":
        return "fp64" if acc in "dz" else "fp32"
    named = {"bf16": "bf16", "f16": "fp16", "tf32": "tf32"}.get(t_in or t_out or "")
    if named:
        return named
    if acc == "s" and shape in ("1688", ""):
        arch = re.search(r"cutlass_(\d\d)_", name)
        return "fp16" if arch and int(arch.group(1)) < 80 else "tf32"  # no TF32 before Ampere
    return "fp16" if acc == "h" else "unknown"


def _cutlass2_unit(name: str) -> str:
    m = _CUTLASS2.search(name)
    return "unknown" if not m else ("no" if m.group(1) == "simt" else "yes")


_TENSILE = re.compile(r"Cijk_A[a-z]+_B[a-z]+_(F8B8|B8F8|F8|B8|I8|[SDHBZC])")
_TENSILE_TYPE = {"S": "fp32", "D": "fp64", "Z": "fp64", "C": "fp32", "H": "fp16", "B": "bf16", "F8": "fp8_e4m3", "B8": "fp8_e5m2",
                 "F8B8": "mixed", "B8F8": "mixed", "I8": "int8"}


def _tensile(name: str) -> str:
    """Tensile/hipBLASLt `Cijk_Ailk_Bljk_BBS_BH...`: the problem type's first letter is the
    input type (S fp32, H fp16, B bf16, F8/B8 fp8, I8 int8)."""
    m = _TENSILE.search(name)
    return _TENSILE_TYPE[m.group(1)] if m else "unknown"


_COMM_DTYPE = re.compile(r"_(f32|f16|bf16|float|half|bfloat16|double|f64)(?:_|\(|$)")
_COMM_DTYPES = {"f32": "fp32", "float": "fp32", "f16": "fp16", "half": "fp16", "bf16": "bf16", "bfloat16": "bf16", "double": "fp64", "f64": "fp64"}


def _comm(name: str) -> str:
    """NCCL/RCCL: `ncclDevKernel_AllReduce_Sum_f32_RING_LL` names the reduced type."""
    m = _COMM_DTYPE.search(name)
    return _COMM_DTYPES[m.group(1)] if m else "unknown"


def _cutlass3(name: str) -> str:
    """CUTLASS 3.x / CuTe templates: block-scaled MX or NV types first, then the element types."""
    if re.search(r"mx_float8|mxf8|mxfp8", name):
        return "mxfp8"
    if re.search(r"mx_float4|mxf4|mxfp4", name):
        return "mxfp4"
    if re.search(r"nv_float4|nvf4|nvfp4", name):
        return "nvfp4"
    if "BlockScaled" in name:  # block-scaled e4m3/e5m2 take MX (ue8m0) scales; e2m1 with ue4m3 scales is NVFP4
        if re.search(r"float_e2m1|e2m1", name):
            return "nvfp4" if re.search(r"ue4m3", name) else "mxfp4"
        if re.search(r"float_e4m3|float_e5m2|e4m3|e5m2", name):
            return "mxfp8"
    for pattern, precision in ((r"float_e4m3|e4m3", "fp8_e4m3"), (r"float_e5m2|e5m2", "fp8_e5m2"), (r"tfloat32", "tf32")):
        if re.search(pattern, name):
            return precision
    return _first_dtype(name)


_LOW_BITS = re.compile(r"(?i)(?:^|[_\Wx\d]|(?<=[a-z])(?=Mx|E\dm\d))(mx)?(e4m3|e5m2|e2m1|fp8|float8|fp4|mxfp4|mxfp8|nvfp4|int8|i8|bf16|bfloat16|fp16|f16|half)(?=$|[_\W\dx]|(?-i:[A-Z]))")


def _low_bits(name: str) -> str:
    """Names that spell their operand types as words (TensorRT-LLM `bmm_MxE4m3_MxE2m1`,
    DeepGEMM `fp8_gemm`, triton_kernels `bf16xbf16xmxfp4`): one type is that precision, an
    8- or 4-bit type beside a wider one is mixed."""
    found = []
    for m in _LOW_BITS.finditer(name):
        mx, t = m.group(1), m.group(2).lower()
        t = {"e4m3": "fp8_e4m3", "fp8": "fp8_e4m3", "float8": "fp8_e4m3", "e5m2": "fp8_e5m2", "e2m1": "nvfp4", "fp4": "nvfp4",
             "i8": "int8", "bfloat16": "bf16", "f16": "fp16", "half": "fp16"}.get(t, t)
        if mx and t == "fp8_e4m3":
            t = "mxfp8"
        elif mx and t == "nvfp4":
            t = "mxfp4"
        found.append(t)
    distinct = list(dict.fromkeys(found))
    if not distinct:
        return "unknown"
    return distinct[0] if len(distinct) == 1 else "mixed"


def _fmha_cutlass(name: str) -> str:
    """PyTorch's memory-efficient attention `fmha_cutlassF_{f32,f16,bf16}_..._sm80`: fp32 runs TF32 from sm80 on."""
    m = re.search(r"fmha_cutlass[FB]_(f32|f16|bf16)\w*_sm(\d+)", name)
    if not m:
        return "unknown"
    if m.group(1) == "f32":
        return "tf32" if int(m.group(2)) >= 80 else "fp32"
    return {"f16": "fp16", "bf16": "bf16"}[m.group(1)]


def _fmha_cutlass_unit(name: str) -> str:
    m = re.search(r"fmha_cutlass[FB]_(f32|f16|bf16)\w*_sm(\d+)", name)
    if not m:
        return "unknown"
    return "yes" if int(m.group(2)) >= (80 if m.group(1) == "f32" else 70) else "no"


def _xmma_unit(name: str) -> str:
    return {"fp32": "no", "fp64": "no", "unknown": "unknown"}.get(_xmma(name), "yes")


def _tensile_unit(name: str) -> str:
    """Tensile's `MI16x16x16` token names the MFMA instruction: Matrix Cores."""
    return "yes" if re.search(r"_MI\d+x\d+x\d+", name) else "no"


_PRECISION_READERS = {
    "@dtype": _first_dtype, "@xmma": _xmma, "@nvjet": _nvjet, "@cutlass2": _cutlass2, "@tensile": _tensile, "@comm": _comm,
    "@cutlass3": _cutlass3, "@low_bits": _low_bits, "@fmha_cutlass": _fmha_cutlass,
}
_UNIT_READERS = {"@xmma": _xmma_unit, "@cutlass2": _cutlass2_unit, "@tensile": _tensile_unit, "@fmha_cutlass": _fmha_cutlass_unit}


def _triton_family(name: str) -> str:
    """Inductor's `triton_{poi,red,per}_fused_<ops>`: softmax and norm by the ops fused, else
    pointwise kernels are elementwise and reductions/persistent reductions are reductions."""
    if "softmax" in name:
        return "softmax"
    if "norm" in name:
        return "norm"
    return "elementwise" if name.startswith("triton_poi") else "reduction"


def _communication_kind(name: str) -> str:
    if re.search(r"(?i)all_?reduce|cross_device_reduce", name):
        return "communication:all_reduce"
    if re.search(r"(?i)all_?gather", name):
        return "communication:all_gather"
    if re.search(r"(?i)reduce_?scatter", name):
        return "communication:reduce_scatter"
    if re.search(r"(?i)all_?to_?all|dispatch|combine", name):
        return "communication:all_to_all"
    if re.search(r"SendRecv|Send|Recv|(?i:send|recv|put|get)", name):
        return "communication:send_recv"
    return "communication:other"


_FAMILY_READERS = {"@triton": _triton_family, "@comm": _communication_kind}

# --- the table ----------------------------------------------------------------------------------
# (pattern, library, family, precision, matrix unit, convention). Patterns are searched in the
# name with its leading `void ` removed; `^` anchors at its start. First row that matches wins.
TAXONOMY: tuple[tuple[str, str, str, str, str, str], ...] = (
    # communication first: a collective's name may spell anything else (types, "reduce", "copy")
    (r"^nccl", "nccl", "@comm", "@comm", "no", "NCCL device kernels: ncclDevKernel_<Coll>_<Op>_<type>_<algo>_<proto>, ncclKernel_*"),
    (r"^rccl|^rcclGenericKernel|^rccl_", "rccl", "@comm", "@comm", "no", "RCCL device kernels"),
    (r"deep_ep::", "deepep", "@comm", "unknown", "no", "DeepEP: deep_ep::{intranode,internode,internode_ll}::{dispatch,combine,notify_*}"),
    (r"multimem_all_reduce|one_shot_all_reduce|two_shot_all_reduce|multimem_all_gather|multimem_reduce_scatter|symm_mem", "symmetric_memory", "@comm", "@dtype", "no",
     "PyTorch symmetric memory (c10d::symmetric_memory) collectives"),
    (r"cross_device_reduce_|custom_all_reduce|allreduce_fusion_kernel|oneShotAllReduce|twoShotAllReduce|lamport|mscclpp|quickreduce|QuickReduce",
     "custom_all_reduce", "communication:all_reduce", "@dtype", "no", "custom all-reduce (vLLM/SGLang cross_device_reduce, TensorRT-LLM one/two-shot, mscclpp, quick reduce)"),
    (r"^nvshmem|nvshmemi_|nvshmemx_", "nvshmem", "@comm", "unknown", "no", "NVSHMEM device collectives"),
    (r"_all_to_all|_alltoall|alltoall|AllToAll|all_to_all_|a2a_dispatch|a2a_combine|moe_dispatch|moe_combine|ep_dispatch|ep_combine", "triton", "@comm", "@low_bits", "no",
     "expert-parallel all-to-all kernels (Triton/torchao symmetric-memory dispatch and combine)"),
    # Inductor templates and generated kernels
    (r"^triton_tem_fused\w*flex_attention|^triton_tem_\w*attention", "triton", "attention", "unknown", "unknown", "Inductor flex_attention template"),
    (r"^triton_tem_fused\w*convolution", "triton", "conv", "unknown", "unknown", "Inductor convolution template (triton_tem_)"),
    (r"^triton_tem_", "triton", "gemm", "unknown", "unknown", "Inductor GEMM template (triton_tem_fused_<epilogue>)"),
    (r"^triton_(?:poi|red|per)_", "triton", "@triton", "unknown", "no", "Inductor generated kernels: triton_{poi,red,per}_fused_<ops>"),
    (r"^triton__\d", "triton", "other", "unknown", "unknown", "Inductor kernels before 2.1 (triton__0d1d2d)"),
    # triton_kernels (MoE matmul_ogs) and other Triton libraries
    (r"^_?p?_matmul_ogs|^_matmul_", "triton_kernels", "grouped_gemm", "@low_bits", "yes", "triton_kernels matmul_ogs_<layout>_<out>x<lhs>x<rhs>"),
    (r"^_finalize_matmul", "triton_kernels", "reduction", "@low_bits", "no", "triton_kernels matmul finalize (scatter-sum of experts)"),
    (r"^_topk_forward|^_topk", "triton_kernels", "sort", "unknown", "no", "triton_kernels top-k routing"),
    (r"^_sum_bitmatrix", "triton_kernels", "reduction", "unknown", "no", "triton_kernels routing bitmatrix sums"),
    (r"^_combined_routing|^_routing", "triton_kernels", "other", "unknown", "no", "triton_kernels routing set-up"),
    (r"fused_moe_kernel|grouped_gemm_kernel|_grouped_mm", "triton", "grouped_gemm", "@low_bits", "unknown", "vLLM/SGLang Triton fused MoE"),
    (r"^_attn_fwd|^attn_fwd|^_fwd_kernel|^_bwd_kernel|^_attn_bwd|unified_attention|^_fwd_attention|decode_attention|^_paged_attn|prefix_prefill",
     "triton", "attention", "unknown", "unknown", "Triton attention kernels (FA Triton, vLLM/SGLang unified/decode attention)"),
    (r"^triton_scale_swizzle|swizzle", "torchao", "copy", "unknown", "no", "scale swizzling for block-scaled GEMMs"),
    # SageAttention
    (r"^sage_fwd|qk_int8_sv_f8|qk_int8_sv_f16|sageattn", "sageattention", "attention", "mixed", "yes", "SageAttention: int8 QK, fp8/fp16 PV"),
    (r"^sage_quant|quant_per_block_int8|quant_per_warp_int8|quant_per_thread_int8", "sageattention", "elementwise", "int8", "no", "SageAttention quantisation"),
    # Tensile / hipBLASLt
    (r"^(?:Custom_)?Cijk_", "tensile", "gemm", "@tensile", "@tensile", "Tensile/hipBLASLt Cijk_<layout>_<types>_..._MT<tile>_MI<mfma>"),
    # CK / CK-tile / aiter / MIOpen
    (r"^_ZN2ck\w*conv|^ck::\w*conv|kernel_grouped_conv", "ck", "conv", "@dtype", "yes", "Composable Kernel convolutions (xdl = MFMA)"),
    (r"^_ZN7ck_tile\w*Fmha|FmhaBatchPrefill|FmhaFwd|FmhaBwd|fmha_fwd|fmha_bwd|mha_fwd|mha_bwd", "ck_tile", "attention", "@dtype", "yes", "CK-tile / aiter FMHA"),
    (r"^_ZN7ck_tile\w*[Nn]orm|^ck_tile::\w*[Nn]orm", "ck_tile", "norm", "@dtype", "no", "CK-tile norms"),
    (r"^_ZN2ck\w*(?:gemm|Gemm)|^ck::\w*(?:gemm|Gemm)|^_ZN7ck_tile\w*(?:Gemm|gemm)", "ck", "gemm", "@dtype", "yes", "Composable Kernel GEMMs (xdl/wmma)"),
    (r"^_ZN5aiter\w*(?:fmoe|moe_gemm|MoeGemm)|^aiter::fmoe", "aiter", "grouped_gemm", "@dtype", "yes", "aiter fused MoE"),
    (r"^_ZN5aiter\w*norm|^aiter::\w*norm", "aiter", "norm", "@dtype", "no", "aiter norms"),
    (r"^_ZN5aiter|^aiter::", "aiter", "other", "unknown", "unknown", "aiter kernels"),
    (r"^MIOpenBatchNorm|^MIOpenLayerNorm|^MIOpenGroupNorm", "miopen", "norm", "unknown", "no", "MIOpen norms"),
    (r"^MIOpenSoftmax|^SoftmaxForward", "miopen", "softmax", "unknown", "no", "MIOpen softmax"),
    (r"^SubTensorOp|^Op[1-4]dTensor|^MIOpenPooling", "miopen", "elementwise", "unknown", "no", "MIOpen tensor ops"),
    (r"^Im2d2Col|^Im3d2Col|^transpose_NCHW|^batched_transpose|^general_4d_reorder|^naive_conv_pack", "miopen", "copy", "@dtype_words", "no", "MIOpen layout kernels"),
    (r"^igemm_(?:fwd|bwd|wrw)_gtcx", "miopen", "conv", "@low_bits", "yes", "MIOpen igemm_<dir>_gtcx<arch> (xdlops)"),
    (r"^igemm_|^MIOpenConv|^naive_conv|^miopenSp3AsmConv|^gridwise_convolution", "miopen", "conv", "@low_bits", "unknown", "MIOpen convolutions"),
    (r"^wvSplitK|^LLGemm", "vllm", "gemm", "@dtype", "unknown", "vLLM ROCm skinny GEMMs"),
    # attention libraries
    (r"paged_attention_ll4mi_QKV_mfma", "vllm", "attention", "@dtype", "yes", "vLLM ROCm paged attention (mfma)"),
    (r"paged_attention_ll4mi_reduce|paged_attention_v2_reduce", "vllm", "attention", "@dtype", "no", "vLLM paged attention split-KV reduce"),
    (r"paged_attention_v[12]_kernel|paged_attention_kernel", "vllm", "attention", "@dtype", "no", "vLLM CUDA paged attention (CUDA cores)"),
    (r"flash_bwd_dot_do_o|dot_do_o", "flash_attn", "attention", "unknown", "no", "attention backward preprocessing (dO.O)"),
    (r"flash_bwd_convert_dq|convert_dq", "flash_attn", "copy", "unknown", "no", "attention backward dQ conversion"),
    (r"flash::|FlashAttn|flash_fwd|flash_bwd|compute_attn_ws|pytorch_flash::|flash_attn", "flash_attn", "attention", "@cutlass3", "yes",
     "FlashAttention 2 (flash_fwd_kernel) and 3 (flash::FlashAttn{Fwd,Bwd}Sm90, compute_attn_ws)"),
    (r"fmha_cutlass[FB]_", "pytorch", "attention", "@fmha_cutlass", "@fmha_cutlass", "PyTorch memory-efficient attention fmha_cutlass{F,B}_<type>_..._sm<arch>"),
    (r"cudnn_generated\w*sdpa|sdpa_\w*(?:fprop|bprop)|fort_native_sdpa", "cudnn", "attention", "unknown", "yes", "cuDNN SDPA (fort_native_sdpa_<arch>_flash_{f,b}prop; f16 covers fp16 and bf16)"),
    (r"fmha_v2|fmhaSm\d+|fmha\w*Kernel|mha_kernel|xqa_kernel|mmha", "trtllm", "attention", "@low_bits", "yes", "TensorRT-LLM FMHA/XQA"),
    (r"flashinfer::\w*(?:Prefill|Decode|Attention|MLA)|BatchPrefillWith|BatchDecodeWith|SinglePrefillWith", "flashinfer", "attention", "@dtype", "unknown", "FlashInfer attention"),
    (r"flashmla|flash_mla|FlashMLA|FlashMla", "flashmla", "attention", "@dtype", "yes", "FlashMLA"),
    # DeepGEMM, TensorRT-LLM, CUTLASS 3.x grouped / block-scaled, CuTe DSL
    (r"deep_gemm::|fp8_gemm_kernel|sm\d+_fp8_gemm|sm\d+_bf16_gemm|m_grouped_|k_grouped_", "deepgemm", "gemm", "@low_bits", "yes",
     "DeepGEMM (deep_gemm::fp8_gemm_kernel, sm90_fp8_gemm_1d1d_impl; grouped: m_grouped/k_grouped/GemmType::Grouped*)"),
    (r"^bmm_|^gemm_(?:Mx)?(?:E4m3|E5m2|E2m1|Bfloat16|Fp16)|tensorrt_llm::\w*[Gg]emm|trtllm\w*[Gg]emm", "trtllm", "gemm", "@low_bits", "yes",
     "TensorRT-LLM gen GEMMs bmm_<A>_<B><C>_<acc>_... / gemm_<types>"),
    (r"^_ZN\d+cutlass\w*ImplicitGemmConvolution", "cudnn", "conv", "@cutlass3", "yes", "CUTLASS 2.x implicit-GEMM convolution inside cuDNN (mangled)"),
    (r"^kernel_cutlass_\w*prepare|set_grouped_gemm_args|prepare_grouped_gemm|grouped_gemm_args", "cutlass", "other", "unknown", "no", "grouped GEMM argument set-up"),
    (r"^kernel_cutlass_kernel\w*(?:[Gg]rouped|gmm)", "cutlass", "grouped_gemm", "@cutlass3", "yes", "CuTe DSL grouped GEMMs (kernel_cutlass_kernel_<module>_<Kernel>)"),
    (r"^kernel_cutlass_kernel\w*(?:[Gg]emm|mm)", "cutlass", "gemm", "@cutlass3", "yes", "CuTe DSL GEMMs"),
    (r"cutlass\w*(?:PtrArray|ArrayTma|Grouped)|cute\w*(?:PtrArray|ArrayTma|Grouped)|GroupProblemShape", "cutlass", "grouped_gemm", "@cutlass3", "yes",
     "CUTLASS 3.x grouped GEMM (GemmUniversal<GroupProblemShape<...>>, MainloopSm{90,100}Array...; aten::_grouped_mm)"),
    (r"cutlass\w*(?:Sm90|Sm100|Sm120|Gmma|Umma|Tma|BlockScaled)\w*(?:Gemm|Mma|Mainloop)|cute\w*(?:Sm90|Sm100|Sm120|Gmma|Umma|Tma|BlockScaled)\w*(?:Gemm|Mma|Mainloop)|cutlass3x_sm\d+|cutlass_3x|cutlass_scaled_mm|cutlass_gemm",
     "cutlass", "gemm", "@cutlass3", "yes", "CUTLASS 3.x GEMMs (GemmUniversal, CollectiveMma Sm90/Sm100, block-scaled)"),
    # cuBLAS / cuBLASLt
    (r"^nvjet_", "cublaslt", "gemm", "@nvjet", "yes", "cuBLASLt nvjet_sm<arch>_<types>_<tile>..."),
    (r"^sm\d+_xmma_gemm", "cublas", "gemm", "@xmma", "@xmma", "cuBLAS xmma: sm<arch>_xmma_gemm_<A><B>_<compute><acc>_<C>_..."),
    (r"^sm\d+_xmma_(?:fprop|dgrad|wgrad)", "cudnn", "conv", "@xmma", "@xmma", "cuDNN xmma: sm<arch>_xmma_{fprop,dgrad,wgrad}_implicit_gemm_<types>"),
    (r"^(?:volta|ampere|turing|maxwell|pascal)_g?cgemm", "cudnn", "conv", "fp32", "no", "cuDNN FFT convolution complex GEMMs (<arch>_cgemm, <arch>_gcgemm)"),
    (r"^(?:volta|ampere|turing|maxwell|pascal|sm\d+)_(?:s|d|c|z)gemm", "cublas", "gemm", "@low_bits_blas", "no", "cuBLAS <arch>_{s,d,c,z}gemm (FMA units)"),
    (r"^(?:volta|ampere|turing|hopper|sm\d+)_(?:bf16_|fp16_|h|s|i8_)?(?:s|h|i)?(?:884|1688|16816|8816|161616)gemm|^(?:volta|turing|ampere)_h\d+gemm",
     "cublas", "gemm", "@tensor_op", "yes", "cuBLAS <arch>_<type>_s16816gemm / h884gemm (Tensor Core instruction shape)"),
    (r"^gemmSN_|^gemmk1_|^gemv|^sgemm_largek|^internal::gemvx|^std::enable_if<!\(false\), void>::type internal::gemvx|^dot_kernel", "cublas", "@blas", "@gemv", "no",
     "cuBLAS small-N GEMM, GEMV and dot kernels (CUDA cores)"),
    (r"^(?:cublasLt::)?splitKreduce_kernel|^reduce_1Block_kernel", "cublas", "reduction", "@splitk", "no", "cuBLAS split-K reduction"),
    (r"^(?:cublasLt::)?epilogue::|^scal_kernel", "cublas", "elementwise", "@dtype", "no", "cuBLAS/cuBLASLt epilogue and scaling"),
    (r"cutlass_(?:\d+_)?(?:tensorop|wmma_tensorop|simt)_\w*(?:fprop|dgrad|wgrad)", "cudnn", "conv", "@cutlass2", "@cutlass2", "CUTLASS 2.x conv names in cuDNN (cutlass_tensorop_s1688fprop_optimized_tf32)"),
    (r"cutlass_(?:\d+_)?(?:tensorop|wmma_tensorop|simt)_\w*gemm", "cublas", "gemm", "@cutlass2", "@cutlass2", "CUTLASS 2.x GEMM names in cuBLAS (cutlass_80_tensorop_s1688gemm_...)"),
    (r"ReduceSplitK|reduction::kernel", "cudnn", "reduction", "@dtype", "no", "CUTLASS split-K reduction"),
    # cuDNN
    (r"scudnn", "cudnn", "conv", "fp32", "no", "cuDNN <arch>_scudnn_* (fp32 FMA convolutions)"),
    (r"hcudnn|h884cudnn|h1688cudnn|s884cudnn|s1688cudnn|s16816cudnn", "cudnn", "conv", "@tensor_op", "yes", "cuDNN Tensor Core convolutions (h884cudnn, ...)"),
    (r"implicit_convolve_sgemm|precomputed_convolve_sgemm|explicit_convolve_sgemm|wgrad_alg\d_engine|dgrad_engine|dgrad2d_alg|conv2d_grouped_direct|convolve_common_engine",
     "cudnn", "conv", "@dtype", "no", "cuDNN legacy convolution engines (CUDA cores)"),
    (r"cudnn::winograd|winograd", "cudnn", "conv", "@dtype", "no", "cuDNN Winograd convolutions"),
    (r"^fft\d?d_|^flip_filter|^pointwise_mult_and_sum_complex|^fft\d?d", "cudnn", "conv", "fp32", "no", "cuDNN FFT convolutions (fft2d_r2c, flip_filter, pointwise complex product)"),
    (r"nchwToNhwc|nhwcToNchw|foldedNhwc|nhwcToFolded|nhwcAddPadding|convertTensor_kernel|im2col|col2im|transpose_readWrite|tensorTransformGeneric",
     "cudnn", "copy", "@dtype", "no", "cuDNN layout transforms"),
    (r"scalePackedTensor|elemWiseRNNcell|(?:LSTM|GENERIC|GRU)_elementWise", "cudnn", "elementwise", "@dtype", "no", "cuDNN pointwise kernels"),
    (r"bn_fw|bn_bw|batchnorm|BatchNorm", "cudnn", "norm", "@dtype", "no", "cuDNN batch norm (bn_fw_tr_1C11, bn_bw_1C11)"),
    (r"reduce_wgrad", "cudnn", "reduction", "@dtype", "no", "cuDNN wgrad reduction"),
    (r"computeOffsets|computeBOffsets|computeWgrad\w*Offsets|init_device_workspace|kern_precompute_indices|kernel_helper_stage|cask_\w*::compute",
     "cudnn", "other", "unknown", "no", "cuDNN/cask index and workspace set-up"),
    (r"^RNN_copy", "cudnn", "copy", "unknown", "no", "cuDNN RNN state copies"),
    (r"^RNN_init|^persistRNN_init", "cudnn", "other", "unknown", "no", "cuDNN RNN set-up"),
    (r"^(?:ampere|volta|turing|hopper)_lstm|persistRNN|^(?:ampere|volta|turing)_gru", "cudnn", "gemm", "unknown", "unknown", "cuDNN persistent RNN kernels"),
    # fbgemm, torchao, vLLM, SGLang, apex, torchvision
    (r"split_embedding|dense_embedding|permute_pooled_embs|embedding_codegen|batch_index_select", "fbgemm", "embedding", "@embedding", "no", "fbgemm TBE (split_embedding_codegen_*)"),
    (r"fbgemm_gpu::[\w:() ]*?hfp8", "fbgemm", "elementwise", "unknown", "no", "fbgemm hfp8 conversion"),
    (r"fbgemm_gpu::[\w:() ]*?(?:FP8|fp8)", "fbgemm", "elementwise", "fp8_e4m3", "no", "fbgemm FP8 quantisation"),
    (r"fbgemm_gpu::[\w:() ]*?permute", "fbgemm", "copy", "unknown", "no", "fbgemm sparse permutes"),
    (r"fbgemm_gpu::|bounds_check_indices", "fbgemm", "other", "unknown", "no", "fbgemm sparse feature set-up"),
    (r"^to_mxfp8|^to_mxfp4|mxfp8_quantize|quantize_mx|_to_mxfp8|triton_to_mxfp8", "torchao", "elementwise", "@low_bits", "no", "torchao MX quantisation"),
    (r"mx_blocked_layout|_copy_into_buffer", "torchao", "copy", "unknown", "no", "torchao MX layout and buffer copies"),
    (r"^_silu_mul", "torchao", "elementwise", "unknown", "no", "torchao fused SiLU*mul"),
    (r"^_ZN7sgl_hip", "sglang", "elementwise", "@dtype", "no", "SGLang ROCm pointwise kernels"),
    (r"reshape_and_cache|store_kvcache|concat_and_cache|copy_blocks", "vllm", "copy", "@dtype", "no", "vLLM/SGLang KV-cache writes"),
    (r"rotary_embedding|rotary_pos|apply_rotary", "vllm", "elementwise", "@dtype", "no", "vLLM rotary embedding"),
    (r"rms_norm_kernel|fused_add_rms_norm|rmsnorm|RMSNorm|layernorm_kernel", "vllm", "norm", "@dtype", "no", "vLLM/SGLang norms"),
    (r"act_and_mul|silu_and_mul|gelu_and_mul|gelu_tanh_and_mul", "vllm", "elementwise", "@dtype", "no", "vLLM/SGLang gated activations"),
    (r"scaled_fp8_quant|per_token_group_quant|per_token_quant|fp8_quant", "vllm", "elementwise", "fp8_e4m3", "no", "vLLM/SGLang FP8 quantisation"),
    (r"moe_align_block_size|topk_softmax|moe_sum|count_and_sort_expert", "vllm", "other", "unknown", "no", "vLLM/SGLang MoE routing set-up"),
    (r"clamp_position|resolve_future_token|compute_position|create_flashinfer_kv_indices", "sglang", "other", "unknown", "no", "SGLang scheduling set-up"),
    (r"^_alloc_kernel|^_fill_indices|^_precompute_\w*offsets", "torchao", "other", "unknown", "no", "torchao expert-parallel buffer and offset set-up"),
    (r"^reduce_segments", "other", "reduction", "unknown", "no", "segment reductions"),
    (r"groupnorm_kernel|group_norm", "pytorch", "norm", "@dtype", "no", "group norm kernels"),
    (r"^multi_tensor_apply_kernel<TensorListMetadata<\d+>, \w+Functor", "apex", "optimizer", "@dtype", "no", "apex fused optimizers (multi_tensor_apply, AdamFunctor)"),
    (r"^vision::ops", "torchvision", "other", "unknown", "no", "torchvision ops (nms, roi_align)"),
    # cub / rocprim
    (r"cub::\w*(?:RadixSort|SegmentedSort|MergeSort|DeviceSegmentedRadix)|cub::detail::radix_sort", "cub", "sort", "unknown", "no", "CUB radix/merge sort"),
    (r"cub::", "cub", "reduction", "unknown", "no", "CUB scans, reductions, select"),
    (r"^rocprim::\w*(?:sort|Sort)", "rocprim", "sort", "unknown", "no", "rocPRIM sort"),
    (r"^rocprim::", "rocprim", "reduction", "unknown", "no", "rocPRIM scans and reductions"),
    # PyTorch ATen: casts, copies and data movement, then the named operations
    (r"bfloat16_copy|float16_copy|bfloat16tofloat32_copy|float8_copy|_to_copy_kernel", "pytorch", "copy", "mixed", "no", "ATen dtype conversion copies"),
    (r"transform_bias_rescale", "pytorch", "elementwise", "@dtype", "no", "ATen native MHA input transform"),
    (r"sbtopk|bitonicSort|radixSort|mbtopk|sort_kernel|segmented_sort|topk", "pytorch", "sort", "@dtype", "no", "ATen sort and top-k"),
    (r"direct_copy|CatArray|copy_device_to_device|roll_cuda|index_elementwise|gather|scatter|indexSelect|index_put|index_select|upsample|write_indices|indexing_backward|take_kernel|(?<![a-z])put_kernel|masked_scatter|flip_kernel",
     "pytorch", "copy", "@dtype", "no", "ATen copies, cat, index/gather/scatter"),
    (r"multi_tensor_apply|fused_adam|fused_sgd|FusedAdam|_fused_adamw", "pytorch", "optimizer", "@dtype", "no", "ATen foreach/fused optimizer kernels"),
    (r"layer_norm|LayerNorm|RowwiseMoments|GammaBeta|batch_norm|ComputeFusedParams|ComputeBackwardFusedParams|ComputeInternalGradients|cuComputeGradGammaBeta|cuComputePartGradGammaBeta|rms_norm|RmsNorm|welford|Welford",
     "pytorch", "norm", "@dtype", "no", "ATen norms (layer/batch/group/RMS)"),
    (r"softmax|SoftMax|Softmax", "pytorch", "softmax", "@dtype", "no", "ATen softmax (softmax_warp_*, cunn_SoftMax*)"),
    (r"fill_reverse_indices|linearize_index|compute_cuda_kernel|krn_partials|krn_partial", "pytorch", "other", "unknown", "no", "ATen index set-up (sort/unique/repeat_interleave)"),
    (r"embedding_backward|EmbeddingBag|embedding_bag|renorm_kernel|embedding_dense", "pytorch", "embedding", "@dtype", "no", "ATen embedding kernels"),
    (r"reduce_kernel|nll_loss|ClassNLLCriterion|pool|Histogram|histogram|cumsum|cumprod|scan_|_scan|norm_kernel|argmax|argmin|unique|bincount",
     "pytorch", "reduction", "@dtype", "no", "ATen reductions, losses, pooling, scans"),
    (r"elementwise|dropout|grid_sampler|distribution|arange|linspace|fill_kernel|FillFunctor|_kernel_cuda|Functor",
     "pytorch", "elementwise", "@dtype", "no", "ATen TensorIterator elementwise kernels"),
)

# Readers only some rows use (kept beside the generic ones above).
_PRECISION_READERS["@low_bits_blas"] = lambda n: "fp64" if re.search(r"_(?:d|z)gemm", n) else "fp32"
_PRECISION_READERS["@gemv"] = lambda n: "fp16" if re.search(r"<__half const>|<int, int, __half|__half,", n) else _first_dtype(n)
_PRECISION_READERS["@splitk"] = lambda n: _first_dtype(n.split("<", 1)[1]) if "<" in n else "unknown"
_PRECISION_READERS["@embedding"] = lambda n: "unknown" if "find_long_segments" in n else _first_dtype(n)
_PRECISION_READERS["@dtype_words"] = lambda n: _first_dtype(n.replace("_", " "))


def _tensor_op(name: str) -> str:
    """cuBLAS/cuDNN Tensor Core kernels named by instruction: the type when spelled, else h (and
    Volta's s884 with fp16 inputs) means fp16, i means int8."""
    spelled = _low_bits(name)
    if spelled != "unknown":
        return spelled
    if re.search(r"_i(?:8816|8832|16832)|imma", name):
        return "int8"
    if re.search(r"_h\d+(?:gemm|cudnn)|h884|h1688|h16816|hmma|(?:volta|turing)_s884", name):
        return "fp16"
    return "unknown"


_PRECISION_READERS["@tensor_op"] = _tensor_op
_FAMILY_READERS["@blas"] = lambda n: "reduction" if n.startswith("dot_kernel") else "gemm"

def _top_level(pattern: str, sep: str = "|") -> list[str]:
    """The pattern split at `sep` outside groups, classes and escapes."""
    parts, depth, cls, start, i = [], 0, False, 0, 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if cls:
            cls = c != "]"
        elif c == "[":
            cls = True
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == sep and depth == 0:
            parts.append(pattern[start:i])
            start = i + 1
        i += 1
    return parts + [pattern[start:]]


def _literal(alternative: str) -> str:
    """The longest run of plain characters the alternative must contain (outside groups and
    classes, not made optional by a quantifier), "" when none is 3 characters long."""
    best, run, depth, cls, i = "", "", 0, False, 0
    while i < len(alternative):
        c = alternative[i]
        nxt = alternative[i + 1] if i + 1 < len(alternative) else ""
        if cls or depth:
            cls = cls and c != "]"
            depth += (c == "(") - (c == ")") if not cls else 0
            if c == "\\":
                i += 1
            i += 1
            continue
        if c == "\\":
            run, i = (run + nxt if nxt in "()[]{}.|*+?^$\\" and alternative[i + 2:i + 3] not in ("?", "*", "{") else ""), i + 2
        elif c == "[":
            cls, run = True, ""
            i += 1
        elif c == "(":
            depth, run = 1, ""
            i += 1
        elif c in ".^$|)?*+":  # a quantifier's own character ends the run too
            run = ""
            i += 1
        elif c == "{":
            run, i = "", alternative.index("}", i) + 1
        elif nxt in ("?", "*", "{"):
            run = ""
            i += 1
        else:
            run += c
            i += 1
            if nxt == "+":
                best = max(best, run, key=len)
                run = ""
        best = max(best, run, key=len)
    return best if len(best) >= 3 else ""


def _hints(pattern: str) -> tuple[str, ...] | None:
    """Plain substrings one of which every name the pattern matches contains (one per top-level
    alternative), or None when an alternative has none: a row is searched only in names that
    contain one of its hints, a substring test far cheaper than the search."""
    literals = tuple(_literal(a) for a in _top_level(pattern))
    return None if not all(literals) else literals


def _compile(rows: tuple[tuple[str, ...], ...]) -> list[tuple[re.Pattern, tuple[str, ...] | None]]:
    return [(re.compile(row[0]), _hints(row[0])) for row in rows]


_TABLE = _compile(TAXONOMY)


def _row_of(text: str) -> int:
    """The first row of the table whose pattern the name contains, -1 when none does."""
    for i, (pattern, hints) in enumerate(_TABLE):
        if hints is not None and not any(h in text for h in hints):
            continue
        if pattern.search(text):
            return i
    return -1


@lru_cache(maxsize=65536)
def read_kernel(name: str) -> KernelReading:
    """Library, family, precision and matrix-unit use one kernel name spells (UNREAD when no row of
    the table matches)."""
    text = name[5:] if name.startswith("void ") else name
    row = _row_of(text)
    if row < 0:
        return UNREAD
    pattern, library, family, precision, unit, convention = TAXONOMY[row]
    if family.startswith("@"):
        family = _FAMILY_READERS[family](text)
    if precision.startswith("@"):
        precision = _PRECISION_READERS[precision](text)
    if unit.startswith("@"):
        unit = _UNIT_READERS[unit](text)
    if family == "other":
        precision = "unknown"  # set-up kernels do no math
    return KernelReading(library, family, precision, unit, convention)


def is_communication(name: str) -> bool:
    """A collective or point-to-point kernel, whoever wrote it (NCCL, RCCL, DeepEP, NVSHMEM,
    symmetric memory, custom all-reduce, all-to-all kernels)."""
    return read_kernel(name).communication


__all__ = [
    "FAMILIES",
    "MATRIX_FAMILIES",
    "PRECISIONS",
    "UNITS",
    "KernelReading",
    "TAXONOMY",
    "read_kernel",
    "is_communication",
]
