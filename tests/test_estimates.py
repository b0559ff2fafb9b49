"""The estimate models' pieces, by hand on small built traces and step models."""

from __future__ import annotations

import dataclasses

import pytest
from tracebuilder import T0, TraceBuilder

import tracedx
from tracedx.analysis import findings as fx
from tracedx.analysis.diagnosis import autocast_casts, compile_region_host
from tracedx.report.text import speedup_label


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
    # no backward in the step (inference): the forward cast only, 6 bytes per element
    # three operands cast (W and bias of the linear, W of the convolution): 3 cast kernels
    assert autocast_casts(t, [1]) == (6 * (32 + 8) + 6 * 16 * 27, 3)
    # a backward node in the step: the gradients are cast back too, 12 bytes per element
    b.op("autograd::engine::evaluate_function: AddmmBackward0", T0 + 50, 5, tid=2)
    t = tracedx.load(b.write(tmp_path / "train.json"))
    # and 3 more for the gradients
    assert autocast_casts(t, [1]) == (12 * (32 + 8) + 12 * 16 * 27, 6)


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


def test_dataloader_workers_overlap_the_main_threads_waits():
    # step 1100 us: host 1000 (DataLoader 800), GPU 100, E = 100 us of blocking waits. The
    # rest of the step is max(200, 100) + 100 = 300 us, during all of which the workers run:
    # 2 workers deliver a batch every 400 us, so T' = max(300, 400) = 400 (not 400 + E)
    m = _model(step_us=1100.0, mean_step_us=1100.0)
    assert m.serial_us == 100.0
    assert fx.dataloader_workers(m, workers=2).estimated_speedup == pytest.approx(1100 / 400)
    # 8 workers, one every 100 us: the rest of the step binds, T' = 300
    assert fx.dataloader_workers(m).estimated_speedup == pytest.approx(1100 / 300)


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


def test_profiled_events_cap_a_part_at_its_traced_time():
    m = _model(host_events=100.0, tax_us=4.0, unprofiled_step_us=600.0)
    # 30 us of traced time in 20 events: at 4 us each their cost would be 80 us; only 7.5
    # events' worth (30 us) is counted, so the part's unprofiled time is 0, not -50 us
    assert fx.profiled_events(m, 30.0, 20.0) == 7.5
    assert fx.host_change(m, 30.0, 20.0) == fx.Change(host_us=-30.0, host_events=-7.5)
    assert fx.host_change(m, 30.0, 20.0, sign=1.0) == fx.Change(host_us=30.0, host_events=7.5)
    # events costing less than their time are all counted; without a profiler cost, all are
    assert fx.profiled_events(m, 100.0, 20.0) == 20.0
    assert fx.profiled_events(_model(), 30.0, 20.0) == 20.0


def test_compile_removed_parts_never_cost_more_than_their_time():
    # host 1000 us traced in 200 events at 4 us of profiler cost: 200 us unprofiled; GPU 100
    m = _model(
        dataloader_us=0.0,
        host_no_gpu_us=30.0,
        host_events=200.0,
        events_per_kernel=2.0,
        tax_us=4.0,
        unprofiled_step_us=200.0,
    )
    assert m.predict() == pytest.approx(200)
    # chain 50 us saving 10 (G' = 90); 2 kernels fused away with 40 us of host time in 4 events
    # (16 us of profiler cost): 24 us goes; 30 us of ops that launch nothing in 20 events
    # (80 us of cost, capped at their 30): 0 goes. H' = 200 - 24 = 176
    f = fx.torch_compile(m, 50.0, 10.0, 2.0, 1.0, 40.0, 0.0, 30.0, 20.0)
    assert f.estimated_speedup == pytest.approx(200 / 176)
    # uncapped, removing the 20 events would add 50 us: T' = 226, no saving at all
    assert fx.apply(m, f.change) == pytest.approx(176)


