"""A training job whose batch grows until it runs out of memory (tests/test_oom.py).

``--batches 8,8,8,200000``: one optimizer step per batch size, an MLP of width 1024,
so under ``stepscope run --memory-limit 1.5GB`` the last batch's first activation
(200000 x 1024 floats, 819 MB) is refused by the CPU allocator after three steps.
``--print-limit``: first print the address-space limit the job runs under.
"""

import argparse
import resource

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--batches", default="8,8,8,200000")
parser.add_argument("--print-limit", action="store_true", help="print RLIMIT_AS first")
args = parser.parse_args()
if args.print_limit:
    print(f"RLIMIT_AS {resource.getrlimit(resource.RLIMIT_AS)[0]}", flush=True)

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 1024), nn.ReLU(), nn.Linear(1024, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for i, batch in enumerate(int(b) for b in args.batches.split(",")):
    x = torch.randn(batch, 64)
    loss = model(x).square().mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {i} batch {batch} loss {loss.item():.4f}", flush=True)
