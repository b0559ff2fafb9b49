"""Steady-state DataLoader steps and the GPU clock's effect on tiny kernels in a CUDA graph.

    python capture/steady_state.py --out steady_state.json

- ``dataloader``: ``capture/convnet_dataloader.py``'s training step with 0 workers, 8 workers
  (pageable) and 8 workers with ``pin_memory=True``, over ``--batches`` batches; every step
  after the first ``--skip`` is timed (synchronized wall clock), and both the median and the
  mean are kept (with workers, batches arrive in bursts of one per worker: the median is a
  step served from the prefetched queue, the mean is the throughput). Also the main process's
  time per batch (``next()`` with no model) with PyTorch's intra-op threads and with one thread
  (what a worker uses: PyTorch sets one thread in each DataLoader worker).
- ``graph_clock``: a CUDA graph of 500 dependent ``x.add_(1.0)`` (1 and 128 elements), GPU time
  per kernel (CUDA events, median of 30 replays), first with the GPU idle beforehand, then
  right after 0.3 s of bf16 8192^3 matmuls, with the SM clock read by ``nvidia-smi``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import cuda_graph  # noqa: E402 (after the path above)


def sm_clock() -> int | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=clocks.sm", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=10,
        ).stdout  # fmt: skip
        return int(out.split()[0])
    except Exception:
        return None


def graph_clock() -> list[dict]:
    rows = []
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for n in (1, 128):
        x = torch.zeros(n, device="cuda")

        def body(x=x) -> None:
            for _ in range(500):
                x.add_(1.0)

        g = cuda_graph(body, replays=1)

        def per_kernel(g=g) -> float:
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            g.replay()
            e.record()
            torch.cuda.synchronize()
            return s.elapsed_time(e) * 1e3 / 500

        for state in ("idle", "after-matmuls"):
            if state == "idle":
                time.sleep(2.0)
            else:
                t0 = time.perf_counter()
                while time.perf_counter() - t0 < 0.3:
                    a @ a
                torch.cuda.synchronize()
            clk = sm_clock()
            t = [per_kernel() for _ in range(30)]
            rows.append(
                {
                    "elements": n,
                    "state": state,
                    "sm_clock_mhz_before": clk,
                    "sm_clock_mhz_after": sm_clock(),
                    "graph_gpu_us_per_kernel_median": statistics.median(t),
                    "first_replay_us_per_kernel": t[0],
                    "min": min(t),
                    "max": max(t),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    return rows


def dataloader_steps(batches: int, skip: int) -> dict:
    """Per-step times as tracedx capture takes them (marker to marker), median and mean."""
    import convnet_dataloader as cd
    import torch.nn.functional as F
    from torch.utils.data import DataLoader

    batch = 128
    data = cd.RandomImages(batch * batches, 144, 96)
    out: dict = {"cpu_count": os.cpu_count(), "threads": torch.get_num_threads()}
    for threads in (out["threads"], 1):
        torch.set_num_threads(threads)
        it = iter(DataLoader(data, batch_size=batch, num_workers=0, drop_last=True))
        next(it)
        t = []
        for _ in range(4):
            t0 = time.perf_counter()
            next(it)
            t.append((time.perf_counter() - t0) * 1e3)
        out[f"main_next_ms_{threads}_threads"] = statistics.median(t)
        print(threads, t, flush=True)
    torch.set_num_threads(out["threads"])
    for name, w, pin in (("main", 0, False), ("workers-pageable", 8, False), ("workers", 8, True)):
        loader = DataLoader(
            data, batch_size=batch, num_workers=w, pin_memory=pin,
            worker_init_fn=cd._one_thread if w else None, drop_last=True,
        )  # fmt: skip
        model = cd.convnet().cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        marks = []
        for x, y in loader:
            x, y = x.cuda(non_blocking=pin), y.cuda(non_blocking=pin)
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            opt.step()
            torch.cuda.synchronize()
            marks.append(time.perf_counter())
        st = [(b - a) * 1e3 for a, b in zip(marks[skip:], marks[skip + 1 :], strict=False)]
        out[name] = {
            "workers": w,
            "pin_memory": pin,
            "n": len(st),
            "step_ms_median": statistics.median(st),
            "step_ms_mean": statistics.mean(st),
            "step_ms_min": min(st),
            "step_ms_max": max(st),
            "steps_ms": [round(s, 2) for s in st],
        }
        print(name, {k: v for k, v in out[name].items() if k != "steps_ms"}, flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="steady_state.json")
    p.add_argument("--batches", type=int, default=48)
    p.add_argument("--skip", type=int, default=16)
    args = p.parse_args()
    doc = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    doc["graph_clock"] = graph_clock()
    doc["dataloader"] = dataloader_steps(args.batches, args.skip)
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
