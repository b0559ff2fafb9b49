"""Dense matmul loop: compute-bound (bf16 8192^3), and the fp32 TF32 off/on pair.

    python capture/matmul.py                                  # 4 x bf16 8192^3 per step
    python capture/matmul.py --dtype fp32 --n 4096            # 4 x fp32 4096^3, TF32 off
    python capture/matmul.py --dtype fp32 --n 4096 --tf32     # the same with TF32 (the fix)

One step = ``--count`` matmuls of random-normal n x n matrices; ``tracedx.step()`` after each.
An earlier run on an H200 (another day, not recorded here): 4 x fp32 4096^3 took 11.2 ms with TF32 off, 1.47 ms with TF32.
"""

from __future__ import annotations

import torch
from _common import done, parser, setup, step_marker

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def main() -> None:
    p = parser(__doc__.splitlines()[0], steps=12)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--n", type=int, default=8192, help="matrix size (n x n)")
    p.add_argument("--count", type=int, default=4, help="matmuls per step")
    p.add_argument("--tf32", action="store_true", help="allow TF32 for fp32 matmuls (the fix)")
    args = p.parse_args()
    device, small = setup(args)
    n = min(args.n, 256) if small else args.n
    dtype = DTYPES[args.dtype]
    if device.type == "cpu" and dtype != torch.float32:
        dtype = torch.float32  # half-precision matmul on CPU is not what this workload is about
    torch.set_float32_matmul_precision("high" if args.tf32 else "highest")
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    c = torch.empty(n, n, device=device, dtype=dtype)
    for _ in range(args.steps):
        for _ in range(args.count):
            torch.matmul(a, b, out=c)
        step_marker()
    done("matmul", args.steps, device, dtype=str(dtype).removeprefix("torch."), n=n, tf32=args.tf32)


if __name__ == "__main__":
    main()
