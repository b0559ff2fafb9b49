"""Issue 7: traces from the wild. Odd but readable traces are analysed, every oddity is counted
in a data-quality warning, and the numbers stay defined. Times are us after ``T0``.
"""

from __future__ import annotations

import copy
import json
import math
import os
import random
import subprocess
import sys

import polars as pl
import pytest
from click.testing import CliRunner

import tracedx
from tests.conftest import SAMPLES, case
from tests.test_reader import EXPECTED_WINDOWS, _windows, main_trace
from tests.tracebuilder import T0, TraceBuilder
from tracedx.analysis.diagnosis import diagnose
from tracedx.analysis.timeline import idle_by_cause, idle_gaps, step_windows
from tracedx.cli import main
from tracedx.report import render


def run_cli(*args: str):
    r = CliRunner().invoke(main, ["diagnose", *map(str, args)])
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    assert "Traceback" not in r.output + r.stderr
    return r


def kinds(t) -> dict[str, int]:
    return {w.kind: w.count for w in t.warnings}


def assert_defined(t):
    """Every per-step metric is a finite number in range (GPU ones null without GPU events)."""
    w = step_windows(t)
    for r in w.iter_rows(named=True):
        assert r["step_time_us"] is not None and math.isfinite(r["step_time_us"])
        if t.has_gpu_activity:
            assert r["gpu_busy_us"] >= 0
            assert 0 <= r["idle_fraction"] <= 1
    g = idle_gaps(t, w)
    if g.height:  # idle by cause adds up to the idle time over the steps (busy is the launching
        # step's, so per step the two differ by GPU work that ran in a neighbour's interval)
        by = idle_by_cause(g)
        assert by["idle_us"].sum() == pytest.approx(
            (w["step_time_us"] - w["gpu_busy_us"]).sum(), abs=max(1.0, 0.05 * w["idle_us"].sum())
        )
    d = diagnose(t)
    out = render(d, "json")
    assert "NaN" not in out and "Infinity" not in out
    return w, d


# --- CPU only ---------------------------------------------------------------------------------
def cpu_only(tmp_path):
    b = TraceBuilder(device_name=None)
    b.step(1, T0, 500)
    b.op("aten::linear", T0 + 10, 200)
    b.op("aten::relu", T0 + 220, 50)
    b.op("aten::sum", T0 + 280, 80)
    return b.write(tmp_path / "cpu_only.json")


def test_cpu_only_trace_is_diagnosed_and_says_why_no_gpu(tmp_path):
    p = cpu_only(tmp_path)
    t = tracedx.load(p)
    assert not t.has_gpu_activity and t.devices == []
    w, d = assert_defined(t)
    assert w["gpu_busy_us"].to_list() == [None] and w["idle_fraction"].to_list() == [None]
    assert w["cpu_time_us"].to_list() == [500]
    assert d.regime is None and d.findings == []
    r = run_cli(p)
    assert r.exit_code == 0
    assert "no GPU activity" in r.output
    assert "ProfilerActivity.CUDA" in r.output and "CUPTI" in r.output  # the usual causes
    assert "100%" not in r.output  # never "idle 100 %"
    j = json.loads(run_cli(p, "--format", "json").stdout)
    assert j["steps"]["gpu_busy_ms"] is None


def test_cpu_only_capture_timed_unprofiled_says_so_without_estimates(tmp_path):
    """A CPU-only capture with --time-unprofiled: the note gives the unprofiled time and says
    there is no estimate, instead of telling the user to pass the flag they passed."""
    b = TraceBuilder(device_name=None)
    b.step(1, T0, 500)
    b.op("aten::linear", T0 + 10, 200)
    b.top["tracedx"] = {"unprofiled_step_ms": {"median": 0.412, "min": 0.4, "max": 0.5, "n": 3}}
    d = diagnose(tracedx.load(b.write(tmp_path / "cpu_unprof.json")))
    assert d.findings == []
    assert any("0.412 ms unprofiled" in n and "no fix estimate" in n for n in d.notes)
    assert not any("--time-unprofiled` also times" in n for n in d.notes)
    r = run_cli(tmp_path / "cpu_unprof.json")
    assert "FIXES\n  no estimate (see the notes)" in r.output
    assert "Amdahl estimate against" not in r.output


