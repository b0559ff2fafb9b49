"""What a kernel costs inside a CUDA graph, unprofiled, against the duration the profiler reports.

    python capture/graph_node_cost.py --out graph_node_cost.json

For each tensor size, a CUDA graph of ``--nodes`` dependent ``x.add_(1.0)`` kernels on one
fp32 tensor is replayed. Unprofiled: CUDA events around each replay, median over
``--replays``, divided by the number of nodes (us per kernel, gaps included). Profiled: the
same replays under ``torch.profiler`` (CPU + CUDA activity), and the kernels' durations as
CUPTI reports them in the chrome trace (median, us) with the profiled replay time per kernel.
The same kernels launched eagerly are profiled too (their reported duration outside a graph).

This measures the model behind the cuda-graphs estimate (``tracedx.analysis.findings``):
which unprofiled in-graph time per kernel goes with a profiled kernel duration.
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import tempfile
from pathlib import Path

import torch


def kernel_durations(trace_path: Path) -> list[float]:
    opener = gzip.open if trace_path.suffix == ".gz" else open
    with opener(trace_path, "rt") as f:
        doc = json.load(f)
    return [
        float(e["dur"])
        for e in doc.get("traceEvents", [])
        if e.get("ph") == "X" and e.get("cat") == "kernel" and "dur" in e
    ]


def profiled(fn, reps: int, tmp: Path, tag: str) -> tuple[list[float], float]:
    """Kernel durations (us) reported by the profiler, and wall us per call of fn."""
    act = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=act, record_shapes=True) as prof:
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        torch.cuda.synchronize()
    per_call_us = start.elapsed_time(end) * 1e3 / reps
    path = tmp / f"{tag}.json"
    prof.export_chrome_trace(str(path))
    return kernel_durations(path), per_call_us


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="graph_node_cost.json")
    p.add_argument("--nodes", type=int, default=200)
    p.add_argument("--replays", type=int, default=50)
    p.add_argument(
        "--sizes", default="1,1024,16384,65536,262144,1048576,4194304,16777216", help="elements"
    )
    args = p.parse_args()
    dev = torch.device("cuda")
    rows = []
    tmp = Path(tempfile.mkdtemp())
    for n_el in [int(s) for s in args.sizes.split(",")]:
        x = torch.zeros(n_el, device=dev)

        def body(x=x) -> None:
            for _ in range(args.nodes):
                x.add_(1.0)

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            body()
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            body()
        for _ in range(5):
            g.replay()
        torch.cuda.synchronize()
        times = []
        for _ in range(args.replays):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            g.replay()
            e.record()
            torch.cuda.synchronize()
            times.append(s.elapsed_time(e) * 1e3)
        unprof = statistics.median(times) / args.nodes
        gd, g_call = profiled(g.replay, 10, tmp, f"graph-{n_el}")
        ed, _ = profiled(body, 3, tmp, f"eager-{n_el}")
        row = {
            "elements": n_el,
            "bytes_moved": 8 * n_el,
            "unprofiled_graph_us_per_kernel": unprof,
            "profiled_graph_us_per_kernel": g_call / args.nodes,
            "profiled_graph_kernel_dur_us": statistics.median(gd) if gd else None,
            "profiled_eager_kernel_dur_us": statistics.median(ed) if ed else None,
            "kernels_seen": [len(gd), len(ed)],
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    doc = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "nodes": args.nodes,
        "replays": args.replays,
        "rows": rows,
    }
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
