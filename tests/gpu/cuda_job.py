"""A small CUDA training job for check_cuda_collectors.py: bf16 autocast matmuls fed by a
DataLoader, no synchronising call of its own in the loop (the step timer must not need one).
``--fp32``: no autocast (check_first_run.py: the bf16 fix has something to do);
``--cpu``: the same job on a CPU, smaller (the checks' dry runs).
"""

import contextlib
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
dev = torch.device("cpu" if "--cpu" in sys.argv else "cuda")
dim, depth = (256, 4) if dev.type == "cpu" else (4096, 8)
fp32 = "--fp32" in sys.argv
model = nn.Sequential(*[m for _ in range(depth) for m in (nn.Linear(dim, dim), nn.GELU())]).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
data = TensorDataset(torch.randn(2048, dim), torch.randn(2048, dim))
loader = DataLoader(
    data, batch_size=256, shuffle=True, pin_memory=dev.type == "cuda", num_workers=2
)
for _epoch in range(1000):  # stopped by STEPSCOPE_MAX_STEPS
    for x, y in loader:
        x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
        with contextlib.nullcontext() if fp32 else torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = nn.functional.mse_loss(model(x).float(), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
print("loop ended without max_steps")
