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

import polars as pl

from tracedx.devices import DeviceSpec

UNDERFILLED_FRACTION = 0.1
"""An op achieving less than this fraction of its roofline bound is far below both roofs;
with fewer thread blocks than SMs (when known) it is called under-filled."""

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
    order = [*df.columns, *_ADDED]

    flops = pl.col("flops").cast(pl.Float64)
    nbytes = pl.col("bytes").cast(pl.Float64)
    t_us = pl.col("device_time_us").cast(pl.Float64)
    t_ok = t_us > 0

    intensity = pl.when(nbytes > 0).then(flops / nbytes).otherwise(None)
    achieved_tflops = pl.when(t_ok).then(flops / t_us / 1e6).otherwise(None)
    achieved_gbps = pl.when(t_ok).then(nbytes / t_us / 1e3).otherwise(None)
    measured = [
        intensity.alias("intensity"),
        achieved_tflops.alias("achieved_tflops"),
        achieved_gbps.alias("achieved_gbps"),
    ]

    if spec is None or not spec.bandwidth_gbs or spec.bandwidth_gbs <= 0:
        return df.with_columns(
            *measured,
            pl.lit(None, dtype=pl.Float64).alias("peak_tflops"),
            pl.lit(None, dtype=pl.Float64).alias("ridge_point"),
            pl.lit(None, dtype=pl.Float64).alias("bound_tflops"),
            pl.lit(None, dtype=pl.Float64).alias("bound_fraction"),
            pl.lit(None, dtype=pl.Float64).alias("roofline_time_us"),
            pl.lit(None, dtype=pl.Utf8).alias("regime"),
        ).select(order)

    bw = float(spec.bandwidth_gbs)  # GB/s
    mode = pl.col("compute_dtype").cast(pl.Utf8)
    if "math_mode" in df.columns:
        mode = pl.coalesce(pl.col("math_mode").cast(pl.Utf8), mode)
    tc = pl.col("tensor_core").cast(pl.Boolean)
    roof_key = (
        pl.when(pl.col("compute_dtype").is_null())
        .then(pl.lit(None, dtype=pl.Utf8))
        .when(tc)
        .then(pl.lit("tc:") + mode)
        .when(mode == "fp64")
        .then(pl.lit("vec:fp64"))
        .otherwise(pl.lit("vec:fp32"))
    )
    peaks = _peak_table(spec)
    peak = roof_key.replace_strict(
        list(peaks), list(peaks.values()), default=None, return_dtype=pl.Float64
    )
    # each with_columns below reads columns the one before added (each is one polars call)
    df = df.with_columns(*measured, peak.alias("peak_tflops"))

    peak_c = pl.col("peak_tflops")
    ridge = peak_c * 1e3 / bw  # TFLOP/s / (GB/s) * 1e3 = FLOP/byte
    bound = pl.min_horizontal(peak_c, pl.col("intensity") * bw / 1e3)
    bound = pl.when(peak_c.is_null() | pl.col("intensity").is_null()).then(None).otherwise(bound)
    compute_us = pl.when(flops == 0).then(pl.lit(0.0)).otherwise(flops / (peak_c * 1e6))
    memory_us = nbytes / (bw * 1e3)  # bytes / (GB/s) -> us
    roof_us = (
        pl.when(compute_us.is_null() | memory_us.is_null())
        .then(None)
        .otherwise(pl.max_horizontal(compute_us, memory_us))
    )
    df = df.with_columns(
        ridge.alias("ridge_point"),
        bound.alias("bound_tflops"),
        roof_us.alias("roofline_time_us"),
    )
    frac = pl.when(t_ok).then(pl.col("roofline_time_us") / t_us).otherwise(None)
    underfilled = frac < UNDERFILLED_FRACTION
    if spec.num_sms is not None and "max_grid_blocks" in df.columns:
        grid = pl.col("max_grid_blocks").cast(pl.Float64)
        underfilled = underfilled & (grid.is_null() | (grid < spec.num_sms))
    by_intensity = (
        pl.when(pl.col("flops") == 0)
        .then(pl.lit("bandwidth"))
        .when(pl.col("intensity") >= pl.col("ridge_point"))
        .then(pl.lit("compute"))
        .when(pl.col("intensity") < pl.col("ridge_point"))
        .then(pl.lit("bandwidth"))
        .otherwise(pl.lit(None, dtype=pl.Utf8))
    )
    regime = (
        pl.when(pl.col("intensity").is_null())
        .then(pl.lit(None, dtype=pl.Utf8))
        .when(underfilled.fill_null(False) & by_intensity.is_not_null())
        .then(pl.lit("under-filled"))
        .otherwise(by_intensity)
    )
    return df.with_columns(frac.alias("bound_fraction"), regime.alias("regime")).select(order)


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
