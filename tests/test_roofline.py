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
