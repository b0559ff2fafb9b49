"""Roofline placement on hand-computed frames; the decode ceiling."""

from __future__ import annotations

import polars as pl
import pytest

from tracedx.analysis.roofline import decode_ceiling, place_on_roofline
from tracedx.devices import DEVICES, DeviceSpec

# A round-number device: ridge points bf16 100, tf32 50, fp32 10 FLOP/byte.
SPEC = DeviceSpec(
    name="Round GPU",
    peak_tflops={"fp32": 10.0, "tf32": 50.0, "bf16": 100.0},
    bandwidth_gbs=1000.0,
    num_sms=100,
    source="test",
)


def _frame(rows: list[dict]) -> pl.DataFrame:
    schema = {
        "flops": pl.Float64,
        "bytes": pl.Float64,
        "compute_dtype": pl.Utf8,
        "tensor_core": pl.Boolean,
        "device_time_us": pl.Float64,
        "math_mode": pl.Utf8,
        "max_grid_blocks": pl.Int64,
    }
    return pl.DataFrame([{k: r.get(k) for k in schema} for r in rows], schema=schema)


def test_two_rows_by_hand():
    df = _frame(
        [
            # GEMM: I = 1e9 / 1e6 = 1000 FLOP/B >= ridge 100 -> compute-bound
            {"flops": 1e9, "bytes": 1e6, "compute_dtype": "bf16", "tensor_core": True,
             "device_time_us": 20.0, "max_grid_blocks": 500},
            # elementwise: I = 1e6 / 8e6 = 0.125 < ridge 10 (fp32 vector roof) -> bandwidth
            {"flops": 1e6, "bytes": 8e6, "compute_dtype": "fp32", "tensor_core": False,
             "device_time_us": 10.0, "max_grid_blocks": 4096},
        ]
    )  # fmt: skip
    out = place_on_roofline(df, SPEC).to_dicts()
    g, e = out
    assert g["intensity"] == pytest.approx(1000.0)
    assert g["achieved_tflops"] == pytest.approx(50.0)  # 1e9 FLOP / 20e-6 s = 5e13 FLOP/s
    assert g["achieved_gbps"] == pytest.approx(50.0)  # 1e6 B / 20e-6 s = 5e10 B/s
    assert g["peak_tflops"] == 100.0
    assert g["ridge_point"] == pytest.approx(100.0)  # 100e12 / 1000e9
    assert g["bound_tflops"] == pytest.approx(100.0)  # min(100, 1000 * 1000e9 / 1e12 = 1000)
    assert g["roofline_time_us"] == pytest.approx(10.0)  # max(1e9/1e14 s, 1e6/1e12 s) = 10 us
    assert g["bound_fraction"] == pytest.approx(0.5)  # 50 / 100 = 10 us / 20 us
    assert g["regime"] == "compute"

    assert e["intensity"] == pytest.approx(0.125)
    assert e["achieved_tflops"] == pytest.approx(0.1)  # 1e6 / 10e-6 = 1e11 FLOP/s
    assert e["achieved_gbps"] == pytest.approx(800.0)  # 8e6 / 10e-6 = 8e11 B/s
    assert e["peak_tflops"] == 10.0
    assert e["ridge_point"] == pytest.approx(10.0)
    assert e["bound_tflops"] == pytest.approx(0.125)  # 0.125 FLOP/B * 1e12 B/s
    assert e["roofline_time_us"] == pytest.approx(8.0)  # 8e6 B / 1e12 B/s
    assert e["bound_fraction"] == pytest.approx(0.8)  # = 800 GB/s / 1000 GB/s
    assert e["regime"] == "bandwidth"


def test_tf32_math_mode_and_fp32_gemm_roofs():
    df = _frame(
        [
            {"flops": 1e9, "bytes": 1e6, "compute_dtype": "fp32", "tensor_core": True,
             "device_time_us": 200.0, "math_mode": "tf32"},
            {"flops": 1e9, "bytes": 1e6, "compute_dtype": "fp32", "tensor_core": True,
             "device_time_us": 200.0},
        ]
    )  # fmt: skip
    tf32, fp32 = place_on_roofline(df, SPEC).to_dicts()
    assert tf32["peak_tflops"] == 50.0 and tf32["ridge_point"] == pytest.approx(50.0)
    assert tf32["bound_fraction"] == pytest.approx(20.0 / 200.0)  # 1e9 / 50e12 = 20 us
    assert fp32["peak_tflops"] == 10.0  # TF32 off: the fp32 CUDA-core rate
    assert fp32["bound_fraction"] == pytest.approx(100.0 / 200.0)
    assert fp32["regime"] == "compute"  # 1000 >= 10


