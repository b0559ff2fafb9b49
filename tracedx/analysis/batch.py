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

from tracedx.analysis.intervals import inside, ints_of, mask_of, rows_in_steps, union
from tracedx.analysis.kernels import KIND_CODES, kernel_name_codes, kernel_name_kinds, kind_codes
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
_KIND = {k: i for i, k in enumerate(KIND_CODES)}  # a kernel kind's code (kernels.kind_codes)


def _shape_key(shape) -> tuple | None:
    return tuple(shape) if shape else None


def weight_shapes(ops: pl.DataFrame) -> set[tuple]:
    """Shapes of weight operands in ``ops`` (and their transposes), as tuples."""
    return _weight_shapes_of(ops["name"].to_list(), ops["input_shapes"].to_list())


def _weight_shapes_of(names: list, shapes: list) -> set[tuple]:
    """:func:`weight_shapes` of the ops whose names and input shapes are ``names``, ``shapes``."""
    out: set[tuple] = set()
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


def _step_weight_shapes(trace: Trace, steps: list[int]) -> set[tuple]:
    """:func:`weight_shapes` of the ops of ``steps`` that take weights: one op per distinct
    (name, ``shape_code``) pair (the op table's code of its list columns), whose shapes alone
    come to Python (the whole op table's shapes are slow to filter and to turn into lists)."""
    ops = trace.ops
    # (Series comparisons and Series.filter: an is_in, a gather or a DataFrame filter is a
    # polars query, 0.04-0.2 ms each whatever its rows)
    name = ops["name"]
    takes = name == _WEIGHT_OPS[0]
    for w in _WEIGHT_OPS[1:]:
        takes = takes | (name == w)
    on = ops_in_steps(trace, steps) & mask_of(takes)
    if not on.any():
        return set()
    # each of those ops' name as its index in _WEIGHT_OPS
    index = {x: i for i, x in enumerate(_WEIGHT_OPS)}
    code = np.array([index[x] for x in name.filter(pl.Series(on)).to_list()], dtype=np.int64)
    rows = np.flatnonzero(on)
    key = code << 32 | ops["shape_code"].to_numpy()[rows].astype(np.int64)
    first = np.sort(np.unique(key, return_index=True)[1])  # (in op order)
    one = np.zeros(len(on), dtype=bool)
    one[rows[first]] = True
    names = [_WEIGHT_OPS[c] for c in code[first].tolist()]
    return _weight_shapes_of(names, ops["input_shapes"].filter(pl.Series(one)).to_list())


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
    kt = trace.kernels
    # the kernels' rows as a mask and their columns as arrays (a polars filter, and a look-up
    # of each kernel's name for its kind, cost 2 ms at 10 MB)
    on = (
        rows_in_steps(kt, steps) & mask_of(kt["device"] == device)
        if device is not None and kt.height
        else np.zeros(kt.height, dtype=bool)
    )
    n_k = int(on.sum())
    if n_k == 0:
        return BatchModel(0.0, 0.0, np.empty((0, 3)), np.empty((0, 3)))
    kind = kind_codes(kernel_name_kinds(trace))[kernel_name_codes(trace)[on]]
    t = kt["duration_us"].to_numpy()[on].astype(float)
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
    in_opt = inside(a_s, a_e, kt["launch_start_us"].cast(pl.Float64).to_numpy()[on])
    # the weight operands' shapes, from the ops of the steps that take weights
    wshapes = _step_weight_shapes(trace, steps)
    # roofline position per op group (name, shapes, dtypes): the bandwidth-bound groups'
    # lists by name (only theirs come to Python; lists compared as they are, not as keys)
    bandwidth_bound: dict[str | None, list[tuple]] = {}
    if ops_tbl is not None and "regime" in ops_tbl.columns and ops_tbl.height:
        bw = pl.Series([r == "bandwidth" for r in ops_tbl["regime"].to_list()], dtype=pl.Boolean)
        if bw.any():
            g = (ops_tbl[c].filter(bw).to_list() for c in ("name", "input_shapes", "input_dtypes"))
            for name, sh, dt in zip(*g, strict=True):
                bandwidth_bound.setdefault(name, []).append((sh, dt))
    from tracedx.analysis.diagnosis import _tensor_bytes

    # per call signature of the launching ops, not per kernel: whether every tensor input is
    # weight-shaped, and the weight byte share w of a bandwidth-bound one
    groups = op_signatures(trace, steps)
    weight_only = np.zeros(groups.height, dtype=bool)
    share = np.zeros(groups.height)
    if wshapes or bandwidth_bound:
        g_names = groups["name"].to_list()
        g_shapes = groups["input_shapes"].to_list()
        g_dtypes = groups["input_dtypes"].to_list() if bandwidth_bound else None
        for j, (name, sh) in enumerate(zip(g_names, g_shapes, strict=True)):
            if wshapes and sh:
                shapes = [x for x in sh if x]
                weight_only[j] = bool(shapes) and all(tuple(x) in wshapes for x in shapes)
            if name not in bandwidth_bound:
                continue
            dt = g_dtypes[j]
            if not any(sh == s2 and dt == d2 for s2, d2 in bandwidth_bound[name]):
                continue
            dts = dt or []
            b = [
                (_tensor_bytes(x, dts[i] if i < len(dts) else None), _shape_key(x) in wshapes)
                for i, x in enumerate(sh or [])
                if x
            ]
            tot = sum(x for x, _ in b)
            share[j] = sum(x for x, is_w in b if is_w) / tot if tot > 0 else 0.0
    # each kernel's op's signature (none for a kernel with no op, or whose op is not in the
    # analysed steps)
    k_op = kt["op_id"].cast(pl.Float64).to_numpy()[on]
    k_op = np.where(np.isin(op_column_of(op_arrays(trace), "step", k_op), steps), k_op, np.nan)
    hit, g = signature_of(groups, k_op)
    k_weight_only = np.zeros(n_k, dtype=bool)
    k_weight_only[hit] = weight_only[g]
    k_w = np.zeros(n_k)
    k_w[hit] = share[g]
    # blocks: grid_x x grid_y x grid_z as floats, left to right (a missing y or z is 1; no
    # grid recorded: 0)
    blocks = kt["grid_x"].cast(pl.Float64).to_numpy()[on]
    for c in ("grid_y", "grid_z"):
        blocks = blocks * ints_of(kt[c], 1)[on].astype(np.float64)
    blocks = np.nan_to_num(blocks, nan=0.0)
    fill = blocks / sms if sms else np.full(n_k, np.inf)
    fill = np.where(blocks != 0, fill, np.inf)
    is_fixed = in_opt | k_weight_only
    # the fixed time summed in kernel order, one kernel after the other (as a loop would)
    fixed = float(np.cumsum(t[is_fixed])[-1]) if is_fixed.any() else 0.0
    is_gemm = ~is_fixed & np.isin(kind, [_KIND["gemm"], _KIND["convolution"]])
    is_scaled = ~is_fixed & ~is_gemm
    gemm = np.column_stack([t, fill, k_w])[is_gemm]
    # each kernel's floor by its kind, one np.where per listed kind (a dict look-up per
    # kernel took 0.07 s at 1 GB)
    floor = np.full(int(is_scaled.sum()), KERNEL_FLOOR_DEFAULT_US)
    for kk, floor_us in KERNEL_FLOOR_US.items():
        floor[kind[is_scaled] == _KIND[kk]] = floor_us
    ts = t[is_scaled]
    scaled = np.column_stack([ts, np.minimum(ts, floor), fill[is_scaled]])
    # polars' sum of the kernels' times, in table order as one column (a lazy query's result
    # comes in parts whose bounds depend on the thread count and the other columns selected,
    # and its sum was the sum of their sums: the last bit varied with them)
    total = float(pl.Series(t, dtype=pl.Float64).sum())
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
