"""Real H200 traces in sample_traces/: verdicts and estimates a performance engineer would sign.

The traces and their unprofiled timings are described in sample_traces/README.md; the
before/after pairs and their measured unprofiled speedups in sample_traces/pairs.json.
"""

from __future__ import annotations

import json

import polars as pl
import pytest

import tracedx
from tests.conftest import SAMPLES, sample_diagnosis
from tracedx.analysis.diagnosis import diagnose
from tracedx.analysis.findings import combined_speedup
from tracedx.analysis.timeline import step_windows
from tracedx.report import render

CAL = SAMPLES / "calibration-h200.json"
PAIRS = (
    json.loads((SAMPLES / "pairs.json").read_text()) if (SAMPLES / "pairs.json").exists() else []
)

diag = sample_diagnosis


def fixes(d) -> dict:
    return {f.fix: f for f in d.findings}


def applied_estimate(d, pair: dict) -> float:
    """BEFORE's estimate for the pair's fix, or for its ``fixes`` applied together; a fix with
    no finding is worth nothing by the tool's own account (1.0x)."""
    if "fixes" in pair:
        found = [f for name in pair["fixes"] if (f := fixes(d).get(name)) is not None]
        return combined_speedup(d.model, found) if found else 1.0
    f = fixes(d).get(pair["fix"])
    return f.estimated_speedup if f else 1.0


def test_bf16_matmul_loop_is_compute_bound_near_peak():
    d = diag("matmul-bf16.json.gz", calibration=str(CAL))
    assert (d.regime, d.bottleneck) == ("compute-bound", "tensor-core math")
    w = d.windows
    assert (w["gpu_busy_us"] / w["step_time_us"]).min() > 0.95  # issue 2: busy over 95%
    mm = d.op_table.filter(pl.col("name") == "aten::mm").row(0, named=True)
    assert mm["regime"] == "compute"
    peak = d.device.peak_tflops["bf16"]
    assert mm["achieved_tflops"] / peak > 0.70  # issue 4: over 70% of the bf16 peak
    assert not [f for f in d.findings if f.recommended]  # nothing worth doing


def test_elementwise_chain_is_bandwidth_bound_near_the_roof():
    d = diag("elementwise-eager.json.gz", calibration=str(CAL))
    assert (d.regime, d.bottleneck) == ("bandwidth-bound", "device memory")
    ew = d.op_table.filter(pl.col("family") == "elementwise")
    assert set(ew["regime"].to_list()) == {"bandwidth"}
    # near the (calibrated) bandwidth roof: device-time weighted fraction of the bound
    frac = (ew["bound_fraction"] * ew["device_time_us"]).sum() / ew["device_time_us"].sum()
    assert frac > 0.8
    assert d.findings[0].fix == "torch-compile"


def test_fp32_matmul_without_tf32_is_bound_by_fp32_math_and_tf32_is_proposed():
    d = diag("matmul-fp32.json.gz", calibration=str(CAL))
    assert (d.regime, d.bottleneck) == ("compute-bound", "fp32 math")
    f = fixes(d)["tf32"]
    cal = json.loads(CAL.read_text())["matmul_tflops"]
    # the local speedup is the ceiling ratio tf32 / fp32 (memory never binds a 4096^3 GEMM)
    assert f.local_speedup == pytest.approx(cal["tf32"] / cal["fp32"], rel=1e-6)
    assert f.recommended


def test_mlp_training_step_is_overhead_bound_and_every_kernel_lands_in_a_step():
    t = tracedx.load(SAMPLES / "mlp_train-eager.json.gz")
    w = step_windows(t)
    assert w["idle_fraction"].min() > 0.5  # issue 2: GPU idle most of the step at batch 64
    # backward kernels are launched from the autograd thread, and still land in their step
    assert t.kernels["launch_tid"].n_unique() == 2
    assert t.kernels["step"].null_count() == 0
    d = diag("mlp_train-eager.json.gz")
    assert (d.regime, d.bottleneck) == ("overhead-bound", "kernel launch")
    assert d.findings[0].fix == "cuda-graphs"


def test_decode_eager_is_host_bound_and_graphs_are_worth_tens_of_x():
    d = diag("decode-eager.json.gz")
    # cuDNN re-plans attention for every new KV length: ~1.8 ms of host time per SDPA call
    # (sample_traces/pairs.json), far above a launch's cost: host work inside one op
    assert (d.regime, d.bottleneck) == ("overhead-bound", "host work")
    assert any("aten::scaled_dot_product_attention holds" in e for e in d.evidence)
    f = fixes(d)["cuda-graphs"]
    assert f.estimated_speedup > 12  # GUIDE.md: ~12x on its machine; 36x measured here
    assert d.decode is not None
    # GPT-2-medium-shaped: ~355 M bf16 parameters read per token
    assert 0.6e9 < d.decode["weight_bytes_per_token"] < 0.8e9


