"""Fit the profiler's cost per recorded event kind from the sample traces' profiled/unprofiled pairs.

    python benchmarks/profiler_cost.py

Each sample trace carries its unprofiled step time (``tracedx capture --time-unprofiled``). On a
host-bound step (unprofiled step over 1.5x the GPU time; no syncs in a loop; no ``[memory]``
events) the host's slowdown under the profiler is the traced step less the unprofiled one.
This fits that excess, per step, as ``a x ops + b x runtime calls + c x kernel records`` by least
squares (numpy.linalg.lstsq) and prints the constants, each trace's excess against the fit's,
and the single cost per event that ``diagnose`` solves per trace instead. The result (README,
"Estimates against measurements"): no per-kind split fits the traces (fitted over measured
0.21x to 4.61x on 18 traces, with a negative cost per runtime call), so the per-trace cost
stays.

    python benchmarks/profiler_cost.py --tiny

prints instead what the profiler adds to tiny kernels, from the device measurement
``sample_traces/profiler_inflation-h200.json`` (``capture/profiler_inflation.py``): host time per
eager launch, GPU time per queued kernel and per kernel in a CUDA graph, unprofiled against
profiled, and the in-graph cost beyond the reported eager duration that the cuda-graphs
estimate adds (``tracedx.analysis.findings.GRAPH_GPU_GAP_US_PER_KERNEL``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import polars as pl

import tracedx

ROOT = Path(__file__).resolve().parents[1] / "sample_traces"
KINDS = ("ops", "runtime", "kernels")


def rows() -> pl.DataFrame:
    out = []
    for f in sorted(ROOT.glob("*.json.gz")):
        t = tracedx.load(f)
        d = tracedx.diagnose(t)
        m = d.model
        if m is None or not m.unprofiled_step_us:
            continue
        n = len(d.steps)
        inside = pl.col("step").is_in(d.steps)
        mem = t.memory.filter(inside).height if t.memory.height else 0
        out.append(
            {
                "trace": f.name.removesuffix(".json.gz"),
                "traced_us": m.step_us,
                "unprofiled_us": m.unprofiled_step_us,
                "gpu_us": m.gpu_us,
                "tax_us": m.tax_us,  # the one cost per event diagnose solves (or assumes)
                "ops": t.ops.filter(inside).height / n,
                "runtime": t.launches.filter(inside).height / n,
                "kernels": t.kernels.filter(inside).height / n,
                "host_bound": m.unprofiled_step_us > 1.5 * m.gpu_us
                and not m.sync_serial
                and mem == 0,
            }
        )
    return pl.DataFrame(out)


def main() -> None:
    df = (
        rows()
        .filter("host_bound")
        .with_columns(excess_us=pl.col("traced_us") - pl.col("unprofiled_us"))
    )
    x = df.select(KINDS).to_numpy()
    y = df["excess_us"].to_numpy()
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    print(
        "fitted cost per event (us):",
        ", ".join(f"{k} {c:.2f}" for k, c in zip(KINDS, coef, strict=True)),
    )
    fit = x @ coef
    r2 = 1 - ((y - fit) ** 2).sum() / ((y - y.mean()) ** 2).sum()
    print(f"R^2 {r2:.3f} over {len(y)} host-bound traces")
    print("| trace | excess, us per step | fitted | fitted / measured | one cost per event (us) |")
    print("| --- | --- | --- | --- | --- |")
    for name, e, f_, tax in zip(df["trace"], y, fit, df["tax_us"], strict=True):
        print(f"| {name} | {e:.0f} | {f_:.0f} | {f_ / e:.2f} | {tax:.2f} |")


def tiny() -> None:
    doc = json.loads((ROOT / "profiler_inflation-h200.json").read_text())
    print(
        "| elements | host per eager add_, us: unprofiled / profiled | reported kernel, us "
        "| GPU per queued kernel, us: unprofiled / profiled | GPU per kernel in a graph, us: "
        "unprofiled / profiled | in graph minus reported, us | graph replay host per kernel, us: "
        "unprofiled / profiled |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in doc["tiny_kernels"]:
        rep = r["eager_reported_kernel_us"]
        print(
            f"| {r['elements']:,} | {r['eager_host_us_per_op_unprofiled']:.2f} / "
            f"{r['eager_host_us_per_op_profiled']:.2f} | {rep:.2f} | "
            f"{r['queued_gpu_us_per_kernel_unprofiled']:.2f} / "
            f"{r['queued_gpu_us_per_kernel_profiled']:.2f} | "
            f"{r['graph_gpu_us_per_kernel_unprofiled']:.2f} / "
            f"{r['graph_gpu_us_per_kernel_profiled']:.2f} | "
            f"{r['graph_gpu_us_per_kernel_unprofiled'] - rep:+.2f} | "
            f"{r['graph_replay_host_us_per_kernel_unprofiled']:.2f} / "
            f"{r['graph_replay_host_us_per_kernel_profiled']:.2f} |"
        )


if __name__ == "__main__":
    tiny() if "--tiny" in sys.argv[1:] else main()
