"""FLOP and byte models for aten ops, from the shapes and dtypes the profiler recorded.

PyTorch 2.11 writes no FLOP count into its traces, not even with ``with_flops=True``
(seen in PyTorch 2.11 traces), so tracedx computes FLOPs and bytes itself from each ``cpu_op``'s
``Input Dims``, ``Input type`` and ``Concrete Inputs``, TraceLens-style: one small function
per op family, registered by aten name in :data:`OP_MODELS`.

Conventions (all models):

- **FLOPs**: one multiply-add is 2 FLOPs. GEMMs count ``2*M*N*K`` (bias and alpha/beta
  add nothing: the ``M*N`` epilogue is below the model's precision); convolutions
  ``2 x (Cin/groups x prod(kernel)) x output elements``; attention ``4*B*H*Nq*Nkv*d``
  (halved when causal; backward 2.5x forward). Elementwise, norm and reduction FLOPs are a
  per-element count of the textbook expression; a transcendental (exp, log, tanh, erf,
  rsqrt) counts as one FLOP. Those ops are bandwidth-bound on every GPU in the device table,
  so their FLOP count never decides a verdict.
- **Bytes**: each tensor input is read once and each output written once, at the size of its
  dtype (``float`` 4, ``c10::BFloat16`` 2, ...). Caches are ignored (this is the DRAM
  traffic of an ideal kernel). Exceptions, where "read every input once" would be wrong:
  ``embedding`` reads only the gathered rows, ``fill_``/``zero_`` read nothing.
- **Which inputs are operands**: each model names its operand positions, so an ``out=``
  tensor recorded as an extra input is not counted as a read.

Composite ops (``linear``, ``matmul``, ``conv2d``, ``scaled_dot_product_attention``,
``layer_norm``, ...) are modelled too, but their work is also carried by the op they dispatch
to; :data:`COMPOSITE_OPS` lists them so a caller that sums costs over an op tree counts each
kernel's work once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import polars as pl

from tracedx.trace.dtypes import INPUT_TYPE_BYTES

# --------------------------------------------------------------------------------------
# dtypes
# --------------------------------------------------------------------------------------


_DTYPE_CLASS: dict[str, str] = {
    "double": "fp64",
    "c10::complex<double>": "fp64",
    "float": "fp32",
    "c10::complex<float>": "fp32",
    "c10::Half": "fp16",
    "c10::complex<c10::Half>": "fp16",
    "c10::BFloat16": "bf16",
    "c10::Float8_e4m3fn": "fp8",
    "c10::Float8_e5m2": "fp8",
    "c10::Float8_e4m3fnuz": "fp8",
    "c10::Float8_e5m2fnuz": "fp8",
    "c10::Float8_e8m0fnu": "fp8",
}

# c10::ScalarType enum values (c10/core/ScalarType.h) -> Kineto type string, for dtype
# arguments recorded as Concrete Inputs (``_to_copy(x, dtype=15)`` is bf16).
_SCALAR_TYPE: dict[int, str] = {
    0: "unsigned char",
    1: "signed char",
    2: "short int",
    3: "int",
    4: "long int",
    5: "c10::Half",
    6: "float",
    7: "double",
    8: "c10::complex<c10::Half>",
    9: "c10::complex<float>",
    10: "c10::complex<double>",
    11: "bool",
    15: "c10::BFloat16",
    23: "c10::Float8_e5m2",
    24: "c10::Float8_e4m3fn",
    25: "c10::Float8_e5m2fnuz",
    26: "c10::Float8_e4m3fnuz",
}


def dtype_class(dtype: str) -> str:
    """The compute class of a Kineto dtype string: fp64, fp32, bf16, fp16, fp8 or int."""
    return _DTYPE_CLASS.get(dtype, "int")


@dataclass(frozen=True)
class OpCost:
    """The modelled work of one op call.

    Attributes:
        flops: floating-point (or integer) operations, a multiply-add counting 2.
        bytes: DRAM bytes moved: each input read once plus each output written once.
        compute_dtype: the math precision: ``fp64``, ``fp32``, ``bf16``, ``fp16``, ``fp8``
            or ``int``. An fp32 GEMM says ``fp32`` even if it ran on TF32 tensor cores
            (the trace reader tells those apart by kernel name).
        family: ``gemm``, ``conv``, ``attention``, ``elementwise``, ``reduction``,
            ``norm``, ``softmax``, ``embedding``, ``gather`` or ``copy``.
        tensor_core: whether the op can run on matrix units (GEMM, conv, attention in a
            floating dtype); fp32 ones do only when TF32 is allowed.
    """

    flops: float
    bytes: float
    compute_dtype: str
    family: str
    tensor_core: bool


# --------------------------------------------------------------------------------------
# Arguments
# --------------------------------------------------------------------------------------


def _prod(xs: Sequence[int]) -> int:
    return math.prod(map(int, xs))


@dataclass(frozen=True)
class OpArgs:
    """One op call's recorded inputs, with helpers the models share."""

    name: str
    shapes: Sequence[Sequence[int]]
    dtypes: Sequence[str]
    concrete: Sequence[str]

    # (the helpers below run a thousand times per diagnosis: written out, not through each
    # other, with the same values and the same errors for a malformed input)
    def dtype(self, i: int) -> str:
        d = self.dtypes
        return (d[i] or "") if 0 <= i < len(d) else ""

    def is_tensor(self, i: int) -> bool:
        d = self.dtypes
        return i < len(self.shapes) and 0 <= i < len(d) and d[i] in INPUT_TYPE_BYTES

    def shape(self, i: int) -> list[int] | None:
        """The shape of input ``i`` (``[]`` for a 0-dim tensor), or None if not a tensor."""
        return list(map(int, self.shapes[i])) if self.is_tensor(i) else None

    def numel(self, i: int) -> int:
        return math.prod(map(int, self.shapes[i])) if self.is_tensor(i) else 0

    def nbytes(self, i: int) -> int:
        d = self.dtypes
        if i < len(self.shapes) and 0 <= i < len(d):
            size = INPUT_TYPE_BYTES.get(d[i])
            if size is not None:
                return math.prod(map(int, self.shapes[i])) * size
        return 0

    def read(self, positions: Sequence[int] | None = None) -> int:
        """Bytes of the tensor inputs at ``positions`` (all inputs when None)."""
        idx = range(len(self.shapes)) if positions is None else positions
        return sum(map(self.nbytes, idx))

    def arg(self, i: int) -> str:
        """The Concrete Inputs string at ``i`` (``""`` when absent)."""
        if 0 <= i < len(self.concrete) and self.concrete[i] is not None:
            return str(self.concrete[i]).strip()
        return ""

    def arg_bool(self, i: int) -> bool | None:
        s = self.arg(i).lower()
        if s in ("true", "1"):
            return True
        if s in ("false", "0"):
            return False
        return None

    def arg_int(self, i: int) -> int | None:
        s = self.arg(i)
        try:
            return int(s)
        except ValueError:
            try:
                f = float(s)
            except ValueError:
                return None
            return int(f) if math.isfinite(f) and f == int(f) else None

    def arg_ints(self, i: int) -> list[int] | None:
        """An int list argument: ``"[1, 1]"`` -> [1, 1]; ``"2"`` -> [2]; absent -> None."""
        s = self.arg(i)
        if not s:
            return None
        s = s.strip("[]() ")
        if not s:
            return []
        try:
            return [int(x) for x in s.replace(",", " ").split()]
        except ValueError:
            return None

    def arg_bools(self, i: int) -> list[bool] | None:
        s = self.arg(i)
        if not s:
            return None
        parts = [p for p in s.strip("[]() ").replace(",", " ").split() if p]
        out = []
        for p in parts:
            if p.lower() in ("true", "1"):
                out.append(True)
            elif p.lower() in ("false", "0"):
                out.append(False)
            else:
                return None
        return out

    def arg_dtype(self, i: int) -> str | None:
        """A ScalarType argument recorded as its enum value, as a Kineto dtype string."""
        v = self.arg_int(i)
        return _SCALAR_TYPE.get(v) if v is not None else None


ModelFn = Callable[[OpArgs], "OpCost | None"]

