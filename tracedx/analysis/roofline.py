"""Each op on the device's roofline: intensity, achieved rates, the bound and the regime.

The roofline model (Williams, Waterman, Patterson, "Roofline: an insightful visual performance
model for multicore architectures", CACM 52(4), 2009): an op of arithmetic intensity
``I = FLOPs / bytes`` on a device of peak compute ``P`` and memory bandwidth ``B`` attains at
most ``min(P, I * B)``; the ridge point ``P / B`` separates bandwidth-bound ops (``I`` below
it) from compute-bound ones. Equivalently, its time is at least
``max(FLOPs / P, bytes / B)`` (the per-op roofline time TraceLens reports).

Which roof applies to an op (``peak_tflops``):

- ops that can use matrix units (``tensor_core``): the tensor-core peak of the math mode:
  ``math_mode`` when given (``"tf32"`` for fp32 GEMMs whose kernels ran on TF32 tensor
  cores), else ``compute_dtype`` (bf16, fp16, fp8; fp32 = the CUDA-core rate, which is what
  an fp32 GEMM with TF32 off runs at; fp64 = the FP64 tensor-core rate where the part has
  one). AMD parts use their FP32 matrix rate for fp32.
- every other op (elementwise, norms, reductions, copies): the vector-unit rate: ``fp64``
  for double, else ``fp32`` (PyTorch computes half-precision elementwise math in fp32).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from tracedx.analysis import UNDERFILLED_FRACTION
from tracedx.devices import DeviceSpec

_REQUIRED = ("flops", "bytes", "compute_dtype", "tensor_core", "device_time_us")
_ADDED = (
    "intensity",
    "achieved_tflops",
    "achieved_gbps",
    "peak_tflops",
    "ridge_point",
    "bound_tflops",
    "bound_fraction",
    "roofline_time_us",
    "regime",
)


def _peak_table(spec: DeviceSpec) -> dict[str, float]:
    """Roof (TFLOP/s) per roof key, with the fallbacks the module docstring describes."""
    p = spec.peak_tflops
    table: dict[str, float] = {}

    def put(key: str, *candidates: str) -> None:
        for c in candidates:
            if p.get(c) is not None:
                table[key] = float(p[c])
                return

    # tensor-core ops, by math mode
    put("tc:fp64", "fp64_tc", "fp64")
    put("tc:fp32", "fp32_tc", "fp32")
    put("tc:tf32", "tf32")
    put("tc:bf16", "bf16")
    put("tc:fp16", "fp16")
    put("tc:fp8", "fp8")
    # vector-unit ops
    put("vec:fp64", "fp64")
    put("vec:fp32", "fp32")
    return table


def place_on_roofline(op_stats: pl.DataFrame, spec: DeviceSpec | None) -> pl.DataFrame:
    """Add roofline columns to per-op-group statistics.

    Input columns: ``flops`` (FLOPs), ``bytes`` (bytes), ``compute_dtype`` (fp64, fp32,
    bf16, fp16, fp8, int), ``tensor_core`` (Boolean), ``device_time_us`` (total device time
    of the kernels the group launched, microseconds); optional ``math_mode`` (``"tf32"`` or
    null) and ``max_grid_blocks`` (largest kernel grid, in blocks). Nulls are allowed
    anywhere (unmodelled ops).

    Added columns (Float64 unless noted; null wherever an input they need is null, the
    device time is not positive, or ``spec`` is None for the device-dependent ones):

    - ``intensity``: FLOP/byte = flops / bytes (null when bytes is 0).
    - ``achieved_tflops``: flops / device time, TFLOP/s.
    - ``achieved_gbps``: bytes / device time, GB/s.
    - ``peak_tflops``: the compute roof for the op's math (module docstring), TFLOP/s.
    - ``ridge_point``: peak / bandwidth, FLOP/byte.
    - ``bound_tflops``: ``min(peak, intensity x bandwidth)``, TFLOP/s (Williams et al. 2009).
    - ``roofline_time_us``: ``max(flops / peak, bytes / bandwidth)``, microseconds: the least
      time the roofline allows (ops with 0 FLOPs need no peak: bytes / bandwidth).
    - ``bound_fraction``: roofline_time_us / device_time_us, which equals
      achieved_tflops / bound_tflops when flops > 0 and achieved_gbps / bandwidth when
      flops = 0.
    - ``regime`` (Utf8): ``"compute"`` when intensity >= ridge point, else ``"bandwidth"``;
      ``"under-filled"`` when bound_fraction < :data:`UNDERFILLED_FRACTION` and (where
      ``max_grid_blocks`` and the SM count are known) the grid has fewer blocks than SMs.

    Raises:
        ValueError: a required input column is missing.
    """
    missing = [c for c in _REQUIRED if c not in op_stats.columns]
    if missing:
        raise ValueError(f"place_on_roofline needs columns {missing}")
    replaced = [c for c in _ADDED if c in op_stats.columns]
    df = op_stats.drop(replaced) if replaced else op_stats

    # Worked out per row in numpy: the op groups are a few hundred rows at most, and the four
    # polars calls of when/then expressions this took cost 0.8-1.2 ms whatever the rows. Each
    # value is a (floats, valid) pair, null where not valid; the arithmetic, comparisons and
    # null rules are polars' (tests/test_roofline.py checks them against polars' own
    # expressions on random and degenerate rows): NaN is above every number, a min or max
    # of two leaves out NaN and nulls (of equals, the second), and a column of more than one
    # row divided by a number is multiplied by its reciprocal.
    h = df.height

    def col(c: str) -> tuple[np.ndarray, np.ndarray]:
        x = df[c].cast(pl.Float64)
        ok = x.is_not_null().to_numpy() if x.null_count() else np.ones(h, dtype=bool)
        return x.to_numpy().astype(np.float64, copy=False), ok

    def by(x: np.ndarray, c: float) -> np.ndarray:
        return x / c if h == 1 else x * (1.0 / c)

    def out(name: str, v: np.ndarray | None, ok: np.ndarray | None) -> pl.Series:
        if v is None:
            return pl.Series(name, [None] * h, dtype=pl.Float64)
        return pl.Series(
            name, [x if o else None for x, o in zip(v.tolist(), ok.tolist(), strict=True)],
            dtype=pl.Float64,
        )  # fmt: skip

    with np.errstate(all="ignore"):
        flops, f_ok = col("flops")
        nbytes, b_ok = col("bytes")
        t_us, t_ok = col("device_time_us")
        t_pos = t_ok & (np.isnan(t_us) | (t_us > 0))  # t > 0, true
        intensity = flops / nbytes
        i_ok = b_ok & (np.isnan(nbytes) | (nbytes > 0)) & f_ok
        measured = [
            out("intensity", intensity, i_ok),
            out("achieved_tflops", by(flops / t_us, 1e6), t_pos & f_ok),
            out("achieved_gbps", by(nbytes / t_us, 1e3), t_pos & b_ok),
        ]
        if spec is None or not spec.bandwidth_gbs or spec.bandwidth_gbs <= 0:
            rest = [out(c, None, None) for c in _ADDED[3:8]]
            regime = pl.Series("regime", [None] * h, dtype=pl.Utf8)
            return pl.DataFrame([*df.get_columns(), *measured, *rest, regime])
        bw = float(spec.bandwidth_gbs)  # GB/s
        peak, p_ok, one_roof = _peaks(df, _peak_table(spec))
        zero_flops = f_ok & (flops == 0)
        if one_roof and h > 1:
            # every row's roof from one literal of the roof expression: polars holds the
            # column as that one number, so the ridge point is worked out once (a division),
            # and so is the FLOP time (a product by the reciprocal) where no when/then around
            # it takes some rows and not others (no row with 0 FLOPs, or with no FLOPs or no
            # bytes: such a when/then spreads the number over the rows first)
            ridge = peak * 1e3 / bw
            plain = f_ok.all() and b_ok.all() and not zero_flops.any()
            compute_us = flops * (1.0 / (peak * 1e6)) if plain else flops / (peak * 1e6)
        else:
            ridge = by(peak * 1e3, bw)  # TFLOP/s / (GB/s) * 1e3 = FLOP/byte
            compute_us = flops / (peak * 1e6)
        bound = _min2(peak, by(intensity * bw, 1e3))
        compute_us = np.where(zero_flops, 0.0, compute_us)
        c_ok = zero_flops | (f_ok & p_ok)
        memory_us = nbytes / (bw * 1e3) if h == 1 else nbytes * (1.0 / (bw * 1e3))
        roof_us, r_ok = _max2(compute_us, memory_us), c_ok & b_ok
        frac, q_ok = roof_us / t_us, t_pos & r_ok
        underfilled = q_ok & ~np.isnan(frac) & (frac < UNDERFILLED_FRACTION)
        if spec.num_sms is not None and "max_grid_blocks" in df.columns:
            grid, g_ok = col("max_grid_blocks")
            underfilled &= ~g_ok | (~np.isnan(grid) & (grid < spec.num_sms))
        # by intensity: 0 FLOPs bandwidth, else against the ridge point (NaN above all)
        ge = np.isnan(intensity) | (~np.isnan(ridge) & (intensity >= ridge))
        by_int = np.where(zero_flops, "bandwidth", np.where(ge, "compute", "bandwidth")).astype(
            object
        )
        known = zero_flops | (i_ok & p_ok)
        regime = [
            None if not io else ("under-filled" if u and k else (b if k else None))
            for io, u, k, b in zip(i_ok.tolist(), underfilled.tolist(), known.tolist(),
                                   by_int.tolist(), strict=True)
        ]  # fmt: skip
        added = [
            out("peak_tflops", peak, p_ok),
            out("ridge_point", ridge, p_ok),
            out("bound_tflops", bound, p_ok & i_ok),
            out("bound_fraction", frac, q_ok),
            out("roofline_time_us", roof_us, r_ok),
            pl.Series("regime", regime, dtype=pl.Utf8),
        ]
    return pl.DataFrame([*df.get_columns(), *measured, *added])


def _peaks(df: pl.DataFrame, peaks: dict[str, float]) -> tuple[np.ndarray, np.ndarray, bool]:
    """Each row's roof (TFLOP/s) and whether it has one: the tensor-core peak of its math
    mode (``math_mode``, else ``compute_dtype``) for a tensor-core op, else the vector rate
    (fp64 for double, fp32 for the rest); none without a compute dtype or a listed peak.
    And whether polars' when/then chain of the roof key gives every row one literal branch
    (a branch whose condition holds for every row or for none is taken whole): no compute
    dtype anywhere, or none missing, no tensor-core row and the math mode fp64 on every row
    or on none."""
    dtype = df["compute_dtype"].cast(pl.Utf8).to_list()
    tc = df["tensor_core"].cast(pl.Boolean).to_list()
    math = df["math_mode"].cast(pl.Utf8).to_list() if "math_mode" in df.columns else None
    got = []
    for i, (d, t) in enumerate(zip(dtype, tc, strict=True)):
        mode = d if math is None or math[i] is None else math[i]
        if d is None:
            key = None
        elif t:
            key = "tc:" + mode
        else:
            key = "vec:fp64" if mode == "fp64" else "vec:fp32"
        got.append(peaks.get(key))
    ok = np.array([x is not None for x in got], dtype=bool)
    no_dtype = [d is None for d in dtype]
    fp64 = [
        (d if math is None or math[i] is None else math[i]) == "fp64" for i, d in enumerate(dtype)
    ]
    one = all(no_dtype) or (
        not any(no_dtype) and not any(t is True for t in tc) and (all(fp64) or not any(fp64))
    )
    return np.array([np.nan if x is None else x for x in got], dtype=np.float64), ok, one


def _min2(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``pl.min_horizontal(a, b)`` of two valid columns: NaN left out; of equals, ``b``."""
    return np.where(np.isnan(a), b, np.where(np.isnan(b) | (a < b), a, b))