def test_truncated_salvaged_trace_gives_no_fix_estimates(tmp_path):
    """Only the events before the break are kept, not in time order (Kineto writes host ops
    before their launches and kernels): steps keep ops and lose launches, so no estimate."""
    src = SAMPLES / "mlp_train-eager.json.gz"
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(src.read_bytes()[:20000])
    t = tracedx.load(cut, repair=True)
    full = diagnose(tracedx.load(src))
    assert full.findings  # the whole trace has estimates (cuda-graphs 7.9x) ...
    d = diagnose(t)
    assert full.regime == "overhead-bound"
    assert d.findings == [] and d.regime is None and d.bottleneck is None  # ... its first 20 kB
    assert any(e.startswith("no verdict: only the events before the break") for e in d.evidence)
    assert any(n.startswith("no fix estimates: this truncated trace") for n in d.notes)
    assert not any("estimates are against" in n for n in d.notes)
    r = CliRunner().invoke(main, ["diagnose", str(cut), "--repair"])
    assert r.exit_code == 0 and "FIXES\n  no estimate (see the notes)" in r.output
    assert "cuda-graphs:" not in r.output and "OVERHEAD-BOUND" not in r.output
    html = tmp_path / "cut.html"
    r = CliRunner().invoke(main, ["report", str(cut), "--repair", "-o", str(html)])
    assert r.exit_code == 0 and "No estimate (see the notes)." in html.read_text()
    # diff with a truncated BEFORE says so first, and checks no estimate
    after = SAMPLES / "mlp_train-cudagraph.json.gz"
    r = CliRunner().invoke(main, ["diff", str(cut), str(after), "--repair"])
    assert r.exit_code == 0
    assert "BEFORE was salvaged from a truncated file" in r.output
    assert "estimate     none" in r.output


def test_launches_but_no_gpu_events_warns(tmp_path):
    b = TraceBuilder()
    b.step(1, T0, 100)
    for i in range(3):
        e = b.op("aten::mm", T0 + 10 + 20 * i, 10)
        b.launch(T0 + 12 + 20 * i, 4, ext=e)
    b.sync(T0 + 80, 10)
    t = tracedx.load(b.write(tmp_path / "nogpu.json"))
    assert kinds(t) == {"no_gpu_activity": 3}
    r = run_cli(tmp_path / "nogpu.json")
    assert r.exit_code == 0 and "3 kernel launches but 0 kernels recorded" in r.output


# --- steps ---------------------------------------------------------------------------------------
def two_kernel_steps(b, spans):
    for n, (s, d) in enumerate(spans, 1):
        b.step(n, T0 + s, d)


def test_nested_step_is_ignored_and_reported(tmp_path):
    b = TraceBuilder()
    b.step(1, T0, 100)
    b.step(2, T0 + 10, 50)  # inside step 1
    b.step(3, T0 + 100, 100)
    b.launched_kernel("aten::mm", T0 + 20, 10, T0 + 30, 20)
    b.launched_kernel("aten::mm", T0 + 120, 10, T0 + 130, 20)
    t = tracedx.load(b.write(tmp_path / "nested.json"))
    assert t.steps["step"].to_list() == [1, 3]
    assert kinds(t) == {"nested_step": 1}
    w, _ = assert_defined(t)
    # the kernel launched at 21 (inside the nested step's window) belongs to step 1
    assert w.sort("step")["kernels"].to_list() == [1, 1]
    r = run_cli(tmp_path / "nested.json")
    assert r.exit_code == 0 and "lie inside another step" in r.output


def test_repeated_step_number_is_reported(tmp_path):
    b = TraceBuilder()
    b.step(1, T0, 100)
    b.step(1, T0 + 100, 100)  # the same number again
    b.launched_kernel("aten::mm", T0 + 20, 10, T0 + 30, 20)
    b.launched_kernel("aten::mm", T0 + 120, 10, T0 + 130, 20)
    t = tracedx.load(b.write(tmp_path / "repeat.json"))
    assert t.steps.height == 1 and kinds(t)["repeated_step"] == 1
    assert_defined(t)
    r = run_cli(tmp_path / "repeat.json")
    assert r.exit_code == 0 and "repeat a step number" in r.output


