"""All-reduce bus bandwidth against message size, as nccl-tests reports it.

    torchrun --standalone --nproc-per-node 2 capture/allreduce_busbw.py --out busbw.json

For each size from ``--min-mb`` to ``--max-mb`` (doubling; default 1 MiB to 1 GiB, bf16 on
CUDA, fp32 and at most 64 MiB on CPU) the all-reduce is run ``--warmup`` times, then timed
``--iters`` times between two barriers plus a device synchronize; the time is the slowest
rank's mean. algbw = bytes / time; busbw = algbw * 2 (n - 1) / n, the factor for all-reduce in
nccl-tests' doc/PERFORMANCE.md (github.com/NVIDIA/nccl-tests). Rank 0 prints one line per size
and writes the curve as JSON (schema ``tracedx.busbw/1``: sizes in bytes, times in us,
bandwidths in GB/s = 1e9 bytes/s).
"""

from __future__ import annotations

import json
import time

import torch
import torch.distributed as dist
from _dist import base_parser, finish, init, sync


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--min-mb", type=float, default=1.0)
    p.add_argument("--max-mb", type=float, default=None)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--out", default=None, help="JSON file for the curve (rank 0 writes it)")
    args = p.parse_args()
    device, rank, world = init(args)
    gpu = device.type == "cuda"
    dtype = torch.bfloat16 if gpu else torch.float32
    max_mb = args.max_mb or (1024.0 if gpu else 64.0)
    esize = torch.tensor([], dtype=dtype).element_size()
    rows = []
    mb = args.min_mb
    while mb <= max_mb + 1e-9:
        n = int(mb * 2**20) // esize
        x = torch.ones(n, dtype=dtype, device=device)
        for _ in range(args.warmup):
            dist.all_reduce(x)
        sync(device)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(args.iters):
            dist.all_reduce(x)
        sync(device)
        mine = (time.perf_counter() - t0) / args.iters
        slowest = torch.tensor([mine], dtype=torch.float64, device=device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        t = float(slowest.item())
        nbytes = n * esize
        algbw = nbytes / t / 1e9
        busbw = algbw * 2 * (world - 1) / world
        rows.append({"bytes": nbytes, "time_us": t * 1e6, "algbw_gbs": algbw, "busbw_gbs": busbw})
        if rank == 0:
            print(
                f"all_reduce {nbytes:>12,d} bytes {dtype}: {t * 1e6:10.1f} us, algbw "
                f"{algbw:7.2f} GB/s, busbw {busbw:7.2f} GB/s (n={world})",
                flush=True,
            )
        del x
        mb *= 2
    if rank == 0 and args.out:
        doc = {
            "schema": "tracedx.busbw/1",
            "collective": "all_reduce",
            "world_size": world,
            "backend": dist.get_backend(),
            "device": torch.cuda.get_device_name(device) if gpu else "cpu",
            "dtype": str(dtype).replace("torch.", ""),
            "iters": args.iters,
            "torch_version": torch.__version__,
            "rows": rows,
        }
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
        print(args.out, flush=True)
    finish()


if __name__ == "__main__":
    main()