def test_overhead_bound_resnet_gains_nothing_from_bf16():
    # GUIDE.md 2.8: bf16 on an overhead-bound ResNet step is worth (almost) nothing
    d = diag("resnet_train-fp32.json.gz")
    assert d.regime == "overhead-bound"
    f = fixes(d)
    assert "bf16-autocast" not in f or not f["bf16-autocast"].recommended


def test_item_loop_sync_removal_is_a_small_gain_and_graphs_rank_higher():
    d = diag("item_loop-sync.json.gz")
    assert d.regime == "overhead-bound"
    f = fixes(d)
    assert 1.0 <= f["remove-host-sync"].estimated_speedup < 1.5
    assert f["cuda-graphs"].estimated_speedup > f["remove-host-sync"].estimated_speedup
    assert any(
        "_local_scalar_dense" in s or "item" in s for s in f["remove-host-sync"].evidence[1:2]
    )


def test_pageable_copy_is_a_transfer_problem():
    d = diag("h2d_copy-pageable.json.gz")
    assert (d.regime, d.bottleneck) == ("bandwidth-bound", "host-device transfer")
    assert d.findings[0].fix == "pinned-memory"
    # the 64 MiB host-to-device copy is not placed on the device-memory roofline
    row = d.op_table.filter(pl.col("name") == "aten::copy_").row(0, named=True)
    assert row["kernel_kind"] == "host-device copy"
    assert row["host_device_copy_us"] == pytest.approx(row["device_time_us"])
    assert row["bytes"] is None and row["regime"] is None
    assert "aten::copy_" in render(d, "text") and "host-device copy" in render(d, "text")


def test_dataloader_in_main_process_is_found():
    d = diag("convnet_dataloader-main.json.gz")
    assert (d.regime, d.bottleneck) == ("overhead-bound", "host work (the DataLoader)")
    assert d.findings[0].fix == "dataloader-workers"


# Known misses, with the reason (see README, "Estimates against measurements").
KNOWN_MISSES = {
    "add_loop": "the one-element add_ kernel's cost inside a graph is not fixed, and the trace "
    "records no GPU clock: 0.87 us per kernel in add_loop-cudagraph's own unprofiled timing, "
    "0.96 us on an idle GPU at 1980 MHz and 1.19 us right after matmuls at 1530-1755 MHz "
    "(steady_state-h200.json), 1.21 us in profiler_inflation-h200.json; the estimate's rule, "
    "reported duration 0.93 us + 0.46 us, gives 1.39 us, which holds for add_ of 128 to 1M "
    "elements (+0.44 to +0.53 us, profiler_inflation-h200.json) (6.3x estimated, 10.4x measured)",
    "gpt2_train": "what the compiled wrapper costs per kernel left is not in the eager trace, and "
    "differs by workload: with the profiler's cost per event removed, the compiled regions cost "
    "33.8 us per kernel in gpt2_train-compile and 18.0 in gpt2_decode-compile, against 30.4 and "
    "11.3 us per kernel of the eager ops that launch; the model's Python between ops goes in "
    "both (6.54 -> 1.05 ms per step, 3.63 -> 0.48 ms), but removing it all over-estimates "
    "decode 2.8x and still leaves training at 0.72, while the model's share rule fits decode "
    "(0.97) and leaves training at 1.40x against 2.12x; the ops that launch nothing and the "
    "autograd engine's own time per backward node, which the model removes, fall from 3.86 to "
    "0.15 ms",
    "llama_train": "the same kind of miss as gpt2_train, on another Hugging Face model (Llama, "
    "8 layers, d 1024): the compiled step's host cost per kernel left is not in the eager trace; "
    "the model's share rule for the Python between ops gives 1.34x against 2.05x measured (not "
    "analysed further)",
    "resnet50_train": "the fp32 step is GPU-bound, so its traced and unprofiled times (38.7, 39.0 "
    "ms) do not tell the profiler's cost per host event, which is assumed (3.6 us): its host "
    "side comes to 7.7 ms unprofiled (8.5 ms with the casts), and the estimate (3.08x, 12.7 ms) is "
    "the GPU's bf16 step; AFTER's "
    "host is longer than that model: bf16 + channels_last moves batch norm from cuDNN to the "
    "native kernels (+3.5 ms of traced host time per step), conv2d's host time doubles "
    "(autocast and its casts: 2.3 -> 5.2 ms), and ops that do not change (aten::item, add_, "
    "relu_) cost 26-84% more host time in AFTER's trace than in BEFORE's; measured 1.71x in the "
    "pair's capture run, 2.29x in interleaved rounds a day later (38.98 -> 16.99 ms, "
    "interleave-5-h200.json)",
    "convnet_dataloader": "AFTER's median step is one served from the 8 workers' prefetched "
    "batches, not the steady state: re-measured over 31 steps (steady_state-h200.json), 8 "
    "workers read 9.1 ms median but 39.3 ms mean (batches come in bursts of 8; max 264 ms), the "
    "main-process step 150 ms mean: 3.8x in steady state against the pair's 20.0x; the estimate "
    "(8.2x, 8 workers at the main process's time per batch) is 2.2x over that, as a one-thread "
    "worker takes 299 ms per batch where the main process took 163 ms on its 16 intra-op "
    "threads, which the trace does not record (8.24 / 1.84 = 4.5x)",
    "convnet_dataloader-both": "the same burst: 8 pinned workers read 3.3 ms median, 35.2 ms "
    "mean in steady state (steady_state-h200.json): 4.3x against the pair's 53.7x; the model's "
    "8.2x for both is 1.9x over the steady state for the one-thread workers' 1.84x slower "
    "batches (see convnet_dataloader)",
    "convnet_dataloader-pinned": "both sides' profiled steps are served from the workers' "
    "prefetched batches; there pinning takes 2.4 ms of host time off the step (5.62 ms, BEFORE, "
    "profiler cost removed -> 3.18 ms, AFTER), of which the model credits the DataLoader's "
    "1.41 ms main-thread time to the pin-memory thread, the rest not separated in BEFORE's trace "
    "(1.99x estimated, 2.69x measured); in steady state pinning is worth 1.12x (39.3 -> 35.2 ms "
    "mean, steady_state-h200.json), the workers binding",
}


