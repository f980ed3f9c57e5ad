"""A `torchrun` DDP job on gloo that takes very few optimizer steps (default: one).

The shape of a smoke test or of a job that dies early: process group, DDP wrapper,
DistributedSampler, SGD, and `--steps 1`. Each rank makes one optimizer step, which
must show up as one step on each rank, not zero (nothing after it to end it) and not
two (the DDP wrapper's forward taken for a step of its own).

    torchrun --standalone --nproc_per_node 2 examples/corpus/ddp_few_steps.py --steps 1
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description="DDP (gloo) for a few steps")
    p.add_argument("--steps", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=16, help="per rank")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    if "RANK" not in os.environ:  # plain `python`: a group of one
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)

    n = args.batch_size * world * max(args.steps, 1)
    x = torch.randn(n, 32)
    y = (x[:, :4].sum(dim=1) > 0).long()
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, shuffle=True, seed=args.seed)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)

    model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 2)))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    criterion = nn.CrossEntropyLoss()

    step, epoch, printed = 0, 0, []
    while step < args.steps:
        sampler.set_epoch(epoch)
        for inputs, targets in loader:
            optimizer.zero_grad()
            loss = criterion(model(inputs), targets)
            loss.backward()
            optimizer.step()
            step += 1
            if rank == 0:
                print(f"[rank {rank}/{world}] step {step}/{args.steps} loss {loss.item():.4f}")
                printed.append(loss.item())
            if step >= args.steps:
                break
        epoch += 1

    if rank == 0:
        record = {"iterations": step, "losses": printed[-5:], "batch_size": args.batch_size}
        print("CORPUS " + json.dumps(record), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
