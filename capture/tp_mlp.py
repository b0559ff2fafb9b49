"""Tensor-parallel MLP blocks (DTensor ``parallelize_module``): all-reduces on the critical path.

    torchrun --nproc-per-node 2 capture/tp_mlp.py
    torchrun --nproc-per-node 2 capture/tp_mlp.py --straggler-rank 1 --host-ms 4
    torchrun --nproc-per-node 2 -m tracedx capture capture/tp_mlp.py

Each block is ``Linear(d, 4d) -> GELU -> Linear(4d, d)`` with the first layer
``ColwiseParallel`` and the second ``RowwiseParallel`` (Megatron-style; PyTorch docs "Tensor
Parallelism - torch.distributed.tensor.parallel"): one all-reduce of the activations per block
in forward, one in backward, which the next compute waits for. On CUDA GPUs (NCCL): 4 blocks,
d 4096, batch 16 x 512 tokens, bf16 autocast; on CPU (gloo): 2 blocks, d 256, batch 8 x 32,
fp32. Run plainly, each rank prints its unprofiled step times (median, min, max of the last
``--time-steps`` steps).
"""

from __future__ import annotations

import torch
from _dist import finish, init, parser, report_timing, train
from torch import nn


def main() -> None:
    p = parser(__doc__.splitlines()[0], steps=30)
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--d-model", type=int, default=None)
    args = p.parse_args()
    device, rank, world = init(args)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    gpu = device.type == "cuda"
    d = args.d_model or (4096 if gpu else 256)
    depth = args.layers or (4 if gpu else 2)
    batch, seq = (16, 512) if gpu else (8, 32)
    mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("tp",))
    blocks = []
    for _ in range(depth):
        blocks += [nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)]
    model = nn.Sequential(*blocks).to(device)
    plan = {}
    for i in range(depth):
        plan[str(3 * i)] = ColwiseParallel()
        plan[str(3 * i + 2)] = RowwiseParallel()
    parallelize_module(model, mesh, plan)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(batch, seq, d, generator=torch.Generator().manual_seed(7)).to(device)
    amp = torch.autocast(device.type, dtype=torch.bfloat16, enabled=gpu)

    def loss_fn() -> torch.Tensor:
        with amp:
            return model(x).float().pow(2).mean()

    timer = train(args, device, rank, opt, loss_fn)
    report_timing(
        "tp_mlp",
        timer,
        rank,
        world,
        layers=depth,
        d_model=d,
        straggler=args.straggler_rank,
        host_ms=args.host_ms,
    )
    finish()


if __name__ == "__main__":
    main()
