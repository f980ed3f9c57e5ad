"""The fixed job ``stepscope calibrate --noise`` runs several times: a small MLP trained
on generated data on one CPU thread (about 3 ms a step on the 2-core dev VM).

Fixed, so that two hosts' spreads compare, and small, so that several whole runs fit in
a minute: the spread it measures is the host's (scheduling, clocks, neighbours, process
start-up effects on a run), not the job's. Run as a script, never imported.
"""

import argparse

import torch
from torch import nn


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(a.threads)
    width, batch = 384, 64
    model = nn.Sequential(*(m for _ in range(4) for m in (nn.Linear(width, width), nn.ReLU())))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(batch, width), torch.randn(batch, width)
    for _ in range(a.steps):
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()


if __name__ == "__main__":
    main()