def test_under_filled_needs_a_small_grid_when_grid_is_known():
    slow = {"flops": 1e9, "bytes": 1e6, "compute_dtype": "bf16", "tensor_core": True,
            "device_time_us": 1000.0}  # fmt: skip
    df = _frame(
        [
            {**slow, "max_grid_blocks": 8},  # 8 < 100 SMs, 1% of the bound
            {**slow, "max_grid_blocks": 4096},  # a full grid that is still slow: not this
            {**slow},  # grid unknown: far below the bound is enough
        ]
    )
    out = place_on_roofline(df, SPEC)
    assert out["bound_fraction"].to_list() == pytest.approx([0.01] * 3)
    assert out["regime"].to_list() == ["under-filled", "compute", "under-filled"]


def test_zero_flop_copy_and_nulls():
    df = _frame(
        [
            {"flops": 0.0, "bytes": 2e6, "compute_dtype": "bf16", "tensor_core": False,
             "device_time_us": 4.0},
            {"device_time_us": 7.0},  # unmodelled
            {"flops": 1e6, "bytes": 1e6, "compute_dtype": "bf16", "tensor_core": False,
             "device_time_us": 0.0},  # no device time
        ]
    )  # fmt: skip
    copy, unmodelled, no_time = place_on_roofline(df, SPEC).to_dicts()
    assert copy["intensity"] == 0.0 and copy["regime"] == "bandwidth"
    assert copy["roofline_time_us"] == pytest.approx(2.0)  # 2e6 B / 1e12 B/s
    assert copy["bound_fraction"] == pytest.approx(0.5)  # = 500 GB/s achieved / 1000
    assert copy["achieved_gbps"] == pytest.approx(500.0)
    for k in ("intensity", "achieved_tflops", "peak_tflops", "bound_fraction", "regime"):
        assert unmodelled[k] is None, k
    assert no_time["achieved_tflops"] is None and no_time["bound_fraction"] is None
    assert no_time["intensity"] == 1.0


def test_no_spec_keeps_device_free_columns_and_schema():
    df = _frame(
        [{"flops": 1e9, "bytes": 1e6, "compute_dtype": "bf16", "tensor_core": True,
          "device_time_us": 20.0}]
    )  # fmt: skip
    with_spec = place_on_roofline(df, SPEC)
    without = place_on_roofline(df, None)
    assert without.columns == with_spec.columns
    assert without.schema == with_spec.schema
    row = without.row(0, named=True)
    assert row["intensity"] == 1000.0 and row["achieved_tflops"] == pytest.approx(50.0)
    assert row["peak_tflops"] is None and row["regime"] is None


def test_missing_dtype_on_the_part_gives_null_roof():
    df = _frame(
        [{"flops": 1e9, "bytes": 1e6, "compute_dtype": "bf16", "tensor_core": True,
          "device_time_us": 20.0}]
    )  # fmt: skip
    row = place_on_roofline(df, DEVICES["t4"]).row(0, named=True)  # T4: no bf16 tensor cores
    assert row["peak_tflops"] is None and row["regime"] is None
    assert row["achieved_gbps"] == pytest.approx(50.0)


def test_minimal_columns_and_missing_column_error():
    df = pl.DataFrame(
        {
            "flops": [2.0 * 8192**3],
            "bytes": [3 * 8192 * 8192 * 2.0],
            "compute_dtype": ["bf16"],
            "tensor_core": [True],
            "device_time_us": [1443.0],
        }
    )
    row = place_on_roofline(df, DEVICES["h200-sxm"]).row(0, named=True)
    # 8192^3 bf16 GEMM: 1.0995e12 FLOP in 1443 us = 762 TFLOP/s (GUIDE.md's H200 figure)
    assert row["achieved_tflops"] == pytest.approx(762.0, rel=1e-3)
    assert row["bound_fraction"] == pytest.approx(762.0 / 989.5, rel=1e-3)
    assert row["regime"] == "compute"
    with pytest.raises(ValueError, match="device_time_us"):
        place_on_roofline(df.drop("device_time_us"), SPEC)