def test_single_step_is_said(tmp_path):
    b = TraceBuilder()
    b.step(7, T0, 100)
    b.launched_kernel("aten::mm", T0 + 20, 10, T0 + 30, 20)
    p = b.write(tmp_path / "one.json")
    t = tracedx.load(p)
    w, d = assert_defined(t)
    assert w["step"].to_list() == [7] and w["gpu_busy_us"].to_list() == [20]
    r = run_cli(p)
    assert r.exit_code == 0 and "a single ProfilerStep" in r.output and "1 step (7..7)" in r.output


def test_no_steps_cli_says_so(tmp_path):
    b = TraceBuilder()
    b.launched_kernel("aten::mm", T0 + 20, 10, T0 + 30, 20)
    r = run_cli(b.write(tmp_path / "nostep.json"))
    assert r.exit_code == 0 and "no ProfilerStep markers" in r.output


# --- data quality: each oddity counted, metrics defined -----------------------------------------
def dq_trace(kind: str) -> tuple[TraceBuilder, int, float]:
    """A one-step trace [0,200) with one oddity. Returns (builder, expected count, busy us)."""
    b = TraceBuilder(flows=False)
    b.step(1, T0, 200)
    b.launched_kernel("aten::mm", T0 + 5, 10, T0 + 10, 20)  # [10,30): busy 20
    if kind == "unattributed_gpu":
        b.kernel(T0 + 40, 5, None, "no_correlation")  # [40,45)
        b.kernel(T0 + 50, 5, 9999, "correlation_without_launch")  # [50,55)
        return b, 2, 30  # 20 + 5 + 5: counted in busy, attributed to no op
    if kind == "launch_without_gpu":
        for i in range(2):
            e = b.op("aten::add", T0 + 50 + 20 * i, 10)
            b.launch(T0 + 51 + 20 * i, 3, ext=e)
        return b, 2, 20
    if kind == "duplicate_gpu_event":
        b.events.append(copy.deepcopy(b.events[-1]))  # the kernel, written twice
        return b, 1, 20
    if kind == "zero_duration":
        b.launched_kernel("aten::zero_", T0 + 40, 5, T0 + 50, 0)
        return b, 1, 20
    if kind == "invalid_duration":
        e = b.op("aten::neg", T0 + 40, 5)
        c = b.launch(T0 + 41, 2, ext=e)
        b.kernel(T0 + 50, -(T0 + 50), c, "end_written_as_zero")  # dur = 0 - start
        b.op("aten::bad", T0 + 60, -(T0 + 60))
        return b, 2, 20  # dropped from every metric: span and busy unchanged
    if kind == "gpu_before_launch":
        e = b.op("aten::add", T0 + 60, 20)
        c = b.launch(T0 + 70, 3, ext=e)
        b.kernel(T0 + 65, 10, c, "early")  # [65,75) but launched at 70: clocks disagree
        return b, 1, 30
    if kind == "gpu_out_of_order":
        # launched at 40 (returns at 43), then at 50: on one stream the second cannot run first
        b.launched_kernel("aten::add", T0 + 39, 5, T0 + 90, 10)  # [90,100)
        b.launched_kernel("aten::mul", T0 + 49, 5, T0 + 60, 10)  # [60,70): before [90,100)
        return b, 1, 40  # 20 + 10 + 10
    if kind == "stream_overlap":
        b.launched_kernel("aten::add", T0 + 16, 5, T0 + 25, 10)  # [25,35) on stream 7 too
        return b, 1, 25  # union [10,35)
    raise AssertionError(kind)


DQ_KINDS = [
    "unattributed_gpu",
    "launch_without_gpu",
    "duplicate_gpu_event",
    "zero_duration",
    "invalid_duration",
    "gpu_before_launch",
    "stream_overlap",
    "gpu_out_of_order",
]


@pytest.mark.parametrize("kind", DQ_KINDS)
def test_data_quality_warning_counted_and_metrics_defined(tmp_path, kind):
    b, count, busy = dq_trace(kind)
    p = b.write(tmp_path / f"{kind}.json")
    t = tracedx.load(p)
    k = kinds(t)
    assert k.get(kind) == count, t.warnings
    # no other warning fires (each oddity is counted once, under its own name), except that a
    # dropped kernel leaves its launch without a GPU event
    also = {"launch_without_gpu"} if kind == "invalid_duration" else set()
    assert set(k) == {kind} | also, t.warnings
    w, _ = assert_defined(t)
    assert w["gpu_busy_us"].to_list() == [busy]
    assert w["step_time_us"].to_list() == [200]
    r = run_cli(p)
    assert r.exit_code == 0
    msg = next(x.message for x in t.warnings if x.kind == kind)
    assert " ".join(msg.split()) in " ".join(r.output.split())  # the report wraps at 100 columns


