"""Issue 2: the reader on hand-made traces. Every expected number is worked out in a comment.

Times are microseconds after ``T0`` (5,000,000 us). The main trace, two steps:

    host thread 4242                              GPU 0
    ProfilerStep#1 [0,100)                         stream 7            stream 8
      aten::copy_ [2,22)  cudaMemcpyAsync @4 (12)  memcpy HtoD [10,30)
      aten::zero_ [30,40) cudaMemsetAsync @32 (5)  memset      [40,44)
      aten::linear [44,74)
        aten::mm [45,70)  cudaLaunchKernel @50 (8) gemm        [60,90)
      aten::add [75,85)   cudaLaunchKernel @76 (4)                     add [80,95)
      aten::relu [86,96)  cuLaunchKernelEx @88 (4) triton      [97,99)
                          (cuda_driver, no External id)
    autograd thread 4343
      aten::mm [62,72)    cudaLaunchKernel @64 (4) bwd gemm    [90,96)
    gpu_user_annotation ProfilerStep#1 [10,90) on stream 7 (covers only the main thread's work)

    ProfilerStep#2 [100,200)
      aten::mm [105,115)  cudaLaunchKernel @106 (5) gemm       [120,160)
      aten::item [150,190)
        aten::_local_scalar_dense [151,189)
                          cudaMemcpyAsync @152 (30) memcpy DtoH 4 B [170,172)
                          cudaStreamSynchronize @183 (5)
                          cuda_sync event [175,182) on stream 7 (waiting, not work)
"""

from __future__ import annotations

import gzip
import json

import polars as pl
import pytest

import tracedx
from tests.tracebuilder import T0, TraceBuilder
from tracedx.analysis.diagnosis import diagnose
from tracedx.analysis.timeline import idle_by_cause, idle_gaps, step_windows, sync_calls
from tracedx.report import render

BWD = 4343  # the autograd (backward) thread


def main_trace(**kw) -> TraceBuilder:
    b = TraceBuilder(**kw)
    b.meta(b.pid, BWD, "autograd thread")
    b.top |= {
        "cuda_runtime_version": 12040,
        "cuda_driver_version": 12080,
        "distributedInfo": {"backend": "nccl", "rank": 1, "world_size": 2},
    }
    b.step(1, T0, 100)
    b.step(2, T0 + 100, 100)
    # step 1
    e = b.op("aten::copy_", T0 + 2, 20)
    c = b.launch(T0 + 4, 12, "cudaMemcpyAsync", ext=e)
    b.memcpy(T0 + 10, 20, c, 1_048_576, ext=e)
    e = b.op("aten::zero_", T0 + 30, 10)
    c = b.launch(T0 + 32, 5, "cudaMemsetAsync", ext=e)
    b.memset(T0 + 40, 4, c, 65_536, ext=e)
    b.op("aten::linear", T0 + 44, 30)
    e = b.op(
        "aten::mm", T0 + 45, 25, input_dims=[[256, 512], [512, 1024]], input_type=["float", "float"]
    )
    c = b.launch(T0 + 50, 8, ext=e)
    b.kernel(T0 + 60, 30, c, "ampere_sgemm_128x64_nn", ext=e, grid=[8, 16, 1], block=[128, 1, 1])
    e = b.op("aten::add", T0 + 75, 10)
    c = b.launch(T0 + 76, 4, ext=e)
    b.kernel(T0 + 80, 15, c, "vectorized_elementwise_kernel_add", stream=8, ext=e)
    b.op("aten::relu", T0 + 86, 10)
    c = b.driver_launch(T0 + 88, 4)
    b.kernel(T0 + 97, 2, c, "triton_poi_fused_relu_0")
    e = b.op("aten::mm", T0 + 62, 10, tid=BWD)
    c = b.launch(T0 + 64, 4, ext=e, tid=BWD)
    b.kernel(T0 + 90, 6, c, "sm90_gemm_bwd", ext=e)
    b.gpu_annotation("ProfilerStep#1", T0 + 10, 80)
    # step 2
    e = b.op("aten::mm", T0 + 105, 10)
    c = b.launch(T0 + 106, 5, ext=e)
    b.kernel(T0 + 120, 40, c, "ampere_sgemm_128x64_nn", ext=e)
    b.op("aten::item", T0 + 150, 40)
    e = b.op("aten::_local_scalar_dense", T0 + 151, 38)
    c = b.launch(T0 + 152, 30, "cudaMemcpyAsync", ext=e)
    b.memcpy(T0 + 170, 2, c, 4, "DtoH", "Device", "Pageable", ext=e)
    c = b.sync(T0 + 183, 5, ext=e)
    b.cuda_sync(T0 + 175, 7, c)
    return b


@pytest.fixture
def trace(tmp_path):
    return tracedx.load(main_trace().write(tmp_path / "main.json"))


def rel(xs):
    """Absolute trace timestamps -> offsets from T0 (exact: all values are integers here)."""
    return [None if x is None else x - T0 for x in xs]


