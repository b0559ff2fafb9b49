"""A torchvision model's training step (ViT-B/16 or ResNet-50), fp32 or bf16 autocast.

    python capture/vision_train.py --model vit_b_16             # fp32, TF32 off (PyTorch's matmul default)
    python capture/vision_train.py --model vit_b_16 --bf16      # bf16 autocast (the fix)
    python capture/vision_train.py --model vit_b_16 --tf32      # TF32 matmuls allowed (the fix)
    python capture/vision_train.py --model resnet50 --bf16 --channels-last
    python capture/vision_train.py --model vit_b_16 --bf16 --compile   # through torch.compile (the fix)

The model comes from ``torchvision.models`` with ``weights=None`` (random weights, no
download): the library's own layers, not a re-implementation. Batch 32 at 224x224 by default,
AdamW, cross-entropy against random labels; steps are marked by ``optimizer.step()``. Needs
``torchvision``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from _common import done, parser, setup


def main() -> None:
    p = parser(__doc__.splitlines()[0], steps=16)
    p.add_argument("--model", default="vit_b_16", choices=("vit_b_16", "resnet50"))
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--size", type=int, default=224, help="input images are size x size")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast")
    p.add_argument("--compile", action="store_true", help="torch.compile(model) (the fix)")
    p.add_argument("--tf32", action="store_true", help="TF32 for matmuls and convolutions")
    p.add_argument("--channels-last", action="store_true", help="channels_last memory format")
    args = p.parse_args()
    device, small = setup(args)
    import torchvision

    batch, size = (2, 64 if args.model == "resnet50" else 224) if small else (args.batch, args.size)
    torch.backends.cuda.matmul.allow_tf32 = args.tf32  # PyTorch's default: False
    torch.backends.cudnn.allow_tf32 = args.tf32  # PyTorch's default: True; strict fp32 here
    torch.backends.cudnn.benchmark = True
    kw = {"image_size": size} if args.model == "vit_b_16" else {}
    model = getattr(torchvision.models, args.model)(weights=None, **kw)
    fmt = torch.channels_last if args.channels_last else torch.contiguous_format
    model = model.to(device=device, memory_format=fmt).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    run = torch.compile(model) if args.compile else model
    x = torch.randn(batch, 3, size, size, device=device).to(memory_format=fmt)
    y = torch.randint(0, 1000, (batch,), device=device)
    amp = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16)
    for _ in range(args.steps):
        opt.zero_grad(set_to_none=True)
        with amp:
            loss = F.cross_entropy(run(x), y)
        loss.backward()
        opt.step()
    done(
        "vision_train", args.steps, device, model=args.model, batch=batch, size=size,
        bf16=args.bf16, tf32=args.tf32, channels_last=args.channels_last, compile=args.compile,
    )  # fmt: skip


if __name__ == "__main__":
    main()
