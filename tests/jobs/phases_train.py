"""The phases of a step on loops written the way people write them (tests/test_step_timer.py).

--pattern loop: a plain loop, an MLP and ``AdamW(..., foreach=False)`` (the per-parameter
  update: a large share of a step whose forward and backward are small GEMMs);
--pattern closure: ``optimizer.step(closure)`` with zero_grad, forward and backward in the
  closure, as Lightning runs every training step (--closure-sleep S: the closure's own
  work besides them, Lightning's hooks and logging);
--pattern infer: forwards under no_grad, no optimizer (forward steps).
--steps N, --dim D (the MLP's width; its hidden layer is 4 D).
"""

import argparse
import time

import torch
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--pattern", choices=["loop", "closure", "infer"], default="loop")
p.add_argument("--steps", type=int, default=12)
p.add_argument("--dim", type=int, default=256)
p.add_argument("--closure-sleep", type=float, default=0.0)
a = p.parse_args()
torch.set_num_threads(1)
torch.manual_seed(0)


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(self.norm(x))))


model = nn.Sequential(*[Block(a.dim) for _ in range(4)], nn.Linear(a.dim, 1))
loss_fn = nn.MSELoss()
batches = [(torch.randn(16, a.dim), torch.randn(16, 1)) for _ in range(4)]

if a.pattern == "infer":
    model.eval()
    with torch.no_grad():
        for i in range(a.steps):
            model(batches[i % 4][0])
else:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
    for i in range(a.steps):
        x, y = batches[i % 4]
        if a.pattern == "loop":
            loss = loss_fn(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        else:

            def closure(x: torch.Tensor = x, y: torch.Tensor = y) -> torch.Tensor:
                optimizer.zero_grad()
                loss = loss_fn(model(x), y)
                loss.backward()
                if a.closure_sleep:
                    time.sleep(a.closure_sleep)
                return loss

            optimizer.step(closure)
print("done")
