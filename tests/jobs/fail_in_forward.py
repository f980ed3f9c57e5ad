"""A trainer whose first forward raises: token ids past its embedding table (an
IndexError, as a model built for a shorter vocabulary or sequence gives)."""

import torch
from torch import nn

model = nn.Sequential(nn.Embedding(64, 8), nn.Flatten(), nn.Linear(8 * 16, 2))
opt = torch.optim.AdamW(model.parameters())
for _ in range(3):
    ids = torch.randint(0, 128, (4, 16))
    loss = model(ids).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
