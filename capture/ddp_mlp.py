"""DDP training of an MLP: balanced, host straggler, data straggler, gradient bucketing off.

    torchrun --nproc-per-node 2 capture/ddp_mlp.py                          # balanced
    torchrun --nproc-per-node 2 capture/ddp_mlp.py --straggler-rank 1 --host-ms 4   # host straggler
    torchrun --nproc-per-node 2 capture/ddp_mlp.py --straggler-rank 1 --batch-scale 1.5  # data straggler
    torchrun --nproc-per-node 2 capture/ddp_mlp.py --bucket-cap-mb 100000   # one bucket: all-reduce after backward
    torchrun --nproc-per-node 2 -m tracedx capture capture/ddp_mlp.py -- --straggler-rank 1 --host-ms 4

On CUDA GPUs (NCCL, one process per GPU) the MLP is width 4096, 6 layers, batch 256 under bf16
autocast; on CPU (gloo) it is width 256, 3 layers, batch 32, fp32. The straggler's extra host
work is a busy Python loop before the forward on ``--straggler-rank`` (its fixed version is the
same command without the straggler options); a data straggler runs a ``--batch-scale`` times
larger batch on that rank. Without ``tracedx capture`` each rank prints its unprofiled step
times (median, min, max of the last ``--time-steps`` steps, synchronized at each step end).
"""

from __future__ import annotations

import torch
from _dist import parser, start
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    p = parser(__doc__.splitlines()[0], steps=30, sizes=("width", "layers", "batch"))
    p.add_argument(
        "--batch-scale",
        type=float,
        default=1.0,
        help="batch multiplier on --straggler-rank (a data straggler)",
    )
    p.add_argument(
        "--bucket-cap-mb", type=float, default=25.0, help="DDP bucket_cap_mb (default 25)"
    )
    run = start(p)
    args, device, gpu = run.args, run.device, run.gpu
    width = args.width or (4096 if gpu else 256)
    depth = args.layers or (6 if gpu else 3)
    batch = args.batch or (256 if gpu else 32)
    layers: list[nn.Module] = []
    for i in range(depth):
        layers.append(nn.Linear(width, width))
        if i < depth - 1:
            layers.append(nn.ReLU())
    model = DDP(
        nn.Sequential(*layers).to(device),
        device_ids=[device.index] if gpu else None,
        bucket_cap_mb=args.bucket_cap_mb,
    )
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    straggler = run.rank == args.straggler_rank
    n = int(round(batch * args.batch_scale)) if straggler else batch
    gen = torch.Generator(device="cpu").manual_seed(1000 + run.rank)
    x = torch.randn(n, width, generator=gen).to(device)
    y = torch.randn(n, width, generator=gen).to(device)

    def loss_fn() -> torch.Tensor:
        with run.autocast():
            return nn.functional.mse_loss(model(x), y)

    run.train_and_report(
        "ddp_mlp",
        opt,
        loss_fn,
        width=width,
        layers=depth,
        batch=n,
        bucket_cap_mb=args.bucket_cap_mb,
        batch_scale=args.batch_scale,
    )


if __name__ == "__main__":
    main()
