"""FLOP and byte models: each family against values computed by hand (arithmetic written out)."""

from __future__ import annotations

import subprocess
import sys

import polars as pl
import pytest

from tracedx.analysis import intensity
from tracedx.analysis.intensity import COMPOSITE_OPS, OP_MODELS, OpCost, add_op_costs, op_cost

F, BF, H, L = "float", "c10::BFloat16", "c10::Half", "long int"


def cost(name, shapes, dtypes, concrete=None) -> OpCost:
    c = op_cost(name, shapes, dtypes, concrete)
    assert c is not None, f"{name} has no model for {shapes} {dtypes}"
    return c


# ---------------------------------------------------------------- GEMM


def test_addmm_issue_example():
    c = cost(
        "aten::addmm", [[1024], [64, 1024], [1024, 1024], [], []], [F, F, F, "Scalar", "Scalar"]
    )
    assert c.flops == 2 * 64 * 1024 * 1024  # 134,217,728: the bias adds nothing
    assert c.bytes == (1024 + 64 * 1024 + 1024 * 1024 + 64 * 1024) * 4  # 4,722,688
    assert (c.compute_dtype, c.family, c.tensor_core) == ("fp32", "gemm", True)


def test_mm_case_c04():
    c = cost("aten::mm", [[256, 512], [512, 1024]], [F, F], ["", ""])
    assert c.flops == 268_435_456  # 2 * 256 * 1024 * 512
    assert c.bytes == 3_670_016  # (256*512 + 512*1024 + 256*1024) * 4


def test_mm_out_tensor_is_not_read_and_bad_inner_dim_is_unmodelled():
    with_out = cost("mm", [[256, 512], [512, 1024], [256, 1024]], [F, F, F])
    assert with_out.bytes == 3_670_016  # the out= tensor is written once, not also read
    assert op_cost("aten::mm", [[256, 512], [256, 1024]], [F, F]) is None  # K 512 != 256


def test_bmm_and_baddbmm_bf16():
    b = cost("aten::bmm", [[4, 64, 128], [4, 128, 32]], [BF, BF])
    assert b.flops == 2 * 4 * 64 * 32 * 128  # 2,097,152
    assert b.bytes == (4 * 64 * 128 + 4 * 128 * 32 + 4 * 64 * 32) * 2  # 114,688
    assert b.compute_dtype == "bf16"
    bb = cost(
        "aten::baddbmm", [[4, 64, 32], [4, 64, 128], [4, 128, 32], [], []], [BF] * 3 + [""] * 2
    )
    assert bb.flops == b.flops
    assert bb.bytes == b.bytes + 4 * 64 * 32 * 2  # + the bias read


def test_matmul_broadcast_and_vector():
    c = cost("aten::matmul", [[2, 3, 64, 128], [128, 32]], [F, F])
    assert c.flops == 2 * (2 * 3) * 64 * 32 * 128  # 3,145,728
    assert c.bytes == (2 * 3 * 64 * 128 + 128 * 32 + 2 * 3 * 64 * 32) * 4  # 262,144
    v = cost("aten::matmul", [[128], [128, 32]], [F, F])
    assert v.flops == 2 * 1 * 32 * 128
    assert v.bytes == (128 + 128 * 32 + 32) * 4
    assert "aten::matmul" in COMPOSITE_OPS and "aten::mm" not in COMPOSITE_OPS


def test_linear_3d_input():
    c = cost("aten::linear", [[8, 16, 1024], [4096, 1024], [4096]], [BF, BF, BF])
    m = 8 * 16
    assert c.flops == 2 * m * 4096 * 1024  # 1,073,741,824
    assert c.bytes == (m * 1024 + 4096 * 1024 + 4096 + m * 4096) * 2  # 9,707,520


