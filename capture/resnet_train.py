"""ResNet-18-shaped training step, batch 128, 96x96: fp32 vs bf16 autocast + channels_last.

    python capture/resnet_train.py                           # fp32, PyTorch's defaults
    python capture/resnet_train.py --bf16 --channels-last    # the "fix" that is worth nothing
    python capture/resnet_train.py --no-tf32                 # strict fp32 (cuDNN TF32 off)

Steps are marked by ``optimizer.step()`` (SGD with momentum). An earlier run on an H200 (another day, not recorded here): the GPU was
busy only 27% of the step, so bf16 + channels_last made it slower (15.9 -> 16.3 ms): the step
is overhead-bound, and an estimate must say the fix is worth nothing. PyTorch's defaults let
cuDNN run fp32 convolutions in TF32; ``--no-tf32`` turns that off, which makes the fp32 step
GPU-bound and the bf16 fix worth something.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from _common import done, parser, setup
from torch import nn


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (x if self.down is None else self.down(x)))


class ResNet18(nn.Module):
    """ResNet-18's layout (He et al. 2016): stem, 4 stages of 2 basic blocks, pool, linear."""

    def __init__(self, classes: int = 1000, width: int = 64):
        super().__init__()
        w = width
        self.stem = nn.Sequential(
            nn.Conv2d(3, w, 7, 2, 3, bias=False),
            nn.BatchNorm2d(w),
            nn.ReLU(),
            nn.MaxPool2d(3, 2, 1),
        )
        blocks, cin = [], w
        for i, cout in enumerate((w, 2 * w, 4 * w, 8 * w)):
            blocks += [BasicBlock(cin, cout, 1 if i == 0 else 2), BasicBlock(cout, cout, 1)]
            cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def main() -> None:
    p = parser(__doc__.splitlines()[0], steps=20)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--size", type=int, default=96, help="input images are size x size")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast")
    p.add_argument("--channels-last", action="store_true", help="channels_last memory format")
    p.add_argument("--no-tf32", action="store_true", help="strict fp32: cuDNN TF32 off")
    args = p.parse_args()
    device, small = setup(args)
    batch, size, width = (8, 32, 16) if small else (args.batch, args.size, 64)
    if args.no_tf32:
        torch.backends.cudnn.allow_tf32 = False  # PyTorch's default is True for convolutions
    torch.backends.cudnn.benchmark = True
    fmt = torch.channels_last if args.channels_last else torch.contiguous_format
    model = ResNet18(width=width).to(device=device, memory_format=fmt)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch, 3, size, size, device=device).to(memory_format=fmt)
    y = torch.randint(0, 1000, (batch,), device=device)
    for _ in range(args.steps):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    done(
        "resnet_train",
        args.steps,
        device,
        batch=batch,
        size=size,
        bf16=args.bf16,
        channels_last=args.channels_last,
        no_tf32=args.no_tf32,
    )


if __name__ == "__main__":
    main()
