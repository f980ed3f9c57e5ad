"""Inference loop: a CNN in eval mode under `torch.inference_mode()`, no optimizer.

Steps: there is no `optimizer.step()` to end a step, so each call of the outermost
module (`model(images)`) is one step; the convolution blocks it calls inside are nested
calls, not steps.

Bottleneck: compute (device compute; CPU compute here). The images are synthetic
tensors held in memory and batched by a plain DataLoader (`TensorDataset`, default
collation, `num_workers` left at 0), which costs a few milliseconds per batch of 64,
against ~0.1 s of convolutions: data wait is a few percent at most.

Fix: on a GPU, bf16 autocast and `channels_last` for the convolutions, and a larger
batch; `torch.compile` of the model. More DataLoader workers would only add
inter-process copies for data that are already in memory.

    python examples/inference_loop.py           # ~20 s on 2 cores
"""

from __future__ import annotations

import time

import torch
from _common import IterationTimer, base_parser, log_every, pick_device, seed_everything
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

NUM_CLASSES = 10


class ResidualBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(channels, channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(channels),
            nn.ReLU(),
            nn.Conv2d(channels, channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(channels),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.body(x))


class SmallResNet(nn.Module):
    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.ReLU())
        self.stage1 = nn.Sequential(ResidualBlock(width), ResidualBlock(width))
        self.down = nn.Conv2d(width, 2 * width, 3, stride=2, padding=1)
        self.stage2 = nn.Sequential(ResidualBlock(2 * width), ResidualBlock(2 * width))
        self.head = nn.Sequential(
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * width, NUM_CLASSES)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.stage2(self.down(self.stage1(self.stem(x)))))


def main() -> None:
    parser = base_parser(__doc__.splitlines()[0], steps=150)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--image-size", type=int, default=32)
    args = parser.parse_args()

    seed_everything(args.seed)
    device = pick_device(args.device)
    n = 1024
    images = torch.randn(n, 3, args.image_size, args.image_size)
    labels = torch.randint(0, NUM_CLASSES, (n,))
    loader = DataLoader(TensorDataset(images, labels), batch_size=args.batch_size)
    model = SmallResNet().to(device).eval()
    loss_fn = nn.CrossEntropyLoss(reduction="sum")
    timer = IterationTimer(args.timings_out, device)
    every = log_every(args)
    step, total_loss, seen = 0, torch.zeros((), device=device), 0
    try:
        with torch.inference_mode():
            timer.restart()
            while step < args.steps:
                for x, y in loader:
                    x, y = x.to(device), y.to(device)
                    logits = model(x)
                    total_loss += loss_fn(logits, y)  # stays on device: no sync per step
                    seen += y.numel()
                    step += 1
                    timer.tick()
                    if step % every == 0:
                        elapsed = time.perf_counter() - timer.started
                        mean = total_loss.item() / seen
                        print(f"step {step}/{args.steps} mean loss {mean:.4f} ({elapsed:.1f} s)")
                    if step >= args.steps:
                        break
    finally:
        timer.write(example="inference_loop", steps=step)
    print(f"final loss {total_loss.item() / max(seen, 1):.4f}")


if __name__ == "__main__":
    main()