def test_scaled_mm_fp8_writes_out_dtype():
    c = cost(
        "aten::_scaled_mm",
        [[128, 256], [256, 512], [], [], [], [], [], []],
        ["c10::Float8_e4m3fn", "c10::Float8_e4m3fn", F, F, "", "", "Scalar", "Scalar"],
        ["", "", "", "", "", "", "15", "False"],
    )
    assert c.flops == 2 * 128 * 512 * 256
    # A and B 1 byte each, two 0-dim fp32 scales (4 bytes each), out bf16 (2 bytes)
    assert c.bytes == 128 * 256 + 256 * 512 + 4 + 4 + 128 * 512 * 2
    assert c.compute_dtype == "fp8"


# ---------------------------------------------------------------- convolution

_CONV_TYPES = [F, F, "", "ScalarList", "ScalarList", "ScalarList", "Scalar", "ScalarList", "Scalar"]


def test_convolution_with_stride_and_padding():
    # ResNet stem: 3->64, 7x7, stride 2, padding 3 on 224x224 -> 112x112
    c = cost(
        "aten::convolution",
        [[32, 3, 224, 224], [64, 3, 7, 7], [], [], [], [], [], [], []],
        _CONV_TYPES,
        ["", "", "", "[2, 2]", "[3, 3]", "[1, 1]", "False", "[0, 0]", "1"],
    )
    out = 32 * 64 * 112 * 112  # (224 + 6 - 6 - 1) // 2 + 1 = 112
    assert c.flops == 2 * (3 * 7 * 7) * out  # 7,552,892,928
    assert c.bytes == (32 * 3 * 224 * 224 + 64 * 3 * 7 * 7 + out) * 4  # 122,065,664
    assert (c.family, c.tensor_core) == ("conv", True)


def test_convolution_without_concrete_assumes_stride_1_same_padding():
    # legacy traces record stride/padding as GenericList with no Concrete Inputs
    c = cost(
        "aten::_convolution",
        [[32, 3, 224, 224], [64, 3, 7, 7]] + [[]] * 11,
        [F, F, "", "GenericList", "GenericList", "GenericList", "Bool", "GenericList", "Int"]
        + ["Bool"] * 4,
        None,
    )
    assert c.flops == 2 * (3 * 7 * 7) * (32 * 64 * 224 * 224)  # output as large as the input


def test_conv2d_depthwise_with_bias_bf16():
    c = cost(
        "aten::conv2d",
        [[8, 32, 56, 56], [32, 1, 3, 3], [32], [], [], [], []],
        [BF, BF, BF, "ScalarList", "ScalarList", "ScalarList", "Scalar"],
        ["", "", "", "[1, 1]", "[1, 1]", "[1, 1]", "32"],
    )
    out = 8 * 32 * 56 * 56  # (56 + 2 - 2 - 1) // 1 + 1 = 56
    assert c.flops == 2 * (1 * 3 * 3) * out  # Cin/groups = 1: 14,450,688
    assert c.bytes == (8 * 32 * 56 * 56 + 32 * 9 + 32 + out) * 2  # 3,211,904


def test_transposed_convolution():
    c = cost(
        "aten::convolution",
        [[1, 16, 8, 8], [16, 8, 4, 4], [], [], [], [], [], [], []],
        _CONV_TYPES,
        ["", "", "", "[2, 2]", "[1, 1]", "[1, 1]", "True", "[0, 0]", "1"],
    )
    # out = (8-1)*2 - 2*1 + 1*(4-1) + 0 + 1 = 16; Cout = 8
    assert c.flops == 2 * (16 * 8 * 4 * 4) * (1 * 8 * 8)  # each input pixel meets the weights
    assert c.bytes == (16 * 8 * 8 + 16 * 8 * 16 + 1 * 8 * 16 * 16) * 4


def test_convolution_backward_mask():
    shapes = [[32, 64, 56, 56], [32, 64, 56, 56], [64, 64, 3, 3]] + [[]] * 8
    dtypes = [F, F, F, "ScalarList", "ScalarList", "ScalarList", "ScalarList", "Scalar"]
    dtypes += ["ScalarList", "Scalar", "ScalarList"]
    conc = ["", "", "", "[64]", "[1, 1]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1"]
    c = cost("aten::convolution_backward", shapes, dtypes, [*conc, "[True, True, False]"])
    fwd = 2 * (64 * 64 * 9) * (32 * 56 * 56)  # 7,398,752,256
    assert c.flops == 2 * fwd  # grad_input + grad_weight
    act, w = 32 * 64 * 56 * 56, 64 * 64 * 9
    assert c.bytes == (3 * act + 2 * w) * 4  # read go, x, w; write dx, dw: 77,365,248
    only_w = cost("aten::convolution_backward", shapes, dtypes, [*conc, "[False, True, True]"])
    assert only_w.flops == fwd + act  # + the bias gradient's sum over grad_output
    assert only_w.bytes == (2 * act + w + w + 64) * 4


