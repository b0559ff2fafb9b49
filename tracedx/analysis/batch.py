"""What a k-times larger batch does to the step: GPU time by kernel kind, and memory headroom.

The larger-batch estimate (:func:`tracedx.analysis.findings.larger_batch`) needs two things the
step model does not hold: how the GPU time grows with the batch, and whether the batch fits.

GPU time at batch kB (us per step), kernel by kernel, each kernel's duration ``t``:

- **Fixed** (``t``): kernels launched inside the optimizer (``Optimizer.step#...`` and
  ``Optimizer.zero_grad#...`` annotations: their work is the size of the weights) and kernels of
  ops whose every tensor input is weight-shaped (autocast's casts of the weights, weight
  updates), a weight shape being the weight operand of ``aten::linear``, ``aten::addmm``,
  ``aten::embedding`` or ``aten::convolution`` in the same steps (or its transpose).
- **Under-filled** kernels (a grid of ``b`` blocks smaller than the device's ``S``
  multiprocessors: one partial wave) grow only once k times the blocks fill a wave: the work
  factor is ``f = k`` for ``b >= S`` and ``max(1, k * b / S)`` below (kernels without a grid
  in the trace count as filled).
- **GEMMs and convolutions** by their roofline position (the op table's ``regime``):
  compute-bound ones take ``t * f``; a bandwidth-bound one (decode's batch-1 matmuls) moves
  its weights once whatever the batch: ``t * (w + f * (1 - w))``, ``w`` the share of its input
  bytes that are weight-shaped.
- **Everything else** (elementwise, reductions, copies, attention) scales with its bytes, less
  a fixed launch floor: ``c + f * (t - c)``, ``c = min(t, KERNEL_FLOOR_US[kind])``; a kernel at
  its floor (launch-bound) barely grows.

Memory (from ``[memory]`` events, ``tracedx capture --profile-memory``): per step, the peak of
the caching allocator's allocated and reserved bytes, and the allocated bytes that persist
across steps (the least allocated at any instant of the step: weights, gradients kept between
steps, optimizer state, inputs). What the step allocates above that is taken to grow with the
batch (activations and temporaries; weight-sized temporaries such as autocast's weight copies
are counted in it, so the headroom is on the safe side). The largest k that fits:
``k_max = floor((capacity - persistent) / (peak - persistent))``, capacity the device's total
memory (``deviceProperties.totalGlobalMem``) times ``USABLE_MEMORY_SHARE``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import polars as pl

from tracedx.analysis.intervals import inside, union
from tracedx.analysis.kernels import kernel_name_kinds
from tracedx.analysis.ops import (
    op_arrays,
    op_column_of,
    op_signatures,
    ops_in_steps,
    signature_of,
)
from tracedx.analysis.timeline import optimizer_windows
from tracedx.trace import Trace

# Duration of a kernel with almost no work, by kind (us): in item_loop-sync.json.gz a
# 1024-element vectorized elementwise kernel runs 0.86 us, a 1024-element reduction 1.79 us.
KERNEL_FLOOR_US = {"elementwise": 0.9, "copy": 0.9}
KERNEL_FLOOR_DEFAULT_US = 1.8
# Share of the device's memory a program can allocate (the CUDA context and the allocator's
# fragmentation take the rest; PyTorch docs, "CUDA semantics: memory management").
USABLE_MEMORY_SHARE = 0.9

_WEIGHT_OPERAND = {"aten::linear": 1, "aten::addmm": 2, "aten::embedding": 0}
_WEIGHT_OPS = (*_WEIGHT_OPERAND, "aten::convolution", "aten::conv2d", "aten::conv1d")


def _shape_key(shape) -> tuple | None:
    return tuple(shape) if shape else None


def _group_key(name: str | None, shapes, dtypes) -> tuple:
    """(name, input shapes, input dtypes) of an op group as a hashable key, lists as tuples
    (1.4 us a row, against 3.2 us for ``str`` of the nested lists)."""
    return (
        name,
        None if shapes is None else tuple(None if x is None else tuple(x) for x in shapes),
        None if dtypes is None else tuple(dtypes),
    )


def weight_shapes(ops: pl.DataFrame) -> set[tuple]:
    """Shapes of weight operands in ``ops`` (and their transposes), as tuples."""
    out: set[tuple] = set()
    names = ops["name"].to_list()
    shapes = ops["input_shapes"].to_list()
    for name, sh in zip(names, shapes, strict=True):
        if not sh:
            continue
        i = _WEIGHT_OPERAND.get(name)
        if i is None and name in ("aten::convolution", "aten::conv2d", "aten::conv1d"):
            i = 1
        if i is None or i >= len(sh) or not sh[i] or len(sh[i]) < 2:
            continue
        s = tuple(sh[i])
        out.add(s)
        if len(s) == 2:
            out.add((s[1], s[0]))
    return out


@dataclass(frozen=True)
class BatchModel:
    """How the primary device's GPU time grows with the batch (totals over the analysed steps).

    ``kernel_us``: device time of the kernels, memcpys excluded; ``fixed_us`` of it does not
    grow; ``gemm`` rows: (t, blocks / SMs, w) per GEMM/convolution kernel, w the weight byte
    share of a bandwidth-bound one (0 for compute-bound); ``scaled`` rows: (t, c, blocks /
    SMs) per other kernel (blocks / SMs is inf when unknown).
    """

    kernel_us: float
    fixed_us: float
    gemm: np.ndarray  # shape (n, 3)
    scaled: np.ndarray  # shape (n, 3)

    @staticmethod
    def _work(k: float, fill: np.ndarray) -> np.ndarray:
        return np.where(fill >= 1.0, k, np.maximum(1.0, k * fill))

    def kernel_us_at(self, k: float) -> float:
        """Kernel device time at k times the batch (us, same steps), by the module's rules."""
        g = 0.0
        if len(self.gemm):
            t, fill, w = (self.gemm[:, i] for i in range(3))
            f = self._work(k, fill)
            g = float((t * (w + f * (1.0 - w))).sum())
        s = 0.0
        if len(self.scaled):
            ts, c, fill = (self.scaled[:, i] for i in range(3))
            s = float((c + self._work(k, fill) * (ts - c)).sum())
        return self.fixed_us + g + s

    def growth(self, k: float) -> float:
        """Kernel time at k x batch over kernel time now (1 when there are no kernels)."""
        return self.kernel_us_at(k) / self.kernel_us if self.kernel_us > 0 else 1.0

    @property
    def fixed_share(self) -> float:
        return self.fixed_us / self.kernel_us if self.kernel_us > 0 else 0.0


