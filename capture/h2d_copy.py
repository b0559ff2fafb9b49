"""64 MiB host-to-device copy per step + 2 fp32 GEMMs: pageable (blocking) vs pinned.

    python capture/h2d_copy.py             # pageable host memory: the copy blocks the host
    python capture/h2d_copy.py --pinned    # pinned memory + non_blocking=True (the fix)

The 64 MiB input is a 4096 x 4096 fp32 matrix used by two GEMMs (TF32 off); ``tracedx.step()``
marks each step. An earlier run on an H200 (another day, not recorded here): 18.5 ms pageable, 6.85 ms pinned.
"""

from __future__ import annotations

import torch
from _common import done, parser, setup, step_marker


def main() -> None:
    p = parser(__doc__.splitlines()[0], steps=20)
    p.add_argument("--n", type=int, default=4096, help="input is n x n fp32 (4096: 64 MiB)")
    p.add_argument("--pinned", action="store_true", help="pinned host memory, non_blocking copy")
    args = p.parse_args()
    device, small = setup(args)
    n = min(args.n, 512) if small else args.n
    torch.set_float32_matmul_precision("highest")
    host = torch.randn(n, n)
    if args.pinned and device.type == "cuda":
        host = host.pin_memory()
    w = torch.randn(n, n, device=device) / n**0.5
    for _ in range(args.steps):
        x = host.to(device, non_blocking=args.pinned)
        y = x @ w
        y @ w
        step_marker()
    done("h2d_copy", args.steps, device, n=n, pinned=args.pinned)


if __name__ == "__main__":
    main()