# ---------------------------------------------------------------- attention

QKV = [[4, 16, 4096, 64]] * 3
FWD_FLOPS = 4 * 4 * 16 * 4096 * 4096 * 64  # 4*B*H*N*N*d = 274,877,906,944
ACT = 4 * 16 * 4096 * 64  # elements of q, k, v or out


def _sdpa(causal: str):
    return cost(
        "aten::scaled_dot_product_attention",
        [*QKV, [], [], [], [], []],
        [BF, BF, BF, "", "Scalar", "Scalar", "", "Scalar"],
        ["", "", "", "", "0.", causal, "", "False"],
    )


def test_sdpa_forward_and_causal():
    full = _sdpa("False")
    assert full.flops == FWD_FLOPS
    assert full.bytes == 4 * ACT * 2  # q, k, v read, out written, bf16
    assert (full.family, full.compute_dtype, full.tensor_core) == ("attention", "bf16", True)
    assert _sdpa("True").flops == FWD_FLOPS / 2


def test_flash_forward_writes_logsumexp_and_bnhd_layout():
    c = cost(
        "aten::_scaled_dot_product_flash_attention",
        [*QKV, [], [], []],
        [BF, BF, BF, "Scalar", "Scalar", "Scalar"],
        ["", "", "", "0.", "True", "False"],
    )
    assert c.flops == FWD_FLOPS / 2
    assert c.bytes == 4 * ACT * 2 + (4 * 16 * 4096) * 4  # + fp32 logsumexp
    f = cost(
        "aten::_flash_attention_forward",
        [[4, 4096, 16, 64]] * 3 + [[]] * 7,
        [BF] * 3 + [""] * 7,
        ["", "", "", "", "", "4096", "4096", "0.", "False", "False"],
    )
    assert f.flops == FWD_FLOPS


def test_flash_backward_is_2_5x_forward():
    c = cost(
        "aten::_scaled_dot_product_flash_attention_backward",
        [*[[4, 16, 4096, 64]] * 5, [4, 16, 4096], [], [], [], [], [], [], [], []],
        [BF] * 5 + [F, "", "", "Scalar", "Scalar", "Scalar", "Scalar", L, L],
        [""] * 8 + ["4096", "4096", "0.", "True", "", ""],
    )
    assert c.flops == 2.5 * FWD_FLOPS / 2  # causal: 343,597,383,680
    reads = 5 * ACT * 2 + (4 * 16 * 4096) * 4 + 2 * 8  # go, q, k, v, out; lse; 0-dim philox
    assert c.bytes == reads + 3 * ACT * 2  # dq, dk, dv written


def test_efficient_attention_gqa_uses_query_heads():
    c = cost(
        "aten::_scaled_dot_product_efficient_attention",
        [[1, 32, 128, 128], [1, 8, 1024, 128], [1, 8, 1024, 128], [], [], [], [], []],
        [H, H, H, "", "Scalar", "Scalar", "Scalar", ""],
        ["", "", "", "", "False", "0.", "False", ""],
    )
    assert c.flops == 4 * 1 * 32 * 128 * 1024 * 128  # 536,870,912
    assert c.bytes == (32 * 128 * 128 + 2 * 8 * 1024 * 128 + 32 * 128 * 128) * 2


# ---------------------------------------------------------------- softmax and norms


