"""The job bench/diff_check.py records: a small MLP trained on generated data.

``--extra`` adds one matrix multiply per step (2.5 times a layer's rows), about 10 % of
the step on one CPU thread (measured 2026-11-26 on the 2-core VM: 0.35-0.40 ms of a
3.0 ms step; a product of a layer's size cost only 5 %): the regression ``stepscope
check`` must flag and ``stepscope diff`` must name (``aten::mm``).
"""

import argparse

import torch
from torch import nn


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--extra", action="store_true", help="one more matmul per step")
    a = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    width, batch = 384, 64
    model = nn.Sequential(*(m for _ in range(4) for m in (nn.Linear(width, width), nn.ReLU())))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(batch, width), torch.randn(batch, width)
    xe, w = torch.randn(batch * 5 // 2, width), torch.randn(width, width)
    for _ in range(a.steps):
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        if a.extra:
            torch.mm(xe, w)  # the regression: work nobody asked for
        opt.step()
        opt.zero_grad()


if __name__ == "__main__":
    main()
