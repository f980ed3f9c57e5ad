"""Memory-bandwidth-bound model: long chains of pointwise ops on big activations.

Bottleneck: memory, bandwidth. Each block does one small matmul (64 -> 64 channels) and
then a dozen elementwise ops (layer norm, GELU, scale and shift, SiLU gate, tanh,
residual adds) over a 64k x 64 activation (16 MiB in float32). Every one of those ops
reads and writes the whole tensor for a handful of flops per element (arithmetic
intensity well under 1 flop/byte), and autograd saves most of the intermediates for
backward, so the step is dominated by moving memory, not by the matmuls. The batches
are prebuilt tensors, so data wait is well under 5 %.

Fix: fuse the pointwise chain so each element is read and written once
(`torch.compile`, or a hand-fused kernel); on a GPU, bf16 halves the bytes moved.
Gradient checkpointing trades the saved activations for recompute when memory
capacity, not bandwidth, is the limit. On a 2-core CPU `torch.compile` may not pay for
its compile time within a short run; that is a measurement to make, not a given.

    python examples/pointwise_memory.py         # ~20 s on 2 cores
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from _common import InMemoryBatches, base_parser, pick_device, seed_everything, train
from torch import nn
from torch.utils.data import DataLoader


class PointwiseBlock(nn.Module):
    """One small matmul, then a long unfused elementwise tail (the expensive part)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.mix = nn.Linear(channels, channels)
        self.norm = nn.LayerNorm(channels)
        self.scale = nn.Parameter(torch.ones(channels))
        self.shift = nn.Parameter(torch.zeros(channels))
        self.gate = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        h = self.mix(h)
        h = F.gelu(h)
        h = h * self.scale + self.shift
        h = h * torch.sigmoid(h + self.gate)  # SiLU-style gate
        h = torch.tanh(h) * 0.5 + h * 0.5
        h = h * h.clamp(-3.0, 3.0).mul(0.1).add(1.0)
        return x + h


class PointwiseNet(nn.Module):
    def __init__(self, channels: int, depth: int) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*(PointwiseBlock(channels) for _ in range(depth)))
        self.out = nn.LayerNorm(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.blocks(x))


def main() -> None:
    parser = base_parser(__doc__.splitlines()[0], steps=60)
    parser.add_argument("--rows", type=int, default=65536, help="rows (tokens) per batch")
    parser.add_argument("--channels", type=int, default=64)
    parser.add_argument("--depth", type=int, default=4)
    args = parser.parse_args()

    seed_everything(args.seed)
    device = pick_device(args.device)
    batches = []
    for _ in range(4):
        x = torch.randn(args.rows, args.channels)
        batches.append((x, torch.tanh(x.roll(1, dims=1))))  # a smooth target to regress
    loader = DataLoader(InMemoryBatches(batches), batch_size=None, shuffle=True)
    model = PointwiseNet(args.channels, args.depth).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.MSELoss()
    train(model, loader, optimizer, loss_fn, device, args, example="pointwise_memory")


if __name__ == "__main__":
    main()