OP_MODELS: dict[str, ModelFn] = {}
"""aten name (``"aten::mm"``) -> model function."""

COMPOSITE_OPS: set[str] = set()
"""Modelled ops whose work is also carried by a child op they dispatch to."""


def register(*names: str, composite: bool = False) -> Callable[[ModelFn], ModelFn]:
    """Register a model under aten names (``"mm"`` means ``"aten::mm"``)."""

    def deco(fn: ModelFn) -> ModelFn:
        for n in names:
            full = n if "::" in n else f"aten::{n}"
            OP_MODELS[full] = fn
            if composite:
                COMPOSITE_OPS.add(full)
        return fn

    return deco


def op_cost(
    name: str,
    shapes: Sequence[Sequence[int]] | None,
    dtypes: Sequence[str] | None,
    concrete: Sequence[str] | None = None,
) -> OpCost | None:
    """The FLOPs and bytes of one op call, or None when no model applies.

    Args:
        name: the op name as the trace writes it (``"aten::addmm"``; ``"addmm"`` also works).
        shapes: ``Input Dims``: one list per input, ``[]`` for non-tensors and TensorLists.
        dtypes: ``Input type`` strings (``"float"``, ``"c10::BFloat16"``, ``"Scalar"``, ...).
        concrete: ``Concrete Inputs``: scalar arguments as strings, ``""`` for tensors.

    Returns None (never raises) for ops without a model, for missing shapes, and for
    shapes that contradict the op's schema (e.g. an ``mm`` whose inner dimensions differ).
    """
    if not name or shapes is None or dtypes is None:
        return None
    fn = OP_MODELS.get(name if "::" in name else f"aten::{name}")
    if fn is None:
        return None
    a = OpArgs(name, list(shapes), list(dtypes), list(concrete or []))
    try:
        cost = fn(a)
    except (IndexError, ValueError, TypeError, KeyError, ZeroDivisionError, OverflowError):
        return None
    if cost is None or not (math.isfinite(cost.flops) and math.isfinite(cost.bytes)):
        return None
    if cost.flops < 0 or cost.bytes < 0:
        return None
    return cost


def _need(cond: bool) -> None:
    if not cond:
        raise ValueError("shape does not fit the op's schema")


def _broadcast(shapes: Sequence[Sequence[int]]) -> list[int]:
    """NumPy/PyTorch broadcasting of several shapes (ValueError if incompatible)."""
    rank = max((len(s) for s in shapes), default=0)
    out = [1] * rank
    for s in shapes:
        for j, d in enumerate(s):
            k = rank - len(s) + j
            if d == out[k] or d == 1:
                continue
            if out[k] == 1:
                out[k] = d
            else:
                raise ValueError(f"shapes {shapes} do not broadcast")
    return out


# --------------------------------------------------------------------------------------
# GEMM (2*M*N*K)
# --------------------------------------------------------------------------------------


def _gemm(
    a: OpArgs,
    flops: float,
    operands: Sequence[int],
    out_numel: int,
    dtype: str,
    out_dtype: str | None = None,
) -> OpCost:
    """A GEMM's cost: ``flops``; operands read once; [out_numel] written in ``out_dtype``
    (default: the matrices' ``dtype``, which is also the compute dtype)."""
    return OpCost(
        flops=float(flops),
        bytes=float(a.read(operands) + out_numel * INPUT_TYPE_BYTES[out_dtype or dtype]),
        compute_dtype=dtype_class(dtype),
        family="gemm",
        tensor_core=True,
    )


@register("mm")
def _mm(a: OpArgs) -> OpCost:
    """``mm(self[M,K], mat2[K,N])``: 2*M*N*K FLOPs; reads both, writes [M,N]."""
    x, w = a.shape(0), a.shape(1)
    _need(x is not None and w is not None and len(x) == 2 and len(w) == 2 and x[1] == w[0])
    m, k, n = x[0], x[1], w[1]
    return _gemm(a, 2 * m * n * k, (0, 1), m * n, a.dtype(0))


@register("addmm")
def _addmm(a: OpArgs) -> OpCost:
    """``addmm(bias, mat1[M,K], mat2[K,N], beta, alpha)``: 2*M*N*K FLOPs.

    The bias add and the alpha/beta scaling add no FLOPs to the count (they are an
    ``M*N`` epilogue, K times smaller than the product; PyTorch's own FLOP counter and
    TraceLens count addmm as 2MNK too). Bytes: bias + mat1 + mat2 read, [M,N] written.
    """
    x, w = a.shape(1), a.shape(2)
    _need(x is not None and w is not None and len(x) == 2 and len(w) == 2 and x[1] == w[0])
    m, k, n = x[0], x[1], w[1]
    return _gemm(a, 2 * m * n * k, (0, 1, 2), m * n, a.dtype(1))


@register("bmm")
def _bmm(a: OpArgs) -> OpCost:
    """``bmm(self[B,M,K], mat2[B,K,N])``: 2*B*M*N*K FLOPs; writes [B,M,N]."""
    x, w = a.shape(0), a.shape(1)
    _need(x is not None and w is not None and len(x) == 3 and len(w) == 3 and x[2] == w[1])
    b, m, k, n = x[0], x[1], x[2], w[2]
    return _gemm(a, 2 * b * m * n * k, (0, 1), b * m * n, a.dtype(0))


@register("baddbmm")
def _baddbmm(a: OpArgs) -> OpCost:
    """``baddbmm(bias, batch1[B,M,K], batch2[B,K,N], beta, alpha)``: 2*B*M*N*K FLOPs."""
    x, w = a.shape(1), a.shape(2)
    _need(x is not None and w is not None and len(x) == 3 and len(w) == 3 and x[2] == w[1])
    b, m, k, n = x[0], x[1], x[2], w[2]
    return _gemm(a, 2 * b * m * n * k, (0, 1, 2), b * m * n, a.dtype(1))


@register("matmul", composite=True)
def _matmul(a: OpArgs) -> OpCost:
    """``matmul(a, b)`` with torch.matmul's 1-D and batched broadcasting rules.

    FLOPs 2*batch*M*N*K with batch the broadcast of the leading dims; a 1-D ``a`` is a
    [1,K] row, a 1-D ``b`` a [K,1] column. Composite: dispatches to mm/bmm/mv/dot.
    """
    x, w = a.shape(0), a.shape(1)
    _need(x is not None and w is not None and len(x) >= 1 and len(w) >= 1)
    xs = [1, *x] if len(x) == 1 else list(x)
    ws = [*w, 1] if len(w) == 1 else list(w)
    _need(xs[-1] == ws[-2])
    batch = _broadcast([xs[:-2], ws[:-2]])
    m, k, n = xs[-2], xs[-1], ws[-1]
    nb = _prod(batch)
    return _gemm(a, 2 * nb * m * n * k, (0, 1), nb * m * n, a.dtype(0))


@register("linear", composite=True)
def _linear(a: OpArgs) -> OpCost:
    """``linear(input[...,K], weight[N,K], bias[N]?)``: 2*M*N*K with M = prod(input[:-1]).

    Composite: dispatches to addmm/mm (or matmul for >2-D inputs).
    """
    x, w = a.shape(0), a.shape(1)
    _need(x is not None and w is not None and len(x) >= 1 and len(w) in (1, 2))
    k = x[-1]
    n = 1 if len(w) == 1 else w[0]
    _need(w[-1] == k)
    m = _prod(x[:-1])
    return _gemm(a, 2 * m * n * k, (0, 1, 2), m * n, a.dtype(0))


@register("_scaled_mm")
def _scaled_mm(a: OpArgs) -> OpCost:
    """``_scaled_mm(a[M,K], b[K,N], scale_a, scale_b, bias?, scale_result?, out_dtype, ...)``.

    FP8 GEMM: 2*M*N*K FLOPs at the fp8 rate; the output dtype is ``out_dtype`` when recorded,
    else the input's.
    """
    x, w = a.shape(0), a.shape(1)
    _need(x is not None and w is not None and len(x) == 2 and len(w) == 2 and x[1] == w[0])
    m, k, n = x[0], x[1], w[1]
    out = a.arg_dtype(6) or a.dtype(0)
    return _gemm(a, 2 * m * n * k, (0, 1, 2, 3, 4, 5), m * n, a.dtype(0), out)


