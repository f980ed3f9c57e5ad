"""Small helpers shared by the example jobs (no stepscope imports, on purpose).

The examples must run unmodified under `stepscope run`, so nothing here knows about
stepscope. What they share is the boring part: seeding, picking the device, the common
flags, and `--timings-out`, which writes the job's own per-iteration wall times so
`bench/overhead.py` can time a run with and without stepscope the same way.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset


def base_parser(description: str, steps: int) -> argparse.ArgumentParser:
    """The flags every example takes; each example adds its own."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--steps", type=int, default=steps, help=f"iterations (default {steps})")
    parser.add_argument("--seed", type=int, default=0, help="RNG seed (default 0)")
    parser.add_argument(
        "--log-every", type=int, default=0, help="progress line every N steps (0: ~10 lines)"
    )
    parser.add_argument(
        "--timings-out",
        metavar="FILE",
        help="write this job's per-iteration wall times (seconds) as JSON to FILE",
    )
    parser.add_argument(
        "--device", default="auto", help="'auto' (cuda when available), 'cpu' or 'cuda'"
    )
    return parser


def seed_everything(seed: int) -> None:
    """Seed every RNG the examples touch, so two runs of one example give the same losses
    (the quality guard of the optimisation runner compares losses step by step)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def pick_device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


def log_every(args: argparse.Namespace) -> int:
    return args.log_every or max(1, args.steps // 10)


def is_rank0() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


class IterationTimer:
    """Wall time of each iteration, measured with `time.perf_counter` from the end of the
    previous iteration to the end of this one, so the DataLoader fetch is included.

    On CUDA the end of an iteration is synchronised, but only when timings were asked for
    (`--timings-out`), so that the recorded time is the work done, not the time to queue it.
    Both arms of the overhead benchmark pay that sync the same way.
    """

    def __init__(self, out: str | None, device: torch.device) -> None:
        self.out = out
        self.sync = out is not None and device.type == "cuda"
        self.times: list[float] = []
        self.started = time.perf_counter()
        self._last = self.started

    def restart(self) -> None:
        """Call right before the loop: excludes set-up time from the first iteration."""
        self._last = time.perf_counter()

    def tick(self) -> None:
        if self.sync:
            torch.cuda.synchronize()
        now = time.perf_counter()
        self.times.append(now - self._last)
        self._last = now

    def write(self, **meta: object) -> None:
        """Write the timings (if asked). Called from a `finally`, so a job stopped early
        (Ctrl-C, `stepscope run --max-steps`) still leaves the iterations it did."""
        if not self.out:
            return
        record = {"iteration_s": self.times, "total_s": time.perf_counter() - self.started}
        record.update(meta)
        path = Path(self.out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record))


class InMemoryBatches(Dataset):
    """Prebuilt (x, y) batches; item i is whole batch i (use with batch_size=None)."""

    def __init__(self, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.batches = batches

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.batches[index]


def train(
    model: torch.nn.Module,
    loader: Iterable,
    optimizer: torch.optim.Optimizer,
    loss_fn: torch.nn.Module,
    device: torch.device,
    args: argparse.Namespace,
    *,
    example: str,
    non_blocking: bool = False,
) -> None:
    """The plain training loop every training example runs: what a user's script does.

    Written once so that the examples differ only in what makes each one slow (the
    data, the model), which is the thing they exist to show.
    """
    timer = IterationTimer(args.timings_out, device)
    every = log_every(args)
    step, loss = 0, torch.zeros(())
    try:
        timer.restart()
        while step < args.steps:
            for x, y in loader:
                x, y = (
                    x.to(device, non_blocking=non_blocking),
                    y.to(device, non_blocking=non_blocking),
                )
                optimizer.zero_grad(set_to_none=True)
                loss = loss_fn(model(x), y)
                loss.backward()
                optimizer.step()
                step += 1
                timer.tick()
                if step % every == 0:
                    elapsed = time.perf_counter() - timer.started
                    print(f"step {step}/{args.steps} loss {loss.item():.4f} ({elapsed:.1f} s)")
                if step >= args.steps:
                    break
    finally:
        timer.write(example=example, steps=step)
    print(f"final loss {loss.item():.4f}")
