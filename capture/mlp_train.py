"""MLP training step: launch-bound (width 1024, batch 64) or compute-bound (width 8192, bf16).

    python capture/mlp_train.py                        # 3-layer MLP, width 1024, batch 64, SGD
    python capture/mlp_train.py --cuda-graph           # the whole step as one CUDA graph (fix)
    python capture/mlp_train.py --width 8192 --batch 2048          # large MLP, fp32 (TF32 off)
    python capture/mlp_train.py --width 8192 --batch 2048 --bf16   # bf16 autocast (fix)

Steps are marked by ``optimizer.step()`` in eager mode. With ``--cuda-graph`` the optimizer
runs inside the graph, so each replay is marked with ``tracedx.step()``; the warm-up steps
before the capture call ``optimizer.step()`` too, so capture it with
``tracedx capture --marker explicit``. An earlier run on an H200 (another day, not recorded here): 1.86 ms eager, 0.18 ms graphed.
"""

from __future__ import annotations

import torch
from _common import done, parser, setup, step_marker
from torch import nn


def main() -> None:
    p = parser(__doc__.splitlines()[0], steps=20)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--bf16", action="store_true", help="bf16 autocast (the fix for large MLPs)")
    p.add_argument("--cuda-graph", action="store_true", help="capture the whole step (the fix)")
    args = p.parse_args()
    device, small = setup(args)
    width = min(args.width, 256) if small else args.width
    batch = min(args.batch, 64) if small else args.batch
    torch.set_float32_matmul_precision("highest")  # fp32 means fp32: TF32 is a separate fix
    layers = []
    for i in range(args.layers):
        layers.append(nn.Linear(width, width))
        if i < args.layers - 1:
            layers.append(nn.ReLU())
    model = nn.Sequential(*layers).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(batch, width, device=device)
    y = torch.randn(batch, width, device=device)
    amp = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16)

    def fwd_bwd() -> torch.Tensor:
        with amp:
            loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss

    if args.cuda_graph:
        if device.type != "cuda":
            p.error("--cuda-graph needs a CUDA device")
        # PyTorch docs, "CUDA Graphs", whole-network capture: warm up on a side stream.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                opt.zero_grad(set_to_none=True)
                fwd_bwd()
                opt.step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(graph):
            fwd_bwd()
            opt.step()
        for _ in range(args.steps):
            graph.replay()
            step_marker()
    else:
        for _ in range(args.steps):
            opt.zero_grad(set_to_none=True)
            fwd_bwd()
            opt.step()
    done(
        "mlp_train",
        args.steps,
        device,
        width=width,
        batch=batch,
        bf16=args.bf16,
        cuda_graph=args.cuda_graph,
    )


if __name__ == "__main__":
    main()
