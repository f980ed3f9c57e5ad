"""Hogwild training the way pytorch/examples mnist_hogwild writes it: spawned processes
sharing one model, no distributed ranks.

The shape is that example's `main.py` and `train.py`: `mp.set_start_method('spawn',
force=True)`, `model.share_memory()`, one `mp.Process(target=train, args=(rank, args,
model, device, dataset, kwargs))` per `--num-processes`, each with its own DataLoader and
SGD optimizer over the shared parameters and `Train Epoch: 1 [640/6000 (11%)]\\tLoss:`
lines with its pid; the parent joins them, then runs `test()` itself. The `rank` the
example passes is only a seed offset: nothing calls `init_process_group`.

`--start-method fork|forkserver` and `--pool` (a `multiprocessing.Pool` mapping the
workers instead of `Process` objects) try the other ways people start such workers.
Images are generated (digit-like blobs), not downloaded; each worker reports its
iterations and last loss to the parent through a queue, for the CORPUS line.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn, optim
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = x.view(-1, 320)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, training=self.training)
        return F.log_softmax(self.fc2(x), dim=1)


def digits(n: int, seed: int) -> TensorDataset:
    """Generated, normalised 28x28 digit-like images: the class decides where the blob sits."""
    g = torch.Generator().manual_seed(seed)
    targets = torch.randint(0, 10, (n,), generator=g)
    images = torch.rand(n, 1, 28, 28, generator=g) * 0.2
    for i in range(n):
        r, c = int(targets[i] // 5) * 12 + 4, int(targets[i] % 5) * 5 + 2
        images[i, 0, r : r + 8, c : c + 4] = 1.0
    return TensorDataset((images - 0.1307) / 0.3081, targets)


def train(rank, args, model, device, dataset, dataloader_kwargs, results) -> None:
    # torch's multiprocessing notes: floor(cores / processes) threads each, against
    # oversubscription (and a forked child must not wait on its parent's thread pool)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // args.num_processes))
    torch.manual_seed(args.seed + rank)
    train_loader = DataLoader(dataset, **dataloader_kwargs)
    optimizer = optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    done = 0
    for epoch in range(1, args.epochs + 1):
        done, loss = train_epoch(epoch, args, model, device, train_loader, optimizer, done)
    results.put((rank, done, loss))


def train_epoch(epoch, args, model, device, data_loader, optimizer, done):
    model.train()
    pid = os.getpid()
    loss_value = float("nan")
    for batch_idx, (data, target) in enumerate(data_loader):
        optimizer.zero_grad()
        output = model(data.to(device))
        loss = F.nll_loss(output, target.to(device))
        loss.backward()
        optimizer.step()
        done += 1
        loss_value = loss.item()
        if batch_idx % args.log_interval == 0:
            print(
                f"{pid}\tTrain Epoch: {epoch} [{batch_idx * len(data)}/{len(data_loader.dataset)} "
                f"({100.0 * batch_idx / len(data_loader):.0f}%)]\tLoss: {loss_value:.6f}",
                flush=True,
            )
    return done, loss_value


def test(args, model, device, dataset, dataloader_kwargs) -> None:
    torch.manual_seed(args.seed)
    test_loader = DataLoader(dataset, **dataloader_kwargs)
    model.eval()
    test_loss, correct = 0.0, 0
    with torch.no_grad():
        for data, target in test_loader:
            output = model(data.to(device))
            test_loss += F.nll_loss(output, target.to(device), reduction="sum").item()
            correct += output.max(1)[1].eq(target.to(device)).sum().item()
    n = len(test_loader.dataset)
    print(
        f"\nTest set: Average loss: {test_loss / n:.4f}, Accuracy: {correct}/{n} "
        f"({100.0 * correct / n:.0f}%)\n",
        flush=True,
    )


def _pool_train(job: tuple) -> None:
    train(*job)


def main() -> None:
    parser = argparse.ArgumentParser(description="PyTorch MNIST Hogwild Example (generated)")
    parser.add_argument("--batch-size", type=int, default=64, metavar="N")
    parser.add_argument("--test-batch-size", type=int, default=1000, metavar="N")
    parser.add_argument("--epochs", type=int, default=1, metavar="N")
    parser.add_argument("--train-size", type=int, default=6000, metavar="N")
    parser.add_argument("--test-size", type=int, default=1000, metavar="N")
    parser.add_argument("--lr", type=float, default=0.01, metavar="LR")
    parser.add_argument("--momentum", type=float, default=0.5, metavar="M")
    parser.add_argument("--seed", type=int, default=1, metavar="S")
    parser.add_argument("--log-interval", type=int, default=10, metavar="N")
    parser.add_argument("--num-processes", type=int, default=2, metavar="N")
    parser.add_argument("--start-method", default="spawn", choices=("spawn", "fork", "forkserver"))
    parser.add_argument("--pool", action="store_true", help="mp.Pool.map instead of Process")
    args = parser.parse_args()

    device = torch.device("cpu")
    kwargs = {"batch_size": args.batch_size, "shuffle": True}
    torch.manual_seed(args.seed)
    mp.set_start_method(args.start_method, force=True)
    dataset1, dataset2 = digits(args.train_size, 1), digits(args.test_size, 2)

    model = Net().to(device)
    model.share_memory()  # gradients are allocated lazily, so they are not shared here
    ctx = mp.get_context(args.start_method)
    manager = ctx.Manager() if args.pool else None
    results = manager.Queue() if manager else ctx.SimpleQueue()
    jobs = [
        (rank, args, model, device, dataset1, kwargs, results) for rank in range(args.num_processes)
    ]
    if args.pool:
        with ctx.Pool(args.num_processes) as pool:
            pool.map(_pool_train, jobs)
    else:
        processes = []
        for job in jobs:
            p = ctx.Process(target=train, args=job)
            # We first train the model across `num_processes` processes
            p.start()
            processes.append(p)
        for p in processes:
            p.join()
    reports = sorted(results.get() for _ in jobs)
    # Once training is complete, we can test the model
    test(args, model, device, dataset2, {"batch_size": args.test_batch_size})
    record = {
        "iterations": sum(done for _, done, _ in reports),
        "per_process": [done for _, done, _ in reports],
        "losses": [loss for _, _, loss in reports],
        "batch_size": args.batch_size,
    }
    print("CORPUS " + json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
