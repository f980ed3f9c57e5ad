"""Image classifier trained the way pytorch/examples imagenet/main.py trains one.

Synthetic images stand in for the ImageFolder, and a small hand-written conv net for
the torchvision model, but the loop is the one thousands of scripts copied: argparse,
AverageMeter/ProgressMeter, `DataLoader(..., num_workers=args.workers,
pin_memory=True, shuffle=True)`, SGD with momentum, a validation pass per epoch.

Each sample costs a real decode (numpy work on a uint8 buffer plus a short sleep for
the storage read), about 4 ms, so at `-j 0` the loop waits on its input.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from enum import Enum

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

parser = argparse.ArgumentParser(description="PyTorch ImageNet-style Training (synthetic data)")
parser.add_argument(
    "-j", "--workers", default=0, type=int, metavar="N", help="number of data loading workers"
)
parser.add_argument("--epochs", default=2, type=int, metavar="N", help="number of total epochs")
parser.add_argument(
    "--iters-per-epoch",
    default=10,
    type=int,
    metavar="N",
    help="batches per epoch (the synthetic train set has N * batch-size images)",
)
parser.add_argument("-b", "--batch-size", default=32, type=int, metavar="N", help="mini-batch size")
parser.add_argument("--lr", "--learning-rate", default=0.1, type=float, metavar="LR", dest="lr")
parser.add_argument("--momentum", default=0.9, type=float, metavar="M", help="momentum")
parser.add_argument(
    "--wd", "--weight-decay", default=1e-4, type=float, metavar="W", dest="weight_decay"
)
parser.add_argument("-p", "--print-freq", default=5, type=int, metavar="N", help="print frequency")
parser.add_argument("--image-size", default=32, type=int, help="side of the (square) crops")
parser.add_argument("--num-classes", default=10, type=int)
parser.add_argument("--seed", default=0, type=int, help="seed for initializing training")

DECODE_SLEEP_S = 0.003  # the storage read of one JPEG


class SyntheticImageFolder(Dataset):
    """Stands in for `datasets.ImageFolder` + transforms: every `__getitem__` decodes.

    The raw "file" of image i is a uint8 buffer generated from i, so a sample is the
    same whichever worker loads it and in whatever order (equal losses run to run).
    """

    def __init__(self, length: int, image_size: int, num_classes: int, train: bool) -> None:
        self.length = length
        self.size = image_size
        self.num_classes = num_classes
        self.train = train
        self.mean = np.array([0.485, 0.456, 0.406], dtype=np.float32)[:, None, None]
        self.std = np.array([0.229, 0.224, 0.225], dtype=np.float32)[:, None, None]

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        rng = np.random.default_rng(index + (0 if self.train else 1_000_000))
        time.sleep(DECODE_SLEEP_S)
        raw = rng.integers(0, 256, size=(3, 72, 72), dtype=np.uint8)  # "decoded" JPEG
        img = raw.astype(np.float32) / 255.0
        # RandomResizedCrop-ish: a crop, a 2x2 box downsample, a flip
        top, left = rng.integers(0, 72 - 2 * self.size + 1, size=2) if self.train else (4, 4)
        img = img[:, top : top + 2 * self.size, left : left + 2 * self.size]
        img = img.reshape(3, self.size, 2, self.size, 2).mean(axis=(2, 4))
        if self.train and rng.random() < 0.5:
            img = img[:, :, ::-1]
        # ColorJitter-ish per-channel gain, then Normalize
        img = img * rng.uniform(0.8, 1.2, size=(3, 1, 1)).astype(np.float32)
        img = (img - self.mean) / self.std
        target = int(rng.integers(0, self.num_classes))
        return torch.from_numpy(np.ascontiguousarray(img, dtype=np.float32)), target


class SmallConvNet(nn.Module):
    """A few conv-BN-ReLU stages and a linear head (a resnet18 would not fit in seconds)."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1, bias=False),
            nn.BatchNorm2d(16),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1, bias=False),
            nn.BatchNorm2d(32),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1, bias=False),
            nn.BatchNorm2d(64),
            nn.ReLU(inplace=True),
        )
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.fc(x)