def test_duplicate_gpu_event_counts_once(tmp_path):
    b, _, _ = dq_trace("duplicate_gpu_event")
    t = tracedx.load(b.write(tmp_path / "dup.json"))
    w = step_windows(t)
    assert t.kernels.height == 1 and w["kernels"].to_list() == [1]
    assert w["gpu_busy_us"].to_list() == [20]


def test_host_function_launch_is_not_a_kernel_launch(tmp_path):
    """cudaLaunchHostFunc enqueues a host callback: no GPU event will ever match it."""
    b = TraceBuilder()
    b.step(1, T0, 100)
    b.launched_kernel("aten::mm", T0 + 5, 10, T0 + 10, 20)
    e = b.op("record_stream_callback", T0 + 40, 10)
    b.launch(T0 + 42, 3, "cudaLaunchHostFunc", ext=e)
    b.launch(T0 + 50, 3, "cuLaunchHostFunc", driver=True)
    t = tracedx.load(b.write(tmp_path / "hostfunc.json"))
    kinds_of = dict(zip(t.launches["name"], t.launches["api_kind"], strict=True))
    assert kinds_of["cudaLaunchHostFunc"] == kinds_of["cuLaunchHostFunc"] == "other"
    assert kinds_of["cudaLaunchKernel"] == "kernel"
    assert t.warnings == []


def test_events_out_of_order_give_the_same_numbers(tmp_path):
    """Kineto files are never globally sorted (GPU events follow the host ones): order is noise."""
    b = main_trace()
    rnd = random.Random(7)
    for i in range(5):
        b2 = main_trace()
        b2.events = b.events[:]
        rnd.shuffle(b2.events)
        t = tracedx.load(b2.write(tmp_path / f"shuffled{i}.json"))
        assert _windows(t) == EXPECTED_WINDOWS
        assert t.warnings == []


def test_invalid_events_left_out_of_span(tmp_path):
    """An end written as 0 gives dur = -start: a naive end would stretch the span to ~5 s."""
    b, _, _ = dq_trace("invalid_duration")
    t = tracedx.load(b.write(tmp_path / "neg.json"))
    assert t.kernels.height == 1 and t.ops.filter(pl.col("name") == "aten::bad").height == 0
    assert "1 kernel" in next(w.message for w in t.warnings if w.kind == "invalid_duration")


# --- several GPUs ------------------------------------------------------------------------------
def test_two_gpus_per_device_numbers_never_mixed(tmp_path):
    b = TraceBuilder(devices=2)
    b.step(1, T0, 100)
    b.step(2, T0 + 100, 100)
    # GPU 0: one kernel [10,40) in step 1 and one [110,120) in step 2
    b.launched_kernel("aten::mm", T0 + 2, 6, T0 + 10, 30, device=0)
    b.launched_kernel("aten::mm", T0 + 102, 6, T0 + 110, 10, device=0)
    # GPU 1: two streams in step 1, [25,75) and [60,90): union [25,90) = 65 (sum 80);
    # nothing in step 2
    b.launched_kernel("aten::mm", T0 + 12, 6, T0 + 25, 50, device=1, stream=7)
    b.launched_kernel("aten::add", T0 + 20, 6, T0 + 60, 30, device=1, stream=8)
    p = b.write(tmp_path / "two_gpus.json")
    t = tracedx.load(p)
    assert t.devices == [0, 1]
    w, d = assert_defined(t)
    by = {(r["step"], r["device"]): r for r in w.iter_rows(named=True)}
    # GPU 0, step 1: GPU window [10,110) (next step's first kernel) = 100; busy 30
    assert by[(1, 0)]["gpu_busy_us"] == 30 and by[(1, 0)]["kernels"] == 1
    assert by[(1, 0)]["gpu_window_us"] == 100
    # GPU 0, step 2: window [110,120) < CPU 100: step 100, busy 10
    assert by[(2, 0)]["gpu_busy_us"] == 10 and by[(2, 0)]["step_time_us"] == 100
    # GPU 1, step 1: GPU window [25,90) = 65 < CPU 100: busy 65 of 100 (mixing GPU 0 in would
    # give the union [10,90) = 80)
    assert by[(1, 1)]["gpu_busy_us"] == 65 and by[(1, 1)]["kernels"] == 2
    assert by[(1, 1)]["idle_fraction"] == pytest.approx(0.35)
    assert by[(2, 1)]["gpu_busy_us"] == 0 and by[(2, 1)]["kernels"] == 0
    # summary per device; the verdict names its device (GPU 1 is the busier: 65 vs 40)
    assert d.summary["devices"]["0"]["gpu_busy_us"]["max"] == 30
    assert d.summary["devices"]["1"]["gpu_busy_us"]["max"] == 65
    assert d.primary_device == 1
    r = run_cli(p)
    assert r.exit_code == 0 and "2 GPUs in this trace" in r.output