@pytest.mark.parametrize("pair", PAIRS, ids=[p["pair"] for p in PAIRS])
def test_applied_fix_estimate_within_1_25x_of_measured(pair, request):
    if pair["pair"] in KNOWN_MISSES:
        request.applymarker(pytest.mark.xfail(strict=True, reason=KNOWN_MISSES[pair["pair"]]))
    d = diag(pair["before"])
    est = applied_estimate(d, pair)
    ratio = est / pair["measured_speedup"]
    assert 1 / 1.25 <= ratio <= 1.25, (pair["pair"], est, pair["measured_speedup"])


def test_costly_sync_is_attributed_to_its_python_line():
    d = diag("item_loop-sync-stack.json.gz")
    top = d.sync_sites.row(0, named=True)
    assert top["op"] == "aten::item" and top["call"] == "cudaStreamSynchronize"
    # the frame is main() of capture/item_loop.py; PyTorch records frames per function, so the
    # line is where main stood when profiling began, and the call made is Tensor.item
    assert top["site"].startswith("capture/item_loop.py(") and ": main -> " in top["site"]
    assert "method item of Tensor" in top["site"]
    f = fixes(d)["remove-host-sync"]
    assert any("capture/item_loop.py(" in e for e in f.evidence)


def test_syncs_of_pageable_copies_go_with_pinned_memory():
    # x.to(device) from pageable memory makes the copy and a stream sync in the same op: that
    # sync is the copy's, so pinned-memory claims it and remove-host-sync does not
    d = diag("convnet_dataloader-workers-pageable.json.gz")
    m = d.model
    assert m.sync_calls >= 1 and m.own_sync_calls == 0
    assert "remove-host-sync" not in fixes(d)
    assert d.findings[0].fix == "pinned-memory"
    # the .item() loop's syncs are its own
    s = diag("item_loop-sync.json.gz").model
    assert s.own_sync_calls == s.sync_calls == 250


def test_larger_batch_grows_the_dataloader_too():
    # 97% of this step is the DataLoader on the main thread, which doubles with the batch
    d = diag("convnet_dataloader-main.json.gz")
    lb = fixes(d)["larger-batch"]
    assert not lb.recommended and lb.estimated_speedup < 1.05


def test_fusion_saves_the_fused_ops_host_time_not_the_steps_mean():
    """decode-eager: SDPA's cuDNN re-planning makes the step's mean host time per kernel large;
    fusing elementwise kernels saves their own ops' host time, so torch-compile is not worth 5%
    (it was 1.17x with the step's mean)."""
    d = diag("decode-eager.json.gz")
    f = next(x for x in d.findings if x.fix == "torch-compile")
    assert not f.recommended and f.estimated_speedup < 1.05
    per_k = float(f.derivation.split("host saves ")[1].split(" us")[0])
    assert per_k < d.model.per_kernel_host_us / 3


