"""Small-tensor loop reading a value with .item() every iteration, vs keeping it on the device.

    python capture/item_loop.py              # .item() per iteration: a host sync each time
    python capture/item_loop.py --no-sync    # accumulate on the device, read once at the end

    python capture/item_loop.py --host-us 100          # + 100 us of Python work per iteration
    python capture/item_loop.py --size 4194304 --iters 100   # GPU work per iteration ~ host's

A step is ``--iters`` iterations of three small ops; ``tracedx.step()`` marks each step.
``--host-us`` adds that much host work (a Python loop on the clock) to every iteration: then the
host binds and the sync is worth little. A larger ``--size`` makes each iteration's GPU work
about as long as its host work: then the sync serialises the two and removing it is worth a lot.
An earlier run on an H200 (another day, not recorded here): removing the sync gained nothing (11.1 -> 12.2 ms), because kernel
launches already bound the host: a fix worth nothing, which estimates must catch.
"""

from __future__ import annotations

import time

import torch
from _common import done, parser, setup, step_marker


def main() -> None:
    p = parser(__doc__.splitlines()[0], steps=20)
    p.add_argument("--iters", type=int, default=250, help="loop iterations per step")
    p.add_argument("--size", type=int, default=1024, help="elements of the small tensor")
    p.add_argument("--host-us", type=float, default=0.0, help="Python work per iteration, us")
    p.add_argument("--no-sync", action="store_true", help="no .item() in the loop (the fix)")
    args = p.parse_args()
    device, _ = setup(args)
    x = torch.rand(args.size, device=device)
    total = 0.0
    acc = torch.zeros((), device=device)
    for _ in range(args.steps):
        for _ in range(args.iters):
            x = x * 0.999 + 0.001
            s = x.sum()
            if args.host_us:
                until = time.perf_counter() + args.host_us * 1e-6
                while time.perf_counter() < until:
                    pass
            if args.no_sync:
                acc += s
            else:
                total += s.item()
        step_marker()
    total += float(acc)
    done(
        "item_loop",
        args.steps,
        device,
        iters=args.iters,
        no_sync=args.no_sync,
        total=round(total, 3),
    )


if __name__ == "__main__":
    main()