@register("_int_mm")
def _int_mm(a: OpArgs) -> OpCost:
    """``_int_mm(a[M,K] int8, b[K,N] int8) -> int32``: 2*M*N*K integer ops."""
    x, w = a.shape(0), a.shape(1)
    _need(x is not None and w is not None and len(x) == 2 and len(w) == 2 and x[1] == w[0])
    m, k, n = x[0], x[1], w[1]
    return _gemm(a, 2 * m * n * k, (0, 1), m * n, a.dtype(0), "int")


@register("mv", "addmv")
def _mv(a: OpArgs) -> OpCost:
    """``mv(mat[N,M], vec[M])`` / ``addmv(bias[N], mat, vec)``: 2*N*M FLOPs (GEMV).

    GEMV streams the matrix once, so it runs on the vector units (``tensor_core`` False).
    """
    off = 1 if a.name.endswith("addmv") else 0
    mat, vec = a.shape(off), a.shape(off + 1)
    _need(mat is not None and vec is not None and len(mat) == 2 and len(vec) == 1)
    _need(mat[1] == vec[0])
    n, m = mat
    ops = (0, 1, 2) if off else (0, 1)
    return OpCost(
        float(2 * n * m),
        float(a.read(ops) + n * INPUT_TYPE_BYTES[a.dtype(off)]),
        dtype_class(a.dtype(off)),
        "gemm",
        False,
    )


# --------------------------------------------------------------------------------------
# Convolution: 2 x (Cin/groups x prod(kernel)) x output elements
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _ConvPos:
    """Argument positions of one convolution schema (-1: the schema has no such argument)."""

    bias: int
    stride: int
    padding: int
    dilation: int
    transposed: int  # position of the ``transposed`` flag, -1 when fixed by the op
    output_padding: int
    groups: int
    fixed_transposed: bool = False


def _expand(v: list[int] | None, n: int) -> list[int] | None:
    if v is None:
        return None
    if len(v) == 1:
        return v * n
    return v if len(v) == n else None


