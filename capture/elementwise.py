"""A gelu-like chain of elementwise ops on 8192^2 fp32: bandwidth-bound, and its fusion.

    python capture/elementwise.py              # eager: ~9 kernels, each reads/writes 256 MiB
    python capture/elementwise.py --compile    # torch.compile fuses the chain (the fix)

``tracedx.step()`` marks each step. An earlier run on an H200 (another day, not recorded here): 1.18 ms eager, 0.20 ms compiled.
"""

from __future__ import annotations

import torch
from _common import done, parser, setup, step_marker


def gelu_like(x: torch.Tensor) -> torch.Tensor:
    """tanh-approximated GELU written op by op (each op is its own kernel in eager mode)."""
    return 0.5 * x * (1.0 + torch.tanh(0.7978845608 * (x + 0.044715 * x * x * x)))


def main() -> None:
    p = parser(__doc__.splitlines()[0], steps=20)
    p.add_argument("--n", type=int, default=8192, help="tensor is n x n fp32")
    p.add_argument("--compile", action="store_true", help="torch.compile the chain (the fix)")
    args = p.parse_args()
    device, small = setup(args)
    n = min(args.n, 512) if small else args.n
    x = torch.randn(n, n, device=device)
    fn = torch.compile(gelu_like) if args.compile else gelu_like
    for _ in range(args.steps):
        fn(x)
        step_marker()
    done("elementwise", args.steps, device, n=n, compile=args.compile)


if __name__ == "__main__":
    main()
