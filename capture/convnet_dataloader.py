"""Conv net trained from a DataLoader whose CPU transforms run in the main process, vs workers.

    python capture/convnet_dataloader.py                             # transforms in the loop
    python capture/convnet_dataloader.py --workers 8 --pin-memory    # 8 workers, pinned (fix)

Each sample is a random 3 x 144 x 144 uint8 image (made on the fly: nothing is downloaded)
put through typical CPU transforms (random crop, flip, brightness/contrast jitter, blur,
antialiased resize to 96 x 96, normalisation); batches of 128 train a small conv net with SGD.
Steps are marked by ``optimizer.step()``. An earlier run on an H200 (another day, not recorded here): 87.6 ms with the transforms in
the main process, 3.9 ms with 8 workers and pinned memory.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from _common import done, parser, setup
from torch import nn
from torch.utils.data import DataLoader, Dataset

MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)


class RandomImages(Dataset):
    """Random images with CPU transforms done in ``__getitem__`` (as torchvision would)."""

    def __init__(self, length: int, raw: int, out: int, classes: int = 10):
        self.length, self.raw, self.out, self.classes = length, raw, out, classes

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int):
        g = torch.Generator().manual_seed(i)
        raw, crop = self.raw, self.raw - self.raw // 9
        img = torch.randint(0, 256, (3, raw, raw), dtype=torch.uint8, generator=g)
        img = img.float().div_(255.0)
        top, left = torch.randint(0, raw - crop + 1, (2,), generator=g).tolist()
        img = img[:, top : top + crop, left : left + crop]
        if torch.rand((), generator=g) < 0.5:
            img = img.flip(-1)
        b, c = (0.8 + 0.4 * torch.rand(2, generator=g)).tolist()
        mean = img.mean()
        img = ((img - mean) * c + mean * b).clamp_(0.0, 1.0)
        img = F.avg_pool2d(img[None], 3, stride=1, padding=1)
        img = F.interpolate(img, size=(self.out, self.out), mode="bilinear", antialias=True)[0]
        img = (img - MEAN) / STD
        label = int(torch.randint(0, self.classes, (), generator=g))
        return img, label


def _one_thread(_: int) -> None:
    torch.set_num_threads(1)


def convnet() -> nn.Module:
    """The small convolutional classifier the DataLoader pairs train (random weights)."""
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, 2, 1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Conv2d(32, 64, 3, 2, 1), nn.BatchNorm2d(64), nn.ReLU(),
        nn.Conv2d(64, 128, 3, 2, 1), nn.BatchNorm2d(128), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10),
    )  # fmt: skip


def main() -> None:
    p = parser(__doc__.splitlines()[0], steps=20)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    p.add_argument("--pin-memory", action="store_true", help="pinned batches, non_blocking copy")
    args = p.parse_args()
    device, small = setup(args)
    batch, raw, out = (16, 40, 32) if small else (args.batch, 144, 96)
    data = RandomImages(batch * args.steps, raw, out)
    loader = DataLoader(
        data,
        batch_size=batch,
        shuffle=False,
        num_workers=args.workers,
        pin_memory=args.pin_memory and device.type == "cuda",
        worker_init_fn=_one_thread if args.workers else None,
        drop_last=True,
    )
    model = convnet().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    non_blocking = args.pin_memory
    steps = 0
    for x, y in loader:
        x = x.to(device, non_blocking=non_blocking)
        y = y.to(device, non_blocking=non_blocking)
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()
        steps += 1
    done(
        "convnet_dataloader",
        steps,
        device,
        batch=batch,
        workers=args.workers,
        pin_memory=args.pin_memory,
    )


if __name__ == "__main__":
    main()
