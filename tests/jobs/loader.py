"""A job whose DataLoader waits on I/O (--io-ms: sleep per sample) or works the CPU
(--cpu-ms: a busy loop per sample), in the main process (num_workers left at 0).

The model's own work per step varies (0 to 2x --compute-ms, seeded), so that sampling
windows differ in how much of them is spent waiting for data: the plan's regression
of CPU on data-wait share needs that spread. Options: --steps N, --batch B, --epochs E
(the steps split over E passes, each a new ``iter(loader)``: persistent workers matter).
"""

import argparse
import random
import time

import torch
from torch.utils.data import DataLoader, Dataset


def busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class Data(Dataset):
    def __init__(self, io_s: float, cpu_s: float) -> None:
        self.io_s = io_s
        self.cpu_s = cpu_s

    def __len__(self) -> int:
        return 10**6

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.io_s:
            time.sleep(self.io_s)
        busy(self.cpu_s)
        return torch.full((4,), float(i % 7))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--io-ms", type=float, default=0.0)
    p.add_argument("--cpu-ms", type=float, default=0.0)
    p.add_argument("--compute-ms", type=float, default=40.0)
    p.add_argument("--epochs", type=int, default=1)
    a = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    rng = random.Random(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Data(a.io_ms / 1000, a.cpu_ms / 1000), batch_size=a.batch)
    per_epoch = max(1, a.steps // max(1, a.epochs))
    for step in range(a.steps):
        if step % per_epoch == 0:
            it = iter(loader)  # an epoch starts
        x = next(it)
        busy(rng.uniform(0.0, 2.0) * a.compute_ms / 1000)  # the model's CPU work
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
