"""FLOPs and bytes of real op events against their definitions, written here from the events'
own shapes, types and scalar arguments: the readings where the cost model follows TraceLens
(convolutions without the bias add, reductions by their `dim`, the norms and GEMMs it models)
and the ones where it keeps its own (a convolution backward by its output mask and with its
bias gradient, training batch-norm backwards, attention bytes by dtype, norms without weight)."""

from __future__ import annotations

import gzip
import json
from math import prod

import orjson
import pytest
from conftest import REPO, shared, shared_trace

from advisor.metrics.op_cost import op_cost

H100 = REPO / "tests" / "data" / "shared" / "kernels" / "h100"
RESNET_TRAIN = REPO / "sample_runs" / "resnet18_cifar" / "runs" / "gpu_baseline"
BYTES = {"float": 4, "int": 4, "c10::BFloat16": 2, "c10::Half": 2, "long int": 8, "double": 8}
VIT = "whatif/h100_vit/baseline"  # resolved inside the test: shared() skips when absent


def _trace(path):
    if isinstance(path, str):
        path = shared(path)
    if path.is_dir():
        path = next(p for p in sorted(path.iterdir()) if p.name.endswith(".json.gz"))
    with gzip.open(path, "rb") as f:
        return orjson.loads(f.read())


def _events(path, name: str) -> list[tuple[list, list, list]]:
    """(Input type, Input Dims, Concrete Inputs) of each distinct `name` event of a trace."""
    seen, out = set(), []
    for e in _trace(path)["traceEvents"]:
        if e.get("name") != name or e.get("ph") != "X":
            continue
        a = e.get("args") or {}
        key = json.dumps([a.get("Input type"), a.get("Input Dims"), a.get("Concrete Inputs")])
        if "Input Dims" in a and key not in seen:
            seen.add(key)
            out.append((a.get("Input type"), a.get("Input Dims"), a.get("Concrete Inputs")))
    assert out, f"no {name} event in {path}"
    return out


def _cost(name, types, dims, concrete):
    c = op_cost(name, tuple(t if isinstance(t, str) else "" for t in types), dims, concrete)
    assert c is not None, (name, dims, concrete)
    return c


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.strip("[] ").split(",") if x.strip()]


