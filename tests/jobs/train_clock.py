"""A plain training loop that keeps its own clock: the end of every step, in a file.

Usage: train_clock.py STEPS CLOCK_FILE [STEP_SLEEP_S]. An MLP, SGD, a fixed batch; after
each ``optimizer.step()`` the wall clock is appended to CLOCK_FILE, so a test can count
the job's own steps over any window. At the end it prints its final loss and whether
any of torch's global hooks, or a method stepscope patches, differs from the start.
"""

import sys
import time

import torch
import torch.nn.modules.module as module_mod
import torch.optim.optimizer as optim_mod
from torch import nn

steps, clock_path = int(sys.argv[1]), sys.argv[2]
pause = float(sys.argv[3]) if len(sys.argv) > 3 else 0.02
# what stepscope's step timer patches, as the job found it
PATCHED = [
    (torch.optim.Optimizer, "zero_grad"),
    (torch.optim.Optimizer, "__init__"),
    (nn.Module, "zero_grad"),
    (torch.autograd, "backward"),
    (torch.utils.data.dataloader._BaseDataLoaderIter, "__next__"),
    (torch.utils.data.DataLoader, "__iter__"),
]
before = [getattr(owner, name) for owner, name in PATCHED]
torch.set_num_threads(1)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
print("ready", flush=True)
with open(clock_path, "w") as clock:
    for _ in range(steps):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        clock.write(f"{time.time():.6f}\n")
        clock.flush()
        time.sleep(pause)
left = (
    len(optim_mod._global_optimizer_pre_hooks)
    + len(optim_mod._global_optimizer_post_hooks)
    + len(module_mod._global_forward_hooks)
    + len(module_mod._global_forward_pre_hooks)
    + sum(getattr(o, n) is not f for (o, n), f in zip(PATCHED, before, strict=True))
)
print(f"done {steps} steps, loss {loss.item():.6f}, left {left}", flush=True)
