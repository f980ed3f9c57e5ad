"""Two optimizers per iteration (a GAN's D and G): one step per iteration."""

import torch
from torch import nn

g, d = nn.Linear(4, 4), nn.Linear(4, 1)
opt_d = torch.optim.Adam(d.parameters())
opt_g = torch.optim.Adam(g.parameters())
for _ in range(7):
    z = torch.randn(5, 4)
    d(g(z).detach()).mean().backward()
    opt_d.step()
    opt_d.zero_grad()
    (-d(g(z)).mean()).backward()
    opt_g.step()
    opt_g.zero_grad()
print("done")
