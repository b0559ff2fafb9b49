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
from _dist import parser, start
from torch import nn


def main() -> None:
    run = start(parser(__doc__.splitlines()[0], steps=30, sizes=("layers", "d_model")))
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    args, gpu = run.args, run.gpu
    d = args.d_model or (4096 if gpu else 256)
    depth = args.layers or (4 if gpu else 2)
    batch, seq = (16, 512) if gpu else (8, 32)
    blocks = []
    for _ in range(depth):
        blocks += [nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)]
    model = nn.Sequential(*blocks).to(run.device)
    plan = {}
    for i in range(depth):
        plan[str(3 * i)] = ColwiseParallel()
        plan[str(3 * i + 2)] = RowwiseParallel()
    parallelize_module(model, run.mesh(mesh_dim_names=("tp",)), plan)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(batch, seq, d, generator=torch.Generator().manual_seed(7)).to(run.device)

    def loss_fn() -> torch.Tensor:
        with run.autocast():
            return model(x).float().pow(2).mean()

    run.train_and_report("tp_mlp", opt, loss_fn, layers=depth, d_model=d)


if __name__ == "__main__":
    main()
