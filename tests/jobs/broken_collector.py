"""Breaks a stepscope collector from inside the job; the job must not notice.

--what batch: the batch-size reader raises (data wait collector goes off);
--what step: the step bookkeeping raises (the step timer goes off).
"""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from stepscope.collectors.steps import step_timer

p = argparse.ArgumentParser()
p.add_argument("--what", choices=["batch", "step"], required=True)
a = p.parse_args()


def boom(*args, **kwargs):
    raise RuntimeError("injected failure")


timer = step_timer.current()
assert timer is not None, "bootstrap did not install the step timer"
if a.what == "batch":
    timer.batch_counter.batch_len = boom
else:
    timer.accounting.take_row = boom

model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(torch.randn(40, 4), torch.randn(40, 1)), batch_size=4)
n = 0
for x, y in loader:
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    opt.zero_grad()
    n += 1
print(f"trained {n} steps")