def _conv_out_spatial(a: OpArgs, pos: _ConvPos, sp_in: list[int], k: list[int], tr: bool):
    """Output spatial size from stride/padding/dilation in the Concrete Inputs.

    Forward: ``floor((in + 2p - d*(k-1) - 1) / s) + 1``; transposed:
    ``(in-1)*s - 2p + d*(k-1) + output_padding + 1`` (PyTorch Conv docs). Missing stride
    or dilation is taken as 1; missing padding as "same-style" ``d*(k-1)/2``, which gives
    ``floor((in-1)/s) + 1`` (0 for transposed convolutions); a string padding ``"same"``
    keeps the input size.
    """
    n = len(sp_in)
    stride = _expand(a.arg_ints(pos.stride), n) or [1] * n
    dil = _expand(a.arg_ints(pos.dilation), n) or [1] * n
    pad_s = a.arg(pos.padding).strip("'\"").lower()
    pad = None if pad_s in ("same", "valid") else _expand(a.arg_ints(pos.padding), n)
    if pad_s == "valid":
        pad = [0] * n
    out = []
    for i in range(n):
        if tr:
            p = pad[i] if pad is not None else 0
            op = _expand(a.arg_ints(pos.output_padding), n) if pos.output_padding >= 0 else None
            out.append(
                (sp_in[i] - 1) * stride[i] - 2 * p + dil[i] * (k[i] - 1) + (op[i] if op else 0) + 1
            )
        elif pad_s == "same":
            out.append(sp_in[i])
        elif pad is None:
            out.append((sp_in[i] - 1) // stride[i] + 1)
        else:
            out.append((sp_in[i] + 2 * pad[i] - dil[i] * (k[i] - 1) - 1) // stride[i] + 1)
    _need(all(o > 0 for o in out))
    return out


def _conv_forward(a: OpArgs, pos: _ConvPos) -> OpCost:
    x, w = a.shape(0), a.shape(1)
    _need(x is not None and w is not None and len(w) >= 3)
    if len(x) == len(w) - 1:  # unbatched input [Cin, *spatial]
        x = [1, *x]
    _need(len(x) == len(w))
    tr = pos.fixed_transposed
    if pos.transposed >= 0:
        tr = bool(a.arg_bool(pos.transposed))
    groups = (a.arg_int(pos.groups) if pos.groups >= 0 else None) or 1
    n, sp_in, k = x[0], x[2:], w[2:]
    out_sp = _conv_out_spatial(a, pos, sp_in, k, tr)
    if tr:
        cout = w[1] * groups
        flops = 2 * _prod(w) * n * _prod(sp_in)
    else:
        cout = w[0]
        flops = 2 * _prod(w) * n * _prod(out_sp)
    out_numel = n * cout * _prod(out_sp)
    ops = (0, 1) if pos.bias < 0 else (0, 1, pos.bias)
    return OpCost(
        float(flops),
        float(a.read(ops) + out_numel * INPUT_TYPE_BYTES[a.dtype(0)]),
        dtype_class(a.dtype(0)),
        "conv",
        True,
    )


def _conv_model(pos: _ConvPos) -> ModelFn:
    def model(a: OpArgs) -> OpCost:
        return _conv_forward(a, pos)

    model.__doc__ = (
        "Convolution: 2 x weight elements x N x output spatial size (transposed: x input "
        "spatial size); reads input, weight, bias; writes the output."
    )
    return model


# convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
_CONV_GENERIC = _ConvPos(2, 3, 4, 5, 6, 7, 8)
register("convolution", "_convolution", composite=True)(_conv_model(_CONV_GENERIC))
# conv{1,2,3}d(input, weight, bias, stride, padding, dilation, groups)
register("conv1d", "conv2d", "conv3d", composite=True)(_conv_model(_ConvPos(2, 3, 4, 5, -1, -1, 6)))
# conv_transpose{1,2,3}d(input, weight, bias, stride, padding, output_padding, groups, dilation)
register("conv_transpose1d", "conv_transpose2d", "conv_transpose3d", composite=True)(
    _conv_model(_ConvPos(2, 3, 4, 7, -1, 5, 6, fixed_transposed=True))
)
# cudnn_convolution(self, weight, padding, stride, dilation, groups, benchmark, ...)
register("cudnn_convolution")(_conv_model(_ConvPos(-1, 3, 2, 4, -1, -1, 5)))
# cudnn_convolution_transpose(self, weight, padding, output_padding, stride, dilation, groups, ...)
register("cudnn_convolution_transpose")(
    _conv_model(_ConvPos(-1, 4, 2, 5, -1, 3, 6, fixed_transposed=True))
)
# miopen_convolution / mkldnn_convolution(self, weight, bias, padding, stride, dilation, groups)
register("miopen_convolution", "mkldnn_convolution")(_conv_model(_ConvPos(2, 4, 3, 5, -1, -1, 6)))
# _conv_depthwise2d(self, weight, kernel_size, bias, stride, padding, dilation)
register("_conv_depthwise2d")(_conv_model(_ConvPos(3, 4, 5, 6, -1, -1, -1)))


def _conv_backward(a: OpArgs, go_i: int, x_i: int, w_i: int, mask: list[bool], tr: bool) -> OpCost:
    go, x, w = a.shape(go_i), a.shape(x_i), a.shape(w_i)
    _need(go is not None and x is not None and w is not None and len(w) >= 3)
    if len(x) == len(w) - 1:
        x = [1, *x]
    if len(go) == len(w) - 1:
        go = [1, *go]
    _need(len(x) == len(w) == len(go))
    fwd = 2 * _prod(w) * x[0] * (_prod(x[2:]) if tr else _prod(go[2:]))
    flops = fwd * (int(mask[0]) + int(mask[1]))
    written = 0
    if mask[0]:
        written += a.nbytes(x_i)
    if mask[1]:
        written += a.nbytes(w_i)
    if len(mask) > 2 and mask[2]:
        flops += _prod(go)  # bias gradient: a sum over everything but the channel
        written += go[1] * INPUT_TYPE_BYTES[a.dtype(go_i)]
    return OpCost(
        float(flops),
        float(a.read((go_i, x_i, w_i)) + written),
        dtype_class(a.dtype(w_i)),
        "conv",
        True,
    )


@register("convolution_backward")
def _convolution_backward(a: OpArgs) -> OpCost:
    """``convolution_backward(grad_output, input, weight, bias_sizes, stride, padding,
    dilation, transposed, output_padding, groups, output_mask)``.

    grad_input and grad_weight each cost the forward FLOPs (2 x weight elements x N x
    output spatial size, the output size read off grad_output); grad_bias adds one FLOP per
    grad_output element. ``output_mask`` says which are computed; when not recorded,
    grad_input and grad_weight are assumed. Bytes: grad_output, input, weight read; each
    computed gradient written.
    """
    mask = a.arg_bools(10) or [True, True, False]
    mask = (mask + [False] * 3)[:3]
    return _conv_backward(a, 0, 1, 2, mask, bool(a.arg_bool(7)))


@register("cudnn_convolution_backward", "miopen_convolution_backward")
def _cudnn_convolution_backward(a: OpArgs) -> OpCost:
    """Legacy ``cudnn_convolution_backward(self, grad_output, weight, padding, stride,
    dilation, groups, benchmark, deterministic, allow_tf32, output_mask[2])``: as
    :func:`_convolution_backward` (no bias gradient)."""
    mask = a.arg_bools(10) or [True, True]
    mask = (mask + [False, False])[:2] + [False]
    return _conv_backward(a, 1, 0, 2, mask, False)


# --------------------------------------------------------------------------------------
# Attention: 4*B*H*Nq*Nkv*d forward (TraceLens; FlashAttention papers), causal halves it,
# backward = 2.5 x forward.
# --------------------------------------------------------------------------------------

BACKWARD_ATTENTION_FACTOR = 2.5
"""Backward/forward FLOP ratio of attention: the backward pass runs 5 matmuls against the
forward's 2 (dQ, dK, dV, dP and the recomputed S). Source: Dao, "FlashAttention-2" (2023),
whose benchmark script counts the backward as 2.5 x the forward FLOPs."""


@dataclass(frozen=True)
class _AttnPos:
    q: int
    k: int
    v: int
    causal: int  # position of is_causal / custom_mask_type
    layout: str  # "bhnd" (SDPA: [..., N, d]) or "bnhd" (flash/mem-eff kernels: [B, N, H, d])
    backward: bool = False
    mask_type: bool = False  # causal argument is an int custom_mask_type (0 = none)
    lse: int = -2  # -1: always writes logsumexp; >=0: position of compute_log_sumexp; -2 never


def _attention(a: OpArgs, p: _AttnPos) -> OpCost:
    q, k, v = a.shape(p.q), a.shape(p.k), a.shape(p.v)
    _need(q is not None and k is not None and v is not None)
    if p.layout == "bhnd":
        _need(len(q) >= 2 and len(k) >= 2 and len(v) >= 2)
        bh, nq, d = _prod(q[:-2]), q[-2], q[-1]
        nkv, dv = k[-2], v[-1]
    else:
        _need(len(q) == 4 and len(k) == 4 and len(v) == 4)  # varlen [total, H, d] unmodelled
        bh, nq, d = q[0] * q[2], q[1], q[3]
        nkv, dv = k[1], v[3]
    flops = 2.0 * bh * nq * nkv * (d + dv)  # = 4*B*H*Nq*Nkv*d when dv == d
    causal = bool(a.arg_int(p.causal)) if p.mask_type else bool(a.arg_bool(p.causal))
    if causal:
        flops /= 2
    qdt = a.dtype(p.q)
    if p.backward:
        flops *= BACKWARD_ATTENTION_FACTOR
        written = a.nbytes(p.q) + a.nbytes(p.k) + a.nbytes(p.v)  # dQ, dK, dV
    else:
        written = bh * nq * dv * INPUT_TYPE_BYTES[qdt]
        if p.lse == -1 or (p.lse >= 0 and a.arg_bool(p.lse)):
            written += bh * nq * 4  # logsumexp, fp32
    return OpCost(float(flops), float(a.read() + written), dtype_class(qdt), "attention", True)


def _attn_model(p: _AttnPos) -> ModelFn:
    def model(a: OpArgs) -> OpCost:
        return _attention(a, p)

    model.__doc__ = (
        "Attention: 2*B*H*Nq*Nkv*(d_qk + d_v) FLOPs (4*B*H*Nq*Nkv*d), halved when causal, "
        "x2.5 for backward; reads every tensor input, writes the output (+ logsumexp) or "
        "dQ, dK, dV."
    )
    return model


for _names, _pos, _comp in (
    # scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    (("scaled_dot_product_attention",), _AttnPos(0, 1, 2, 5, "bhnd"), True),
    (("_scaled_dot_product_attention_math",), _AttnPos(0, 1, 2, 5, "bhnd"), True),
    # _scaled_dot_product_flash_attention(q, k, v, dropout_p, is_causal, return_debug_mask)
    (
        ("_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_for_cpu"),
        _AttnPos(0, 1, 2, 4, "bhnd", lse=-1),
        False,
    ),
    # _scaled_dot_product_{efficient,cudnn}_attention(q, k, v, attn_bias, compute_log_sumexp,
    #   dropout_p, is_causal, ...)
    (
        ("_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention"),
        _AttnPos(0, 1, 2, 6, "bhnd", lse=4),
        False,
    ),
    # _flash_attention_forward(q, k, v, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal)
    (("_flash_attention_forward",), _AttnPos(0, 1, 2, 8, "bnhd", lse=-1), False),
    # _cudnn_attention_forward(q, k, v, attn_bias, cum_seq_q, cum_seq_k, max_q, max_k,
    #   compute_log_sumexp, dropout_p, is_causal, return_debug_mask)
    (("_cudnn_attention_forward",), _AttnPos(0, 1, 2, 10, "bhnd", lse=8), False),
    # _efficient_attention_forward(q, k, v, bias, cu_q, cu_k, max_q, max_k, dropout_p,
    #   custom_mask_type, compute_log_sumexp)
    (
        ("_efficient_attention_forward",),
        _AttnPos(0, 1, 2, 9, "bnhd", mask_type=True, lse=10),
        False,
    ),
    # backward ops: grad_out first, then q, k, v
    (
        ("_scaled_dot_product_flash_attention_backward",),
        _AttnPos(1, 2, 3, 11, "bhnd", backward=True),
        False,
    ),
    (
        ("_scaled_dot_product_flash_attention_for_cpu_backward",),
        _AttnPos(1, 2, 3, 7, "bhnd", backward=True),
        False,
    ),
    (
        ("_scaled_dot_product_efficient_attention_backward",),
        _AttnPos(1, 2, 3, 11, "bhnd", backward=True),
        False,
    ),
    (
        ("_scaled_dot_product_cudnn_attention_backward", "_cudnn_attention_backward"),
        _AttnPos(1, 2, 3, 14, "bhnd", backward=True),
        False,
    ),
    (("_flash_attention_backward",), _AttnPos(1, 2, 3, 11, "bnhd", backward=True), False),
    (
        ("_efficient_attention_backward",),
        _AttnPos(1, 2, 3, 14, "bnhd", backward=True, mask_type=True),
        False,
    ),
):
    register(*_names, composite=_comp)(_attn_model(_pos))


# --------------------------------------------------------------------------------------
# Softmax
# --------------------------------------------------------------------------------------

SOFTMAX_FLOPS_PER_ELEMENT = 5
"""max, subtract, exp, sum, divide: one FLOP each per element (exp counted as one)."""
SOFTMAX_BACKWARD_FLOPS_PER_ELEMENT = 4
"""``y * (g - sum(g * y))``: multiply, sum, subtract, multiply."""


def _rowwise(a: OpArgs, operands: Sequence[int], flops_per: int, out_dtype: str, family: str):
    x = a.shape(operands[0])
    _need(x is not None)
    n = _prod(x)
    return OpCost(
        float(flops_per * n),
        float(a.read(operands) + n * INPUT_TYPE_BYTES[out_dtype]),
        dtype_class(a.dtype(operands[0])),
        family,
        False,
    )


@register("_softmax", "_log_softmax")
def _softmax_(a: OpArgs) -> OpCost:
    """``_softmax(self, dim, half_to_float)``: 5 FLOPs/element; reads x, writes y (fp32 when
    half_to_float)."""
    out = "float" if a.arg_bool(2) else a.dtype(0)
    return _rowwise(a, (0,), SOFTMAX_FLOPS_PER_ELEMENT, out, "softmax")


@register("softmax", "log_softmax", composite=True)
def _softmax_composite(a: OpArgs) -> OpCost:
    """``softmax(self, dim, dtype)``: as ``_softmax``; output dtype from ``dtype`` if given."""
    return _rowwise(a, (0,), SOFTMAX_FLOPS_PER_ELEMENT, a.arg_dtype(2) or a.dtype(0), "softmax")


@register("_softmax_backward_data", "_log_softmax_backward_data")
def _softmax_backward(a: OpArgs) -> OpCost:
    """``_softmax_backward_data(grad_output, output, dim, input_dtype)``: 4 FLOPs/element;
    reads grad_output and output, writes grad_input (``input_dtype`` when recorded)."""
    out = a.arg_dtype(3) or a.dtype(0)
    return _rowwise(a, (0, 1), SOFTMAX_BACKWARD_FLOPS_PER_ELEMENT, out, "softmax")


# --------------------------------------------------------------------------------------
# Normalization
# --------------------------------------------------------------------------------------

NORM_FLOPS_PER_ELEMENT = 6
"""LayerNorm/BatchNorm with statistics: mean (1), variance (3: subtract, square, add),
normalize (2: subtract, multiply by rstd); the affine weight and bias add 1 each."""
NORM_BACKWARD_FLOPS_PER_ELEMENT = 10
"""LayerNorm/BatchNorm backward: recompute x_hat (2), grad_weight and grad_bias sums (3),
grad_input ``rstd * (w*g - mean(w*g) - x_hat * mean(w*g*x_hat))`` (5)."""
RMS_NORM_FLOPS_PER_ELEMENT = 3
"""RMSNorm: square and sum (2), multiply by rstd (1); the weight adds 1."""
RMS_NORM_BACKWARD_FLOPS_PER_ELEMENT = 8


def _acc_bytes(dtype: str) -> int:
    return 8 if dtype == "double" else 4


def _norm_rows(a: OpArgs, x_i: int, w_i: int, shape_i: int) -> tuple[int, int]:
    """(rows M, normalized size D) of a layer/RMS norm: D from the weight, the recorded
    normalized_shape, or else the last dim."""
    x = a.shape(x_i)
    _need(x is not None and len(x) >= 1)
    w = a.shape(w_i) if w_i >= 0 else None
    if w is not None and len(w) >= 1:
        d = _prod(w)
    else:
        ns = a.arg_ints(shape_i) if shape_i >= 0 else None
        d = _prod(ns) if ns else x[-1]
    n = _prod(x)
    _need(d > 0 and n % d == 0)
    return n // d, d


@register("native_layer_norm")
def _native_layer_norm(a: OpArgs) -> OpCost:
    """``native_layer_norm(input, normalized_shape, weight?, bias?, eps)``.

    FLOPs: (6 + weight + bias) per element (:data:`NORM_FLOPS_PER_ELEMENT`). Bytes: input,
    weight, bias read; output, mean[M] and rstd[M] (fp32; fp64 for double) written.
    """
    m, _ = _norm_rows(a, 0, 2, 1)
    n = a.numel(0)
    per = NORM_FLOPS_PER_ELEMENT + int(a.is_tensor(2)) + int(a.is_tensor(3))
    out = a.nbytes(0) + 2 * m * _acc_bytes(a.dtype(0))
    return OpCost(
        float(per * n), float(a.read((0, 2, 3)) + out), dtype_class(a.dtype(0)), "norm", False
    )


@register("layer_norm", composite=True)
def _layer_norm(a: OpArgs) -> OpCost:
    """``layer_norm(input, normalized_shape, weight?, bias?, eps, cudnn_enable)``: as
    ``native_layer_norm`` without the saved statistics."""
    _norm_rows(a, 0, 2, 1)
    per = NORM_FLOPS_PER_ELEMENT + int(a.is_tensor(2)) + int(a.is_tensor(3))
    return OpCost(
        float(per * a.numel(0)),
        float(a.read((0, 2, 3)) + a.nbytes(0)),
        dtype_class(a.dtype(0)),
        "norm",
        False,
    )


@register("native_layer_norm_backward")
def _native_layer_norm_backward(a: OpArgs) -> OpCost:
    """``native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight?,
    bias?, output_mask)``: 10 FLOPs/element; reads grad_out, input, mean, rstd, weight, bias;
    writes grad_input, grad_weight, grad_bias per ``output_mask`` (all when not recorded)."""
    _norm_rows(a, 1, 5, 2)
    mask = (a.arg_bools(7) or [True, True, True]) + [False] * 3
    w_bytes = a.nbytes(5) if a.is_tensor(5) else 0
    written = (a.nbytes(1) if mask[0] else 0) + (w_bytes if mask[1] else 0)
    written += w_bytes if mask[2] and a.is_tensor(5) else 0
    return OpCost(
        float(NORM_BACKWARD_FLOPS_PER_ELEMENT * a.numel(1)),
        float(a.read((0, 1, 3, 4, 5, 6)) + written),
        dtype_class(a.dtype(1)),
        "norm",
        False,
    )


def _rms(a: OpArgs, fused: bool) -> OpCost:
    m, _ = _norm_rows(a, 0, 2, 1)
    n = a.numel(0)
    per = RMS_NORM_FLOPS_PER_ELEMENT + int(a.is_tensor(2))
    out = a.nbytes(0) + (m * _acc_bytes(a.dtype(0)) if fused else 0)
    return OpCost(
        float(per * n), float(a.read((0, 2)) + out), dtype_class(a.dtype(0)), "norm", False
    )


@register("rms_norm", composite=True)
def _rms_norm(a: OpArgs) -> OpCost:
    """``rms_norm(input, normalized_shape, weight?, eps)``: (3 + weight) FLOPs/element;
    reads input and weight, writes the output. Composite (``_fused_rms_norm`` on CUDA in
    recent PyTorch, a chain of pow/mean/rsqrt/mul kernels in older ones)."""
    return _rms(a, fused=False)


@register("_fused_rms_norm")
def _fused_rms_norm(a: OpArgs) -> OpCost:
    """``_fused_rms_norm(input, normalized_shape, weight?, eps) -> (output, rstd)``: as
    ``rms_norm`` plus rstd[M] (fp32) written."""
    return _rms(a, fused=True)


@register("_fused_rms_norm_backward")
def _fused_rms_norm_backward(a: OpArgs) -> OpCost:
    """``_fused_rms_norm_backward(grad_out, input, normalized_shape, rstd, weight?,
    output_mask)``: 8 FLOPs/element; writes grad_input and grad_weight per ``output_mask``."""
    _norm_rows(a, 1, 4, 2)
    mask = (a.arg_bools(5) or [True, True]) + [False, False]
    written = (a.nbytes(1) if mask[0] else 0) + (a.nbytes(4) if mask[1] else 0)
    return OpCost(
        float(RMS_NORM_BACKWARD_FLOPS_PER_ELEMENT * a.numel(1)),
        float(a.read((0, 1, 3, 4)) + written),
        dtype_class(a.dtype(1)),
        "norm",
        False,
    )


@register("_C::rms_norm")
def _vllm_rms_norm(a: OpArgs) -> OpCost:
    """vLLM ``_C::rms_norm(out, input, weight, epsilon)``: (3 + 1) FLOPs/element; reads input
    and weight, writes out."""
    x, w = a.shape(1), a.shape(2)
    _need(x is not None and w is not None and len(x) >= 1)
    n = _prod(x)
    return OpCost(
        float((RMS_NORM_FLOPS_PER_ELEMENT + 1) * n),
        float(a.read((1, 2)) + a.nbytes(1)),
        dtype_class(a.dtype(1)),
        "norm",
        False,
    )


@register("_C::fused_add_rms_norm")
def _vllm_fused_add_rms_norm(a: OpArgs) -> OpCost:
    """vLLM ``_C::fused_add_rms_norm(input, residual, weight, epsilon)``, in place:
    residual += input, input = rms_norm(residual) * weight. (1 + 3 + 1) FLOPs/element;
    reads input, residual, weight; writes input and residual."""
    x, r = a.shape(0), a.shape(1)
    _need(x is not None and r is not None and _prod(x) == _prod(r))
    n = _prod(x)
    return OpCost(
        float((RMS_NORM_FLOPS_PER_ELEMENT + 2) * n),
        float(a.read((0, 1, 2)) + a.nbytes(0) + a.nbytes(1)),
        dtype_class(a.dtype(0)),
        "norm",
        False,
    )


@register("native_group_norm")
def _native_group_norm(a: OpArgs) -> OpCost:
    """``native_group_norm(input, weight?, bias?, N, C, HxW, group, eps)``: as LayerNorm;
    writes output plus mean and rstd [N*group] (N*group from ``group`` when recorded)."""
    x = a.shape(0)
    _need(x is not None and len(x) >= 2)
    groups = a.arg_int(6) or 1
    per = NORM_FLOPS_PER_ELEMENT + int(a.is_tensor(1)) + int(a.is_tensor(2))
    out = a.nbytes(0) + 2 * x[0] * groups * _acc_bytes(a.dtype(0))
    return OpCost(
        float(per * a.numel(0)),
        float(a.read((0, 1, 2)) + out),
        dtype_class(a.dtype(0)),
        "norm",
        False,
    )


@register("native_group_norm_backward")
def _native_group_norm_backward(a: OpArgs) -> OpCost:
    """``native_group_norm_backward(grad_out, input, mean, rstd, weight?, N, C, HxW, group,
    output_mask)``: 10 FLOPs/element; writes grad_input, grad_weight, grad_bias."""
    x = a.shape(1)
    _need(x is not None and len(x) >= 2)
    mask = (a.arg_bools(9) or [True, True, True]) + [False] * 3
    c_bytes = x[1] * INPUT_TYPE_BYTES[a.dtype(1)]
    written = (a.nbytes(1) if mask[0] else 0) + (c_bytes if mask[1] else 0)
    written += c_bytes if mask[2] else 0
    return OpCost(
        float(NORM_BACKWARD_FLOPS_PER_ELEMENT * a.numel(1)),
        float(a.read((0, 1, 2, 3, 4)) + written),
        dtype_class(a.dtype(1)),
        "norm",
        False,
    )


def _batch_norm(a: OpArgs, training: bool | None, operands: Sequence[int]) -> OpCost:
    x = a.shape(0)
    _need(x is not None and len(x) >= 2)
    c = x[1]
    train = True if training is None else training
    per = NORM_FLOPS_PER_ELEMENT + int(a.is_tensor(1)) + int(a.is_tensor(2))
    if not train:
        per -= 4  # no statistics: subtract the running mean, multiply by the running rstd
    out = a.nbytes(0)
    if train:
        out += 2 * c * _acc_bytes(a.dtype(0))  # save_mean, save_invstd
    return OpCost(
        float(per * a.numel(0)),
        float(a.read(operands) + out),
        dtype_class(a.dtype(0)),
        "norm",
        False,
    )


_BN_DOC = (
    "BatchNorm forward: (6 + weight + bias) FLOPs/element in training, (2 + weight + bias) in "
    "eval; reads input, weight, bias, running stats; writes output (+ save_mean and "
    "save_invstd [C] in training). Training is assumed when the flag is not recorded."
)


def _bn_model(training_pos: int | None, fixed: bool | None = None, composite: bool = False):
    def model(a: OpArgs) -> OpCost:
        t = fixed if training_pos is None else a.arg_bool(training_pos)
        return _batch_norm(a, t, (0, 1, 2, 3, 4))

    model.__doc__ = _BN_DOC
    return model


# native_batch_norm / cudnn_batch_norm / miopen_batch_norm / _batch_norm_impl_index /
# batch_norm / _native_batch_norm_legit(input, weight, bias, running_mean, running_var,
#   training, momentum, eps, ...)
register("native_batch_norm", "cudnn_batch_norm", "miopen_batch_norm", "_native_batch_norm_legit")(
    _bn_model(5)
)
register("_batch_norm_impl_index", "batch_norm", composite=True)(_bn_model(5))
# _batch_norm_with_update(input, weight, bias, running_mean, running_var, momentum, eps)
register("_batch_norm_with_update")(_bn_model(None, True))
register("_batch_norm_no_update", "_native_batch_norm_legit_no_training")(_bn_model(None, False))


def _bn_backward(a: OpArgs, go_i: int, x_i: int, w_i: int, reads: Sequence[int], mask) -> OpCost:
    x = a.shape(x_i)
    _need(x is not None and len(x) >= 2 and a.is_tensor(go_i))
    c_bytes = x[1] * INPUT_TYPE_BYTES[a.dtype(w_i) if a.is_tensor(w_i) else a.dtype(x_i)]
    written = (a.nbytes(x_i) if mask[0] else 0) + (c_bytes if mask[1] else 0)
    written += c_bytes if mask[2] else 0
    return OpCost(
        float(NORM_BACKWARD_FLOPS_PER_ELEMENT * a.numel(x_i)),
        float(a.read(reads) + written),
        dtype_class(a.dtype(x_i)),
        "norm",
        False,
    )


@register("native_batch_norm_backward")
def _native_batch_norm_backward(a: OpArgs) -> OpCost:
    """``native_batch_norm_backward(grad_out, input, weight, running_mean, running_var,
    save_mean, save_invstd, train, eps, output_mask)``: 10 FLOPs/element; writes
    grad_input, grad_weight, grad_bias per ``output_mask`` (all when not recorded)."""
    mask = (a.arg_bools(9) or [True, True, True]) + [False] * 3
    return _bn_backward(a, 0, 1, 2, range(7), mask)


@register("batch_norm_backward")
def _batch_norm_backward(a: OpArgs) -> OpCost:
    """``batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean,
    save_var, update, eps, output_mask, reserve)``: as ``native_batch_norm_backward``."""
    mask = (a.arg_bools(9) or [True, True, True]) + [False] * 3
    return _bn_backward(a, 0, 1, 2, (*range(7), 10), mask)


@register("cudnn_batch_norm_backward", "miopen_batch_norm_backward")
def _cudnn_batch_norm_backward(a: OpArgs) -> OpCost:
    """``cudnn_batch_norm_backward(input, grad_output, weight, running_mean, running_var,
    save_mean, save_var, epsilon, reserveSpace)``: writes all three gradients."""
    return _bn_backward(a, 1, 0, 2, (*range(7), 8), [True, True, True])


# --------------------------------------------------------------------------------------
# Elementwise
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Elementwise:
    arity: int  # leading positions that may hold tensor operands
    flops: int  # per output element
    out: str = "same"  # "same": promoted operand dtype; "bool"; "first": operand 0's dtype


_EW: dict[str, _Elementwise] = {}


def _ew(names: str, arity: int, flops: int, out: str = "same") -> None:
    for n in names.split():
        _EW[n] = _Elementwise(arity, flops, out)


# unary
_ew("abs neg relu sign sgn floor ceil round trunc frac square exp exp2 expm1 log log2 log10", 1, 1)
_ew("log1p sqrt rsqrt reciprocal sin cos tan asin acos atan sinh cosh tanh erf erfc erfinv", 1, 1)
_ew("bitwise_not", 1, 1)
_ew("threshold relu6", 1, 2)
_ew("hardtanh leaky_relu nan_to_num", 1, 2)
_ew("sigmoid elu softplus log_sigmoid", 1, 4)
_ew("hardsigmoid", 1, 4)
_ew("silu hardswish", 1, 5)
_ew("gelu", 1, 8)  # 0.5*x*(1+erf(x/sqrt2)); the tanh form is ~9
_ew("mish", 1, 7)
_ew("logical_not isnan isinf isfinite isneginf isposinf signbit", 1, 1, "bool")
# binary
_ew("add sub mul div true_divide floor_divide rsub pow maximum minimum fmax fmin fmod", 2, 1)
_ew("remainder atan2 copysign bitwise_and bitwise_or bitwise_xor bitwise_left_shift", 2, 1)
_ew("bitwise_right_shift clamp_min clamp_max xlogy hypot", 2, 1)
_ew("eq ne lt le gt ge logical_and logical_or logical_xor", 2, 1, "bool")
_ew("masked_fill", 2, 1, "first")
_ew("native_dropout_backward", 2, 1, "first")
# ternary
_ew("clamp clip", 3, 2)
_ew("where", 3, 1)
_ew("addcmul addcdiv lerp", 3, 3)
# backward of activations: (grad_output, saved) -> grad_input
_ew("threshold_backward hardtanh_backward leaky_relu_backward", 2, 1, "first")
_ew("sigmoid_backward tanh_backward logit_backward", 2, 3, "first")
_ew("silu_backward hardswish_backward hardsigmoid_backward softplus_backward", 2, 6, "first")
_ew("gelu_backward", 2, 10, "first")


def _promoted(a: OpArgs, tensors: list[int]) -> str:
    """The output dtype of a promoting elementwise op: the widest non-bool operand among
    those that are not 0-dim (0-dim tensors do not promote a dimensioned one)."""
    pool = [i for i in tensors if a.dtype(i) != "bool"] or tensors
    dimmed = [i for i in pool if a.shape(i)] or pool
    return max((a.dtype(i) for i in dimmed), key=lambda d: INPUT_TYPE_BYTES[d])


def _elementwise(a: OpArgs, spec: _Elementwise, inplace: bool) -> OpCost:
    tensors = [i for i in range(min(spec.arity, len(a.shapes))) if a.is_tensor(i)]
    _need(bool(tensors))
    if inplace:
        _need(0 in tensors)
        out_shape = a.shape(0)
        out_dtype = a.dtype(0)
    else:
        out_shape = _broadcast([a.shape(i) for i in tensors])
        if spec.out == "bool":
            out_dtype = "bool"
        elif spec.out == "first":
            out_dtype = a.dtype(tensors[0])
        else:
            out_dtype = _promoted(a, tensors)
    n = _prod(out_shape)
    math_dtype = _promoted(a, tensors) if out_dtype == "bool" else out_dtype
    return OpCost(
        float(spec.flops * n),
        float(a.read(tensors) + n * INPUT_TYPE_BYTES[out_dtype]),
        dtype_class(math_dtype),
        "elementwise",
        False,
    )


def _ew_model(spec: _Elementwise, inplace: bool) -> ModelFn:
    def model(a: OpArgs) -> OpCost:
        return _elementwise(a, spec, inplace)

    model.__doc__ = (
        f"Elementwise ({spec.flops} FLOP/element): output numel = broadcast of the tensor "
        "operands (in-place: the first operand); reads each tensor operand once, writes "
        "the output once."
    )
    return model


for _name, _spec in _EW.items():
    register(_name)(_ew_model(_spec, inplace=False))
    register(_name + "_")(_ew_model(_spec, inplace=True))


@register("max", "min")
def _max_min(a: OpArgs) -> OpCost:
    """``max(self)`` / ``max(self, dim, keepdim)`` reduce; ``max(self, other)`` is the
    elementwise maximum."""
    if a.is_tensor(1):
        return _elementwise(a, _Elementwise(2, 1), inplace=False)
    return _reduction(a, _Reduction(1, 1, "values+indices" if len(a.shapes) >= 3 else "same"))


@register("fill_", "zero_", "normal_", "uniform_", "bernoulli_", "random_", "exponential_")
def _fill(a: OpArgs) -> OpCost:
    """``fill_(self, value)`` / ``zero_(self)`` and the in-place random fills (``normal_``,
    ``uniform_``, ...): write self once, read only tensor arguments other than self; counted
    as 0 FLOPs (random-number generation is integer work)."""
    _need(a.is_tensor(0))
    return OpCost(
        0.0,
        float(a.nbytes(0) + a.read(range(1, len(a.shapes)))),
        dtype_class(a.dtype(0)),
        "elementwise",
        False,
    )


@register("native_dropout")
def _native_dropout(a: OpArgs) -> OpCost:
    """``native_dropout(input, p, train)``: 3 FLOPs/element (random draw, compare, scale);
    reads input, writes output and a bool mask."""
    _need(a.is_tensor(0))
    n = a.numel(0)
    return OpCost(
        float(3 * n), float(2 * a.nbytes(0) + n), dtype_class(a.dtype(0)), "elementwise", False
    )


# --------------------------------------------------------------------------------------
# Reductions
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Reduction:
    flops: int  # per input element
    dim: int  # position of the dim argument (-1: none)
    out: str = "same"  # same | int64 | bool | values+indices | scan | int_promote | two


_RED: dict[str, _Reduction] = {
    "sum": _Reduction(1, 1, "int_promote"),
    "nansum": _Reduction(1, 1),
    "mean": _Reduction(1, 1),
    "nanmean": _Reduction(1, 1),
    "prod": _Reduction(1, 1, "int_promote"),
    "amax": _Reduction(1, 1),
    "amin": _Reduction(1, 1),
    "aminmax": _Reduction(1, 1, "two"),
    "argmax": _Reduction(1, 1, "int64"),
    "argmin": _Reduction(1, 1, "int64"),
    "any": _Reduction(1, 1, "bool"),
    "all": _Reduction(1, 1, "bool"),
    "norm": _Reduction(2, 2),
    "linalg_vector_norm": _Reduction(2, 2),
    "var": _Reduction(3, 1),
    "std": _Reduction(3, 1),
    "var_mean": _Reduction(3, 1, "two"),
    "std_mean": _Reduction(3, 1, "two"),
    "logsumexp": _Reduction(4, 1),
    "cumsum": _Reduction(1, 1, "scan"),
    "cumprod": _Reduction(1, 1, "scan"),
}


def _reduction(a: OpArgs, spec: _Reduction) -> OpCost:
    x = a.shape(0)
    _need(x is not None)
    n = _prod(x)
    dt = a.dtype(0)
    if spec.out == "scan":
        out_n = n
    else:
        # the dim is only there in the overloads that also take keepdim after it
        # (``sum(self, dtype)`` has no dim; ``sum(self, dim, keepdim, dtype)`` has)
        has_dim = spec.dim >= 0 and len(a.shapes) >= spec.dim + 2
        dims = a.arg_ints(spec.dim) if has_dim else None
        if dims:
            keep = [d for j, d in enumerate(x) if j not in {k % len(x) for k in dims}] if x else []
            out_n = _prod(keep)
        else:
            out_n = 1  # full reduction, or dims not recorded (output counted as 1 element)
    out_bytes = {
        "same": out_n * INPUT_TYPE_BYTES[dt],
        "int64": out_n * 8,
        "bool": out_n,
        "values+indices": out_n * (INPUT_TYPE_BYTES[dt] + 8),
        "two": 2 * out_n * INPUT_TYPE_BYTES[dt],
        "scan": out_n * INPUT_TYPE_BYTES[dt],
        "int_promote": out_n * (8 if dtype_class(dt) == "int" else INPUT_TYPE_BYTES[dt]),
    }[spec.out]
    return OpCost(
        float(spec.flops * n), float(a.nbytes(0) + out_bytes), dtype_class(dt), "reduction", False
    )


def _red_model(spec: _Reduction) -> ModelFn:
    def model(a: OpArgs) -> OpCost:
        return _reduction(a, spec)

    model.__doc__ = (
        f"Reduction ({spec.flops} FLOP/input element): reads the input once, writes the "
        "reduced output (its size from the recorded dims; 1 element when they are not "
        "recorded)."
    )
    return model


for _name, _rspec in _RED.items():
    register(_name)(_red_model(_rspec))


# --------------------------------------------------------------------------------------
# Embedding and gathers
# --------------------------------------------------------------------------------------


@register("embedding")
def _embedding(a: OpArgs) -> OpCost:
    """``embedding(weight[V,D], indices[...], padding_idx, scale_grad_by_freq, sparse)``.

    0 FLOPs. Bytes: the indices, the gathered rows (numel(indices) x D, not the whole
    table) and the output of the same size.
    """
    w, idx = a.shape(0), a.shape(1)
    _need(w is not None and idx is not None and len(w) == 2)
    rows = _prod(idx) * w[1] * INPUT_TYPE_BYTES[a.dtype(0)]
    return OpCost(0.0, float(a.nbytes(1) + 2 * rows), dtype_class(a.dtype(0)), "embedding", False)


@register("embedding_dense_backward")
def _embedding_dense_backward(a: OpArgs) -> OpCost:
    """``embedding_dense_backward(grad_output[...,D], indices, num_weights, padding_idx,
    scale_grad_by_freq)``: one add per grad_output element; reads grad_output and indices,
    writes grad_weight [num_weights, D] (when ``num_weights`` is recorded; else the
    numel(grad_output) accumulations)."""
    g, idx = a.shape(0), a.shape(1)
    _need(g is not None and idx is not None and len(g) >= 1)
    nw = a.arg_int(2)
    size = INPUT_TYPE_BYTES[a.dtype(0)]
    written = nw * g[-1] * size if nw else _prod(g) * size
    return OpCost(
        float(_prod(g)),
        float(a.read((0, 1)) + written),
        dtype_class(a.dtype(0)),
        "embedding",
        False,
    )


@register("index_select")
def _index_select(a: OpArgs) -> OpCost:
    """``index_select(self, dim, index)``: reads the index and the selected slices, writes
    them: output numel = numel(self) / self[dim] x numel(index) (dim 0 when not recorded)."""
    x, idx = a.shape(0), a.shape(2)
    dim = a.arg_int(1)
    if dim is None:
        dim = 0  # not recorded: the only choice for 1-D inputs, the usual one otherwise
    _need(x is not None and idx is not None and len(x) >= 1)
    out_n = _prod(x) // max(x[dim % len(x)], 1) * _prod(idx)
    return OpCost(
        0.0,
        float(a.nbytes(2) + 2 * out_n * INPUT_TYPE_BYTES[a.dtype(0)]),
        dtype_class(a.dtype(0)),
        "gather",
        False,
    )


@register("gather")
def _gather(a: OpArgs) -> OpCost:
    """``gather(self, dim, index)``: output has index's shape; reads index and the gathered
    elements, writes the output."""
    x, idx = a.shape(0), a.shape(2)
    _need(x is not None and idx is not None)
    out_n = _prod(idx)
    return OpCost(
        0.0,
        float(a.nbytes(2) + 2 * out_n * INPUT_TYPE_BYTES[a.dtype(0)]),
        dtype_class(a.dtype(0)),
        "gather",
        False,
    )


# --------------------------------------------------------------------------------------
# Copies and casts
# --------------------------------------------------------------------------------------


def _copy(a: OpArgs, src: int, out_numel: int, out_dtype: str) -> OpCost:
    return OpCost(
        0.0,
        float(a.nbytes(src) + out_numel * INPUT_TYPE_BYTES[out_dtype]),
        dtype_class(out_dtype),
        "copy",
        False,
    )


@register("copy_")
def _copy_(a: OpArgs) -> OpCost:
    """``copy_(self, src, non_blocking)``: reads src, writes self (self's numel and dtype)."""
    _need(a.is_tensor(0) and a.is_tensor(1))
    return _copy(a, 1, a.numel(0), a.dtype(0))


@register("_copy_from")
def _copy_from(a: OpArgs) -> OpCost:
    """``_copy_from(self, dst, non_blocking)``: reads self, writes dst."""
    _need(a.is_tensor(0) and a.is_tensor(1))
    return _copy(a, 0, a.numel(1), a.dtype(1))


@register("_to_copy")
def _to_copy(a: OpArgs) -> OpCost:
    """``_to_copy(self, dtype, layout, device, pin_memory, non_blocking, memory_format)``:
    reads self, writes a copy in ``dtype`` (self's dtype when not recorded)."""
    _need(a.is_tensor(0))
    return _copy(a, 0, a.numel(0), a.arg_dtype(1) or a.dtype(0))


@register("to", "contiguous", "clone", composite=True)
def _to(a: OpArgs) -> OpCost:
    """``to`` / ``contiguous`` / ``clone``: as ``_to_copy`` (they dispatch to it or to
    ``copy_``; ``to`` and ``contiguous`` launch nothing when no copy is needed)."""
    _need(a.is_tensor(0))
    out = a.arg_dtype(1) if a.name.endswith("::to") else None
    return _copy(a, 0, a.numel(0), out or a.dtype(0))


# --------------------------------------------------------------------------------------
# Polars entry point
# --------------------------------------------------------------------------------------

_KEYS = ["name", "input_shapes", "input_dtypes", "concrete_inputs"]
_OUT_SCHEMA = {
    "flops": pl.Float64,
    "bytes": pl.Float64,
    "compute_dtype": pl.Utf8,
    "family": pl.Utf8,
    "tensor_core": pl.Boolean,
}


def add_op_costs(ops: pl.DataFrame, *, distinct: bool = False) -> pl.DataFrame:
    """Add the modelled cost of each op call to an ops table.

    Input columns: ``name`` (Utf8), ``input_shapes`` (List(List(Int64))), ``input_dtypes``
    (List(Utf8)), ``concrete_inputs`` (List(Utf8)); any may be null (shapes not recorded).
    A missing ``concrete_inputs`` column counts as all-null.

    Returns the same rows in the same order with ``flops`` (Float64, FLOPs), ``bytes``
    (Float64, bytes), ``compute_dtype`` (Utf8), ``family`` (Utf8) and ``tensor_core``
    (Boolean) added (replacing columns of those names); all five are null for ops without a
    model. The Python model runs once per distinct (name, shapes, dtypes, concrete inputs),
    not once per row; ``distinct=True`` says that no two rows share those (the model then runs
    once per row, with no join on the nested key columns).
    """
    replaced = [c for c in _OUT_SCHEMA if c in ops.columns]
    df = ops.drop(replaced) if replaced else ops
    if "concrete_inputs" not in df.columns:
        df = df.with_columns(pl.lit(None, dtype=pl.List(pl.Utf8)).alias("concrete_inputs"))
        drop_concrete = True
    else:
        drop_concrete = False
    if distinct:
        out = _costs_per_row(df)
        return out.drop("concrete_inputs") if drop_concrete else out
    keys = df.select(_KEYS).unique(maintain_order=True)
    modelled = keys.filter(
        pl.col("name").is_in(list(OP_MODELS)) & pl.col("input_shapes").is_not_null()
    )
    costs = modelled.with_columns(_cost_columns(modelled.iter_rows()))
    out = df.join(costs, on=_KEYS, how="left", nulls_equal=True, maintain_order="left")
    if drop_concrete:
        out = out.drop("concrete_inputs")
    return out


def _costs_per_row(df: pl.DataFrame) -> pl.DataFrame:
    """``df`` with the five cost columns of :func:`add_op_costs`, one model call per row."""
    return pl.DataFrame([*df.get_columns(), *_cost_columns(df.select(_KEYS).iter_rows())])


def _cost_columns(keys) -> list[pl.Series]:
    """The five cost columns (:data:`_OUT_SCHEMA`) of the (name, shapes, dtypes, concrete
    inputs) rows ``keys``: one :func:`op_cost` call each."""
    return [
        pl.Series(c, v, dtype=t)
        for (c, t), v in zip(_OUT_SCHEMA.items(), cost_lists(keys).values(), strict=True)
    ]


def cost_lists(keys) -> dict[str, list]:
    """The five cost columns of :func:`add_op_costs` (:data:`_OUT_SCHEMA`'s names) as Python
    lists (None: no model), one :func:`op_cost` call per (name, shapes, dtypes, concrete
    inputs) row of ``keys``."""
    flops, nbytes, dtype, family, tc = [], [], [], [], []
    for name, shapes, dtypes, concrete in keys:
        c = op_cost(name, shapes, dtypes, concrete) if name in OP_MODELS else None
        if c is None:
            flops.append(None)
            nbytes.append(None)
            dtype.append(None)
            family.append(None)
            tc.append(None)
        else:
            flops.append(c.flops)
            nbytes.append(c.bytes)
            dtype.append(c.compute_dtype)
            family.append(c.family)
            tc.append(c.tensor_core)
    return {
        "flops": flops,
        "bytes": nbytes,
        "compute_dtype": dtype,
        "family": family,
        "tensor_core": tc,
    }
