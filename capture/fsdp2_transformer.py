"""FSDP2 (``fully_shard``) training of a small transformer: prefetch and resharding variants.

    torchrun --nproc-per-node 2 capture/fsdp2_transformer.py                     # defaults
    torchrun --nproc-per-node 2 capture/fsdp2_transformer.py --no-prefetch       # no explicit prefetch
    torchrun --nproc-per-node 2 capture/fsdp2_transformer.py --no-reshard        # reshard_after_forward=False
    torchrun --nproc-per-node 2 -m tracedx capture capture/fsdp2_transformer.py -- --no-reshard

Each block is ``fully_shard``-ed, then the root (``torch.distributed.fsdp.fully_shard``,
PyTorch docs "FSDP2"). By default each block prefetches the next block's all-gather in forward
(``set_modules_to_forward_prefetch``) and the previous one's in backward
(``set_modules_to_backward_prefetch``); ``--no-prefetch`` leaves only FSDP2's implicit
prefetching. ``reshard_after_forward`` is True by default (backward re-gathers every block's
parameters); ``--no-reshard`` keeps them gathered. On CUDA GPUs (NCCL): 8 blocks, d_model
1024, 16 heads, batch 8 x 512 tokens, bf16 parameters (MixedPrecisionPolicy); on CPU (gloo):
2 blocks, d_model 128, 4 heads, batch 4 x 64, fp32. Run plainly, each rank prints its
unprofiled step times (median, min, max of the last ``--time-steps`` steps).
"""

from __future__ import annotations

import torch
from _dist import parser, start
from torch import nn


class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


def main() -> None:
    p = parser(__doc__.splitlines()[0], steps=30, sizes=("layers", "d_model"))
    p.add_argument(
        "--no-prefetch", action="store_true", help="no explicit forward/backward prefetch"
    )
    p.add_argument("--no-reshard", action="store_true", help="reshard_after_forward=False")
    run = start(p)
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    args, gpu = run.args, run.gpu
    d = args.d_model or (1024 if gpu else 128)
    depth = args.layers or (8 if gpu else 2)
    heads = 16 if gpu else 4
    batch, seq = (8, 512) if gpu else (4, 64)
    mesh = run.mesh()
    blocks = nn.ModuleList(Block(d, heads) for _ in range(depth))
    model = nn.Sequential(*blocks, nn.Linear(d, d)).to(run.device)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16) if gpu else MixedPrecisionPolicy()
    reshard = not args.no_reshard
    for b in blocks:
        fully_shard(b, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp)
    if not args.no_prefetch:
        for i, b in enumerate(blocks):
            if i + 1 < len(blocks):
                b.set_modules_to_forward_prefetch([blocks[i + 1]])
            if i > 0:
                b.set_modules_to_backward_prefetch([blocks[i - 1]])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator(device="cpu").manual_seed(1000 + run.rank)
    x = torch.randn(batch, seq, d, generator=gen).to(run.device)
    run.train_and_report(
        "fsdp2_transformer",
        opt,
        lambda: model(x).float().pow(2).mean(),
        layers=depth,
        d_model=d,
        prefetch=not args.no_prefetch,
        reshard_after_forward=reshard,
    )


if __name__ == "__main__":
    main()