# --- tables, dtypes, units -------------------------------------------------------------------
def test_tables_have_explicit_dtypes_and_unit_named_columns(trace):
    k = trace.kernels
    for c, dt in {
        "device": pl.Int64,
        "stream": pl.Int64,
        "start_us": pl.Float64,
        "end_us": pl.Float64,
        "duration_us": pl.Float64,
        "name": pl.Utf8,
        "correlation": pl.Int64,
        "grid_x": pl.Int64,
        "block_x": pl.Int64,
        "shared_memory_bytes": pl.Int64,
        "step": pl.Int64,
    }.items():
        assert k.schema[c] == dt, c
    assert trace.memcpys.schema["bytes"] == pl.Int64
    assert trace.memsets.schema["bytes"] == pl.Int64
    assert trace.launches.schema["correlation"] == pl.Int64
    assert trace.ops.schema["input_shapes"] == pl.List(pl.List(pl.Int64))
    assert trace.ops.schema["input_dtypes"] == pl.List(pl.Utf8)
    assert trace.steps.schema["duration_us"] == pl.Float64
    for t in (trace.kernels, trace.memcpys, trace.memsets, trace.launches, trace.ops):
        timeish = [c for c in t.columns if "start" in c or "end" in c or "duration" in c]
        assert timeish and all(c.endswith("_us") for c in timeish), timeish


def test_table_sizes(trace):
    # kernels: gemm, add, triton, bwd gemm (step 1) + gemm (step 2) = 5
    assert trace.kernels.height == 5
    assert trace.memcpys.height == 2  # HtoD 1 MiB, DtoH 4 B
    assert trace.memsets.height == 1
    # launches: memcpy, memset, 3 x cudaLaunchKernel, cuLaunchKernelEx (step 1); launch,
    # memcpy, synchronize (step 2) = 9
    assert trace.launches.height == 9
    # ops: copy_, zero_, linear, mm, add, relu, bwd mm, mm, item, _local_scalar_dense = 10
    assert trace.ops.height == 10
    assert trace.steps["step"].to_list() == [1, 2]
    assert not trace.steps_synthetic
    # annotations: 2 host ProfilerSteps + 1 GPU copy
    assert sorted(trace.annotations["category"].to_list()) == [
        "gpu_user_annotation",
        "user_annotation",
        "user_annotation",
    ]
    assert trace.syncs.height == 1  # the cuda_sync event


def test_kernel_columns_values(trace):
    g = (
        trace.kernels.filter(pl.col("name") == "ampere_sgemm_128x64_nn")
        .sort("start_us")
        .row(0, named=True)
    )
    assert (g["device"], g["stream"]) == (0, 7)
    assert g["start_us"] - T0 == 60 and g["end_us"] - T0 == 90 and g["duration_us"] == 30
    assert (g["grid_x"], g["grid_y"], g["grid_z"]) == (8, 16, 1)
    assert (g["block_x"], g["block_y"], g["block_z"]) == (128, 1, 1)
    m = trace.memcpys.sort("start_us")
    assert m["direction"].to_list() == ["HtoD", "DtoH"]
    assert m["src_memory"].to_list() == ["Pageable", "Device"]
    assert m["dst_memory"].to_list() == ["Device", "Pageable"]
    assert m["bytes"].to_list() == [1_048_576, 4]
    assert trace.memsets["bytes"].to_list() == [65_536]


def test_ops_shapes_tree_and_steps(trace):
    mm = trace.ops.filter((pl.col("name") == "aten::mm") & (pl.col("tid") == 4242)).sort("start_us")
    first = mm.row(0, named=True)
    assert first["input_shapes"] == [[256, 512], [512, 1024]]
    assert first["input_dtypes"] == ["float", "float"]
    linear = trace.ops.filter(pl.col("name") == "aten::linear").row(0, named=True)
    assert first["parent_id"] == linear["op_id"] and first["depth"] == 1
    assert linear["parent_id"] is None
    lsd = trace.ops.filter(pl.col("name") == "aten::_local_scalar_dense").row(0, named=True)
    item = trace.ops.filter(pl.col("name") == "aten::item").row(0, named=True)
    assert lsd["parent_id"] == item["op_id"]
    # op step = step whose host window holds the op start
    by = dict(zip(rel(trace.ops["start_us"].to_list()), trace.ops["step"].to_list(), strict=True))
    assert by[2] == 1 and by[62] == 1 and by[105] == 2 and by[151] == 2


def test_metadata(trace):
    md = trace.metadata
    assert md["cuda_runtime_version"] == 12040 and md["cuda_driver_version"] == 12080
    assert md["rank"] == 1 and md["world_size"] == 2
    assert trace.device_name == "NVIDIA H100 80GB HBM3"
    assert trace.devices == [0]


# --- linking ---------------------------------------------------------------------------------
def test_link_kernel_launch_op_step(trace):
    k = trace.kernels.sort("start_us")
    assert rel(k["start_us"].to_list()) == [60, 80, 90, 97, 120]
    assert k["launch_name"].to_list() == [
        "cudaLaunchKernel",
        "cudaLaunchKernel",
        "cudaLaunchKernel",
        "cuLaunchKernelEx",
        "cudaLaunchKernel",
    ]
    assert rel(k["launch_start_us"].to_list()) == [50, 76, 64, 88, 106]
    # innermost op: aten::mm (not its parent aten::linear), by External id
    assert k["op_name"].to_list() == ["aten::mm", "aten::add", "aten::mm", "aten::relu", "aten::mm"]
    assert k["top_op_name"].to_list()[0] == "aten::linear"
    # the backward kernel: launched from thread 4343 at t+64, inside step 1's host window
    # [0,100), although it runs at [90,96), outside the GPU copy of ProfilerStep#1 [10,90)
    assert k["launch_tid"].to_list() == [4242, 4242, BWD, 4242, 4242]
    assert k["step"].to_list() == [1, 1, 1, 1, 2]