def test_softmax_and_backward():
    n = 8192 * 8192
    c = cost(
        "aten::_softmax", [[8192, 8192], [], []], [BF, "Scalar", "Scalar"], ["", "-1", "False"]
    )
    assert c.flops == 5 * n  # max, sub, exp, sum, div
    assert c.bytes == 2 * n * 2
    up = cost(
        "aten::_softmax", [[8192, 8192], [], []], [BF, "Scalar", "Scalar"], ["", "-1", "True"]
    )
    assert up.bytes == n * 2 + n * 4  # half_to_float writes fp32
    b = cost(
        "aten::_softmax_backward_data",
        [[8192, 8192], [8192, 8192], [], []],
        [BF, BF, "Scalar", "Scalar"],
        ["", "", "-1", "15"],
    )
    assert b.flops == 4 * n
    assert b.bytes == 3 * n * 2
    assert c.family == "softmax" and not c.tensor_core


def test_layer_norm_forward_and_backward():
    n, m, d = 1024 * 512, 1024, 512
    c = cost(
        "aten::native_layer_norm",
        [[1024, 512], [], [512], [512], []],
        [F, "", F, F, "Scalar"],
    )
    assert c.flops == (6 + 2) * n  # stats 4 + normalize 2 + weight 1 + bias 1
    assert c.bytes == (n + 2 * d) * 4 + (n + 2 * m) * 4  # read x, w, b; write y, mean, rstd
    b = cost(
        "aten::native_layer_norm_backward",
        [[1024, 512], [1024, 512], [], [1024, 1], [1024, 1], [512], [512], []],
        [F, F, "", F, F, F, F, ""],
        ["", "", "[512]", "", "", "", "", "[True, True, True]"],
    )
    assert b.flops == 10 * n
    assert b.bytes == (2 * n + 2 * m + 2 * d) * 4 + (n + 2 * d) * 4  # 6,307,840


def test_rms_norm_fused():
    c = cost(
        "aten::_fused_rms_norm",
        [[16, 4096], [], [4096], []],
        [BF, "ScalarList", BF, "Scalar"],
        ["", "[4096]", "", "1e-06"],
    )
    n = 16 * 4096
    assert c.flops == (3 + 1) * n
    assert c.bytes == (n + 4096) * 2 + n * 2 + 16 * 4  # read x, w; write y, rstd (fp32)


def test_batch_norm_training_eval_and_backward():
    n, ch = 32 * 64 * 112 * 112, 64
    stats = [[32, 64, 112, 112], [64], [64], [64], [64], [], [], []]
    types = [F] * 5 + ["Bool", "Double", "Double"]
    t = cost("aten::cudnn_batch_norm", stats, types, None)  # flag not recorded: training
    assert t.flops == 8 * n
    assert t.bytes == (n + 4 * ch) * 4 + (n + 2 * ch) * 4  # + save_mean, save_invstd
    e = cost("aten::native_batch_norm", stats, types, ["", "", "", "", "", "False", "0.1", "1e-05"])
    assert e.flops == 4 * n  # no statistics
    assert e.bytes == (n + 4 * ch) * 4 + n * 4
    nb = 32 * 2048 * 7 * 7
    b = cost(
        "aten::cudnn_batch_norm_backward",
        [[32, 2048, 7, 7], [32, 2048, 7, 7], *[[2048]] * 5, [], [0]],
        [F] * 7 + ["Double", "unsigned char"],
    )
    assert b.flops == 10 * nb
    assert b.bytes == (2 * nb + 5 * 2048) * 4 + (nb + 2 * 2048) * 4  # 38,592,512


# ---------------------------------------------------------------- elementwise


def test_binary_broadcast():
    c = cost("aten::add", [[1024, 768], [768], []], [F, F, "Scalar"])
    n = 1024 * 768
    assert c.flops == n
    assert c.bytes == (n + 768 + n) * 4  # 6,294,528
    assert (c.family, c.compute_dtype, c.tensor_core) == ("elementwise", "fp32", False)


def test_zero_dim_tensor_does_not_promote_and_out_arg_is_not_read():
    c = cost("aten::mul", [[4096], []], [BF, F])
    assert c.bytes == 4096 * 2 + 4 + 4096 * 2  # output stays bf16
    assert c.compute_dtype == "bf16"
    out = cost("aten::add", [[10], [10], [], [10]], [F, F, "Scalar", F])
    assert out.bytes == 3 * 10 * 4  # a, b read; out written (not also read)


