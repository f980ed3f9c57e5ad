"""Hinton's forward-forward training as pytorch/examples `mnist_forward_forward` writes it.

Each `Layer` is an `nn.Linear` with its own Adam optimizer and trains on a "goodness"
loss of its own; `Net.train` trains the first layer for all its epochs, then passes the
positive and negative data through it and trains the second layer. Two optimizers, one
after the other, never alternating: 30 optimizer steps of layer 1, then 30 of layer 2.
Random "images" stand in for MNIST (nothing is downloaded); the label is written into
the first 10 pixels, as the example's `overlay_y_on_x` does.
"""

from __future__ import annotations

import argparse
import json

import torch
from torch import nn
from torch.optim import Adam

parser = argparse.ArgumentParser(description="forward-forward on random MNIST-sized data")
parser.add_argument("--epochs", type=int, default=30, help="training iterations per layer")
parser.add_argument("--lr", type=float, default=0.03, help="learning rate")
parser.add_argument("--train-size", type=int, default=1000, help="samples (one full batch)")
parser.add_argument("--threshold", type=float, default=2.0)
parser.add_argument("--seed", type=int, default=1, help="random seed")
parser.add_argument("--log-interval", type=int, default=10, help="epochs between loss lines")
args = parser.parse_args()
torch.manual_seed(args.seed)
losses: list[float] = []


def overlay_y_on_x(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The label, one-hot, in the first 10 pixels."""
    x_ = x.clone()
    x_[:, :10] *= 0.0
    x_[range(x.shape[0]), y] = x.max()
    return x_


class Layer(nn.Linear):
    def __init__(self, in_features: int, out_features: int, name: str) -> None:
        super().__init__(in_features, out_features)
        self.relu = torch.nn.ReLU()
        self.opt = Adam(self.parameters(), lr=args.lr)
        self.threshold = args.threshold
        self.num_epochs = args.epochs
        self.name = name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_direction = x / (x.norm(2, 1, keepdim=True) + 1e-4)
        return self.relu(torch.mm(x_direction, self.weight.T) + self.bias.unsqueeze(0))

    def train(self, x_pos: torch.Tensor, x_neg: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        for i in range(self.num_epochs):
            g_pos = self.forward(x_pos).pow(2).mean(1)
            g_neg = self.forward(x_neg).pow(2).mean(1)
            loss = torch.log(
                1 + torch.exp(torch.cat([-g_pos + self.threshold, g_neg - self.threshold]))
            ).mean()
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            losses.append(loss.item())
            if i % args.log_interval == 0:
                print(f"{self.name} epoch {i}: loss {loss.item():.6f}", flush=True)
        return self.forward(x_pos).detach(), self.forward(x_neg).detach()


class Net(torch.nn.Module):
    def __init__(self, dims: list[int]) -> None:
        super().__init__()
        self.layers = [Layer(dims[d], dims[d + 1], f"layer {d}") for d in range(len(dims) - 1)]

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        goodness_per_label = []
        for label in range(10):
            h = overlay_y_on_x(x, torch.full((x.shape[0],), label, dtype=torch.long))
            goodness = []
            for layer in self.layers:
                h = layer(h)
                goodness += [h.pow(2).mean(1)]
            goodness_per_label += [sum(goodness).unsqueeze(1)]
        return torch.cat(goodness_per_label, 1).argmax(1)

    def train(self, x_pos: torch.Tensor, x_neg: torch.Tensor) -> None:  # type: ignore[override]
        h_pos, h_neg = x_pos, x_neg
        for i, layer in enumerate(self.layers):
            print("training layer", i, "...", flush=True)
            h_pos, h_neg = layer.train(h_pos, h_neg)


x = torch.rand(args.train_size, 784)
y = torch.randint(0, 10, (args.train_size,))
net = Net([784, 500, 500])
x_pos = overlay_y_on_x(x, y)
rnd = torch.randperm(x.size(0))
x_neg = overlay_y_on_x(x, y[rnd])
net.train(x_pos, x_neg)
print(f"train error: {1.0 - net.predict(x).eq(y).float().mean().item():.4f}", flush=True)
record = {"iterations": len(losses), "losses": losses[-4:], "batch_size": None}
print("CORPUS " + json.dumps(record), flush=True)
