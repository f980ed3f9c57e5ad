"""A job whose input is in memory, except for one long pause inside the DataLoader.

Stands for a real job that waits for data on no step but one: a garbage-collection
pause, a cold cache, a lazy file open that lands inside ``DataLoader.__next__``. Every
step does --compute-ms of CPU work; the sample at index --pause-at sleeps --pause-ms
once (main-process loader, so the loop waits for it). With --every, every sample sleeps
--pause-ms instead: a job that really is input-bound, for contrast.

Options: --steps N, --batch B, --compute-ms C, --pause-ms P, --pause-at I, --every.
"""

import argparse
import time

import torch
from torch.utils.data import DataLoader, Dataset


def busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class Data(Dataset):
    def __init__(self, pause_s: float, pause_at: int, every: bool) -> None:
        self.pause_s = pause_s
        self.pause_at = pause_at
        self.every = every

    def __len__(self) -> int:
        return 10**6

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.every or i == self.pause_at:
            time.sleep(self.pause_s)
        return torch.full((4,), float(i % 7))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--compute-ms", type=float, default=10.0)
    p.add_argument("--pause-ms", type=float, default=200.0)
    p.add_argument("--pause-at", type=int, default=80)
    p.add_argument("--every", action="store_true")
    a = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Data(a.pause_ms / 1000, a.pause_at, a.every), batch_size=a.batch)
    it = iter(loader)
    for _ in range(a.steps):
        x = next(it)
        busy(a.compute_ms / 1000)  # the model's CPU work
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
