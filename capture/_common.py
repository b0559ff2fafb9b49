"""Helpers shared by the workload scripts in this folder (not a workload itself).

Every script runs as plain ``python capture/<name>.py`` on a CUDA GPU or on CPU (smaller sizes,
chosen automatically, or forced with ``--small``), needs no download and uses random weights.
Under ``tracedx capture`` the loops mark their steps with ``tracedx.step()`` (decode and other
loops) or through ``optimizer.step()`` (training loops); without tracedx the marker is a no-op.
"""

from __future__ import annotations

import argparse

import torch

try:  # tracedx is optional: the scripts also run without it
    import tracedx

    step_marker = tracedx.step
except Exception:  # pragma: no cover - tracedx or its dependencies missing

    def step_marker() -> None:
        """No tracedx here: nothing to mark."""


def parser(description: str, steps: int) -> argparse.ArgumentParser:
    """An argument parser with the options every workload has."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--steps", type=int, default=steps, help="steps (iterations) to run")
    p.add_argument("--small", action="store_true", help="small sizes (the default on CPU)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    p.add_argument("--seed", type=int, default=0)
    return p


def setup(args: argparse.Namespace) -> tuple[torch.device, bool]:
    """The device to run on and whether to use small sizes; seeds the generators."""
    name = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    torch.manual_seed(args.seed)
    small = bool(args.small or device.type != "cuda")
    return device, small


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def done(name: str, steps: int, device: torch.device, **info) -> None:
    """Print one closing line (after a synchronization, so the work really finished)."""
    sync(device)
    extra = "".join(f", {k}={v}" for k, v in info.items())
    print(f"{name}: {steps} steps on {device.type}{extra}", flush=True)


def cuda_graph(body, replays: int = 5) -> torch.cuda.CUDAGraph:
    """``body()`` captured in a CUDA graph, after one warm-up run on a side stream (as the
    PyTorch CUDA-graph docs require), then replayed ``replays`` times and synchronized."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        body()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        body()
    for _ in range(replays):
        g.replay()
    torch.cuda.synchronize()
    return g
