"""Attention B4 H16 T4096 D64 bf16: naive (materialised scores) vs scaled_dot_product_attention.

    python capture/attention.py           # softmax(q @ k^T / sqrt(d)) @ v, op by op
    python capture/attention.py --sdpa    # F.scaled_dot_product_attention (fused; the fix)

Forward only; ``tracedx.step()`` marks each step. An earlier run on an H200 (another day, not recorded here): 10.4 ms naive, 0.66 ms
with SDPA.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from _common import done, parser, setup, step_marker


def naive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    return scores.softmax(dim=-1) @ v


def main() -> None:
    p = parser(__doc__.splitlines()[0], steps=20)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--sdpa", action="store_true", help="use scaled_dot_product_attention")
    args = p.parse_args()
    device, small = setup(args)
    seq = min(args.seq, 256) if small else args.seq
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shape = (args.batch, args.heads, seq, args.head_dim)
    q, k, v = (torch.randn(shape, device=device, dtype=dtype) for _ in range(3))
    attend = F.scaled_dot_product_attention if args.sdpa else naive
    for _ in range(args.steps):
        attend(q, k, v)
        step_marker()
    done("attention", args.steps, device, seq=seq, sdpa=args.sdpa)


if __name__ == "__main__":
    main()
