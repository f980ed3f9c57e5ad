"""A job that runs out of memory the first time only (tests/test_oom_fit.py).

``--marker PATH``: the first run (no file at PATH) writes it and asks for 2 GB at once,
which a ``--memory-limit`` below that refuses; every later run trains a small MLP with
AdamW for ``--steps`` steps: an experiment's baseline run again under the same limit
completes, and the experiment goes on as usual.
"""

import argparse
import os

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--marker", required=True)
parser.add_argument("--steps", type=int, default=6)
args = parser.parse_args()

torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
first = not os.path.exists(args.marker)
if first:
    open(args.marker, "w").close()
for step in range(args.steps):
    x = torch.randn(32, 64)
    if first:
        x = torch.empty(500_000_000, 1)  # 2 GB of floats: refused under the limit
    loss = model(x[:, :1].expand(-1, 64)).square().mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item():.4f}", flush=True)