def test_cuda_graphs_kept_host_work_is_never_negative():
    # 10 kernels on a nearly idle GPU (busy 1 us): host 1000 us traced, 100 events at 4 us of
    # profiler cost (600 us unprofiled). The ops that launch nothing stay: 30 us traced in 20
    # events, whose 80 us of cost is capped at their 30 (0 us unprofiled, not -50);
    # H' = 30 + 1.4 x 10 replay - 4 x (7.5 + 1) = 10 us; G' = 1 + 0.46 x 10 = 5.6 us
    m = _model(
        busy_us=1.0,
        dataloader_us=0.0,
        host_no_gpu_us=30.0,
        no_gpu_events=20.0,
        host_events=100.0,
        tax_us=4.0,
        unprofiled_step_us=600.0,
    )
    f = fx.cuda_graphs(m)
    assert fx.apply(m, f.change) == pytest.approx(10.0)
    assert f.estimated_speedup == pytest.approx(600 / 10)


def test_dataloader_removal_with_cheap_events_saves_nothing():
    # the DataLoader's 100 us traced holds 100 events at 4 us: all profiler cost. Taking it
    # off the main thread (workers already run, or pinned-memory's pin thread) saves 0 us
    # unprofiled, never adds 300
    m = _model(
        dataloader_us=100.0,
        host_no_gpu_us=100.0,
        dataloader_events=100.0,
        host_events=200.0,
        tax_us=4.0,
        unprofiled_step_us=200.0,
        dataloader_multiprocess=True,
    )
    w = fx.dataloader_workers(m)
    assert fx.apply(m, w.change) == pytest.approx(m.predict())
    p = fx.pinned_memory(m, 10.0, 1e6, 50.0, "test")
    both = fx.combined_change(m, [w, p])
    # the DataLoader is removed once: 100 us traced, 25 events (its 100 us of cost)
    assert (both.host_us, both.host_events) == pytest.approx((-100.0, -25.0))
    # a larger batch adds the DataLoader's time at its unprofiled cost, 0 here: per sample
    # the step halves
    lb = fx.larger_batch(m, 0.9, growth=lambda k: 1.0)
    assert lb.estimated_speedup == pytest.approx(2.0)


def test_pairs_steady_state_figures_are_the_measurements():
    """pairs.json's steady-state means and speedups are steady_state-h200.json's, recomputed."""
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "sample_traces"
    if not (root / "steady_state-h200.json").exists():
        pytest.skip("sample traces missing")
    runs = json.loads((root / "steady_state-h200.json").read_text())["dataloader"]
    means = {r["step_ms_mean"] for k, r in runs.items() if isinstance(r, dict) and "n" in r}
    checked = 0
    for p in json.loads((root / "pairs.json").read_text()):
        s = p.get("steady_state")
        if s is None:
            continue
        assert {s["before_mean_ms"], s["after_mean_ms"]} <= {round(m, 3) for m in means}
        assert s["speedup_of_means"] == round(s["before_mean_ms"] / s["after_mean_ms"], 2)
        checked += 1
    assert checked == 3


def _held_trace(b: TraceBuilder, held: tuple[float, ...]) -> None:
    """One 1000 us step: five ops each launching one 200 us kernel, the kernels back to back
    from T0 + 300 (each queued: kernel i starts 299 - d_i us after its launch returned, d_i its
    duration); the launch calls last ``held`` (us)."""
    b.step(1, T0, 1000)
    for i, dur in enumerate(held):
        ext = b.op("aten::mm", T0 + 200 * i, 150)
        corr = b.launch(T0 + 200 * i + 1, dur, ext=ext)
        b.kernel(T0 + 300 + 200 * i, 200, corr, ext=ext)


def test_launches_held_by_a_full_queue_are_not_host_time(tmp_path):
    # median launch 5 us; two calls held 105 and 55 us: 100 + 50 us beyond it, 15% of the step,
    # their kernels queued 194 and 244 us after they returned (longer than they were held)
    b = TraceBuilder()
    _held_trace(b, (5, 5, 5, 105, 55))
    d = tracedx.diagnose(_load(b, tmp_path))
    m = d.model
    assert m.launch_held_us == 150.0
    assert m.host_us == m.cpu_us - 150.0
    assert not m.tax_assumed and m.tax_us == 0.0  # no unprofiled timing: nothing assumed
    assert any("launch calls waited 0.150 ms per step" in n for n in d.notes)
    # under 5% of the step (one call held 45 us beyond the median): a slow call, not counted
    b = TraceBuilder()
    _held_trace(b, (5, 5, 5, 50, 5))
    m = tracedx.diagnose(tracedx.load(b.write(tmp_path / "few.json"))).model
    assert m.launch_held_us == 0.0 and m.host_us == m.cpu_us
    # a slow call whose kernel starts soon after it returns (a first launch loading its module,
    # not a full queue): 250 us held, its kernel 44 us after: not counted
    b = TraceBuilder()
    _held_trace(b, (5, 5, 5, 255, 5))
    m = tracedx.diagnose(tracedx.load(b.write(tmp_path / "slow.json"))).model
    assert m.launch_held_us == 0.0


