"""What a kernel costs inside a CUDA graph, unprofiled, against the duration the profiler reports.

    python capture/graph_node_cost.py --out graph_node_cost.json

For each op of ``--ops`` and each tensor size, a CUDA graph of ``--nodes`` dependent kernels
on one fp32 tensor is replayed (``add_``: ``x.add_(1.0)``, an elementwise kernel; ``sum``:
``torch.sum(x, 0, out=y)``, a reduction; ``copy``: ``y.copy_(x)``; ``cumsum``:
``torch.cumsum(x, 0, out=z)``, a scan). The ``*_us_per_kernel`` figures are per call of the op
(one graph node of the loop): for an op that launches several kernels per call (``cumsum``: 2,
see ``kernels_seen``) they cover all of them. Unprofiled: CUDA events around each replay, median over
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
from _common import cuda_graph


def kernel_events(trace_path: Path) -> list[dict]:
    opener = gzip.open if trace_path.suffix == ".gz" else open
    with opener(trace_path, "rt") as f:
        doc = json.load(f)
    return [
        e
        for e in doc.get("traceEvents", [])
        if e.get("ph") == "X" and e.get("cat") == "kernel" and "dur" in e
    ]


def kernel_durations(trace_path: Path) -> list[float]:
    return [float(e["dur"]) for e in kernel_events(trace_path)]


def grid_blocks(trace_path: Path) -> list[int]:
    """Thread blocks per kernel (grid x*y*z) of every kernel in the trace."""
    out = []
    for e in kernel_events(trace_path):
        g = e.get("args", {}).get("grid") or [0]
        n = 1
        for v in g:
            n *= int(v)
        out.append(n)
    return out


def profiled(fn, reps: int, tmp: Path, tag: str) -> tuple[list[float], float, list[int]]:
    """Kernel durations (us) reported by the profiler, wall us per call of fn, grid sizes."""
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
    return kernel_durations(path), per_call_us, grid_blocks(path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="graph_node_cost.json")
    p.add_argument("--nodes", type=int, default=200)
    p.add_argument("--replays", type=int, default=50)
    p.add_argument("--ops", default="add_", help="comma list of add_, sum, copy, cumsum")
    p.add_argument(
        "--sizes", default="1,1024,16384,65536,262144,1048576,4194304,16777216", help="elements"
    )
    args = p.parse_args()
    dev = torch.device("cuda")
    rows = []
    tmp = Path(tempfile.mkdtemp())
    cases = [(op, int(n)) for op in args.ops.split(",") for n in args.sizes.split(",")]
    for op, n_el in cases:
        x = torch.zeros(n_el, device=dev)
        y = torch.zeros((), device=dev) if op == "sum" else torch.zeros(n_el, device=dev)

        def one(op=op, x=x, y=y) -> None:
            if op == "add_":
                x.add_(1.0)
            elif op == "sum":
                torch.sum(x, 0, out=y)
            elif op == "copy":
                y.copy_(x)
            elif op == "cumsum":
                torch.cumsum(x, 0, out=y)
            else:
                raise SystemExit(f"unknown op {op!r}")

        def body(one=one) -> None:
            for _ in range(args.nodes):
                one()

        g = cuda_graph(body)
        times = []
        for _ in range(args.replays):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            g.replay()
            e.record()
            torch.cuda.synchronize()
            times.append(s.elapsed_time(e) * 1e3)
        unprof = statistics.median(times) / args.nodes
        gd, g_call, grids = profiled(g.replay, 10, tmp, f"graph-{op}-{n_el}")
        ed, _, _ = profiled(body, 3, tmp, f"eager-{op}-{n_el}")
        row = {
            "op": op,
            "grid_blocks": sorted(set(grids)),
            "elements": n_el,
            "bytes_moved": (4 * n_el + 4) if op == "sum" else 8 * n_el,
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
