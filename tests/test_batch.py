"""The larger-batch model (tracedx.analysis.batch): GPU time by kernel kind, memory headroom."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

import tracedx
from tests.conftest import SAMPLES
from tracedx.analysis.batch import BatchModel, StepMemory, batch_model, step_memory, weight_shapes


def test_growth_by_kind_by_hand():
    # fixed 10 us; a filled compute-bound GEMM 100 us (x2); a GEMM of 33 blocks on 132 SMs
    # (a quarter wave: 2x the blocks still fit one wave) 40 us (x1); a bandwidth-bound GEMM
    # 20 us whose inputs are 75% weight bytes (0.75 + 2 x 0.25 = 1.25x); an elementwise kernel
    # of 10.9 us with a 0.9 us floor (0.9 + 2 x 10) and one at its floor, 0.9 us (x1).
    bm = BatchModel(
        kernel_us=10 + 100 + 40 + 20 + 10.9 + 0.9,
        fixed_us=10.0,
        gemm=np.array([[100.0, np.inf, 0.0], [40.0, 0.25, 0.0], [20.0, 2.0, 0.75]]),
        scaled=np.array([[10.9, 0.9, np.inf], [0.9, 0.9, np.inf]]),
    )
    want = 10 + 200 + 40 + 25 + (0.9 + 20) + 0.9
    assert bm.kernel_us_at(2) == pytest.approx(want)
    assert bm.growth(2) == pytest.approx(want / 181.8)
    # at 8x the quarter-wave GEMM fills two waves: 40 x 8 x 0.25 = 80 us
    assert bm.kernel_us_at(8) == pytest.approx(
        10 + 800 + 80 + 20 * (0.75 + 8 * 0.25) + 0.9 + 80 + 0.9
    )


def test_memory_headroom_by_hand():
    m = StepMemory(
        peak_allocated_bytes=10e9,
        peak_reserved_bytes=12e9,
        persistent_bytes=4e9,
        batch_bytes=6e9,
        capacity_bytes=40e9,
    )
    assert m.bytes_at(2) == 16e9
    assert m.max_factor == 6  # (40 - 4) / 6
    assert StepMemory(1, 1, 1, 0, 40e9).max_factor is None


def test_weight_shapes_include_transposes():
    ops = pl.DataFrame(
        {
            "name": ["aten::linear", "aten::addmm", "aten::relu"],
            "input_shapes": [
                [[64, 1024], [512, 1024], [512]],
                [[768], [4096, 768], [768, 2304]],
                [[64, 512]],
            ],
        }
    )
    assert weight_shapes(ops) == {(512, 1024), (1024, 512), (768, 2304), (2304, 768)}


def test_memory_events_read_and_headroom_on_a_real_trace():
    p = SAMPLES / "mlp_large-b2048.json.gz"
    if not p.exists():
        pytest.skip("sample traces missing")
    t = tracedx.load(p)
    d = tracedx.diagnose(t)
    mem = step_memory(t, d.steps, d.primary_device)
    assert t.memory.height == 252
    # width 8192, 3 layers: 201M fp32 weights (805 MB) + inputs at the step's low point
    assert mem.persistent_bytes == 1007779840
    assert mem.peak_allocated_bytes == 2014495232
    f = {x.fix: x for x in d.findings}["larger-batch"]
    assert any("grows with the batch" in e for e in f.evidence)
    # the optimizer's foreach kernels and autocast's weight casts do not grow with the batch
    bm = batch_model(t, d.steps, d.primary_device, d.op_table)
    assert 0.35 < bm.fixed_share < 0.4


def test_no_memory_events_means_headroom_unknown():
    p = SAMPLES / "mlp_train-eager.json.gz"
    if not p.exists():
        pytest.skip("sample traces missing")
    d = tracedx.diagnose(tracedx.load(p))
    f = {x.fix: x for x in d.findings}["larger-batch"]
    assert any("memory headroom unknown" in e for e in f.evidence)


def _mem_trace(tmp_path, with_totals: bool):
    from tests.tracebuilder import T0, TraceBuilder

    b = TraceBuilder()
    b.step(1, T0, 100)
    b.launched_kernel("aten::mm", T0 + 1, 5, T0 + 10, 50)
    for ts, size, total in ((T0 + 2, 4096, 8192), (T0 + 60, -4096, 4096)):
        args = {"Bytes": size, "Device Id": 0, "Device Type": 1, "Addr": 1}
        if with_totals:
            args |= {"Total Allocated": total, "Total Reserved": 2 * total}
        b.add(
            {
                "ph": "i",
                "cat": "cpu_instant_event",
                "s": "t",
                "name": "[memory]",
                "pid": 1,
                "tid": 1,
                "ts": ts,
                "args": args,
            }
        )
    return tracedx.load(b.write(tmp_path / f"mem{with_totals}.json"))


def test_memory_events_by_hand(tmp_path):
    t = _mem_trace(tmp_path, True)
    assert t.memory["bytes"].to_list() == [4096, -4096]
    m = step_memory(t, [1], 0)
    # peak 8192 allocated (16384 reserved), low 4096: 4096 bytes grow with the batch
    assert (m.peak_allocated_bytes, m.peak_reserved_bytes) == (8192, 16384)
    assert (m.persistent_bytes, m.batch_bytes) == (4096, 4096)


def test_memory_events_without_totals_leave_headroom_unknown(tmp_path):
    # older Kineto writes [memory] sizes without the allocator's totals: no headroom, no error
    t = _mem_trace(tmp_path, False)
    assert t.memory.height == 2
    assert step_memory(t, [1], 0) is None


def test_convolution_kernels_scale_like_gemms():
    """Convolution kernels (kind "convolution") grow with the batch by their fill, as GEMMs do,
    not by bytes with the elementwise kernels: on the ResNet step they are most of the GEMM-like
    time (before, only the classifier's few GEMMs were: under 5% of the kernel time)."""
    p = SAMPLES / "resnet_train-fp32.json.gz"
    if not p.exists():
        pytest.skip("sample traces missing")
    t = tracedx.load(p)
    d = tracedx.diagnose(t)
    bm = batch_model(t, d.steps, d.primary_device, d.op_table)
    assert float(bm.gemm[:, 0].sum()) > 0.3 * bm.kernel_us
