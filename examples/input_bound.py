"""Input-bound image classification: the model waits for the DataLoader.

Bottleneck: I/O, input pipeline. Every sample costs ~5 ms of simulated storage latency
(`time.sleep`, standing for a read from network or disk) plus ~1 ms of numpy "decode and
augment" work, in `Dataset.__getitem__`. The DataLoader runs in the main process
(`num_workers` left at its default, 0), so each step first spends ~0.17 s building a batch
of 32 and only then ~0.03 s on the small CNN: data wait is ~80 % of the step.

Fix: DataLoader workers (`--num-workers 4 --persistent-workers`). Because the per-sample
cost is mostly waiting, not CPU, more workers than cores still help: 4 workers on 2 cores
overlap four sleeps and run the loader beside the model, for a >= 2x shorter step.
Predicted bound from the breakdown: removing an 80 % wait bounds the speed-up at 5x.

The data are deterministic per sample index, so the losses are the same whatever
`num_workers` is: the fix does not change numerics.

    python examples/input_bound.py                      # ~20 s, input-bound
    python examples/input_bound.py --num-workers 4 --persistent-workers   # the fix
"""

from __future__ import annotations

import time

import numpy as np
import torch
from _common import base_parser, pick_device, seed_everything, train
from torch import nn
from torch.utils.data import DataLoader, Dataset

NUM_CLASSES = 10
IMAGE_SIZE = 32


class SlowImageDataset(Dataset):
    """Synthetic 'JPEG files': each item sleeps (storage latency), then decodes and
    augments a 40x40 uint8 image with numpy into a normalised 3x32x32 float tensor."""

    def __init__(self, length: int, io_latency_s: float, seed: int) -> None:
        self.length = length
        self.io_latency_s = io_latency_s
        self.seed = seed
        # One colour pattern per class, so the model has something to learn.
        rng = np.random.default_rng(seed)
        self.patterns = rng.integers(0, 256, (NUM_CLASSES, 40, 40, 3)).astype(np.float32)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        time.sleep(self.io_latency_s)  # the read: waiting, not CPU work
        # Seeded by the index: the same sample whichever worker (or none) loads it.
        rng = np.random.default_rng((self.seed, index))
        label = index % NUM_CLASSES
        noise = rng.integers(0, 256, (40, 40, 3)).astype(np.float32)
        raw = (0.5 * self.patterns[label] + 0.5 * noise).astype(np.uint8)  # "decoded" image
        img = raw.astype(np.float32) / 255.0
        # 3x3 box blur, random crop and flip: a stand-in for the usual augmentations.
        blurred = sum(
            img[1 + dy : 39 + dy, 1 + dx : 39 + dx] for dy in (-1, 0, 1) for dx in (-1, 0, 1)
        )
        y, x = rng.integers(0, 38 - IMAGE_SIZE + 1, size=2)
        crop = blurred[y : y + IMAGE_SIZE, x : x + IMAGE_SIZE] / 9.0
        if rng.random() < 0.5:
            crop = crop[:, ::-1]
        mean, std = crop.mean(axis=(0, 1)), crop.std(axis=(0, 1)) + 1e-6
        chw = np.ascontiguousarray(((crop - mean) / std).transpose(2, 0, 1))
        return torch.from_numpy(chw), label


def small_cnn() -> nn.Module:
    def block(cin: int, cout: int) -> nn.Sequential:
        return nn.Sequential(
            nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(), nn.MaxPool2d(2)
        )

    return nn.Sequential(
        block(3, 32),
        block(32, 64),
        block(64, 128),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(128, NUM_CLASSES),
    )


def main() -> None:
    parser = base_parser(__doc__.splitlines()[0], steps=100)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument(
        "--num-workers",
        type=int,
        default=None,
        help="DataLoader workers (default: not passed, i.e. torch's default of 0)",
    )
    parser.add_argument("--persistent-workers", action="store_true")
    parser.add_argument(
        "--io-latency-ms", type=float, default=5.0, help="simulated read latency per sample"
    )
    args = parser.parse_args()

    seed_everything(args.seed)
    device = pick_device(args.device)
    dataset = SlowImageDataset(2048, args.io_latency_ms / 1000.0, args.seed)
    # Only the settings the user asked for are passed, like a typical script: the
    # baseline is DataLoader's default num_workers=0.
    loader_kwargs: dict[str, object] = {}
    if args.num_workers is not None:
        loader_kwargs["num_workers"] = args.num_workers
    if args.persistent_workers:
        loader_kwargs["persistent_workers"] = True
    loader = DataLoader(
        dataset, batch_size=args.batch_size, shuffle=True, drop_last=True, **loader_kwargs
    )

    model = small_cnn().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    train(model, loader, optimizer, loss_fn, device, args, example="input_bound")


if __name__ == "__main__":
    main()
