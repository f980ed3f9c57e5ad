"""Inference over a DataLoader: a small classifier in eval mode, no optimizer.

Seeded, so every trial of an experiment sees the same weights and the same inputs.
--batch-size B per call; --calls N calls in all (the loader is read again as needed).
"""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--calls", type=int, default=40)
p.add_argument("--batch-size", type=int, default=8)
a = p.parse_args()
torch.set_num_threads(1)
torch.manual_seed(0)

model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 10)).eval()
loader = DataLoader(TensorDataset(torch.randn(4096, 16)), batch_size=a.batch_size)
done = 0
with torch.no_grad():
    while done < a.calls:
        for (x,) in loader:
            model(x).argmax(-1)
            done += 1
            if done >= a.calls:
                break
print("done")
