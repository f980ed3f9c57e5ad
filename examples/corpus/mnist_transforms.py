"""MNIST-style training the way pytorch/examples mnist/main.py writes it, transforms and all.

The loop is that script's: `train(args, model, device, train_loader, optimizer, epoch)`
printing `Train Epoch: 1 [640/6000 (11%)]\\tLoss: 2.301`, `test()` after each epoch
(`model.eval()`, `torch.no_grad()`, summed NLL loss and accuracy), Adadelta with a
StepLR, `DataLoader(dataset, batch_size=64, num_workers=..., shuffle=True)`.

Its datasets apply their transform in `__getitem__`, as torchvision's `MNIST` does:
`transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))])`.
torchvision does not import with this machine's CPU torch, so the transforms are
written here with the same shapes: `Normalize` and v2's `RandomAffine`-like shift are
`nn.Module`s (as torchvision's are), v1's `Compose` a plain object, v2's (`--v2`)
a module itself. Every sample calls them: thousands of module calls that are the
input pipeline, not a model. Images are generated (digit-like blobs), not downloaded.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
from torch import nn, optim
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader, Dataset


class ToTensor:
    """uint8 HxW -> float 1xHxW in [0, 1] (torchvision's ToTensor is no module either)."""

    def __call__(self, img: torch.Tensor) -> torch.Tensor:
        return img.unsqueeze(0).float().div(255)


class Normalize(nn.Module):
    def __init__(self, mean: tuple[float, ...], std: tuple[float, ...]) -> None:
        super().__init__()
        self.mean, self.std = mean, std

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = torch.tensor(self.mean).view(-1, 1, 1)
        return (x - mean) / torch.tensor(self.std).view(-1, 1, 1)


class RandomShift(nn.Module):
    """v2.RandomAffine(translate=...) reduced to whole-pixel shifts."""

    def __init__(self, pixels: int, seed: int) -> None:
        super().__init__()
        self.pixels, self.gen = pixels, torch.Generator().manual_seed(seed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dx, dy = torch.randint(-self.pixels, self.pixels + 1, (2,), generator=self.gen).tolist()
        return torch.roll(x, shifts=(dy, dx), dims=(-2, -1))


class Compose:
    def __init__(self, transforms: list) -> None:
        self.transforms = transforms

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        for t in self.transforms:
            x = t(x)
        return x


class ComposeV2(nn.Module):
    """transforms.v2.Compose: a module holding modules."""

    def __init__(self, transforms: list) -> None:
        super().__init__()
        self.to_tensor = transforms[0]
        self.rest = nn.ModuleList(transforms[1:])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.to_tensor(x)
        for t in self.rest:
            x = t(x)
        return x


class Digits(Dataset):
    """Generated 28x28 digit-like images: the class decides where the blob sits."""

    def __init__(self, n: int, seed: int, transform) -> None:
        g = torch.Generator().manual_seed(seed)
        self.targets = torch.randint(0, 10, (n,), generator=g)
        noise = torch.rand(n, 28, 28, generator=g) * 60
        rows = (self.targets // 5) * 12 + 4
        cols = (self.targets % 5) * 5 + 2
        self.data = noise.to(torch.uint8)
        for i in range(n):
            r, c = int(rows[i]), int(cols[i])
            self.data[i, r : r + 8, c : c + 4] = 255
        self.transform = transform

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        img, target = self.data[index], int(self.targets[index])
        if self.transform is not None:
            img = self.transform(img)
        return img, target


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, 1)
        self.conv2 = nn.Conv2d(16, 32, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.fc1 = nn.Linear(4608, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(self.dropout1(x), 1)
        return F.log_softmax(self.fc2(F.relu(self.fc1(x))), dim=1)


def train(args, model, device, train_loader, optimizer, epoch, record) -> None:
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        record["iterations"] += 1
        record["losses"].append(loss.item())
        if batch_idx % args.log_interval == 0:
            print(
                f"Train Epoch: {epoch} [{batch_idx * len(data)}/{len(train_loader.dataset)} "
                f"({100.0 * batch_idx / len(train_loader):.0f}%)]\tLoss: {loss.item():.6f}",
                flush=True,
            )


def test(model, device, test_loader) -> None:
    model.eval()
    test_loss, correct = 0.0, 0
    with torch.no_grad():
        for data, target in test_loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            correct += output.argmax(dim=1).eq(target).sum().item()
    n = len(test_loader.dataset)
    print(
        f"\nTest set: Average loss: {test_loss / n:.4f}, Accuracy: {correct}/{n} "
        f"({100.0 * correct / n:.0f}%)\n",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description="PyTorch MNIST Example (generated digits)")
    parser.add_argument("--batch-size", type=int, default=64, metavar="N")
    parser.add_argument("--test-batch-size", type=int, default=250, metavar="N")
    parser.add_argument("--epochs", type=int, default=2, metavar="N")
    parser.add_argument("--train-size", type=int, default=640, metavar="N")
    parser.add_argument("--test-size", type=int, default=500, metavar="N")
    parser.add_argument("--lr", type=float, default=1.0, metavar="LR")
    parser.add_argument("--gamma", type=float, default=0.7, metavar="M")
    parser.add_argument("--num-workers", type=int, default=0, metavar="N")
    parser.add_argument("--v2", action="store_true", help="transforms.v2-style: a module Compose")
    parser.add_argument("--seed", type=int, default=1, metavar="S")
    parser.add_argument("--log-interval", type=int, default=1, metavar="N")
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    device = torch.device("cpu")

    if args.v2:
        transform = ComposeV2(
            [ToTensor(), RandomShift(2, args.seed), Normalize((0.1307,), (0.3081,))]
        )
    else:
        transform = Compose([ToTensor(), Normalize((0.1307,), (0.3081,))])
    train_kwargs = {"batch_size": args.batch_size, "shuffle": True, "num_workers": args.num_workers}
    test_kwargs = {"batch_size": args.test_batch_size, "num_workers": args.num_workers}
    train_loader = DataLoader(Digits(args.train_size, 1, transform), **train_kwargs)
    test_loader = DataLoader(Digits(args.test_size, 2, transform), **test_kwargs)

    model = Net().to(device)
    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)
    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    record = {"iterations": 0, "losses": [], "batch_size": args.batch_size}
    for epoch in range(1, args.epochs + 1):
        train(args, model, device, train_loader, optimizer, epoch, record)
        test(model, device, test_loader)
        scheduler.step()
    record["losses"] = record["losses"][-3:]  # the last iterations', to full precision
    print("CORPUS " + json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