class Summary(Enum):
    NONE = 0
    AVERAGE = 1


class AverageMeter:
    """Computes and stores the average and current value"""

    def __init__(self, name: str, fmt: str = ":f", summary_type: Summary = Summary.AVERAGE):
        self.name = name
        self.fmt = fmt
        self.summary_type = summary_type
        self.reset()

    def reset(self) -> None:
        self.val = 0.0
        self.avg = 0.0
        self.sum = 0.0
        self.count = 0

    def update(self, val: float, n: int = 1) -> None:
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count

    def __str__(self) -> str:
        fmtstr = "{name} {val" + self.fmt + "} ({avg" + self.fmt + "})"
        return fmtstr.format(**self.__dict__)


class ProgressMeter:
    def __init__(self, num_batches: int, meters: list[AverageMeter], prefix: str = "") -> None:
        self.batch_fmtstr = self._get_batch_fmtstr(num_batches)
        self.meters = meters
        self.prefix = prefix

    def display(self, batch: int) -> None:
        entries = [self.prefix + self.batch_fmtstr.format(batch)]
        entries += [str(meter) for meter in self.meters]
        print("\t".join(entries), flush=True)

    def _get_batch_fmtstr(self, num_batches: int) -> str:
        num_digits = len(str(num_batches // 1))
        fmt = "{:" + str(num_digits) + "d}"
        return "[" + fmt + "/" + fmt.format(num_batches) + "]"


def accuracy(output: torch.Tensor, target: torch.Tensor) -> float:
    """Top-1 accuracy in percent."""
    with torch.no_grad():
        return (output.argmax(dim=1) == target).float().mean().item() * 100.0


def train(loader, model, criterion, optimizer, epoch: int, args, printed: list[float]) -> int:
    batch_time = AverageMeter("Time", ":6.3f")
    data_time = AverageMeter("Data", ":6.3f")
    losses = AverageMeter("Loss", ":.4e")
    top1 = AverageMeter("Acc@1", ":6.2f")
    progress = ProgressMeter(
        len(loader), [batch_time, data_time, losses, top1], prefix=f"Epoch: [{epoch}]"
    )

    model.train()
    iterations = 0
    end = time.time()
    for i, (images, target) in enumerate(loader):
        data_time.update(time.time() - end)

        output = model(images)
        loss = criterion(output, target)

        losses.update(loss.item(), images.size(0))
        top1.update(accuracy(output, target), images.size(0))

        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        iterations += 1

        batch_time.update(time.time() - end)
        end = time.time()

        if i % args.print_freq == 0:
            progress.display(i + 1)
            printed.append(losses.val)
    return iterations


def validate(loader, model, criterion) -> float:
    top1 = AverageMeter("Acc@1", ":6.2f")
    model.eval()
    with torch.no_grad():
        for images, target in loader:
            output = model(images)
            criterion(output, target)
            top1.update(accuracy(output, target), images.size(0))
    print(f" * Acc@1 {top1.avg:.3f}", flush=True)
    return top1.avg


def main() -> None:
    args = parser.parse_args()
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)

    model = SmallConvNet(args.num_classes)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(
        model.parameters(), args.lr, momentum=args.momentum, weight_decay=args.weight_decay
    )
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=30, gamma=0.1)

    train_dataset = SyntheticImageFolder(
        args.iters_per_epoch * args.batch_size, args.image_size, args.num_classes, train=True
    )
    val_dataset = SyntheticImageFolder(
        2 * args.batch_size, args.image_size, args.num_classes, train=False
    )
    train_loader = DataLoader(
        train_dataset,
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
        pin_memory=True,
    )
    val_loader = DataLoader(
        val_dataset,
        batch_size=args.batch_size,
        shuffle=False,
        num_workers=args.workers,
        pin_memory=True,
    )

    printed: list[float] = []
    iterations = 0
    for epoch in range(args.epochs):
        iterations += train(train_loader, model, criterion, optimizer, epoch, args, printed)
        validate(val_loader, model, criterion)
        scheduler.step()

    record = {"iterations": iterations, "losses": printed[-5:], "batch_size": args.batch_size}
    print("CORPUS " + json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
