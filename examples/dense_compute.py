"""Compute-bound dense model: big matmuls, data already in memory.

Bottleneck: compute (device compute; on a CPU job, CPU compute). A stack of
transformer-style MLP blocks (512 -> 2048 -> 512, batch 256 rows) spends almost
all of its step in GEMMs (forward and backward); the batches are prebuilt tensors, so
the DataLoader hands them over in microseconds and data wait is well under 5 %.

Fix: nothing on the input side helps (more DataLoader workers only add overhead).
What helps is less or cheaper arithmetic: on a GPU bf16 autocast / TF32 (Tensor Cores),
`torch.compile` for the pointwise tails; on this 2-core CPU there is little to gain,
which is the point of the example: a run where the right verdict is "compute-bound,
the input pipeline is fine".

    python examples/dense_compute.py            # ~20 s on 2 cores
"""

from __future__ import annotations

import torch
from _common import InMemoryBatches, base_parser, pick_device, seed_everything, train
from torch import nn
from torch.utils.data import DataLoader


def make_batches(
    n: int, batch_size: int, dim: int, classes: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Inputs with labels from a fixed random linear 'teacher', so the loss can fall."""
    teacher = torch.randn(dim, classes)
    batches = []
    for _ in range(n):
        x = torch.randn(batch_size, dim)
        batches.append((x, (x @ teacher).argmax(dim=1)))
    return batches


class MLPBlock(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(self.norm(x))))


class DenseNet(nn.Module):
    def __init__(self, dim: int, hidden: int, depth: int, classes: int) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*(MLPBlock(dim, hidden) for _ in range(depth)))
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(x))


def main() -> None:
    parser = base_parser(__doc__.splitlines()[0], steps=120)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--depth", type=int, default=4)
    args = parser.parse_args()

    seed_everything(args.seed)
    device = pick_device(args.device)
    classes = 16
    dataset = InMemoryBatches(make_batches(32, args.batch_size, args.dim, classes))
    loader = DataLoader(dataset, batch_size=None, shuffle=True)
    model = DenseNet(args.dim, args.hidden, args.depth, classes).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    train(
        model, loader, optimizer, loss_fn, device, args, example="dense_compute", non_blocking=True
    )


if __name__ == "__main__":
    main()
