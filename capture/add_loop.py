"""500 x add_ on one element per step: pure launch overhead, and its CUDA graph.

    python capture/add_loop.py                  # eager: 500 tiny kernels launched from Python
    python capture/add_loop.py --cuda-graph     # the 500 adds replayed as one graph (the fix)

``tracedx.step()`` marks each step. An earlier run on an H200 (another day, not recorded here): 7.45 ms eager, 0.73 ms graphed.
"""

from __future__ import annotations

import torch
from _common import cuda_graph, done, parser, setup, step_marker


def main() -> None:
    p = parser(__doc__.splitlines()[0], steps=20)
    p.add_argument("--ops", type=int, default=500, help="add_ calls per step")
    p.add_argument("--cuda-graph", action="store_true", help="replay the step as a CUDA graph")
    args = p.parse_args()
    device, _ = setup(args)
    x = torch.zeros(1, device=device)

    def body() -> None:
        for _ in range(args.ops):
            x.add_(1.0)

    if args.cuda_graph:
        if device.type != "cuda":
            p.error("--cuda-graph needs a CUDA device")
        graph = cuda_graph(body, replays=0)
        for _ in range(args.steps):
            graph.replay()
            step_marker()
    else:
        for _ in range(args.steps):
            body()
            step_marker()
    done("add_loop", args.steps, device, ops=args.ops, cuda_graph=args.cuda_graph)


if __name__ == "__main__":
    main()