def test_driver_launch_without_external_id_linked_by_time(trace):
    la = trace.launches.filter(pl.col("name") == "cuLaunchKernelEx").row(0, named=True)
    assert la["external_id"] is None and la["category"] == "cuda_driver"
    relu = trace.ops.filter(pl.col("name") == "aten::relu").row(0, named=True)
    # cuLaunchKernelEx at t+88 lies in aten::relu [86,96) on the same thread: that op
    assert la["op_id"] == relu["op_id"]
    assert la["api_kind"] == "kernel"


def test_memcpy_memset_linked_to_their_ops(trace):
    m = trace.memcpys.sort("start_us")
    assert m["op_name"].to_list() == ["aten::copy_", "aten::_local_scalar_dense"]
    assert m["top_op_name"].to_list() == ["aten::copy_", "aten::item"]
    assert m["step"].to_list() == [1, 2]
    assert trace.memsets["op_name"].to_list() == ["aten::zero_"]


def test_api_kinds(trace):
    kinds = dict(
        zip(trace.launches["name"].to_list(), trace.launches["api_kind"].to_list(), strict=False)
    )
    assert kinds == {
        "cudaMemcpyAsync": "memcpy",
        "cudaMemsetAsync": "memset",
        "cudaLaunchKernel": "kernel",
        "cuLaunchKernelEx": "kernel",
        "cudaStreamSynchronize": "sync",
    }


def test_no_data_quality_warnings_on_a_clean_trace(trace):
    assert trace.warnings == []


# --- per-step numbers (GUIDE.md 2.3) ---------------------------------------------------------
def test_step_windows_by_hand(trace):
    w = step_windows(trace).sort("step")
    s1, s2 = w.rows(named=True)
    # step 1: CPU window [0,100) = 100. GPU window: first GPU event of step 1 (memcpy at 10)
    # to the first GPU event of step 2 (gemm at 120) = 110. Step 2: CPU 100, GPU 52 (below).
    # The CPU windows add up to more (200 > 162): the host binds, every step is measured over
    # its CPU window (one choice for all steps, so the windows tile the timeline).
    assert s1["cpu_time_us"] == 100
    assert (s1["gpu_start_us"] - T0, s1["gpu_end_us"] - T0) == (10, 120)
    assert s1["gpu_window_us"] == 110 and s1["step_time_us"] == 100
    # busy = union over both streams: [10,30) 20 + [40,44) 4 + [60,96) 36 (gemm [60,90),
    # add [80,95) on stream 8, bwd [90,96)) + [97,99) 2 = 62. The plain sum would be
    # 20 + 4 + 30 + 15 + 6 + 2 = 77.
    assert s1["gpu_busy_us"] == 62
    assert s1["idle_us"] == 100 - 62 == 38
    assert s1["idle_fraction"] == pytest.approx(38 / 100)
    assert (s1["kernels"], s1["memcpys"], s1["memsets"]) == (4, 1, 1)
    assert s1["memcpy_bytes"] == 1_048_576 and s1["memcpy_us"] == 20
    # step 2: CPU [100,200) = 100. GPU window: the gemm at 120 to the end of the step's last
    # GPU event (the DtoH copy ends at 172) = 52. Step time = its CPU window, 100.
    assert s2["cpu_time_us"] == 100
    assert (s2["gpu_start_us"] - T0, s2["gpu_end_us"] - T0) == (120, 172)
    assert s2["gpu_window_us"] == 52 and s2["step_time_us"] == 100 and s2["overlap_prev_us"] == 0
    # busy: gemm [120,160) 40 + memcpy [170,172) 2 = 42; the cuda_sync [175,182) is waiting.
    assert s2["gpu_busy_us"] == 42
    assert s2["idle_fraction"] == pytest.approx(58 / 100)
    assert (s2["kernels"], s2["memcpys"], s2["memsets"]) == (1, 1, 0)


def test_hidden_host_sync_counted_as_sync_time(trace):
    """GUIDE 2.6: aten::item -> _local_scalar_dense -> cudaMemcpyAsync + cudaStreamSynchronize."""
    sc = sync_calls(trace).sort("start_us")
    assert sc["name"].to_list() == ["cudaMemcpyAsync", "cudaMemcpyAsync", "cudaStreamSynchronize"]
    assert sc["blocking_reason"].to_list() == ["pageable memcpy", "synchronous copy", "synchronize"]
    w = step_windows(trace).sort("step")
    # step 1: the 1 MiB pageable HtoD copy blocks the host 12 us; step 2: 30 + 5 = 35 us.
    assert w["sync_us"].to_list() == [12, 35]