def test_decode_ceiling():
    # GPT-2-medium-sized decode: 355M bf16 weights = 710 MB, plus 10 MB of KV cache
    assert decode_ceiling(710e6, 10e6, 4800.0) == pytest.approx(4800e9 / 720e6)  # ~6667 tok/s
    assert decode_ceiling(1e9, 0.0, 1000.0) == pytest.approx(1000.0)
    for args in [(1e9, 0.0, 0.0), (0.0, 0.0, 100.0), (-1.0, 5.0, 100.0)]:
        with pytest.raises(ValueError):
            decode_ceiling(*args)


def _polars_placement(df: pl.DataFrame, spec) -> pl.DataFrame:
    """place_on_roofline as polars expressions (the implementation before the numpy one):
    the reference its floats, nulls and regimes must equal."""
    from tracedx.analysis.roofline import _ADDED, UNDERFILLED_FRACTION, _peak_table

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


def _random_frame(rng, h: int) -> pl.DataFrame:
    specials = [None, float("nan"), 0.0, -0.0, float("inf"), -1.0, 1e-300, 1e300]

    def floats(scale):
        v = (rng.random(h) * 10.0 ** rng.integers(-3, scale, h)).tolist()
        for i in range(h):
            if rng.random() < 0.25:
                v[i] = specials[rng.integers(0, len(specials))]
        return v

    pick = lambda xs: [xs[i] for i in rng.integers(0, len(xs), h)]  # noqa: E731
    return pl.DataFrame(
        {
            "flops": floats(13),
            "bytes": floats(10),
            "compute_dtype": pick(["fp32", "bf16", "fp16", "fp64", "fp8", "int", None]),
            "tensor_core": pick([True, False, None]),
            "device_time_us": floats(5),
            "math_mode": pick(["tf32", None, None]),
            "max_grid_blocks": pick([1, 50, 99, 100, 5000, None]),
        },
        schema=_frame([]).schema,
    )


def test_numpy_placement_is_polars_placement():
    """place_on_roofline (numpy over the rows) gives the frame polars' expressions give, to
    the last bit and null for null, on random rows full of nulls, NaN, zeros, signed zeros and
    infinities, for one row and many, with and without peaks, SM counts or math modes."""
    import numpy as np

    rng = np.random.default_rng(17)
    no_sms = DeviceSpec(name="x", peak_tflops={"fp32": 10.0, "fp64": 1.0, "bf16": 100.0},
                        bandwidth_gbs=900.0, num_sms=None, source="test")  # fmt: skip
    for spec in (SPEC, DEVICES["t4"], DEVICES["h200-sxm"], no_sms, None):
        for h in (1, 2, 3, 7, 60, 300):
            for drop in ((), ("math_mode",), ("max_grid_blocks",), "one roof", "fp64"):
                df = _random_frame(rng, h)
                if drop == "one roof":  # every row on the fp32 vector roof
                    df = df.with_columns(compute_dtype=pl.lit("bf16"), tensor_core=False)
                elif drop == "fp64":
                    df = df.with_columns(compute_dtype=pl.lit("fp64"), math_mode=None)
                else:
                    df = df.drop(drop)
                # (columns as the op table has them: no literal held as one value)
                df = pl.DataFrame([pl.Series(c, df[c].to_list(), df[c].dtype) for c in df.columns])
                got = place_on_roofline(df, spec)
                want = _polars_placement(df, spec)
                assert got.schema == want.schema
                for c in got.columns:
                    a, b = got[c].to_list(), want[c].to_list()
                    same = [
                        (x is None and y is None)
                        or (
                            isinstance(x, float)
                            and isinstance(y, float)
                            and np.isnan(x)
                            and np.isnan(y)
                        )
                        or (
                            x == y
                            and (not isinstance(x, float) or np.copysign(1, x) == np.copysign(1, y))
                        )
                        for x, y in zip(a, b, strict=True)
                    ]
                    assert all(same), (
                        spec and spec.name,
                        h,
                        drop,
                        c,
                        [(x, y) for x, y, s in zip(a, b, same, strict=True) if not s][:3],
                    )
