"""Training loop that marks its own steps: one mark per two optimizer steps.

``--lead N`` runs N plain optimizer steps first, as a job that starts marking late.
"""

import argparse

import torch
from torch import nn

import stepscope

p = argparse.ArgumentParser()
p.add_argument("--marks", type=int, default=5)
p.add_argument("--lead", type=int, default=0)
a = p.parse_args()
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(a.lead):
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    opt.zero_grad()
for _ in range(a.marks):
    for _ in range(2):
        model(torch.randn(3, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
    stepscope.mark_step()
print("done")