def test_idle_gaps_add_up_and_have_causes(trace):
    w = step_windows(trace)
    g = idle_gaps(trace, w).sort("start_us")
    # step 1 window [0,100), busy [10,30) [40,44) [60,96) [97,99):
    # gaps [0,10) 10, [30,40) 10, [44,60) 16, [96,97) 1, [99,100) 1 = 38.
    # step 2 window [100,200), busy [120,160) [170,172):
    # gaps [100,120) 20, [160,170) 10, [172,200) 28 = 58.
    assert [(a - T0, b - T0) for a, b in g.select("start_us", "end_us").rows()] == [
        (0, 10),
        (30, 40),
        (44, 60),
        (96, 97),
        (99, 100),
        (100, 120),
        (160, 170),
        (172, 200),
    ]
    by = idle_by_cause(g).group_by("step").agg(pl.col("idle_us").sum()).sort("step")
    assert by["idle_us"].to_list() == [38, 58]
    causes = dict(zip(rel(g["start_us"].to_list()), g["cause"].to_list(), strict=False))
    # [96,97): the triton kernel was launched at 88, before the gap: queued GPU-side work
    assert causes[96] == "kernel wait"
    # [172,200): after the .item() copy: the host was in cudaStreamSynchronize (returns at 188)
    assert causes[172] == "host sync"


# --- GUIDE.md section 2, one test per trap ---------------------------------------------------
def test_trap1_cpu_runs_ahead_of_gpu(tmp_path):
    """CPU step 0.2 ms, GPU step 5.5 ms: the step time is the GPU window and busy ~100 %."""
    b = TraceBuilder()
    # A kernel queued during warm-up (its launch predates the trace) runs first: [5,20).
    b.kernel(T0 + 5, 15, None, "warmup_gemm")
    gstart = T0 + 20
    for i in range(3):
        s = T0 + 200 * i
        b.step(i + 1, s, 200)
        b.launched_kernel("aten::mm", s + 10, 20, gstart + 5500 * i, 5500)
    t = tracedx.load(b.write(tmp_path / "ahead.json"))
    w = step_windows(t).sort("step")
    # GPU windows: [20,5520), [5520,11020), [11020,16520) (last: end of its kernel)
    assert rel(w["gpu_start_us"].to_list()) == [20, 5520, 11020]
    assert w["cpu_time_us"].to_list() == [200, 200, 200]
    assert w["step_time_us"].to_list() == [5500, 5500, 5500]  # max(200, 5500)
    assert w["gpu_busy_us"].to_list() == [5500, 5500, 5500]
    assert w["idle_fraction"].to_list() == [0, 0, 0]
    # The naive reading: busy inside the CPU windows [0,600) is 15 + 580 = 595 of 600 here,
    # but over the trace span [5,16520) the kernels are busy 15 + 16500 = 16515 of 16515:
    # either way never "73 % idle". The unattributed warm-up kernel is reported, not lost.
    assert {x.kind for x in t.warnings} == {"unattributed_gpu"}
    d = diagnose(t)
    assert d.summary["devices"]["0"]["idle_fraction"]["median"] == 0
    assert d.regime != "overhead-bound"


def test_trap2_gpu_user_annotation_not_used_for_steps(trace):
    # The GPU copy of ProfilerStep#1 ends at 90: the bwd kernel [90,96) and the triton kernel
    # [97,99) lie after it and still belong to step 1 (by their launches' host time).
    ann = trace.annotations.filter(pl.col("category") == "gpu_user_annotation").row(0, named=True)
    assert ann["end_us"] - T0 == 90
    late = trace.kernels.filter(pl.col("start_us") >= ann["end_us"]).filter(pl.col("step") == 1)
    assert late.height == 2
    assert trace.steps.height == 2  # the GPU annotation is not a step


def test_trap3_backward_thread_kernel_lands_in_step(trace):
    bwd = trace.kernels.filter(pl.col("launch_tid") == BWD)
    assert bwd["step"].to_list() == [1]
    # not the launching thread's own op table row for thread 4242
    assert trace.ops.filter(pl.col("op_id") == bwd["op_id"][0])["tid"].to_list() == [BWD]


def test_trap4_busy_is_a_union_not_a_sum(trace):
    w = step_windows(trace).sort("step")
    k1 = trace.gpu_activity().filter(pl.col("step") == 1)
    assert k1["duration_us"].sum() == 77  # 20 + 4 + 30 + 15 + 6 + 2
    assert w["gpu_busy_us"][0] == 62  # the union


def test_trap5_one_graph_launch_many_kernels(tmp_path):
    b = TraceBuilder()
    b.step(1, T0, 300)
    # 1 cudaGraphLaunch (host 15 us) -> 4 kernels back to back [30,140), same correlation
    e = b.op("cuda_graph_replay", T0 + 8, 20)
    b.graph_launch(
        T0 + 10, 15, [(T0 + 30, 20), (T0 + 50, 30), (T0 + 80, 40), (T0 + 120, 20)], ext=e
    )
    b.launched_kernel("aten::add", T0 + 180, 10, T0 + 200, 10, kname="add_kernel")
    t = tracedx.load(b.write(tmp_path / "graph.json"))
    assert t.kernels.height == 5 and t.launches.height == 2
    assert t.kernels["launch_name"].null_count() == 0
    g = t.kernels.filter(pl.col("launch_name") == "cudaGraphLaunch")
    assert g.height == 4 and g["correlation"].n_unique() == 1
    assert g["op_name"].unique().to_list() == ["cuda_graph_replay"]
    assert t.warnings == []  # not orphans, not duplicates
    w = step_windows(t).row(0, named=True)
    # busy 20+30+40+20 (contiguous [30,140)) + 10 = 120; CPU window 300 > GPU [30,210) = 180
    assert w["kernels"] == 5 and w["gpu_busy_us"] == 120 and w["step_time_us"] == 300
    assert w["idle_fraction"] == pytest.approx(0.6)
    d = diagnose(t)
    assert "cuda-graphs" not in {f.fix for f in d.findings}  # already replaying a graph


