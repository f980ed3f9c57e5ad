"""A training job that reacts to the experiment's plan the way a fix can go right or wrong.

The experiment runner hands every trial its fixes in a plan file (``STEPSCOPE_PLAN``).
This job reads that file itself and, for each ``--effect FIX=MODE``, behaves as the fix
would if it were in the plan. The fixes are applied for real as well (the runner measures
only candidates whose fixes took effect): the model has a 1x1 convolution so that
channels_last applies, the loader takes workers, SGD takes fused, and TF32 and
cudnn.benchmark are flags a CPU build sets too; DDP fixes do not apply (no DDP), so they
are only used for the failures, which end a trial before anything is checked:

  raise    RuntimeError at step 3 (a crash)
  oom      torch.OutOfMemoryError at step 3 (the CUDA allocator's error type)
  hang     sleeps for an hour at step 3
  fast     the per-step wait is halved (two 'fast' fixes: a quarter)
  slow     the per-step wait is tripled
  stacked  the per-step wait is halved, only beside a 'fast' fix of the plan (a fix that
           pays once another bottleneck is gone)
  diverge  learning rate x10000: the loss overflows to inf by step 7
  drift    noisier targets: the loss settles at a higher level, finite

Options: --steps N (default 40), --wait S per step (default 0.02), --effect FIX=MODE.
Seeded, one thread: two trials with the same plan give the same losses.
"""

import argparse
import json
import os
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def planned_fixes() -> set[str]:
    """The plan's fixes, and the one the runner applies through the environment."""
    fixes = set()
    if "expandable_segments:True" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""):
        fixes.add("expandable_segments")
    path = os.environ.get("STEPSCOPE_PLAN")
    if path:
        with open(path) as f:
            fixes |= set(json.load(f).get("fixes") or {})
    return fixes


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--wait", type=float, default=0.02)
    p.add_argument("--effect", action="append", default=[], metavar="FIX=MODE")
    a = p.parse_args()
    in_plan = planned_fixes()
    modes = [m for fix, m in (e.split("=", 1) for e in a.effect) if fix in in_plan]

    torch.manual_seed(0)
    torch.set_num_threads(1)
    x = torch.randn(512, 8)
    y = x @ torch.randn(8, 1) + 0.05 * torch.randn(512, 1)
    if "drift" in modes:
        y = y + 3.0 * torch.randn(512, 1)
    gen = torch.Generator().manual_seed(0)
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True, generator=gen)
    # a 1x1 convolution over the 8 features, so channels_last has something to act on
    model = nn.Sequential(
        nn.Unflatten(1, (8, 1, 1)), nn.Conv2d(8, 8, 1), nn.Flatten(), nn.Linear(8, 1)
    )
    lr = 0.05 * (1e4 if "diverge" in modes else 1.0)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    wait = a.wait * 0.5 ** modes.count("fast") * (3.0 if "slow" in modes else 1.0)
    if "stacked" in modes and "fast" in modes:
        wait *= 0.5

    step = 0
    while step < a.steps:
        for xb, yb in loader:
            if step == 3:
                if "raise" in modes:
                    raise RuntimeError("this fix breaks the job (on purpose)")
                if "oom" in modes:
                    raise torch.OutOfMemoryError(
                        "CUDA out of memory. Tried to allocate 20.00 GiB (simulated)"
                    )
                if "hang" in modes:
                    print("hanging", flush=True)
                    time.sleep(3600)
            time.sleep(wait)
            loss = nn.functional.mse_loss(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if step >= a.steps:
                break
    print(f"done, loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
