"""Optimizers that take turns by phase, or step now and then (tests/test_step_timer.py).

--pattern stages: a two-stage fine-tune: stage 1 trains the body with SGD for --steps
  iterations, then stage 2 makes a new Adam for the head and trains it as long;
--pattern sidecar: one SGD every iteration, and a second optimizer that steps inside
  every --every-th iteration after it (an auxiliary model updated now and then);
--pattern sidecar-first: the same, the second optimizer stepping before the first.
Prints one loss per iteration ("loss X", the first optimizer's in a sidecar iteration).
"""

import argparse

import torch
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--pattern", choices=["stages", "sidecar", "sidecar-first"], default="stages")
p.add_argument("--steps", type=int, default=6)
p.add_argument("--every", type=int, default=3)
a = p.parse_args()
torch.manual_seed(0)
torch.set_num_threads(1)
body, head = nn.Linear(16, 16), nn.Linear(16, 1)
x, y = torch.randn(32, 16), torch.randn(32, 1)


def loss_of() -> torch.Tensor:
    return nn.functional.mse_loss(head(torch.relu(body(x))), y)


if a.pattern == "stages":
    for params, make in ((body.parameters(), torch.optim.SGD), (head.parameters(), None)):
        opt = make(params, lr=0.01) if make else torch.optim.Adam(params, lr=0.01)
        for _ in range(a.steps):
            opt.zero_grad()
            loss = loss_of()
            loss.backward()
            opt.step()
            print(f"loss {loss.item():.6f}", flush=True)
else:
    main, aux = (
        torch.optim.SGD(body.parameters(), lr=0.01),
        torch.optim.SGD(head.parameters(), lr=0.01),
    )
    for i in range(a.steps):
        main.zero_grad()
        aux.zero_grad()
        loss = loss_of()
        loss.backward()
        now_too = i % a.every == a.every - 1
        if now_too and a.pattern == "sidecar-first":
            aux.step()
        main.step()
        if now_too and a.pattern == "sidecar":
            aux.step()
        print(f"loss {loss.item():.6f}", flush=True)
