"""The estimate models' pieces, by hand on small built traces and step models."""

from __future__ import annotations

import math

import pytest
from tracebuilder import T0, TraceBuilder

import tracedx
from tracedx.analysis import findings as fx
from tracedx.analysis.diagnosis import autocast_cast_bytes, compile_region_host


def _load(b: TraceBuilder, tmp_path):
    return tracedx.load(b.write(tmp_path / "t.json"))


def test_autocast_casts_count_fp32_weights_of_forward_gemms(tmp_path):
    b = TraceBuilder()
    b.step(1, T0, 100)
    # linear(x [2, 4], W [8, 4], bias [8]) in fp32: W and bias are cast, each element 12 bytes
    # (4 read + 2 written forward, 2 read + 4 written for the gradient); x is not counted
    b.op("aten::linear", T0 + 1, 5, input_dims=[[2, 4], [8, 4], [8]], input_type=["float"] * 3)
    # a bf16 weight needs no cast; addmm and mm (inside linear, or backward) are not counted
    b.op(
        "aten::linear",
        T0 + 10,
        5,
        input_dims=[[2, 4], [8, 4], [8]],
        input_type=["c10::BFloat16"] * 3,
    )
    b.op("aten::addmm", T0 + 20, 5, input_dims=[[8], [2, 4], [4, 8]], input_type=["float"] * 3)
    # convolution(x, W [16, 3, 3, 3], no bias)
    b.op(
        "aten::convolution",
        T0 + 30,
        5,
        input_dims=[[1, 3, 8, 8], [16, 3, 3, 3], []],
        input_type=["float", "float", ""],
    )
    t = _load(b, tmp_path)
    assert autocast_cast_bytes(t, [1]) == 12 * (32 + 8) + 12 * 16 * 27


def test_compile_region_host_by_hand(tmp_path):
    b = TraceBuilder()
    b.step(1, T0, 200)
    b.launched_kernel("aten::mm", T0 + 10, 20, T0 + 15, 10)  # launches: stays
    b.op("aten::view", T0 + 40, 5)  # launches nothing, inside the model: goes
    # a backward node (autograd thread) whose child op launches a kernel: its own time
    # 30 - 12 = 18 us goes
    b.op("autograd::engine::evaluate_function: MulBackward0", T0 + 50, 30, tid=2)
    b.launched_kernel("aten::mul", T0 + 55, 12, T0 + 60, 5, tid=2)
    # AccumulateGrad writes .grad outside the compiled graph: stays
    b.op("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", T0 + 90, 6, tid=2)
    # the optimizer is outside the model: its window is neither Python nor traced away
    b.annotation("Optimizer.step#SGD.step", T0 + 120, 50)
    b.op("aten::item", T0 + 125, 4)
    t = _load(b, tmp_path)
    python, no_gpu, events = compile_region_host(t, [1])
    assert no_gpu == 5 + 18
    assert events == 2  # aten::view and the backward node
    # covered: mm [10, 30], view [40, 45], node [50, 80], acc [90, 96], optimizer [120, 170]
    assert python == 200 - (20 + 5 + 30 + 6 + 50)


def _model(**kw) -> fx.StepModel:
    base = dict(
        step_us=1000.0,
        mean_step_us=1000.0,
        busy_us=100.0,
        cpu_us=1000.0,
        sync_us=0.0,
        pageable_block_us=0.0,
        idle_us={},
        kernels=10.0,
        host_no_gpu_us=800.0,
        dataloader_us=800.0,
        graph_replays=0.0,
        per_kernel_host_us=20.0,
    )
    base.update(kw)
    return fx.StepModel(**base)


def test_dataloader_workers_by_hand():
    # host 1000 us of which the DataLoader 800: the rest of the step is 200 us; 8 workers make
    # a batch every 800 / 8 = 100 us, faster than that: the DataLoader is hidden, T' = 200
    f = fx.dataloader_workers(_model())
    assert f.estimated_speedup == pytest.approx(1000 / 200)
    # 2 workers: one every 400 us, the main thread waits 200 us more per step: T' = 400
    f2 = fx.dataloader_workers(_model(), workers=2)
    assert f2.estimated_speedup == pytest.approx(1000 / 400)
    assert any("needs ~4 workers" in e for e in f2.evidence)
    assert "2 workers (assumed, on 2 free cores)" in f2.derivation


def test_dataloader_workers_with_profiler_cost_by_hand():
    # traced 1000 us, unprofiled 600: 400 us of profiler cost over 100 events (4 us each), of
    # which 50 in the DataLoader: D = 800 - 200 = 600 us unprofiled, the rest 200 - 200 = 0
    m = _model(host_events=100.0, dataloader_events=50.0, tax_us=4.0, unprofiled_step_us=600.0)
    assert m.predict() == pytest.approx(600)
    # 8 workers: a batch every 75 us; the rest of the step is the GPU's 100 us: T' = 100
    f = fx.dataloader_workers(m)
    assert f.estimated_speedup == pytest.approx(600 / 100)
    # 4 workers: 150 us per batch on the main thread, over the GPU's 100: T' = 150
    assert fx.dataloader_workers(m, workers=4).estimated_speedup == pytest.approx(600 / 150)


def test_compile_traced_away_events_never_cost_more_than_their_time():
    # 30 us of ops that launch nothing, 20 events at 4 us of profiler cost each (80 us): only
    # their 30 us of traced time can go, not the 80 us of profiler cost the events would carry
    m = _model(
        dataloader_us=0.0,
        host_no_gpu_us=30.0,
        host_events=200.0,
        tax_us=4.0,
        unprofiled_step_us=200.0,
    )
    f = fx.torch_compile(m, 50.0, 10.0, 2.0, 1.0, 40.0, 0.0, 30.0, 20.0)
    h = m.host_us - 40 - 30 - m.tax_us * (200 - 2 * m.events_per_kernel - 30 / 4)
    assert f.estimated_speedup == pytest.approx(m.predict() / max(h, m.gpu_us - 10))
    assert math.isfinite(f.estimated_speedup)