def test_inplace_writes_first_input():
    n = 32 * 64 * 112 * 112
    r = cost("aten::relu_", [[32, 64, 112, 112]], [F])
    assert (r.flops, r.bytes) == (n, 2 * n * 4)
    a = cost("aten::add_", [[1024, 96, 15], [15], []], [F, F, "Scalar"])
    m = 1024 * 96 * 15
    assert a.bytes == (m + 15 + m) * 4


def test_activation_and_backward_flops():
    n = 8192 * 8192
    g = cost("aten::gelu", [[8192, 8192], []], [F, ""], ["", "none"])
    assert (g.flops, g.bytes) == (8 * n, 2 * n * 4)
    tb = cost("aten::threshold_backward", [[2048, 256], [2048, 256], []], [F, F, "Scalar"])
    assert (tb.flops, tb.bytes) == (2048 * 256, 3 * 2048 * 256 * 4)


def test_comparison_where_fill_zero():
    eq = cost("aten::eq", [[1024], [1024]], [L, L])
    assert eq.bytes == 2 * 1024 * 8 + 1024  # bool output
    assert eq.compute_dtype == "int"
    w = cost("aten::where", [[1024], [1024], [1024]], ["bool", F, F])
    assert w.bytes == 1024 * 1 + 2 * 1024 * 4 + 1024 * 4  # output float
    f = cost("aten::fill_", [[45310188], []], [F, "Scalar"], ["", "0"])
    assert (f.flops, f.bytes) == (0, 45310188 * 4)  # written only
    z = cost("aten::zero_", [[1000]], [BF])
    assert z.bytes == 2000
    c = cost("aten::clamp", [[1024, 64], [], []], [F, "Scalar", "Scalar"])
    assert (c.flops, c.bytes) == (2 * 1024 * 64, 2 * 1024 * 64 * 4)


def test_max_other_is_elementwise():
    c = cost("aten::max", [[16, 8], [8]], [F, F])
    assert c.family == "elementwise"
    assert c.bytes == (128 + 8 + 128) * 4


# ---------------------------------------------------------------- reductions


def test_reductions():
    s = cost("aten::sum", [[1024, 40], [], [], []], [F, "", "Scalar", ""], ["", "[1]", "False", ""])
    assert (s.flops, s.bytes) == (40960, 40960 * 4 + 1024 * 4)
    assert s.family == "reduction"
    full = cost("aten::sum", [[979, 1024], []], ["int", ""])  # sum(self, dtype): no dim
    assert full.bytes == 979 * 1024 * 4 + 8  # int sums to int64
    mx = cost("aten::max", [[4, 1024], [], []], [F, "Scalar", "Scalar"], ["", "-1", "False"])
    assert mx.bytes == 4 * 1024 * 4 + 4 * (4 + 8)  # values and int64 indices
    am = cost("aten::amax", [[4, 1024], [], []], [BF, "ScalarList", "Scalar"], ["", "[-1]", "1"])
    assert am.bytes == (4096 + 4) * 2
    nrm = cost(
        "aten::linalg_vector_norm", [[512, 8192], [], [], [], []], [F, "Scalar", "", "Scalar", ""]
    )
    assert (nrm.flops, nrm.bytes) == (2 * 512 * 8192, 512 * 8192 * 4 + 4)  # dim unknown: 1 out
    cs = cost("aten::cumsum", [[300], [], []], [L, "Scalar", ""], ["", "0", ""])
    assert cs.bytes == 2 * 300 * 8  # a scan writes as much as it reads


# ---------------------------------------------------------------- embedding, copies


def test_embedding_reads_only_gathered_rows():
    c = cost(
        "aten::embedding",
        [[25136, 2880], [888], [], [], []],
        [BF, L, "Scalar", "Scalar", "Scalar"],
        ["", "", "-1", "False", "False"],
    )
    assert c.flops == 0
    assert c.bytes == 888 * 8 + 2 * 888 * 2880 * 2  # indices + rows read + output written
    b = cost(
        "aten::embedding_dense_backward",
        [[888, 2880], [888], [], [], []],
        [BF, L, "Scalar", "Scalar", "Scalar"],
        ["", "", "25136", "-1", "False"],
    )
    assert b.flops == 888 * 2880
    assert b.bytes == 888 * 2880 * 2 + 888 * 8 + 25136 * 2880 * 2


