"""What the profiler adds to tiny kernels, what DataLoader workers remove, and how a step is timed.

    python capture/profiler_inflation.py --out profiler_inflation.json

Three measurements on one GPU, each unprofiled and (where it says so) under ``torch.profiler``
(CPU + CUDA activity, as ``tracedx capture`` records):

- ``tiny_kernels``: for each tensor size, ``--ops`` dependent ``x.add_(1.0)`` on one fp32
  tensor, (a) launched eagerly back to back: host wall time per op (host-bound: the GPU keeps
  up), unprofiled and profiled, with the profiled trace's mean ``aten::add_`` and
  ``cudaLaunchKernel`` durations; (b) launched eagerly behind a ``torch.cuda._sleep`` so that
  all of them are queued before the first runs: GPU time per kernel between two CUDA events,
  unprofiled and profiled, with the kernels' reported durations (median) and the reported
  start-to-start spacing; (c) captured in one CUDA graph and replayed: GPU time per kernel
  (CUDA events, median over replays) unprofiled and profiled, the reported in-graph durations,
  and the host time of ``graph.replay()`` itself (perf_counter, no sync inside) per kernel.
- ``dataloader``: the CPU cores this process may use, the main-process DataLoader's time per
  batch of ``capture/convnet_dataloader.py`` (its transforms, no model), and the whole training
  step of that script timed unprofiled (synchronized wall clock per step, median) with 0, 1, 2,
  4 and 8 workers, pageable batches.
- ``step_timing``: ``capture/mlp_train.py``'s width-8192 MLP (batch 2048; fp32 and bf16
  autocast): each step timed from an idle GPU (synchronize before and after, as
  ``tracedx capture --time-unprofiled`` does) against free-running steps (one synchronize
  after all of them).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import cuda_graph  # noqa: E402 (after the path above)


def _trace_events(prof, tmp: Path, tag: str) -> list[dict]:
    path = tmp / f"{tag}.json"
    prof.export_chrome_trace(str(path))
    return json.loads(path.read_text()).get("traceEvents", [])


def _profile(fn, tmp: Path, tag: str):
    act = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=act, record_shapes=True) as prof:
        out = fn()
        torch.cuda.synchronize()
    return out, _trace_events(prof, tmp, tag)


def _kernels(ev: list[dict]) -> list[dict]:
    return sorted(
        (e for e in ev if e.get("ph") == "X" and e.get("cat") == "kernel"), key=lambda e: e["ts"]
    )


def _mean_dur(ev: list[dict], name: str) -> float | None:
    d = [float(e["dur"]) for e in ev if e.get("ph") == "X" and e.get("name") == name]
    return statistics.mean(d) if d else None


def tiny_kernels(sizes: list[int], ops: int, tmp: Path) -> list[dict]:
    rows = []
    for n in sizes:
        x = torch.zeros(n, device="cuda")

        def body(x=x) -> None:
            for _ in range(ops):
                x.add_(1.0)

        for _ in range(3):
            body()
        torch.cuda.synchronize()

        def host_loop(body=body) -> float:  # host wall per op, back to back
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            body()
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            return (t1 - t0) * 1e6 / ops

        host_unprof = statistics.median(host_loop() for _ in range(5))
        host_prof, ev = _profile(host_loop, tmp, f"host-{n}")
        ks = _kernels(ev)

        def queued(body=body) -> float:  # GPU time per kernel, all queued ahead
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            torch.cuda._sleep(int(2e8))  # ~0.1 s at ~2 GHz: the host queues every add first
            s.record()
            body()
            e.record()
            torch.cuda.synchronize()
            return s.elapsed_time(e) * 1e3 / ops

        q_unprof = statistics.median(queued() for _ in range(5))
        q_prof, qev = _profile(queued, tmp, f"queued-{n}")
        qk = [k for k in _kernels(qev) if "add" in k["name"]]
        starts = [float(k["ts"]) for k in qk]
        spacing = (starts[-1] - starts[0]) / (len(starts) - 1) if len(starts) > 1 else None

        g = cuda_graph(body)

        def replay(g=g) -> tuple[float, float]:  # GPU us per kernel, host us per kernel
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            s.record()
            t0 = time.perf_counter()
            g.replay()
            t1 = time.perf_counter()
            e.record()
            torch.cuda.synchronize()
            return s.elapsed_time(e) * 1e3 / ops, (t1 - t0) * 1e6 / ops

        un = [replay() for _ in range(30)]
        pr, gev = _profile(lambda: [replay() for _ in range(5)], tmp, f"graph-{n}")
        gk = _kernels(gev)
        k0 = ks[0] if ks else {}
        row = {
            "elements": n,
            "kernel": k0.get("name", "")[:120],
            "grid": k0.get("args", {}).get("grid"),
            "block": k0.get("args", {}).get("block"),
            "eager_host_us_per_op_unprofiled": host_unprof,
            "eager_host_us_per_op_profiled": host_prof,
            "eager_aten_add_us_profiled": _mean_dur(ev, "aten::add_"),
            "eager_cudaLaunchKernel_us_profiled": _mean_dur(ev, "cudaLaunchKernel"),
            "eager_reported_kernel_us": statistics.median(float(k["dur"]) for k in ks)
            if ks
            else None,
            "queued_gpu_us_per_kernel_unprofiled": q_unprof,
            "queued_gpu_us_per_kernel_profiled": q_prof,
            "queued_reported_kernel_us": statistics.median(float(k["dur"]) for k in qk)
            if qk
            else None,
            "queued_reported_start_spacing_us": spacing,
            "graph_gpu_us_per_kernel_unprofiled": statistics.median(u[0] for u in un),
            "graph_gpu_us_per_kernel_profiled": statistics.median(p[0] for p in pr),
            "graph_reported_kernel_us": statistics.median(float(k["dur"]) for k in gk)
            if gk
            else None,
            "graph_replay_host_us_per_kernel_unprofiled": statistics.median(u[1] for u in un),
            "graph_replay_host_us_per_kernel_profiled": statistics.median(p[1] for p in pr),
            "graph_cudaGraphLaunch_us_profiled": _mean_dur(gev, "cudaGraphLaunch"),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def dataloader(steps: int) -> dict:
    import convnet_dataloader as cd
    import torch.nn.functional as F
    from torch.utils.data import DataLoader

    batch = 128
    out: dict = {
        "os_cpu_count": os.cpu_count(),
        "sched_getaffinity": len(os.sched_getaffinity(0)),
        "torch_num_threads": torch.get_num_threads(),
    }
    data = cd.RandomImages(batch * (steps + 3), 144, 96)
    it = iter(DataLoader(data, batch_size=batch, num_workers=0, drop_last=True))
    next(it)
    t = []
    for _ in range(5):
        t0 = time.perf_counter()
        next(it)
        t.append((time.perf_counter() - t0) * 1e3)
    out["main_process_next_ms"] = statistics.median(t)
    out["main_process_next_ms_all"] = t
    one_item = []
    for i in range(20):
        t0 = time.perf_counter()
        data[i]
        one_item.append((time.perf_counter() - t0) * 1e3)
    out["getitem_ms_median"] = statistics.median(one_item)
    by_workers = {}
    for w in (0, 1, 2, 4, 8):
        torch.manual_seed(0)
        loader = DataLoader(
            data,
            batch_size=batch,
            num_workers=w,
            worker_init_fn=cd._one_thread if w else None,
            drop_last=True,
        )
        model = cd.convnet().cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        times, nexts = [], []
        it = iter(loader)
        for i in range(steps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            x, y = next(it)
            t1 = time.perf_counter()
            x, y = x.cuda(), y.cuda()
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            opt.step()
            torch.cuda.synchronize()
            if i >= 2:  # the first batches wait for the workers to start
                times.append((time.perf_counter() - t0) * 1e3)
                nexts.append((t1 - t0) * 1e3)
        by_workers[str(w)] = {
            "step_ms_median": statistics.median(times),
            "step_ms_min": min(times),
            "step_ms_max": max(times),
            "next_ms_median": statistics.median(nexts),
            "n": len(times),
        }
        print(w, json.dumps(by_workers[str(w)]), flush=True)
        del it, loader
    out["by_workers"] = by_workers
    return out


def step_timing(steps: int) -> list[dict]:
    from torch import nn

    torch.set_float32_matmul_precision("highest")
    rows = []
    for bf16 in (False, True):
        layers = []
        for i in range(3):
            layers.append(nn.Linear(8192, 8192))
            if i < 2:
                layers.append(nn.ReLU())
        model = nn.Sequential(*layers).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        x = torch.randn(2048, 8192, device="cuda")
        y = torch.randn(2048, 8192, device="cuda")
        amp = torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16)

        def step(model=model, opt=opt, amp=amp, x=x, y=y) -> None:
            opt.zero_grad(set_to_none=True)
            with amp:
                loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()

        for _ in range(5):
            step()
        torch.cuda.synchronize()
        synced = []
        for _ in range(steps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            step()
            torch.cuda.synchronize()
            synced.append((time.perf_counter() - t0) * 1e3)
        host = []
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps):
            h0 = time.perf_counter()
            step()
            host.append((time.perf_counter() - h0) * 1e3)
        torch.cuda.synchronize()
        free = (time.perf_counter() - t0) * 1e3 / steps
        row = {
            "dtype": "bf16-autocast" if bf16 else "fp32",
            "synced_step_ms_median": statistics.median(synced),
            "synced_step_ms_min": min(synced),
            "free_running_step_ms": free,
            "host_ms_per_step_free_running_median": statistics.median(host),
            "n": steps,
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="profiler_inflation.json")
    p.add_argument("--sizes", default="1,128,1024,65536,1048576")
    p.add_argument("--ops", type=int, default=500)
    p.add_argument("--dl-steps", type=int, default=10)
    p.add_argument("--mlp-steps", type=int, default=20)
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp())
    doc = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    doc["tiny_kernels"] = tiny_kernels([int(s) for s in args.sizes.split(",")], args.ops, tmp)
    doc["step_timing"] = step_timing(args.mlp_steps)
    doc["dataloader"] = dataloader(args.dl_steps)
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
