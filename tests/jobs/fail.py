"""A job whose own code fails after a few steps."""

import torch
from torch import nn

model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
print("about to fail")
x = 1 / 0  # noqa: F841 - the failure under test
