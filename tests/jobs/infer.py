"""Inference loop with no optimizer: nested modules, N outermost calls.

--grad keeps autograd on (people forget no_grad); --sleep S between calls.
"""

import argparse

import torch
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--calls", type=int, default=12)
p.add_argument("--grad", action="store_true")
p.add_argument("--sleep", type=float, default=0.0)
a = p.parse_args()
torch.set_num_threads(1)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(8, 8), nn.GELU())

    def forward(self, x):
        return x + self.inner(x)


model = nn.Sequential(Block(), Block(), nn.Linear(8, 2))
head = nn.Softmax(dim=-1)
ctx = torch.enable_grad() if a.grad else torch.no_grad()
with ctx:
    for _ in range(a.calls):
        probs = head(model(torch.randn(4, 8)))  # a second top-level module: not a step
        if a.sleep:
            import time

            time.sleep(a.sleep)
print("done")