def test_a_kernel_past_its_cpu_window_is_its_launching_steps_busy_time():
    # elementwise-compile is host-bound (CPU windows): its one fused kernel per step (126.0,
    # 128.3, 127.2, 126.2, 126.5 us) starts late in its step's window and runs past its end.
    # Busy time is the launching step's: median 126.5 us, and the steps add up to the kernel
    # table's total over the analysed steps (634.3 us), not 71-116 us per step.
    d = diag("elementwise-compile.json.gz")
    t = tracedx.load(SAMPLES / "elementwise-compile.json.gz")
    w = d.windows
    kernels = t.kernels.filter(pl.col("step").is_not_null())
    assert w["gpu_busy_us"].to_list() == pytest.approx(
        kernels.sort("step")["duration_us"].to_list(), abs=1e-3
    )
    assert float(w["gpu_busy_us"].sum()) == pytest.approx(
        float(kernels["duration_us"].sum()), abs=1e-3
    )
    assert round(float(w["gpu_busy_us"].median()) / 1e3, 3) == 0.127


def test_readme_profiler_cost_ranges_name_their_sets_and_hold(capsys):
    """The README's two ranges of the profiler's cost per host event, each over the set it
    names: every sample trace whose cost is solved (an unprofiled timing, no CUDA graph, not
    assumed), and the host-bound ones ``benchmarks/profiler_cost.py`` fits; the fit's numbers
    as that benchmark prints them; the assumed cost as the first set's median."""
    import importlib.util
    import re
    import statistics
    import types

    from tests.conftest import ROOT
    from tracedx.analysis import diagnosis as dg

    if not CAL.exists():
        pytest.skip("sample traces missing")
    solved = []
    for p in sorted(SAMPLES.glob("*.json.gz")):
        d = diag(p.name)
        m = d.model
        if m is None or not m.unprofiled_step_us or m.tax_assumed:
            continue
        if d.trace.launches.filter(pl.col("api_kind") == "graph").height:
            continue
        solved.append(m.tax_us)
    spec = importlib.util.spec_from_file_location(
        "profiler_cost", ROOT / "benchmarks/profiler_cost.py"
    )
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    # the benchmark reads the diagnoses made above, not its own of every sample again
    made = {}

    def load(f):
        d = diag(f.name)
        made[id(d.trace)] = d
        return d.trace

    bench.tracedx = types.SimpleNamespace(load=load, diagnose=lambda t: made[id(t)])
    bench.main()
    out = capsys.readouterr().out
    coef = re.search(r"ops (-?[\d.]+), runtime (-?[\d.]+), kernels (-?[\d.]+)", out).groups()
    r2, n_hb = re.search(r"R\^2 ([\d.]+) over (\d+) host-bound", out).groups()
    rows = [r.split(" | ") for r in out.splitlines() if r.startswith("| ") and r[2:3] != "-"][1:]
    ratio = {r[0][2:]: float(r[3]) for r in rows}
    per_event = [float(r[4].rstrip(" |")) for r in rows]
    lo, hi = min(ratio, key=ratio.get), max(ratio, key=ratio.get)
    readme = " ".join((ROOT / "README.md").read_text().split())
    n, a, b = len(solved), min(solved), max(solved)
    ha, hb = min(per_event), max(per_event)
    assert f"(the {n} with an unprofiled timing, no CUDA graph and a host side that" in readme
    assert (
        f"it can be solved from: {a:.1f} to {b:.1f} us; {ha:.1f} to {hb:.1f} us on the {n_hb} of "
        "them that `benchmarks/profiler_cost.py` counts host-bound" in readme
    )
    assert (
        f"on the {n_hb} host-bound sample traces with an unprofiled timing (unprofiled step over 1.5x"
        in readme
    )
    assert (
        f"gives {coef[0]} us per op, {coef[1]} us per runtime call and {coef[2]} us per kernel "
        f"record (R^2 {r2}," in readme
    )
    assert (
        f"from {ratio[lo]:.2f}x (`{lo}`) to {ratio[hi]:.2f}x (`{hi}`) of their measured excess"
        in readme
    )
    assert (
        f"solves from each of these {n_hb} traces ranges {ha:.1f} to {hb:.1f} us ({a:.1f} to "
        f"{b:.1f} us over all {n} sample traces whose cost is solved" in readme
    )
    assert f"from the {n_hb} host-bound sample traces ({ha:.1f} to {hb:.1f} us per event)" in readme
    assert round(statistics.median(solved), 1) == dg.TAX_ASSUMED_US
    assert f"{a:.1f} to {b:.1f} us over {n} of them" in dg._TAX_ASSUMED_NOTE
    assert round(hb, 1) == dg.TAX_USUAL_MAX_US


