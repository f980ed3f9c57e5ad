"""A plain hand-written loop: an ~8.4 M-parameter MLP, AdamW with its defaults.

`torch.optim.AdamW(model.parameters(), lr=...)` with no `foreach=` or `fused=`: on the
CPU that is the per-parameter loop, several elementwise passes over all 8.4 M
parameters and both moment buffers every step, so the optimizer step is a large share
of a step whose forward and backward are a few GEMMs on a small batch. Batches are
prebuilt in memory: no DataLoader, nothing to wait for.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(self.norm(x))))


class MLP(nn.Module):
    def __init__(self, dim: int = 512, hidden: int = 2048, depth: int = 4) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*[Block(dim, hidden) for _ in range(depth)])
        self.head = nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(x))


def main() -> None:
    parser = argparse.ArgumentParser(description="MLP regression with AdamW")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--log-every", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    model = MLP()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params / 1e6:.2f}M parameters")
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    loss_fn = nn.MSELoss()

    batches = [
        (torch.randn(args.batch_size, 512), torch.randn(args.batch_size, 1)) for _ in range(8)
    ]
    printed: list[float] = []
    t0 = time.time()
    for it in range(args.iters):
        x, y = batches[it % len(batches)]
        loss = loss_fn(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if (it + 1) % args.log_every == 0:
            dt = (time.time() - t0) / (it + 1)
            print(f"it {it + 1}/{args.iters} loss {loss.item():.5f} ({dt * 1000:.1f} ms/it)")
            printed.append(loss.item())

    record = {"iterations": args.iters, "losses": printed[-5:], "batch_size": args.batch_size}
    print("CORPUS " + json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
