"""A LightningModule trained by `L.Trainer`, as the Lightning docs write one.

An MLP classifier on generated features, with a `validation_step`: Lightning then runs
a sanity check of 2 validation batches *before* the first training step (forward calls
with no optimizer behind them), and validates again every `--val-check-interval`
training batches. `--pause-at-batch K` makes the training dataset stall once, for 0.2 s,
while it loads batch K (0-based; its first sample, counted in load order, so shuffling
does not move it): the one long pause (a garbage collection, a slow read) that a real
run shows in its step-time chart.
"""

from __future__ import annotations

import argparse
import json
import time

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

PAUSE_S = 0.2


class RandomClassification(Dataset):
    """`length` (features, label) pairs; item i is the same on every run and worker."""

    def __init__(
        self, length: int, dim: int, classes: int, seed: int, pause_at: int | None = None
    ) -> None:
        self.length = length
        self.dim = dim
        self.classes = classes
        self.seed = seed
        self.pause_at = pause_at  # stall on this many-th load (0-based), once
        self.loads = 0

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.loads == self.pause_at:
            time.sleep(PAUSE_S)
        self.loads += 1
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        x = torch.randn(self.dim, generator=g)
        y = torch.randint(0, self.classes, (), generator=g)
        return x, y


class LitClassifier(L.LightningModule):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.save_hyperparameters(vars(args))
        self.args = args
        self.net = nn.Sequential(
            nn.Linear(args.dim, args.hidden),
            nn.ReLU(),
            nn.Linear(args.hidden, args.hidden),
            nn.ReLU(),
            nn.Linear(args.hidden, args.classes),
        )
        self.printed: list[float] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        # global_step has already counted this batch's optimizer step here
        if (self.global_step - 1) % self.args.print_freq == 0:
            loss = outputs["loss"].item()
            print(
                f"Epoch {self.current_epoch} | step {self.global_step:4d} | train_loss {loss:.4f}"
            )
            self.printed.append(loss)

    def validation_step(self, batch, batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        self.log("val_loss", F.cross_entropy(logits, y))
        self.log("val_acc", (logits.argmax(dim=1) == y).float().mean())

    def on_validation_epoch_end(self) -> None:
        if not self.trainer.sanity_checking:
            metrics = self.trainer.callback_metrics
            print(
                f"validation at step {self.global_step}: val_loss {metrics['val_loss']:.4f}"
                f" val_acc {metrics['val_acc']:.3f}"
            )

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.args.lr)

    def train_dataloader(self) -> DataLoader:
        a = self.args
        pause_at = None if a.pause_at_batch is None else a.pause_at_batch * a.batch_size
        ds = RandomClassification(
            a.max_steps * a.batch_size * 2, a.dim, a.classes, a.seed, pause_at
        )
        return DataLoader(ds, batch_size=a.batch_size, shuffle=True, num_workers=a.workers)

    def val_dataloader(self) -> DataLoader:
        a = self.args
        ds = RandomClassification(4 * a.batch_size, a.dim, a.classes, a.seed + 1)
        return DataLoader(ds, batch_size=a.batch_size, num_workers=a.workers)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Lightning MLP classifier on generated data")
    p.add_argument("--max-steps", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--val-check-interval", type=int, default=20, help="train batches")
    p.add_argument("--print-freq", type=int, default=10)
    p.add_argument(
        "--pause-at-batch",
        type=int,
        default=None,
        metavar="K",
        help="the training dataset stalls 0.2 s once, while loading batch K (0-based)",
    )
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    L.seed_everything(args.seed)
    model = LitClassifier(args)
    trainer = L.Trainer(
        max_steps=args.max_steps,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        limit_val_batches=2,
        val_check_interval=args.val_check_interval,
    )
    trainer.fit(model)
    record = {
        "iterations": trainer.global_step,
        "losses": model.printed[-5:],
        "batch_size": args.batch_size,
    }
    print("CORPUS " + json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
