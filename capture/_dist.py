"""Helpers shared by the distributed workload scripts (``ddp_mlp.py``, ``fsdp2_transformer.py``,
``tp_mlp.py``, ``allreduce_busbw.py``); not a workload itself.

Each script runs under ``torchrun --nproc-per-node N``: NCCL on CUDA GPUs (one process per
GPU, ``LOCAL_RANK`` picks the device), gloo on CPU. Under ``tracedx capture`` the training loop
marks its steps through ``optimizer.step()``; run plainly, each script times its own steps
without the profiler and prints one line per rank (:func:`report_timing`).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist


def base_parser(description: str) -> argparse.ArgumentParser:
    """Options every distributed script has: the device and the seed."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    p.add_argument("--seed", type=int, default=0)
    return p


def parser(
    description: str, steps: int = 30, sizes: tuple[str, ...] = ()
) -> argparse.ArgumentParser:
    """Options every distributed workload has: steps, timing, device, straggler injection;
    and one integer option per name in ``sizes`` (``"d_model"`` -> ``--d-model``, default
    None: the script's size for the device)."""
    p = base_parser(description)
    p.add_argument("--steps", type=int, default=steps, help="training steps to run")
    p.add_argument(
        "--time-steps",
        type=int,
        default=20,
        help="steps timed (the last ones); the steps before them are warm-up",
    )
    p.add_argument(
        "--straggler-rank", type=int, default=None, help="the rank that does extra work per step"
    )
    p.add_argument(
        "--host-ms",
        type=float,
        default=0.0,
        help="extra host work per step on --straggler-rank, in ms (a busy Python loop before "
        "the forward)",
    )
    for name in sizes:
        p.add_argument(f"--{name.replace('_', '-')}", type=int, default=None)
    return p


@dataclass
class Run:
    """One rank of a started job (:func:`start`): its options, device, rank and world size."""

    args: argparse.Namespace
    device: torch.device
    rank: int
    world: int

    @property
    def gpu(self) -> bool:
        return self.device.type == "cuda"

    def autocast(self):
        """bf16 autocast on CUDA, a no-op on CPU."""
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.gpu)

    def mesh(self, **kw):
        """A 1-D device mesh over all ranks (``torch.distributed.device_mesh``)."""
        from torch.distributed.device_mesh import init_device_mesh

        return init_device_mesh(self.device.type, (self.world,), **kw)

    def train_and_report(self, name: str, opt, loss_fn, **info) -> None:
        """:func:`train`, then :func:`report_timing` (``info`` plus the straggler options),
        then :func:`finish`."""
        timer = train(self.args, self.device, self.rank, opt, loss_fn)
        report_timing(
            name,
            timer,
            self.rank,
            self.world,
            **info,
            straggler=self.args.straggler_rank,
            host_ms=self.args.host_ms,
        )
        finish()


def start(p: argparse.ArgumentParser) -> Run:
    """Parse the options and join the job (:func:`init`)."""
    args = p.parse_args()
    device, rank, world = init(args)
    return Run(args, device, rank, world)


def init(args: argparse.Namespace) -> tuple[torch.device, int, int]:
    """Initialise the default process group from torchrun's environment.

    Returns (device, rank, world_size). NCCL when the device is CUDA (``LOCAL_RANK`` selects
    the GPU), gloo otherwise.
    """
    name = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)  # the same weights on every rank
    return device, rank, world


def busy_host(ms: float) -> None:
    """Keep the host busy for ``ms`` milliseconds in a Python loop (not a sleep: a sleeping
    thread looks idle in a trace, a straggler's extra host work does not)."""
    if ms <= 0:
        return
    end = time.perf_counter() + ms / 1e3
    x = 0
    while time.perf_counter() < end:
        x += 1


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Timer:
    """Per-step wall time (synchronized at each step end) of the last ``count`` steps."""

    def __init__(self, device: torch.device, steps: int, count: int):
        self.device = device
        self.skip = max(steps - count, 0)
        self.times_ms: list[float] = []
        self._t = None
        self._i = 0

    def step(self) -> None:
        """Call once at the end of every step."""
        sync(self.device)
        now = time.perf_counter()
        if self._t is not None and self._i >= max(self.skip, 1):
            self.times_ms.append((now - self._t) * 1e3)
        self._t = now
        self._i += 1


def train(args: argparse.Namespace, device: torch.device, rank: int, opt, loss_fn) -> Timer:
    """Run ``args.steps`` training steps (zero_grad, ``loss_fn().backward()``, ``opt.step()``);
    on ``args.straggler_rank`` each step starts with ``args.host_ms`` of host work. Returns
    the step timer."""
    timer = Timer(device, args.steps, args.time_steps)
    straggler = rank == args.straggler_rank
    for _ in range(args.steps):
        if straggler:
            busy_host(args.host_ms)
        opt.zero_grad(set_to_none=True)
        loss_fn().backward()
        opt.step()
        timer.step()
    return timer


def report_timing(name: str, timer: Timer, rank: int, world: int, **info) -> None:
    """Print this rank's step times (median, min, max in ms) and, on rank 0, the job's line.

    Under ``tracedx capture`` the steps ran under the profiler and the line says so; run
    plainly they are the unprofiled step times issue 18 asks for.
    """
    try:
        from tracedx import capture as _cap

        profiled = _cap._active_markers is not None
    except Exception:
        profiled = False
    kind = "profiled" if profiled else "unprofiled"
    t = timer.times_ms
    extra = "".join(f" {k}={v}" for k, v in info.items())
    if t:
        line = (
            f"{name} rank {rank}/{world}: {kind} step ms median {statistics.median(t):.3f} "
            f"min {min(t):.3f} max {max(t):.3f} n={len(t)}{extra}"
        )
    else:
        line = f"{name} rank {rank}/{world}: no step timed (steps <= warm-up){extra}"
    print(line, flush=True)
    medians = [None] * world
    dist.all_gather_object(medians, statistics.median(t) if t else None)
    if rank == 0 and all(m is not None for m in medians):
        print(
            f"{name} job: {kind} median step ms per rank "
            + " ".join(f"{m:.3f}" for m in medians)
            + f"; job (slowest rank) {max(medians):.3f}",
            flush=True,
        )


def finish() -> None:
    """Leave the job: a barrier, a short pause, then destroy the default process group.

    The pause lets gloo's worker threads finish with their last work item first: when the
    last reference to a ``ProcessGroupGloo`` goes (DDP's reducer holds one until the model is
    freed), its destructor joins those threads while holding the GIL, and a worker that still
    needs the GIL to free its work's thread-local state deadlocks the exit (seen here with
    torch 2.13 CPU in about one run in three of ``ddp_mlp.py`` under ``tracedx capture``).
    """
    if dist.is_initialized():
        dist.barrier()
        time.sleep(0.2)
        dist.destroy_process_group()