def batch_model(
    trace: Trace, steps: list[int], device: int, ops_tbl: pl.DataFrame | None
) -> BatchModel:
    """The :class:`BatchModel` of ``device`` over ``steps`` (see the module docstring)."""
    names = kernel_name_kinds(trace)
    k = (
        trace.kernels.lazy()
        .filter(pl.col("step").is_in(steps) & (pl.col("device") == device))
        .select(
            "op_id",
            "duration_us",
            "launch_start_us",
            kk=pl.col("name").replace_strict(names["name"], names["kind"]),
            blocks=pl.col("grid_x").cast(pl.Float64)
            * pl.col("grid_y").fill_null(1)
            * pl.col("grid_z").fill_null(1),
        )
        .collect()
    )  # (lazy: the filter reads only the columns selected)
    if k.height == 0:
        return BatchModel(0.0, 0.0, np.empty((0, 3)), np.empty((0, 3)))
    props = trace.metadata.get("device_properties") or []
    sms = next(
        (
            float(p["numSms"])
            for p in props
            if isinstance(p, dict) and p.get("id", 0) == device and p.get("numSms")
        ),
        None,
    )
    # launched inside the optimizer (host time of the launch inside its annotation)
    ann = optimizer_windows(trace)
    a_s, a_e = union(ann["start_us"].to_numpy(), ann["end_us"].to_numpy())
    in_opt = inside(a_s, a_e, k["launch_start_us"].cast(pl.Float64).to_numpy())
    # the weight operands' shapes, from the ops of the steps that take weights (the whole op
    # table's shapes are slow to filter and to turn into lists)
    takes_weights = pl.lit(pl.Series(ops_in_steps(trace, steps))) & pl.col("name").is_in(
        list(_WEIGHT_OPS)
    )
    wshapes = weight_shapes(
        trace.ops[["name", "input_shapes"]].filter(takes_weights).unique(maintain_order=True)
    )
    # roofline position per op group (name, shapes, dtypes)
    bandwidth_bound: set[tuple] = set()
    if ops_tbl is not None and "regime" in ops_tbl.columns:
        for name, sh, dt, regime in ops_tbl.select(
            "name", "input_shapes", "input_dtypes", "regime"
        ).rows():
            if regime == "bandwidth":
                bandwidth_bound.add(_group_key(name, sh, dt))
    from tracedx.analysis.diagnosis import _tensor_bytes

    # per call signature of the launching ops, not per kernel: whether every tensor input is
    # weight-shaped, and the weight byte share w of a bandwidth-bound one
    groups = op_signatures(trace, steps)
    weight_only, share = [], []
    for name, sh, dt, _, _ in groups.rows():
        shapes = [x for x in (sh or []) if x]
        weight_only.append(bool(shapes) and all(_shape_key(x) in wshapes for x in shapes))
        w = 0.0
        if bandwidth_bound and _group_key(name, sh, dt) in bandwidth_bound:
            dts = dt or []
            b = [
                (_tensor_bytes(x, dts[i] if i < len(dts) else None), _shape_key(x) in wshapes)
                for i, x in enumerate(sh or [])
                if x
            ]
            tot = sum(x for x, _ in b)
            w = sum(x for x, is_w in b if is_w) / tot if tot > 0 else 0.0
        share.append(w)
    # each kernel's op's signature (none for a kernel with no op, or whose op is not in the
    # analysed steps)
    k_op = k["op_id"].cast(pl.Float64).to_numpy()
    k_op = np.where(np.isin(op_column_of(op_arrays(trace), "step", k_op), steps), k_op, np.nan)
    hit, g = signature_of(groups, k_op)
    k_weight_only = np.zeros(k.height, dtype=bool)
    k_weight_only[hit] = np.array(weight_only, dtype=bool)[g]
    k_w = np.zeros(k.height)
    k_w[hit] = np.array(share, dtype=float)[g]
    t = k["duration_us"].to_numpy().astype(float)
    blocks = np.nan_to_num(k["blocks"].to_numpy(), nan=0.0)  # no grid recorded: 0
    fill = blocks / sms if sms else np.full(k.height, np.inf)
    fill = np.where(blocks != 0, fill, np.inf)
    is_fixed = in_opt | k_weight_only
    # the fixed time summed in kernel order, one kernel after the other (as a loop would)
    fixed = float(np.cumsum(t[is_fixed])[-1]) if is_fixed.any() else 0.0
    kind = k["kk"].to_numpy()
    is_gemm = ~is_fixed & np.isin(kind, ["gemm", "convolution"])
    is_scaled = ~is_fixed & ~is_gemm
    gemm = np.column_stack([t, fill, k_w])[is_gemm]
    # each kernel's floor by its kind, one np.where per listed kind (a dict look-up per
    # kernel took 0.07 s at 1 GB)
    floor = np.full(int(is_scaled.sum()), KERNEL_FLOOR_DEFAULT_US)
    for kk, floor_us in KERNEL_FLOOR_US.items():
        floor[kind[is_scaled] == kk] = floor_us
    ts = t[is_scaled]
    scaled = np.column_stack([ts, np.minimum(ts, floor), fill[is_scaled]])
    total = float(k["duration_us"].sum())
    return BatchModel(total, fixed, gemm.reshape(-1, 3), scaled.reshape(-1, 3))