def test_copies_and_casts():
    c = cost("aten::copy_", [[951, 1024], [951, 1024], []], [F, "int", "Scalar"])
    assert c.bytes == 951 * 1024 * (4 + 4)
    assert (c.flops, c.family) == (0, "copy")
    t = cost(
        "aten::_to_copy",
        [[1024, 1024], [], [], [], [], [], []],
        [F] + ["Scalar"] * 6,
        ["", "15"] + [""] * 5,
    )
    assert t.bytes == 1024 * 1024 * (4 + 2)  # fp32 -> bf16
    same = cost("aten::clone", [[1024, 96, 50], []], [F, "Scalar"])
    assert same.bytes == 2 * 1024 * 96 * 50 * 4


# ---------------------------------------------------------------- robustness


def test_unmodelled_and_missing():
    assert op_cost("aten::view", [[4, 4], []], [F, ""]) is None
    assert op_cost("aten::mm", None, None) is None
    assert op_cost("aten::add", [[], [], []], ["Scalar", "Scalar", "Scalar"]) is None
    assert op_cost("aten::add", [[3], [4]], [F, F]) is None  # does not broadcast
    assert op_cost("mm", [[2, 3], [3, 4]], [F, F]).flops == 48  # bare name


def test_registry_covers_the_issue_list():
    for name in [
        "mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "convolution", "_convolution",
        "cudnn_convolution", "conv2d", "convolution_backward", "scaled_dot_product_attention",
        "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention", "_flash_attention_forward",
        "_scaled_dot_product_flash_attention_backward",
        "_scaled_dot_product_efficient_attention_backward",
        "_scaled_dot_product_cudnn_attention_backward", "_flash_attention_backward",
        "_softmax", "softmax", "_softmax_backward_data", "native_layer_norm", "layer_norm",
        "native_layer_norm_backward", "rms_norm", "_fused_rms_norm", "native_batch_norm",
        "cudnn_batch_norm", "_batch_norm_impl_index", "native_batch_norm_backward",
        "cudnn_batch_norm_backward", "add", "sub", "mul", "div", "relu", "gelu", "silu", "tanh",
        "sigmoid", "exp", "pow", "neg", "threshold_backward", "gelu_backward", "fill_", "zero_",
        "clamp", "where", "sum", "mean", "max", "amax", "norm", "embedding",
        "embedding_dense_backward", "copy_", "to", "_to_copy", "contiguous", "clone",
    ]:  # fmt: skip
        assert f"aten::{name}" in OP_MODELS, name


# ---------------------------------------------------------------- polars entry point


def _ops_frame() -> pl.DataFrame:
    mm = ("aten::mm", [[256, 512], [512, 1024]], [F, F], ["", ""])
    rows = [
        mm,
        ("aten::view", [[4, 4], []], [F, ""], None),
        mm,
        ("aten::addmm", None, None, None),  # shapes not recorded
        ("aten::relu", [[10]], [F], None),
        mm,
    ]
    return pl.DataFrame(
        {
            "name": [r[0] for r in rows],
            "input_shapes": [r[1] for r in rows],
            "input_dtypes": [r[2] for r in rows],
            "concrete_inputs": [r[3] for r in rows],
            "row": list(range(len(rows))),
        },
        schema={
            "name": pl.Utf8,
            "input_shapes": pl.List(pl.List(pl.Int64)),
            "input_dtypes": pl.List(pl.Utf8),
            "concrete_inputs": pl.List(pl.Utf8),
            "row": pl.Int64,
        },
    )


