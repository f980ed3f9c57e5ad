"""A job that forks its training process the moment torch is imported.

As mnist_hogwild does with the fork start method, only sooner: the fork lands while
stepscope is still setting itself up in the parent, where a fork used to leave the child
waiting for ever on import locks held by a thread it does not have.
"""

import multiprocessing as mp

import torch
from torch import nn


def train(steps: int) -> None:
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


if __name__ == "__main__":
    worker = mp.get_context("fork").Process(target=train, args=(3,))
    worker.start()
    worker.join()
    print("exit code", worker.exitcode)