def test_trap5_graph_of_394_kernels(tmp_path):
    """GUIDE 2.5: one cudaGraphLaunch for 394 kernels, all attributed to the step."""
    b = TraceBuilder()
    b.step(1, T0, 1000)
    ks = [(T0 + 100 + 2 * i, 2) for i in range(394)]  # back to back: [100, 888)
    b.graph_launch(T0 + 10, 680, ks)
    t = tracedx.load(b.write(tmp_path / "graph394.json"))
    w = step_windows(t).row(0, named=True)
    assert w["kernels"] == 394
    assert w["gpu_busy_us"] == 394 * 2 == 788
    assert t.warnings == []


def test_trap6_cuda_sync_events_never_busy(tmp_path):
    b = TraceBuilder()
    b.step(1, T0, 100)
    c = b.launched_kernel("aten::mm", T0 + 5, 10, T0 + 10, 20)
    b.sync(T0 + 20, 15)
    # a cuda_sync span on the GPU track covering [30,60): no work runs there
    b.cuda_sync(T0 + 30, 30, c)
    t = tracedx.load(b.write(tmp_path / "sync.json"))
    w = step_windows(t).row(0, named=True)
    assert t.syncs.height == 1
    assert w["gpu_busy_us"] == 20  # the kernel only, not 20 + 30
    assert w["sync_us"] == 15


def test_trap7_report_says_the_profiler_slows_the_host(trace):
    out = render(diagnose(trace), "text")
    assert "profiler slows the host" in out


def _overhead_bound_fp32(tmp_path, n_kernels=20):
    """A host-bound step: 20 fp32 GEMMs of 2 us each, each op 40 us on the host.

    Step 1 [0, 1000): ops at 10 + 45 i (40 us), kernel 2 us after launch (+1 +3).
    CPU window 1000; GPU busy 20 x 2 = 40 us: idle 96 %.
    """
    b = TraceBuilder()
    b.step(1, T0, 1000)
    for i in range(n_kernels):
        s = T0 + 10 + 45 * i
        ext = b.op(
            "aten::mm", s, 40, input_dims=[[64, 64], [64, 64]], input_type=["float", "float"]
        )
        corr = b.launch(s + 1, 3, ext=ext)
        b.kernel(s + 6, 2, corr, "ampere_sgemm_32x32_nn", ext=ext)
    return tracedx.load(b.write(tmp_path / "overhead.json"))


def test_trap8_faster_math_is_worth_nothing_when_overhead_bound(tmp_path):
    t = _overhead_bound_fp32(tmp_path)
    w = step_windows(t).row(0, named=True)
    assert w["gpu_busy_us"] == 40 and w["step_time_us"] == 1000
    d = diagnose(t)
    assert d.regime == "overhead-bound"
    math = {f.fix: f for f in d.findings if f.fix in ("bf16-autocast", "tf32")}
    assert set(math) == {"bf16-autocast", "tf32"}  # considered (fp32 GEMMs are there) ...
    for f in math.values():
        # ... and worth nothing: faster GEMMs shave at most 40 us of GPU time off a 1000 us
        # step whose host is busy the whole time, so the step does not get shorter
        assert f.estimated_speedup < 1.05 and not f.recommended


def test_trap8_removing_a_sync_is_worth_nothing_when_launches_bind(tmp_path):
    """.item() every step on small tensors: the host is busy launching anyway."""
    b = TraceBuilder()
    b.step(1, T0, 1000)
    for i in range(20):
        s = T0 + 10 + 45 * i
        b.launched_kernel("aten::add", s, 40, s + 6, 2, kname="vectorized_elementwise_kernel")
    # the .item() at the end: a 4-byte DtoH copy; the GPU is long idle, the host waits 2 us
    b.op("aten::item", T0 + 920, 30)
    e = b.op("aten::_local_scalar_dense", T0 + 921, 28)
    c = b.launch(T0 + 922, 4, "cudaMemcpyAsync", ext=e)
    b.memcpy(T0 + 923, 1, c, 4, "DtoH", "Device", "Pageable", ext=e)
    b.sync(T0 + 927, 2, ext=e)
    t = tracedx.load(b.write(tmp_path / "itemloop.json"))
    assert step_windows(t)["sync_us"].to_list() == [6]  # 4 (small DtoH copy) + 2 (sync)
    d = diagnose(t)
    f = {x.fix: x for x in d.findings}
    assert "remove-host-sync" in f
    assert f["remove-host-sync"].estimated_speedup < 1.05
    assert not f["remove-host-sync"].recommended


