"""The job bench/diff_check.py records: a small MLP trained on generated data.

``--extra`` adds one matrix multiply per step (2.5 times a layer's rows), about 10 % of
the step on one CPU thread (measured 2026-11-26 on the 2-core VM: 0.35-0.40 ms of a
3.0 ms step; a product of a layer's size cost only 5 %): the regression ``stepscope
check`` must flag and ``stepscope diff`` must name (``aten::mm``).

``--slower F`` adds F times each step's own time (0.15: 15 % more; the time from the end
of the last wait, so stepscope's own hooks count) as a busy-wait in Python at the end
of the step: the same operators with the same calls and shapes, only
more time, as a slower machine, a slower library build or host-side work the trace
does not name would give. Only the step times can see it, so only an interval that
covers run-to-run spread may judge it (``stepscope check``'s time-based verdicts).
"""

import argparse
import time

import torch
from torch import nn


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--extra", action="store_true", help="one more matmul per step")
    p.add_argument("--slower", type=float, default=0.0, help="busy-wait this share of a step")
    a = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    width, batch = 384, 64
    model = nn.Sequential(*(m for _ in range(4) for m in (nn.Linear(width, width), nn.ReLU())))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(batch, width), torch.randn(batch, width)
    xe, w = torch.randn(batch * 5 // 2, width), torch.randn(width, width)
    began = time.perf_counter()  # the step's own time: everything but the wait below
    for _ in range(a.steps):
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        if a.extra:
            torch.mm(xe, w)  # the regression: work nobody asked for
        opt.step()
        opt.zero_grad()
        if a.slower > 0:  # no operator, no new call: time alone
            end = time.perf_counter() + a.slower * (time.perf_counter() - began)
            while time.perf_counter() < end:
                pass
        began = time.perf_counter()


if __name__ == "__main__":
    main()