def _conv_out(x, w, stride, padding, dilation):
    nd = len(x) - 2
    stride, padding, dilation = ([v[0]] * nd if len(v) == 1 else v for v in (stride, padding, dilation))
    return [x[0], w[0]] + [(x[2 + i] + 2 * padding[i] - dilation[i] * (w[2 + i] - 1) - 1) // stride[i] + 1 for i in range(nd)]


# --- convolutions ------------------------------------------------------------------------------
@pytest.mark.parametrize("path", [H100 / "bf16.pt.trace.json.gz", VIT, RESNET_TRAIN])
def test_convolution_forward_is_its_multiply_adds(path):
    """2·(Cin/groups·kernel) per output element, the bias add not counted (as PyTorch's flop
    counter and TraceLens); bytes: x, w, the output and the bias vector once."""
    for types, dims, conc in _events(path, "aten::convolution"):
        x, w, bias = dims[0], dims[1], dims[2]
        out = _conv_out(x, w, _ints(conc[3]), _ints(conc[4]), _ints(conc[5]))
        bpe = BYTES[types[0]]
        c = _cost("aten::convolution", types, dims, conc)
        assert c.flops == 2 * prod(w[1:]) * prod(out)
        assert c.bytes == (prod(x) + prod(w) + prod(out) + (out[1] if bias else 0)) * bpe


@pytest.mark.parametrize("path", [H100 / "bf16.pt.trace.json.gz", H100 / "fp32.pt.trace.json.gz", VIT, RESNET_TRAIN])
def test_convolution_backward_computes_what_its_output_mask_asks_for(path):
    """grad_input and grad_weight each cost the forward's multiply-adds and one pass reading gy and
    the other operand and writing the gradient, only where the mask (argument 10) asks; the bias
    gradient is the child `aten::sum` of gy (its own kernel, its own row), not counted here."""
    masks = set()
    for types, dims, conc in _events(path, "aten::convolution_backward"):
        gy, x, w = dims[0], dims[1], dims[2]
        mask = [m.strip() == "True" for m in conc[10].strip("[]").split(",")]
        masks.add(tuple(mask))
        bpe = BYTES[types[1]]
        passes = int(mask[0]) + int(mask[1])
        c = _cost("aten::convolution_backward", types, dims, conc)
        assert c.flops == passes * 2 * prod(w[1:]) * prod(gy)
        assert c.bytes == passes * (prod(gy) + prod(x) + prod(w)) * bpe
    if path == RESNET_TRAIN:
        assert (False, True, False) in masks  # the first layer: the image needs no gradient


def test_cudnn_batch_norm_backward_is_a_training_backward():
    """Autograd calls cudnn_batch_norm_backward only for a training-mode forward (its events carry
    the batch statistics, save_mean and save_var [C]): dx = w·invstd·(dy − mean(dy) − x̂·mean(dy·x̂))
    is 4 FLOPs per element for the two per-channel sums and 5 for the update; it reads dy and x
    and writes dx, reads invstd and the weight and writes grad_weight and grad_bias (C each)."""
    for types, dims, conc in _events(RESNET_TRAIN, "aten::cudnn_batch_norm_backward"):
        x = dims[0]
        assert dims[5] == dims[6] == [x[1]]  # the batch statistics are there
        n, ch, bpe = prod(x), x[1], BYTES[types[0]]
        c = _cost("aten::cudnn_batch_norm_backward", types, dims, conc)
        assert c.flops == pytest.approx(9 * n)
        assert c.bytes == 3 * n * bpe + ch * bpe + 3 * ch * bpe


# --- reductions --------------------------------------------------------------------------------
@pytest.mark.parametrize("path", [H100 / "bf16.pt.trace.json.gz", H100 / "fp32.pt.trace.json.gz", VIT, RESNET_TRAIN])
def test_reductions_write_what_their_dim_leaves(path):
    """sum(x, dtype) (two inputs: the second is the dtype) writes one element; sum/mean(x, dim,
    keepdim, dtype) write the product of the dimensions `dim` does not name. One FLOP per input
    element; bytes: the input read, the output written, at the input's element size."""
    kinds = set()
    for name in ("aten::sum", "aten::mean"):
        try:
            events = _events(path, name)
        except AssertionError:
            continue
        for types, dims, conc in events:
            x, bpe = dims[0], BYTES[types[0]]
            if len(dims) == 2:
                n_out = 1
                kinds.add("all")
            else:
                reduced = {d % len(x) for d in _ints(conc[1])}
                n_out = prod(s for i, s in enumerate(x) if i not in reduced) if reduced else 1
                kinds.add("dim")
            c = _cost(name, types, dims, conc)
            assert c.flops == prod(x)
            assert c.bytes == (prod(x) + n_out) * bpe
    assert kinds


def test_cumsum_writes_as_many_elements_as_it_reads():
    for types, dims, conc in _events(shared_trace("corpus/b200_ep_moe_ref_fwd.json.gz"), "aten::cumsum"):
        c = _cost("aten::cumsum", types, dims, conc)
        assert c.flops == prod(dims[0]) and c.bytes == 2 * prod(dims[0]) * BYTES[types[0]]


# --- attention ---------------------------------------------------------------------------------
@pytest.mark.parametrize("recording", ["fp32", "bf16"])
def test_attention_bytes_use_the_tensors_dtype(recording):
    """q, k, v read and the output written once, at the dtype's element size (4 bytes for fp32);
    FLOPs 2·B·H·Nq·Nkv·(d_qk + d_v) for the two matrix products."""
    path = H100 / f"{recording}.pt.trace.json.gz"
    found = 0
    for name in ("aten::_scaled_dot_product_efficient_attention", "aten::_scaled_dot_product_cudnn_attention"):
        try:
            events = _events(path, name)
        except AssertionError:
            continue
        for types, dims, conc in events:
            q, k, v = dims[0], dims[1], dims[2]
            b, h, nq, d = q
            nkv, dv = k[2], v[3]
            c = _cost(name, types, dims, conc)
            assert c.bytes == (prod(q) + prod(k) + prod(v) + b * h * nq * dv) * BYTES[types[0]]
            assert c.flops == 2 * b * h * nq * nkv * (d + dv) / (2 if conc[6] == "True" else 1)  # is_causal
            found += 1
    assert found


# --- norms (the normalization test trace of TraceLens's repository) ------------------------------
NORMS = "corpus/mi300x_layernorm_fwd_bwd.json.gz"


def test_layer_and_rms_norm_without_weight_read_none():
    """A layer norm over C values with no weight nor bias (their Input Dims are []): 2 FLOPs per
    element to normalize, 3 per element and 6 per channel for the statistics; bytes: x read, y
    written, mean and rstd read and written (C each). An RMS norm: 2·C+2 per row and 1 per element
    (2 with a weight), x read and y written (and the weight where there is one)."""
    path = shared_trace(NORMS)
    for types, dims, conc in _events(path, "aten::native_layer_norm"):
        x, c_ = dims[0], prod(_ints(conc[1]))
        n, bpe = prod(x), BYTES[types[0]]
        affine, bias = bool(dims[2]), bool(dims[3])
        c = _cost("aten::native_layer_norm", types, dims, conc)
        assert c.flops == 3 * c_ + 3 * n + 3 * c_ + 2 * n
        assert c.bytes == 2 * n * bpe + (4 + affine + (affine and bias)) * c_ * bpe
    for types, dims, conc in _events(path, "aten::_fused_rms_norm"):
        x, c_ = dims[0], prod(_ints(conc[1]))
        n, bpe, affine = prod(x), BYTES[types[0]], bool(dims[2])
        c = _cost("aten::_fused_rms_norm", types, dims, conc)
        assert c.flops == n // c_ * (2 * c_ + 2) + n * (2 if affine else 1)
        assert c.bytes == 2 * n * bpe + (c_ * bpe if affine else 0)


def test_group_and_instance_norm_forward():
    """Statistics from the input (3 FLOPs per element, 6 per channel), 2 per element to normalize;
    bytes: x read, y written, per channel C: mean and var read and written, weight and bias read."""
    path = shared_trace(NORMS)
    for name, w_at in (("aten::group_norm", 2), ("aten::native_group_norm", 1), ("aten::instance_norm", 1)):
        for types, dims, conc in _events(path, name):
            x = dims[0]
            n, ch, bpe = prod(x), x[1], BYTES[types[0]]
            c = _cost(name, types, dims, conc)
            assert c.flops == 6 * ch + 5 * n
            assert c.bytes == 2 * n * bpe + (4 + bool(dims[w_at]) + bool(dims[w_at + 1])) * ch * bpe


def test_rms_and_group_norm_backward():
    path = shared_trace(NORMS)
    for types, dims, conc in _events(path, "aten::_fused_rms_norm_backward"):
        x, c_ = dims[1], prod(_ints(conc[2]))
        n, bpe, affine = prod(x), BYTES[types[1]], bool(dims[4])
        mask = [m.strip() == "True" for m in conc[5].strip("[]").split(",")]
        c = _cost("aten::_fused_rms_norm_backward", types, dims, conc)
        # x̂ = x·rstd (1), ·weight (1 if any), grad_in: a dot product (2) and the update (4)
        assert c.flops == n + (n if affine else 0) + (6 * n if mask[0] else 0) + ((2 * n if n > c_ else n) if mask[1] and affine else 0)
        assert c.bytes == 3 * n * bpe + (2 * c_ * bpe if affine else 0)
    for types, dims, conc in _events(path, "aten::native_group_norm_backward"):
        x = dims[1]
        n, ch, bpe = prod(x), x[1], BYTES[types[1]]
        mask = [m.strip() == "True" for m in conc[9].strip("[]").split(",")]
        c = _cost("aten::native_group_norm_backward", types, dims, conc)
        # the training gradient: 4 FLOPs per element for the sums, 5 for dx (2 without dx)
        assert c.flops == pytest.approx(n * (4 + (5 if mask[0] else 2)))
        assert c.bytes == n * bpe + n * bpe * (2 if mask[0] else 1) + ch * bpe + (3 * ch * bpe if dims[4] else 0)


# --- GEMMs outside aten --------------------------------------------------------------------------
def test_library_gemms_with_linears_arguments():
    """AITER's gemm_a16w16(x [M, K], w [N, K], ...): 2·M·N·K FLOPs; x, w read and [M, N] written."""
    for types, dims, conc in _events(shared_trace("corpus/mi300x_sglang_decode_graph_capture.json.gz"), "aiter::gemm_a16w16"):
        (m, k), (n, k2) = dims[0], dims[1]
        assert k == k2
        c = _cost("aiter::gemm_a16w16", types, dims, conc)
        assert (c.m, c.n, c.k) == (m, n, k)
        assert c.flops == 2 * m * n * k and c.bytes == (m * k + n * k + m * n) * BYTES[types[0]]


def test_a_backward_without_input_gradient_runs_no_input_gradient_kernel():
    """What the output mask reading rests on, in the recording's own kernels: ResNet-18's first
    convolution backward (mask [False, True, False]) launches no data-gradient (dgrad) kernel,
    while one with [True, True, False] launches a dgrad and a wgrad kernel."""
    ev = _trace(RESNET_TRAIN)["traceEvents"]
    kernels_of: dict = {}
    for e in ev:
        if e.get("cat") == "kernel":
            kernels_of.setdefault((e.get("args") or {}).get("External id"), []).append(e["name"])
    ops = [e for e in ev if e.get("cat") == "cpu_op"]
    seen = {}
    for e in ops:
        if e["name"] != "aten::convolution_backward":
            continue
        inside = [c for c in ops if c["tid"] == e["tid"] and e["ts"] <= c["ts"] <= e["ts"] + e["dur"]]
        names = [k for c in inside for k in kernels_of.get(c["args"].get("External id"), [])]
        seen.setdefault(e["args"]["Concrete Inputs"][10], []).append(any("dgrad" in k for k in names))
    assert seen["[False, True, False]"] and not any(seen["[False, True, False]"])
    assert seen["[True, True, False]"] and all(seen["[True, True, False]"])


def test_library_norms_and_gated_silu():
    """AITER's RMS norms with a weight [C]: 2·C+2 FLOPs per row and 2 per element, x read and y
    written and the weight read; with the residual add fused (add_rmsnorm(out, x, residual_in,
    residual_out, weight)), one more FLOP per element and the residual read and the sum written.
    silu_and_mul(out [..., d], input [..., 2d]): 5 FLOPs per output element, input read, out written."""
    path = shared_trace("corpus/mi300x_sglang_decode_graph_capture.json.gz")
    for name, xi, wi, add in (("aiter::rmsnorm", 1, 2, False), ("aiter::add_rmsnorm", 1, 4, True)):
        for types, dims, conc in _events(path, name):
            x, c_ = dims[xi], prod(dims[wi])
            n, bpe = prod(x), BYTES[types[xi]]
            cost = _cost(name, types, dims, conc)
            assert cost.flops == n // c_ * (2 * c_ + 2) + 2 * n + (n if add else 0)
            assert cost.bytes == (4 if add else 2) * n * bpe + c_ * bpe
    for types, dims, conc in _events(path, "sgl_kernel::silu_and_mul"):
        out, x = dims[0], dims[1]
        assert x[-1] == 2 * out[-1]
        cost = _cost("sgl_kernel::silu_and_mul", types, dims, conc)
        assert cost.flops == 5 * prod(out) and cost.bytes == prod(x) * BYTES[types[1]] + prod(out) * BYTES[types[0]]


def test_the_bias_gradient_is_a_child_sum_with_its_own_kernel():
    """Why convolution_backward's cost leaves the bias gradient out: on cuDNN it runs as a child
    `aten::sum` of gy over batch and space ([0, 2, 3]) that launches its own reduction kernel, and
    the roofline charges that kernel (and those bytes) to the sum."""
    ev = _trace(H100 / "bf16.pt.trace.json.gz")["traceEvents"]
    launched = {(e.get("args") or {}).get("External id") for e in ev if e.get("cat") == "kernel"}
    ops = [e for e in ev if e.get("cat") == "cpu_op"]
    backward = [e for e in ops if e["name"] == "aten::convolution_backward" and e["args"]["Concrete Inputs"][10].endswith("True]")]
    assert backward
    for e in backward:
        sums = [c for c in ops if c["name"] == "aten::sum" and c["tid"] == e["tid"] and e["ts"] <= c["ts"] <= e["ts"] + e["dur"]]
        gy = e["args"]["Input Dims"][0]
        assert any(c["args"]["Input Dims"][0] == gy and c["args"]["Concrete Inputs"][1] == "[0, 2, 3]" and c["args"].get("External id") in launched for c in sums)


def test_nearest_upsampling_copies_one_input_element_per_output_element():
    """upsample_nearest2d(x [N, C, H, W], output_size [H', W'] or scale factors): one FLOP per
    output element, x read and the [N, C, H', W'] output written."""
    for types, dims, conc in _events(shared_trace("corpus/mi300x_xdit_flux_infer.json.gz"), "aten::upsample_nearest2d"):
        x = dims[0]
        size = _ints(conc[1]) or [int(d * float(f)) for d, f in zip(x[2:], conc[2].strip("[]").split(","), strict=True)]
        out = x[0] * x[1] * prod(size)
        c = _cost("aten::upsample_nearest2d", types, dims, conc)
        assert c.flops == out and c.bytes == (prod(x) + out) * BYTES[types[0]]


def test_a_norm_without_dim_reduces_everything():
    """linalg_norm(x, ord, dim, keepdim, dtype) with no dim recorded (a trace without scalar
    arguments): one output element; one FLOP per input element, x read once."""
    for types, dims, conc in _events(shared_trace("a100_two_ranks/rank-0.json.gz"), "aten::linalg_norm"):
        c = _cost("aten::linalg_norm", types, dims, conc)
        assert c.flops == prod(dims[0]) and c.bytes == (prod(dims[0]) + 1) * BYTES[types[0]]


def test_inductor_gemm_templates_are_the_product_their_output_joins():
    # Real launches of torch.compile's GEMM templates (SAM's mask generator on an A100): the
    # operands as Inductor passes them (an input [.., K] with its leading dims flattened, a weight
    # [N, K] or [K, N], [batch.., K, N] for bmm) and the output of M·N elements per batch.
    sam = "traces/corpus/a100_sam_amg_compile_cudagraph.json.gz"
    expected = {
        "triton_tem_fused_mm_2": (2048, 128, 2, 1),  # [1024, 2, 2] @ [2, 128] -> [2048, 128]
        "triton_tem_fused_bmm_12": (8, 4096, 16, 8192),  # [1024, 8, 8, 16] @ [1024, 8, 16, 4096] -> [8192, 8, 4096]
        "triton_tem_fused_relu_31": (1024, 4, 256, 1),  # [1024, 256] @ [4, 256]ᵀ -> [1024, 4], relu fused
    }
    for name, (m, n, k, batch) in expected.items():
        ((types, dims, conc),) = _events(sam, name)[:1]
        cost = op_cost(name, tuple(types), dims, conc)
        assert cost is not None and cost.kind == "gemm", name
        assert (cost.m, cost.n, cost.k, cost.batch) == (m, n, k, batch), name
        assert cost.flops == 2 * batch * m * n * k, name


def test_inductor_pointwise_kernels_move_their_tensors_once_and_gathers_get_no_cost():
    # ResNet-18 compiled (bf16 autocast, batch 512, the sample's final run): its launches' tensors.
    run = REPO / "sample_runs" / "resnet18_cifar" / "runs" / "gpu_walk_final"
    name = "triton_poi_fused__native_batch_norm_legit_functional_relu_5"
    ((types, dims, conc),) = _events(run, name)[:1]
    cost = op_cost(name, tuple(types), dims, conc)
    act = 512 * 64 * 112 * 112
    # x and the output in bf16, mean and invstd [1, 64, 1, 1] and weight and bias [64] in fp32
    assert cost.kind == "elementwise" and cost.bytes == 2 * act * 2 + 4 * 64 * 4
    assert cost.flops == 2 * act  # `norm` and `relu`: one FLOP per element each (a lower bound)
    # max-pool's backward gathers each input's windows from the output gradient and indices:
    # the tensors' sizes are not its bytes, so no cost rather than a wrong one
    name = "triton_poi_fused_add_max_pool2d_with_indices_max_pool2d_with_indices_backward_36"
    ((types, dims, conc),) = _events(run, name)[:1]
    assert op_cost(name, tuple(types), dims, conc) is None