# --- no ProfilerStep ---------------------------------------------------------------------------
def test_no_profiler_step_is_one_synthetic_step_and_said(tmp_path):
    b = TraceBuilder()
    # ops [10,40) and [50,90); kernels [20,50) and [70,100); span [10,100) = 90
    b.launched_kernel("aten::mm", T0 + 10, 30, T0 + 20, 30)
    b.launched_kernel("aten::relu", T0 + 50, 40, T0 + 70, 30)
    t = tracedx.load(b.write(tmp_path / "nostep.json"))
    assert t.steps_synthetic and t.steps.height == 1
    st = t.steps.row(0, named=True)
    assert (st["start_us"] - T0, st["end_us"] - T0, st["duration_us"]) == (10, 100, 90)
    w = step_windows(t).row(0, named=True)
    # busy 30 + 30 = 60 of a 90 us span; both kernels counted in the one step
    assert w["gpu_busy_us"] == 60 and w["step_time_us"] == 90 and w["kernels"] == 2
    d = diagnose(t)
    assert any("no ProfilerStep markers" in n for n in d.notes)
    assert "no ProfilerStep markers" in render(d, "text")
    assert json.loads(render(d, "json"))["steps"]["synthetic"] is True


# --- field-name variants, same timeline --------------------------------------------------------
EXPECTED_WINDOWS = {
    # step: (cpu_time, gpu_window, step_time, busy, kernels, memcpys, memsets, sync_us)
    # CPU windows add up to 200, GPU windows to 110 + 52 = 162: both steps are measured over
    # their CPU windows [0,100) and [100,200) (busy 62 and 42, see test_step_windows_by_hand)
    1: (100, 110, 100, 62, 4, 1, 1, 12),
    2: (100, 52, 100, 42, 1, 1, 0, 35),
}


def _windows(t):
    w = step_windows(t).sort("step")
    cols = [
        "cpu_time_us",
        "gpu_window_us",
        "step_time_us",
        "gpu_busy_us",
        "kernels",
        "memcpys",
        "memsets",
        "sync_us",
    ]
    return {r[0]: tuple(r[1:]) for r in w.select("step", *cols).rows()}


@pytest.mark.parametrize(
    "variant",
    [
        {},
        {"legacy": True},  # Kernel/Memcpy/Memset/Runtime/Operator, `external id`, "stream 7"
        {"hip": True},  # hipLaunchKernel, hipMemcpyAsync, hipStreamSynchronize, ...
        {"flows": False},  # no ac2g flows at all
        {"ts_as_string": True},  # "ts": "5000010.0"
    ],
    ids=["modern", "legacy", "hip", "noflows", "ts-string"],
)
def test_variants_give_the_same_numbers(tmp_path, variant):
    b = main_trace(**variant)
    t = tracedx.load(b.write(tmp_path / "v.json"))
    assert _windows(t) == EXPECTED_WINDOWS
    k = t.kernels.sort("start_us")
    assert k["op_name"].to_list() == ["aten::mm", "aten::add", "aten::mm", "aten::relu", "aten::mm"]
    assert k["step"].to_list() == [1, 1, 1, 1, 2]
    assert k["launch_name"].null_count() == 0
    assert not [w for w in t.warnings if w.kind != "not_nested"]


def test_legacy_variant_shape(tmp_path):
    b = main_trace(legacy=True)
    raw = b.to_dict()["traceEvents"]
    cats = {e.get("cat") for e in raw}
    assert {"Kernel", "Memcpy", "Memset", "Runtime", "Operator"} <= cats
    assert any(e.get("tid") == "stream 7" for e in raw)
    assert any("external id" in (e.get("args") or {}) for e in raw)
    t = tracedx.load(b.write(tmp_path / "legacy.json"))
    assert t.kernels["stream"].unique().sort().to_list() == [7, 8]
    assert t.kernels["external_id"].null_count() == 1  # only the cuLaunchKernelEx kernel


def test_hip_variant_names(tmp_path):
    b = main_trace(hip=True)
    # an AMD launch through the module API, as in ROCm traces
    b.step(3, T0 + 200, 100)
    e = b.op("aten::mm", T0 + 205, 20)
    c = b.launch(T0 + 206, 5, "hipExtModuleLaunchKernel", ext=e)
    b.kernel(T0 + 215, 10, c, "Cijk_Alik_Bljk_SB_MT64x64", ext=e)
    t = tracedx.load(b.write(tmp_path / "hip.json"))
    names = set(t.launches["name"].to_list())
    assert {
        "hipLaunchKernel",
        "hipMemcpyAsync",
        "hipMemsetAsync",
        "hipStreamSynchronize",
        "hipExtModuleLaunchKernel",
    } <= names
    kinds = dict(zip(t.launches["name"].to_list(), t.launches["api_kind"].to_list(), strict=False))
    assert kinds["hipLaunchKernel"] == kinds["hipExtModuleLaunchKernel"] == "kernel"
    assert kinds["hipStreamSynchronize"] == "sync" and kinds["hipMemcpyAsync"] == "memcpy"
    w = step_windows(t).sort("step")
    assert w.filter(pl.col("step") == 3)["kernels"].to_list() == [1]
    # sync time on HIP: hipMemcpyAsync (4-byte DtoH into pageable memory) 30 + hipStreamSynchronize 5
    assert w.filter(pl.col("step") == 2)["sync_us"].to_list() == [35]


