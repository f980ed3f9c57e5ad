"""A small training job: N optimizer steps over a DataLoader.

Options: --steps N, --sleep S (seconds inside __getitem__, per sample), --batch B,
--accum A (backward calls per optimizer step), --compute C (extra matmuls per step),
--workers W [--spawn] [--transform], --print (print "step i <time>" as it goes).
"""

import argparse
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Data(Dataset):
    def __init__(self, sleep: float, transform: bool):
        self.sleep = sleep
        # a module called inside the workers: its calls must not become steps
        self.transform = nn.LayerNorm(16) if transform else None

    def __len__(self):
        return 10**6

    def __getitem__(self, i):
        if self.sleep:
            time.sleep(self.sleep)
        x = torch.randn(16)
        if self.transform is not None:
            with torch.no_grad():
                x = self.transform(x)
        return x, torch.randn(1)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, x):
        return self.body(x)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--accum", type=int, default=1)
    p.add_argument("--compute", type=int, default=0)
    p.add_argument("--print", action="store_true")
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--spawn", action="store_true", help="start workers with spawn, not fork")
    p.add_argument("--transform", action="store_true", help="an nn.Module runs in __getitem__")
    a = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(
        Data(a.sleep, a.transform),
        batch_size=a.batch,
        num_workers=a.workers,
        multiprocessing_context="spawn" if a.spawn else None,
    )
    it = iter(loader)
    for step in range(a.steps):
        for _ in range(a.accum):
            x, y = next(it)
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
        for _ in range(a.compute):
            torch.randn(256, 256) @ torch.randn(256, 256)
        opt.step()
        opt.zero_grad()
        if a.print:
            print(f"step {step} {time.time():.3f}", flush=True)
    print("done", file=sys.stdout)


if __name__ == "__main__":
    main()