def test_profiler_cost_is_assumed_when_the_gpu_holds_the_host(tmp_path):
    from tracedx.analysis.diagnosis import TAX_ASSUMED_US

    b = TraceBuilder()
    _held_trace(b, (5, 5, 5, 105, 55))
    b.top["tracedx"] = {"unprofiled_step_ms": {"median": 1.0, "min": 1.0, "max": 1.0, "n": 5}}
    d = tracedx.diagnose(_load(b, tmp_path))
    m = d.model
    # the traced and unprofiled steps are both the GPU's (1.0 ms): the cost is assumed
    assert m.tax_assumed and m.tax_us == TAX_ASSUMED_US == 3.6
    assert any("assumed, not solved" in n for n in d.notes)


def test_faster_math_launches_the_kernels_it_adds_by_hand():
    # a GPU-bound step: GPU 900 us (busy), host 500 us in 100 events at a profiler cost of 2 us
    # each (300 us unprofiled); 10 kernels at 20 us of traced host time and 4 events each
    m = _model(
        step_us=900.0,
        mean_step_us=900.0,
        busy_us=900.0,
        cpu_us=500.0,
        host_no_gpu_us=0.0,
        dataloader_us=0.0,
        host_events=100.0,
        events_per_kernel=4.0,
        tax_us=2.0,
        unprofiled_step_us=900.0,
    )
    assert m.predict() == pytest.approx(900)
    # 800 us of GEMMs made 8x faster: G' = 900 - 700 = 200, the host's 300 binds: T' = 300
    plain = fx.faster_math(m, "bf16-autocast", "t", 800.0, 100.0, "d", [])
    assert plain.estimated_speedup == pytest.approx(900 / 300)
    # and 5 cast kernels added: host + 5 x 20 us traced, + 5 x 4 events' 2 us of cost each:
    # H' = 300 + 100 - 40 = 360 unprofiled: T' = 360
    cast = fx.faster_math(m, "bf16-autocast", "t", 800.0, 100.0, "d", [], added_kernels=5.0)
    assert cast.estimated_speedup == pytest.approx(900 / 360)
    # without a host time per kernel the casts cost the host nothing known: as without them
    none = fx.faster_math(
        dataclasses.replace(m, per_kernel_host_us=None),
        "bf16-autocast",
        "t",
        800.0,
        100.0,
        "d",
        [],
        added_kernels=5.0,
    )
    assert none.estimated_speedup == pytest.approx(900 / 300)


def test_a_predicted_slowdown_is_said_not_just_clamped():
    # host-bound: host 1000 us binds, GPU 100 us busy; 10 GEMM-side us saved on the GPU is
    # nothing, and 5 added kernels at 20 us of host time each make the host 1100 us: the model
    # predicts 1000 / 1100 = 0.91x, clamped to 1.00x and said in the evidence
    m = _model(host_no_gpu_us=0.0, dataloader_us=0.0)
    f = fx.faster_math(m, "bf16-autocast", "t", 50.0, 40.0, "d", [], added_kernels=5.0)
    assert f.estimated_speedup == 1.0
    assert (
        f.evidence[-1]
        == "the model predicts a slowdown (0.91x: the step 10% longer), shown as 1.00x"
    )
    # and every report's label says it, not only the JSON evidence
    assert f.unclamped_speedup == pytest.approx(1000 / 1100)
    assert f.to_dict()["unclamped_speedup"] == 0.909
    assert speedup_label(f.to_dict()) == "1.00x (the model predicts 0.91x, a slowdown)"
    # without the casts nothing is slower: no such line
    g = fx.faster_math(m, "bf16-autocast", "t", 50.0, 40.0, "d", [])
    assert g.estimated_speedup == 1.0
    assert not any("slowdown" in e for e in g.evidence)
    assert g.unclamped_speedup is None
    assert speedup_label(g.to_dict()) == "1.00x"