def test_ts_as_float_string_and_int_pid_strings(tmp_path):
    b = TraceBuilder()
    b.add({"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#4", "pid": "4242",
           "tid": "4242", "ts": "1365627865398.728", "dur": "100"})  # fmt: skip
    b.add({"ph": "X", "cat": "kernel", "name": "k", "pid": "0", "tid": "stream 7",
           "ts": "1365627865410.728", "dur": "25.5", "args": {"device": 0, "stream": 7}})  # fmt: skip
    t = tracedx.load(b.write(tmp_path / "s.json"))
    assert t.steps["step"].to_list() == [4]
    k = t.kernels.row(0, named=True)
    assert k["start_us"] == pytest.approx(1365627865410.728) and k["duration_us"] == 25.5
    assert (k["device"], k["stream"]) == (0, 7)
    assert step_windows(t)["gpu_busy_us"].to_list() == [25.5]


def test_cuda_time_era_legacy_autograd_array(tmp_path):
    """The pre-Kineto autograd-profiler array: no cat, lanes 'CPU functions'/'CUDA functions'."""
    evs = TraceBuilder.legacy_autograd(
        cpu=[("aten::mm", 100, 8), ("aten::relu", 120, 6)],
        cuda=[("aten::mm", 110, 4), ("aten::relu", 128, 3)],
    )
    p = tmp_path / "autograd.json"
    p.write_text(json.dumps(evs))
    t = tracedx.load(p)
    assert t.ops.height == 2 and t.kernels.height == 2 and t.steps_synthetic
    w = step_windows(t).row(0, named=True)
    # span [100,131) = 31; busy 4 + 3 = 7
    assert w["step_time_us"] == 31 and w["gpu_busy_us"] == 7


def test_gzip_equals_plain(tmp_path):
    b = main_trace()
    plain = tracedx.load(b.write(tmp_path / "a.json"))
    gz = tracedx.load(b.write(tmp_path / "a.json.gz"))
    # gzip is detected by magic bytes, not by the name
    odd = tmp_path / "a.trace"
    odd.write_bytes(gzip.compress(b.dumps().encode()))
    other = tracedx.load(odd)
    assert _windows(plain) == _windows(gz) == _windows(other) == EXPECTED_WINDOWS


def test_legacy_profiler_step_as_cpu_op(tmp_path):
    """Old traces wrote ProfilerStep#N as a cpu_op (cat Operator): it still defines the step."""
    t = tracedx.load(main_trace(legacy=True).write(tmp_path / "l.json"))
    assert t.steps["step"].to_list() == [1, 2]
    assert (t.steps["duration_us"]).to_list() == [100, 100]


# --- real H200 traces (sample_traces/, made by `tracedx capture`; see its README) -------------
def sample(name: str):
    from tests.conftest import SAMPLES

    p = SAMPLES / f"{name}.json.gz"
    if not p.exists():
        pytest.skip(f"sample_traces/{p.name} is not present")
    return tracedx.load(p)


@pytest.mark.parametrize("name", ["matmul-bf16", "matmul-fp32"])
def test_real_compute_bound_matmul_loop_busy_over_95_percent(name):
    t = sample(name)
    w = step_windows(t)
    assert w.height >= 3
    for busy, step in w.select("gpu_busy_us", "step_time_us").rows():
        assert busy / step > 0.95
    # GUIDE 2.1 on a real trace: the kernels queued during warm-up (no launch record in the
    # window) run first, before any kernel of the first recorded step
    orphans = t.kernels.filter(pl.col("launch_name").is_null())
    first_attributed = t.kernels.filter(pl.col("step").is_not_null())["start_us"].min()
    assert orphans.height >= 1 and orphans["end_us"].max() <= first_attributed + 1e-3


def test_real_mlp_train_batch_64_gpu_idle_most_of_the_step():
    w = step_windows(sample("mlp_train-eager"))
    assert w.height >= 3 and (w["idle_fraction"] > 0.5).all()


@pytest.mark.parametrize("name", ["mlp_train-eager", "resnet_train-fp32", "mlp_large-fp32"])
def test_real_training_step_every_kernel_lands_in_a_step_backward_included(name):
    t = sample(name)
    lo, hi = t.steps["start_us"].min(), t.steps["end_us"].max()
    launched_inside = t.kernels.filter(pl.col("launch_start_us").is_between(lo, hi, closed="left"))
    assert launched_inside.height > 0 and launched_inside["step"].null_count() == 0
    # backward kernels: launched from a thread other than the one that holds ProfilerStep#N
    main_tid = t.steps["tid"][0]
    bwd = t.kernels.filter(pl.col("launch_tid").is_not_null() & (pl.col("launch_tid") != main_tid))
    assert bwd.height > 0 and bwd["step"].null_count() == 0
    assert bwd.filter(pl.col("top_op_name").str.contains("(?i)backward")).height > 0


