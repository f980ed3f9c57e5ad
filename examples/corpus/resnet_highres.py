"""A ResNet-style CNN trained at a high input resolution: the activations are the memory.

Written the way image classifiers are written from torchvision's ResNet and the
pytorch/examples ImageNet script: a `BasicBlock` class (conv-BN-ReLU-conv-BN plus the
shortcut), a `_make_layer` that stacks the blocks in an `nn.Sequential`, a `Dataset`
of images behind a `DataLoader`, SGD with momentum, cross-entropy, and a progress line
per iteration. The network is narrow (16 channels) and the images are large (160 x 160
by default, as segmentation and detection backbones see them): every block keeps a few
feature maps of batch x 16 x 160 x 160 floats for its backward, so the activations, not
the 40 k weights, decide whether a batch fits.

The trap: at `--batch-size 32` under a 1.6 GB process memory limit
(`stepscope run --memory-limit 1.6GB -- python examples/corpus/resnet_highres.py
--batch-size 32`) the job runs out of memory in its first step (the CPU allocator's
"can't allocate memory"); at its default batch of 8 it fits with room to spare.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

parser = argparse.ArgumentParser(description="train a small ResNet on large random images")
parser.add_argument("-b", "--batch-size", type=int, default=8)
parser.add_argument("--image-size", type=int, default=160)
parser.add_argument("--width", type=int, default=16, help="channels of the first stage")
parser.add_argument("--blocks", type=int, default=6, help="residual blocks at full resolution")
parser.add_argument("--iters", type=int, default=6)
parser.add_argument("-j", "--workers", type=int, default=0)
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--print-freq", type=int, default=1)
args = parser.parse_args()


class RandomImages(Dataset):
    """`length` images with 10 labels; item i is the same on every run."""

    def __init__(self, length: int, size: int, seed: int) -> None:
        self.length = length
        self.size = size
        self.seed = seed

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        g = torch.Generator().manual_seed(self.seed * 100_003 + i)
        image = torch.randn(3, self.size, self.size, generator=g)
        return image, int(torch.randint(0, 10, (1,), generator=g))


class BasicBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + x)


class ResNet(nn.Module):
    def __init__(self, width: int, blocks: int, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU()
        )
        self.layer1 = self._make_layer(width, blocks)
        self.down = nn.Conv2d(width, 2 * width, 3, stride=2, padding=1, bias=False)
        self.layer2 = self._make_layer(2 * width, 2)
        self.fc = nn.Linear(2 * width, classes)

    @staticmethod
    def _make_layer(channels: int, blocks: int) -> nn.Sequential:
        return nn.Sequential(*[BasicBlock(channels) for _ in range(blocks)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layer1(self.stem(x))
        x = self.layer2(F.relu(self.down(x)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def main() -> None:
    torch.manual_seed(args.seed)
    model = ResNet(args.width, args.blocks)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
    data = RandomImages(args.iters * args.batch_size, args.image_size, args.seed)
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=True, num_workers=args.workers)
    print(f"=> {sum(p.numel() for p in model.parameters())} parameters, batch {args.batch_size}")
    model.train()
    losses = []
    end = time.time()
    for i, (images, target) in enumerate(loader):
        output = model(images)
        loss = criterion(output, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if i % args.print_freq == 0:
            print(f"[{i}/{len(loader)}]\tTime {time.time() - end:.3f}\tLoss {losses[-1]:.4e}")
        end = time.time()
    record = {"iterations": len(losses), "losses": losses[-3:], "batch_size": args.batch_size}
    print("CORPUS " + json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