@dataclass(frozen=True)
class StepMemory:
    """Device memory of the typical analysed step (bytes; medians over the steps).

    ``peak_allocated_bytes`` / ``peak_reserved_bytes``: the caching allocator's peaks in the
    step; ``persistent_bytes``: the least allocated at any instant of the step (what stays
    between steps); ``batch_bytes`` = peak - persistent (what grows with the batch);
    ``capacity_bytes``: usable device memory (None when the trace does not say the device's).
    """

    peak_allocated_bytes: float
    peak_reserved_bytes: float
    persistent_bytes: float
    batch_bytes: float
    capacity_bytes: float | None

    def bytes_at(self, k: float) -> float:
        """Peak allocated bytes at k times the batch."""
        return self.persistent_bytes + k * self.batch_bytes

    @property
    def max_factor(self) -> int | None:
        """The largest whole k whose peak fits in the capacity (None when unknown)."""
        if self.capacity_bytes is None or self.batch_bytes <= 0:
            return None
        return max(
            int(math.floor((self.capacity_bytes - self.persistent_bytes) / self.batch_bytes)), 0
        )


def step_memory(trace: Trace, steps: list[int], device: int) -> StepMemory | None:
    """:class:`StepMemory` from the trace's ``[memory]`` events on ``device``; None without them."""
    m = trace.memory
    if m.height == 0 or "step" not in m.columns:
        return None
    m = m.filter(
        pl.col("step").is_in(steps)
        & (pl.col("device") == device)
        & (pl.col("device_type").fill_null(1) == 1)
        & pl.col("allocated_bytes").is_not_null()  # older Kineto: sizes without totals
    )
    if m.height == 0:
        return None
    per = m.group_by("step").agg(
        peak=pl.col("allocated_bytes").max(),
        low=pl.col("allocated_bytes").min(),
        reserved=pl.col("reserved_bytes").max(),
    )
    peak = float(per["peak"].median())
    low = float(per["low"].median())
    reserved = per["reserved"].median()
    cap = None
    props = trace.metadata.get("device_properties") or []
    for p in props:
        if isinstance(p, dict) and p.get("id", 0) == device and p.get("totalGlobalMem"):
            cap = float(p["totalGlobalMem"]) * USABLE_MEMORY_SHARE
    return StepMemory(
        peak, float(reserved) if reserved is not None else peak, low, max(peak - low, 0.0), cap
    )