def _max2(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``pl.max_horizontal(a, b)`` of two valid columns: NaN left out; of equals, ``b``."""
    return np.where(np.isnan(a), b, np.where(np.isnan(b) | (a > b), a, b))


def decode_ceiling(
    weight_bytes_per_token: float, kv_bytes_per_token: float, bandwidth_gbs: float
) -> float:
    """The decode ceiling in tokens/s: bandwidth / bytes read per generated token.

    A decode step that must read every weight and the whole KV cache once per token is
    capped at ``bandwidth_gbs * 1e9 / (weight_bytes_per_token + kv_bytes_per_token)`` tokens
    per second (the roofline bound at an intensity near zero: Williams et al., CACM 2009; for
    decoding, Pope et al., "Efficiently Scaling Transformer Inference", MLSys 2023). For batch size b sharing one read of the weights, pass the
    weight bytes divided by b.

    Args:
        weight_bytes_per_token: bytes of weights read per token (bytes).
        kv_bytes_per_token: bytes of KV cache read per token (bytes).
        bandwidth_gbs: memory bandwidth (GB/s).

    Raises:
        ValueError: bandwidth not positive, a negative byte count, or no bytes at all.
    """
    if not bandwidth_gbs or bandwidth_gbs <= 0:
        raise ValueError(f"bandwidth_gbs must be positive, got {bandwidth_gbs!r}")
    if weight_bytes_per_token < 0 or kv_bytes_per_token < 0:
        raise ValueError("bytes per token cannot be negative")
    total = weight_bytes_per_token + kv_bytes_per_token
    if total <= 0:
        raise ValueError("decode ceiling needs a positive number of bytes per token")
    return bandwidth_gbs * 1e9 / total
