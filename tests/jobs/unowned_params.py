"""A job whose optimizer updates a bare tensor no module owns (the model search fails)."""

import torch
from torch import nn

w = nn.Parameter(torch.zeros(4))
opt = torch.optim.SGD([w], lr=0.1)
feature = nn.Linear(4, 4)
for _ in range(60):
    with torch.no_grad():
        x = feature(torch.randn(2, 4))
    loss = ((x.sum(0) - w) ** 2).sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
print("done", flush=True)
