"""Host-overhead-bound model: 200 tiny layers on a tiny batch.

Bottleneck: compute, host overhead. Each layer is a 32x32 Linear plus a ReLU on a batch
of 8, i.e. a few thousand flops, while every op costs microseconds of Python, dispatcher
and autograd bookkeeping. Forward, backward and the optimizer (SGD with momentum, looping
over 400 parameter tensors one by one: torch's CPU default is not foreach) are each
hundreds of tiny ops, so the step is almost all framework overhead: on a GPU the device
would sit idle between short kernels, on a CPU one core does Python. The batches are
prebuilt tensors, so data wait is well under 5 %.

Fix: do more work per op or fewer ops: a larger batch (same samples, fewer steps), a
foreach/fused optimizer (`torch.optim.SGD(..., foreach=True)`: one multi-tensor op
instead of 400), `torch.compile` / CUDA graphs to fuse the layers. More DataLoader
workers do nothing here.

    python examples/host_overhead.py            # ~20 s on 2 cores
"""

from __future__ import annotations

import torch
from _common import InMemoryBatches, base_parser, pick_device, seed_everything, train
from torch import nn
from torch.utils.data import DataLoader


def tiny_layers(width: int, depth: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers)


def main() -> None:
    parser = base_parser(__doc__.splitlines()[0], steps=1500)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--depth", type=int, default=200)
    args = parser.parse_args()

    seed_everything(args.seed)
    device = pick_device(args.device)
    # Regression on a fixed random target: the loss only needs to be well defined.
    batches = [
        (torch.randn(args.batch_size, args.width), torch.randn(args.batch_size, args.width))
        for _ in range(64)
    ]
    loader = DataLoader(InMemoryBatches(batches), batch_size=None, shuffle=True)
    model = tiny_layers(args.width, args.depth).to(device)
    # Small init keeps 200 ReLU layers from blowing up or dying, so the loss stays finite.
    for module in model.modules():
        if isinstance(module, nn.Linear):
            nn.init.kaiming_uniform_(module.weight, nonlinearity="relu")
            nn.init.zeros_(module.bias)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    loss_fn = nn.MSELoss()
    train(model, loader, optimizer, loss_fn, device, args, example="host_overhead")


if __name__ == "__main__":
    main()