def test_gpu_work_is_not_counted_in_two_steps(tmp_path):
    b = TraceBuilder()
    b.step(1, T0, 20)  # launches a 97 us kernel: [5,102)
    b.launched_kernel("aten::mm", T0 + 2, 5, T0 + 5, 97)
    b.step(2, T0 + 20, 61)  # launches a 1 us kernel, queued behind it: [102,103)
    b.launched_kernel("aten::add", T0 + 21, 5, T0 + 102, 1, kname="elementwise_kernel")
    b.step(3, T0 + 81, 20)  # host only
    b.op("aten::to", T0 + 85, 10)
    t = tracedx.load(b.write(tmp_path / "lag.json"))
    w = step_windows(t).sort("step")
    # The GPU was busy 97 + 1 = 98 us in all, over a wall time of [0,103) = 103 us. The CPU
    # windows add up to 101 against GPU windows of 97 + 1: all steps use their CPU windows
    # [0,20) [20,81) [81,101), which tile the timeline, so the kernel is counted once.
    assert w["gpu_busy_us"].sum() <= 98
    assert w["step_time_us"].sum() <= 103


def test_legacy_profiler_step_op_is_not_an_op(tmp_path):
    """ProfilerStep#N written as an Operator is a step, not the parent of every op."""
    modern = tracedx.load(main_trace().write(tmp_path / "m.json"))
    legacy = tracedx.load(main_trace(legacy=True).write(tmp_path / "l.json"))
    assert legacy.ops.filter(pl.col("name").str.starts_with("ProfilerStep")).height == 0
    assert legacy.ops.height == modern.ops.height == 10
    for col in ("op_name", "top_op_name", "step"):
        assert legacy.kernels.sort("start_us")[col].to_list() == (
            modern.kernels.sort("start_us")[col].to_list()
        )
    top = sorted(legacy.ops.filter(pl.col("parent_id").is_null())["name"].to_list())
    assert top == sorted(modern.ops.filter(pl.col("parent_id").is_null())["name"].to_list())


def test_c04_legacy_and_modern_spellings_same_ops_and_idle_causes():
    """CASES.md C04: the same timeline must give the same answer in both spellings."""
    from tests.conftest import case

    a = tracedx.load(case("C04a_legacy_category_names.json"))
    b = tracedx.load(case("C04b_modern_category_names.json"))
    for t in (a, b):
        # 5 ops, all top-level: copy_, zero_, mm, relu, sum (ProfilerStep#1 is the step)
        assert sorted(t.ops.filter(pl.col("parent_id").is_null())["name"].to_list()) == [
            "aten::copy_",
            "aten::mm",
            "aten::relu",
            "aten::sum",
            "aten::zero_",
        ]
    ga, gb = (idle_gaps(t, step_windows(t)).sort("start_us") for t in (a, b))
    assert (
        ga.select("start_us", "end_us", "cause").rows()
        == gb.select("start_us", "end_us", "cause").rows()
    )


def test_time_containment_picks_the_innermost_running_op(tmp_path):
    """cuLaunchKernelEx without External id: the innermost op on the thread running at launch."""
    b = TraceBuilder()
    b.step(1, T0, 100)
    b.op("aten::linear", T0 + 10, 40)  # [10,50)
    b.op("aten::addmm", T0 + 10, 30)  # [10,40), starts with its parent
    b.op("aten::t", T0 + 10, 5)  # [10,15), starts with both
    for name, ts in (("k1", 12), ("k2", 20), ("k3", 45), ("k4", 60), ("k5", 40)):
        c = b.driver_launch(T0 + ts, 2)
        b.kernel(T0 + 60 + ts, 1, c, name)
    t = tracedx.load(b.write(tmp_path / "inner.json"))
    got = dict(t.kernels.select("name", "op_name").rows())
    assert got == {
        "k1": "aten::t",  # 12 in [10,15)
        "k2": "aten::addmm",  # 20: t is over, addmm [10,40) runs
        "k3": "aten::linear",  # 45: only linear [10,50) runs
        "k4": None,  # 60: no op runs on the thread
        "k5": "aten::linear",  # 40: addmm ended at 40 ([start, end)), linear runs
    }


def test_list_columns_through_json_match_polars_own_conversion():
    """tables._nested (list columns built through polars' JSON reader) gives the values and
    dtype of polars' own conversion of the Python lists, nulls and empty lists kept apart."""
    from tracedx.trace.tables import _nested

    shapes = [None, [], [[]], [[1, 2], []], [[2**62, -3]]]
    strs = [None, [], ['a\u00e9"\\x', ""], ["c10::BFloat16"]]
    for vals, dtype in ((shapes, pl.List(pl.List(pl.Int64))), (strs, pl.List(pl.Utf8))):
        got = _nested(vals, dtype)
        assert got.dtype == dtype
        assert got.to_list() == vals
    assert _nested([], pl.List(pl.Utf8)).to_list() == []


def test_float_columns_non_finite_become_null_finite_kept():
    """The numpy finite check of tables._any_float_col: inf and NaN become null, nulls stay
    null, finite values are unchanged (est. achieved occupancy % of a kernel)."""
    from tracedx.trace.tables import _any_float_col

    assert _any_float_col([1.5, 2.0]).to_list() == [1.5, 2.0]
    assert _any_float_col([1.5, float("inf"), None, float("nan"), 3]).to_list() == [
        1.5,
        None,
        None,
        None,
        3.0,
    ]


def test_a_directory_points_to_load_job(tmp_path):
    from tracedx.errors import TraceFormatError

    with pytest.raises(
        TraceFormatError,
        match=r"is a directory, not a trace file \(a job's traces: tracedx.load_job\)",
    ):
        tracedx.load(tmp_path)