def test_add_op_costs_joins_back_in_order_with_nulls(monkeypatch):
    calls = []
    real = OP_MODELS["aten::mm"]

    def counting(a):
        calls.append(a.name)
        return real(a)

    monkeypatch.setitem(intensity.OP_MODELS, "aten::mm", counting)
    out = add_op_costs(_ops_frame())
    assert out["row"].to_list() == [0, 1, 2, 3, 4, 5]
    assert calls == ["aten::mm"]  # three identical mm rows, one evaluation
    assert out.schema["flops"] == pl.Float64 and out.schema["tensor_core"] == pl.Boolean
    assert out.schema["compute_dtype"] == pl.Utf8 and out.schema["family"] == pl.Utf8
    assert out["flops"].to_list() == [268_435_456.0, None, 268_435_456.0, None, 10.0, 268_435_456.0]
    assert out["bytes"].to_list()[0] == 3_670_016.0
    assert out["family"].to_list() == ["gemm", None, "gemm", None, "elementwise", "gemm"]
    assert out["tensor_core"].to_list() == [True, None, True, None, False, True]


def test_add_op_costs_without_concrete_column_and_rerun():
    df = _ops_frame().drop("concrete_inputs")
    out = add_op_costs(df)
    assert "concrete_inputs" not in out.columns
    assert out["flops"][0] == 268_435_456.0
    again = add_op_costs(out)  # re-running replaces the columns, it does not duplicate them
    assert again.columns == out.columns


def test_analysis_never_imports_torch():
    code = (
        "import sys, tracedx.analysis.intensity, tracedx.analysis.roofline, tracedx.devices;"
        "sys.exit(1 if 'torch' in sys.modules else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


@pytest.mark.parametrize(
    "dtype,size", [(F, 4), ("double", 8), (H, 2), (BF, 2), (L, 8), ("bool", 1)]
)
def test_dtype_sizes(dtype, size):
    assert cost("aten::neg", [[10]], [dtype]).bytes == 2 * 10 * size


# ---------------------------------------------------------------- records copied from a real trace
# (PyTorch 2.11 + CUDA 13.0 on an H200: default SDPA picked cuDNN for a causal bf16 call)


def test_real_cudnn_attention_records():
    fwd = cost(
        "aten::_cudnn_attention_forward",
        [*QKV] + [[]] * 10,
        [BF, BF, BF, "", "", "", "Scalar", "Scalar", "Scalar", "Scalar", "Scalar", "Scalar", ""],
        ["", "", "", "", "", "", "4096", "4096", "True", "0.", "True", "False", ""],
    )
    assert fwd.flops == FWD_FLOPS / 2  # is_causal at position 10
    assert fwd.bytes == 4 * ACT * 2 + (4 * 16 * 4096) * 4  # compute_log_sumexp True
    bwd = cost(
        "aten::_cudnn_attention_backward",
        [*[[4, 16, 4096, 64]] * 5, [4, 16, 4096, 1]] + [[]] * 10,
        [BF] * 5 + [F, L, L, "", "", "", "Scalar", "Scalar", "Scalar", "Scalar", ""],
        [""] * 11 + ["4096", "4096", "0.", "True", ""],
    )
    assert bwd.flops == 2.5 * FWD_FLOPS / 2
    # philox seed/offset were recorded with empty dims: 0-dim int64 tensors, 8 bytes each
    assert bwd.bytes == 5 * ACT * 2 + (4 * 16 * 4096) * 4 + 2 * 8 + 3 * ACT * 2


def test_real_efficient_attention_forward_record():
    c = cost(
        "aten::_efficient_attention_forward",
        [[4, 4096, 16, 64]] * 3 + [[]] * 11,
        [BF] * 3 + [""] * 5 + ["Scalar"] * 3 + [""] * 3,
        [""] * 8 + ["0.", "0", "True", "", "", ""],
    )
    assert c.flops == FWD_FLOPS  # custom_mask_type 0: not causal; [B, N, H, d] layout
    assert c.bytes == 4 * ACT * 2 + (4 * 16 * 4096) * 4


def test_random_fill_is_write_only():
    c = cost("aten::normal_", [[8192, 8192], [], [], []], [BF, "Scalar", "Scalar", ""])
    assert (c.flops, c.bytes) == (0, 8192 * 8192 * 2)
