"""Communication-bound data-parallel training: 2-process DDP on the gloo backend.

    torchrun --standalone --nproc_per_node 2 examples/ddp_gloo.py

Bottleneck: communication, collectives. The model is wide and shallow (6 Linear layers
of 1024x1024, ~6.3 M parameters, 25 MB of float32 gradients) and each rank sees only 4
samples per step, so forward, backward and optimizer take ~15 ms of one core while
every step all-reduces the whole 25 MB gradient through gloo (over TCP on localhost,
through the CPU: ~26 ms for 25 MB between two processes on this 2-core machine). The data are in memory behind a `DistributedSampler`, so
data wait is small.

Fix: move fewer bytes or hide them: fewer, larger steps (a bigger per-rank batch, or
gradient accumulation with `no_sync()`), bf16/fp16 gradient compression
(`ddp_comm_hooks.default_hooks.bf16_compress_hook`: half the bytes), a larger
`bucket_cap_mb` / `gradient_as_bucket_view=True` / `static_graph=True`; on GPUs, NCCL
instead of gloo.

Run without torchrun it trains as a 1-process group (handy for a quick check).
Only rank 0 prints.
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist
from _common import IterationTimer, base_parser, is_rank0, log_every, seed_everything
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def wide_mlp(width: int, depth: int, classes: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, classes))


def main() -> None:
    parser = base_parser(__doc__.splitlines()[0], steps=500)
    parser.add_argument("--batch-size", type=int, default=4, help="samples per rank per step")
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=6)
    args = parser.parse_args()

    if "RANK" not in os.environ:  # plain `python ddp_gloo.py`: a group of one
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29531")
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    # gloo is a CPU backend; with CUDA each rank takes a GPU (ranks share one when there
    # are fewer GPUs than ranks) and gloo all-reduces through host memory.
    if torch.cuda.is_available() and args.device != "cpu":
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")

    seed_everything(args.seed)  # same seed on every rank: same initial weights
    classes = 10
    n = 4096
    x_all = torch.randn(n, args.width)
    y_all = (x_all[:, :classes] * 3).argmax(dim=1)  # a learnable rule
    dataset = TensorDataset(x_all, y_all)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, seed=args.seed)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)

    model = DistributedDataParallel(wide_mlp(args.width, args.depth, classes).to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    if is_rank0():
        params = sum(p.numel() for p in model.parameters())
        print(f"world {world}, {params / 1e6:.1f} M parameters, batch {args.batch_size}/rank")

    timer = IterationTimer(args.timings_out if rank == 0 else None, device)
    every = log_every(args)
    step, epoch, loss = 0, 0, torch.zeros(())
    try:
        timer.restart()
        while step < args.steps:
            sampler.set_epoch(epoch)
            for x, y in loader:
                x, y = x.to(device), y.to(device)
                optimizer.zero_grad(set_to_none=True)
                loss = loss_fn(model(x), y)
                loss.backward()  # DDP all-reduces the gradients here
                optimizer.step()
                step += 1
                timer.tick()
                if is_rank0() and step % every == 0:
                    elapsed = time.perf_counter() - timer.started
                    print(f"step {step}/{args.steps} loss {loss.item():.4f} ({elapsed:.1f} s)")
                if step >= args.steps:
                    break
            epoch += 1
    finally:
        timer.write(example="ddp_gloo", steps=step, world_size=world)
        if is_rank0():
            print(f"final loss {loss.item():.4f}")
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