def test_op_tables_tell_every_row_apart_and_mark_cut_shapes():
    # resnet50's convolution_backward groups differ late in their shapes: the text table cut
    # two of them to the same text; the markdown table cut shapes at 60 with no mark, so a cut
    # "32x12x12" read as a real shape
    d = diag("resnet50_train-fp32.json.gz")
    text = render(d, "text").splitlines()
    i = next(i for i, ln in enumerate(text) if ln.startswith("  op (inputs where names repeat)"))
    rows = [ln[2:42] for ln in text[i + 1 :] if ln.startswith("  aten::")]
    assert len(rows) >= 6 and len(set(rows)) == len(rows)
    md = render(diag("bert_train-bf16-eager.json.gz"), "md").splitlines()
    row = next(r for r in md if r.startswith("| `aten::_cudnn_attention_backward` |"))
    shapes = row.split(" | ")[1]
    assert len(shapes) == 60 and shapes.endswith("…")


def test_an_on_target_estimate_of_a_fix_that_slowed_the_step_says_so():
    # ViT-B/16 bf16 eager -> compiled: 1.12x estimated, 0.98x achieved unprofiled (1.14, within
    # 1.25x): on target, and the line says AFTER got slower
    if not (SAMPLES / "vit_train-bf16-compile.json.gz").exists():
        pytest.skip("sample traces missing")
    td = tracedx.diff(
        tracedx.load(SAMPLES / "vit_train-bf16-eager.json.gz"),
        tracedx.load(SAMPLES / "vit_train-bf16-compile.json.gz"),
    )
    p = td.prediction
    assert p.verdict == "on target"
    assert p.explanation == (
        "estimate 1.12x against 0.98x achieved (unprofiled): within 1.25x; but AFTER is slower: "
        "the fix did not pay here"
    )


def test_fp32_math_in_a_cuda_graph_says_why_tf32_is_not_estimated():
    # the graph-replayed MLP step is compute-bound on fp32 math, but its GEMMs have no op (no
    # shapes): no tf32 finding, and a note says so instead of nothing
    d = diag("mlp_train-cudagraph.json.gz")
    assert (d.regime, d.bottleneck) == ("compute-bound", "fp32 math")
    assert "tf32" not in fixes(d)
    assert any(n.startswith("fp32 math binds, but tf32 is not estimated") for n in d.notes)
    # where tf32 is estimated, no such note
    m = diag("matmul-fp32.json.gz", calibration=str(CAL))
    assert "tf32" in fixes(m) and not any("tf32 is not estimated" in n for n in m.notes)


def test_fp32_math_without_shapes_names_record_shapes_not_cuda_graphs(tmp_path):
    # matmul-fp32 with its ops' input shapes stripped (as without record_shapes=True): no tf32
    # finding, and the note blames the missing shapes, not CUDA graphs (there are none)
    import gzip

    if not (SAMPLES / "matmul-fp32.json.gz").exists():
        pytest.skip("sample traces missing")
    doc = json.loads(gzip.decompress((SAMPLES / "matmul-fp32.json.gz").read_bytes()))
    for ev in doc["traceEvents"]:
        (ev.get("args") or {}).pop("Input Dims", None)
    p = tmp_path / "noshapes.json"
    p.write_text(json.dumps(doc))
    d = diagnose(tracedx.load(p), calibration=str(CAL))
    assert d.bottleneck == "fp32 math" and "tf32" not in fixes(d)
    (note,) = [n for n in d.notes if "tf32 is not estimated" in n]
    assert "(the ops record no input shapes (record_shapes=True)," in note
    assert "CUDA graph" not in note


def test_large_rates_print_as_numbers_not_exponents():
    # llama's device-to-device copies ran at 1,728 GB/s: "1.73e+03 GB/s" before
    from tracedx.report.html import _cell

    text = " ".join(render(diag("llama_train-eager.json.gz"), "text").split())
    assert "0.248 ms at 1,728 GB/s" in text and "e+03" not in text
    assert _cell("achieved_gbps", 1153.4)[0] == "1,153"
    assert _cell("achieved_gbps", 512.34)[0] == "512"