# --- unknown categories and args ----------------------------------------------------------------
def test_unknown_categories_and_args_kept_aside(tmp_path):
    b = TraceBuilder()
    b.step(1, T0, 100)
    b.launched_kernel("aten::mm", T0 + 5, 10, T0 + 10, 20)
    b.add({"ph": "X", "cat": "gpu_fancy_2030", "name": "x", "pid": 0, "tid": 7,
           "ts": T0 + 40, "dur": 30, "args": {"device": 0}})  # fmt: skip
    b.add({"ph": "X", "cat": "gpu_fancy_2030", "name": "y", "pid": 0, "tid": 7,
           "ts": T0 + 80, "dur": 5})  # fmt: skip
    b.add({"ph": "X", "name": "no category", "pid": 1, "tid": 1, "ts": T0 + 1, "dur": 1})
    b.add({"ph": "i", "cat": "cpu_instant_event", "name": "inst", "pid": 1, "tid": 1,
           "ts": T0 + 3, "s": "t"})  # fmt: skip
    b.add({"ph": "C", "name": "counter", "pid": 1, "ts": T0 + 3, "args": {"v": 1}})
    # a kernel whose args carry unknown keys and odd types
    b.add({"ph": "X", "cat": "kernel", "name": "odd_args", "pid": 0, "tid": 7, "ts": T0 + 50,
           "dur": 5, "args": {"device": 0, "stream": 7, "grid": "oops", "block": {"x": 1},
                              "registers per thread": "many", "shared memory": None,
                              "est. achieved occupancy %": "n/a",
                              "future_field": [1, {"a": 2}]}})  # fmt: skip
    b.top["futureTopLevelKey"] = {"anything": [1, 2, 3]}
    p = b.write(tmp_path / "unknown.json")
    t = tracedx.load(p)
    assert kinds(t)["unknown_category"] == 3  # 2 x gpu_fancy_2030 + 1 without a category
    assert t.metadata["unknown_categories"].get("gpu_fancy_2030") == 2
    assert t.kernels.height == 2
    odd = t.kernels.filter(pl.col("name") == "odd_args").row(0, named=True)
    assert odd["grid_x"] is None and odd["registers_per_thread"] is None
    w, _ = assert_defined(t)
    assert w["gpu_busy_us"].to_list() == [25]  # 20 + 5; the unknown events are not busy time
    assert run_cli(p).exit_code == 0


# --- names -------------------------------------------------------------------------------------
LONG = "void cutlass::Kernel<" + "cutlass::gemm::GemmShape<128, 128, 32>, " * 100 + ">(Params)"


def test_multi_kilobyte_names_kept_whole_and_grouped_by_full_name(tmp_path):
    a, bname = LONG, LONG[:-1] + "X"  # differ in the last character only
    assert len(a) > 4000
    b = TraceBuilder()
    b.step(1, T0, 100)
    b.launched_kernel("aten::mm", T0 + 5, 5, T0 + 10, 20, kname=a)
    b.launched_kernel("aten::mm", T0 + 15, 5, T0 + 30, 20, kname=a)
    b.launched_kernel("aten::mm", T0 + 25, 5, T0 + 50, 20, kname=bname)
    p = b.write(tmp_path / "long.json")
    t = tracedx.load(p)
    counts = dict(t.kernels.group_by("name").len().rows())
    assert counts == {a: 2, bname: 1}
    r = run_cli(p)
    assert r.exit_code == 0
    assert max(len(line) for line in r.output.splitlines()) < 400  # cut for display only


NON_ASCII = "Vorwärts_前向_forward_шаг_🚀"


def test_non_ascii_names_kept_exactly(tmp_path):
    b = TraceBuilder()
    b.step(1, T0, 100)
    b.annotation(NON_ASCII, T0 + 1, 60)
    b.launched_kernel(NON_ASCII, T0 + 5, 10, T0 + 10, 20, kname="κέρνελ_" + NON_ASCII)
    p = b.write(tmp_path / "utf8.json")
    t = tracedx.load(p)
    assert NON_ASCII in t.ops["name"].to_list()
    assert NON_ASCII in t.annotations["name"].to_list()
    assert t.kernels["name"].to_list() == ["κέρνελ_" + NON_ASCII]
    r = run_cli(p)
    assert r.exit_code == 0 and NON_ASCII in r.output
    j = json.loads(run_cli(p, "--format", "json").stdout)
    assert NON_ASCII in json.dumps(j, ensure_ascii=False)


@pytest.mark.parametrize(
    "env", [{"LC_ALL": "C", "LANG": "C"}, {"PYTHONIOENCODING": "ascii"}], ids=["C-locale", "ascii"]
)
def test_non_ascii_names_on_a_non_utf8_terminal(tmp_path, env):
    b = TraceBuilder()
    b.step(1, T0, 100)
    b.launched_kernel(NON_ASCII, T0 + 5, 10, T0 + 10, 20)
    p = b.write(tmp_path / "utf8.json")
    e = {k: v for k, v in os.environ.items() if k not in ("LC_ALL", "LANG", "PYTHONIOENCODING")}
    r = subprocess.run(
        [sys.executable, "-m", "tracedx.cli", "diagnose", str(p)],
        capture_output=True,
        env=e | env,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    assert b"Traceback" not in r.stderr


# --- estimates on odd but valid timelines (once crashes: ZeroDivisionError, float(None)) -------
def test_fusion_estimate_on_two_streams_and_two_threads_does_not_crash(tmp_path):
    # Step [0,100). Main thread: aten::add [0,50), aten::mul [50,100); autograd thread the same.
    # Each op launches one elementwise kernel: stream 7 [60,80) [80,100), stream 8 the same.
    # Busy (union) 40; each stream's chain of 2 saves 20 by the fusion rule (sum - max), 40 in
    # all = the whole busy time; host 100 - 2 fused-away kernels x 50 us/kernel = 0.
    b = TraceBuilder()
    b.step(1, T0, 100)
    k = "void at::native::vectorized_elementwise_kernel<4, add>"
    for tid, stream in ((None, 7), (4343, 8)):
        b.launched_kernel("aten::add", T0, 50, T0 + 60, 20, kname=k, stream=stream, tid=tid)
        b.launched_kernel("aten::mul", T0 + 50, 50, T0 + 80, 20, kname=k, stream=stream, tid=tid)
    p = b.write(tmp_path / "fusion.json")
    assert step_windows(tracedx.load(p))["gpu_busy_us"].to_list() == [40]
    r = CliRunner().invoke(main, ["diagnose", str(p)])
    assert r.exit_code == 0, r.stderr


def test_zero_length_step_is_answered(tmp_path):
    # ProfilerStep#1 of 0 us; its one kernel also lasts 0 us: step time 0, busy 0, idle n/a
    b = TraceBuilder()
    b.step(1, T0, 0)
    b.launched_kernel("aten::mm", T0, 0, T0, 0, launch_offset=0, launch_dur=0)
    p = b.write(tmp_path / "zero_step.json")
    w = step_windows(tracedx.load(p))
    assert w["step_time_us"].to_list() == [0] and w["idle_fraction"].to_list() == [None]
    r = CliRunner().invoke(main, ["diagnose", str(p)])
    assert r.exit_code == 0, r.stderr


# --- odd values in real-looking traces ----------------------------------------------------------
def test_one_far_future_timestamp_does_not_discard_the_trace(tmp_path):
    b = main_trace()
    # one more kernel with a corrupt timestamp: the 5 real kernels must survive
    b.kernel(1e300, 5, None, "corrupt_ts")
    t = tracedx.load(b.write(tmp_path / "future.json"))
    assert t.kernels.filter(pl.col("start_us") < 1e12).height == 5
    assert _windows(t) == EXPECTED_WINDOWS


@pytest.mark.parametrize(
    "cat,key,value",
    [
        ("kernel", "shared memory", 1e300),
        ("kernel", "registers per thread", 1e300),
        ("kernel", "graph node id", 1e300),
        ("kernel", "grid", [1e300, 1, 1]),
        ("gpu_memcpy", "bytes", 1e300),
        ("cpu_op", "Sequence number", 1e300),
    ],
)
def test_huge_float_in_an_integer_arg_is_not_a_crash(tmp_path, cat, key, value):
    b = TraceBuilder()
    b.step(1, T0, 100)
    b.launched_kernel("aten::mm", T0 + 5, 10, T0 + 10, 20)
    c = b.launch(T0 + 30, 3, "cudaMemcpyAsync")
    b.memcpy(T0 + 40, 5, c, 100)
    ev = next(e for e in b.events if e.get("cat") == cat)
    ev["args"][key] = value
    r = CliRunner().invoke(main, ["diagnose", str(b.write(tmp_path / "huge.json"))])
    assert r.exit_code in (0, 2), r.stderr


@pytest.mark.parametrize("key,value", [("stream", 7.5), ("correlation", 1e20)])
def test_one_odd_id_does_not_refuse_the_whole_trace_under_repair(tmp_path, key, value):
    b = main_trace()
    ev = next(e for e in b.events if e.get("cat") == "kernel")
    ev["args"][key] = value
    r = CliRunner().invoke(main, ["diagnose", "--repair", str(b.write(tmp_path / "odd.json"))])
    assert r.exit_code == 0, r.stderr


def test_no_events_left_says_which_were_left_out(tmp_path):
    """--repair reads a NaN timestamp as null; the event is left out, and the one-line error
    says so instead of only 'no events'."""
    p = tmp_path / "nan.json"
    p.write_text(
        '{"traceEvents":[{"ph":"X","cat":"kernel","name":"k","pid":0,"tid":7,"ts":NaN,'
        '"dur":3,"args":{"stream":7}}]}'
    )
    r = CliRunner().invoke(main, ["diagnose", str(p), "--repair"])
    assert r.exit_code == 2
    assert "no events to analyse: 1 event(s) with a negative or missing duration/timestamp" in (
        r.output
    )


def test_cut_after_the_event_list_keeps_verdict_and_estimates(tmp_path):
    """A file cut inside a key written after traceEvents (traceName) lost no event: --repair
    reads every event, and the diagnosis is the whole trace's, verdict and estimates included."""
    import gzip

    data = gzip.decompress((SAMPLES / "mlp_train-eager.json.gz").read_bytes())
    end = data.rindex(b'"traceName"') + 20
    cut = tmp_path / "cut_tail.json"
    cut.write_bytes(data[:end])
    full = diagnose(tracedx.load(SAMPLES / "mlp_train-eager.json.gz"))
    d = diagnose(tracedx.load(cut, repair=True))
    assert any("broken after its event list: kept all" in r for r in d.trace.metadata["repairs"])
    assert (d.regime, d.bottleneck) == (full.regime, full.bottleneck)
    assert [f.fix for f in d.findings] == [f.fix for f in full.findings]
    assert d.findings[0].estimated_speedup == pytest.approx(full.findings[0].estimated_speedup)


@pytest.mark.parametrize(
    "name",
    [
        "C02b_nan_infinity_tokens.json",
        "C03_windows_unescaped_backslashes.txt",
        "C13a_raw_control_char_in_name.txt",
    ],
)
def test_repairs_that_lose_no_event_keep_verdict_and_estimates(name):
    """Only a file cut inside its event list loses its verdict; NaN literals, stray
    backslashes and control characters are repaired in place."""
    p = case(name)
    d = diagnose(tracedx.load(p, repair=True))
    assert d.regime is not None and d.findings
    assert not any(e.startswith("no verdict") for e in d.evidence)
