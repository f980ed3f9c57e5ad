"""Time-sequence prediction with LBFGS, written as pytorch/examples' time_sequence_prediction
is: two stacked LSTMCells stepped by hand over each time step in Python, an LBFGS
optimizer whose ``step(closure)`` calls the closure up to 20 times, the loss printed inside
the closure, and a prediction of the test set (with future steps) after every step, under
``torch.no_grad()``. Its steps are long (the original's are about a minute on a laptop;
``--length`` sets how long here) and made of thousands of tiny operators.

Sine waves stand in for the example's ``traindata.pt`` (built the same way, in memory).
The last line is ``CORPUS {json}``: steps done, the loss after each, the test loss, and
the loop's own wall time (``loop_s``: what a capture that stalls the job lengthens).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch
from torch import nn, optim


class Sequence(nn.Module):
    def __init__(self, hidden: int = 51) -> None:
        super().__init__()
        self.hidden = hidden
        self.lstm1 = nn.LSTMCell(1, hidden)
        self.lstm2 = nn.LSTMCell(hidden, hidden)
        self.linear = nn.Linear(hidden, 1)

    def forward(self, input: torch.Tensor, future: int = 0) -> torch.Tensor:
        outputs = []
        h_t = torch.zeros(input.size(0), self.hidden, dtype=torch.double)
        c_t = torch.zeros(input.size(0), self.hidden, dtype=torch.double)
        h_t2 = torch.zeros(input.size(0), self.hidden, dtype=torch.double)
        c_t2 = torch.zeros(input.size(0), self.hidden, dtype=torch.double)
        for input_t in input.split(1, dim=1):
            h_t, c_t = self.lstm1(input_t, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            output = self.linear(h_t2)
            outputs += [output]
        for _ in range(future):  # if we should predict the future
            h_t, c_t = self.lstm1(output, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            output = self.linear(h_t2)
            outputs += [output]
        return torch.cat(outputs, dim=1)


def sine_waves(n: int, length: int, seed: int = 2) -> np.ndarray:
    """The example's generate_sine_wave.py: shifted sine waves, period 20."""
    rng = np.random.default_rng(seed)
    x = np.empty((n, length), dtype=np.int64)
    x[:] = np.arange(length) + rng.integers(-80, 80, n).reshape(n, 1)
    return np.sin(x / 20.0).astype(np.float64)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6, help="steps to run")
    parser.add_argument("--length", type=int, default=200, help="time steps of each wave")
    parser.add_argument("--waves", type=int, default=100)
    parser.add_argument("--future", type=int, default=100)
    opt = parser.parse_args()
    np.random.seed(0)
    torch.manual_seed(0)
    data = sine_waves(opt.waves, opt.length)
    input = torch.from_numpy(data[3:, :-1])
    target = torch.from_numpy(data[3:, 1:])
    test_input = torch.from_numpy(data[:3, :-1])
    test_target = torch.from_numpy(data[:3, 1:])
    seq = Sequence()
    seq.double()
    criterion = nn.MSELoss()
    # use LBFGS as optimizer since we can load the whole data to train
    optimizer = optim.LBFGS(seq.parameters(), lr=0.8)
    losses: list[float] = []
    test_loss = float("nan")
    started = time.perf_counter()
    for i in range(opt.steps):
        print("STEP: ", i)

        def closure() -> torch.Tensor:
            optimizer.zero_grad()
            out = seq(input)
            loss = criterion(out, target)
            print("loss:", loss.item())
            loss.backward()
            return loss

        loss = optimizer.step(closure)
        losses.append(loss.item())
        # begin to predict, no need to track gradient here
        with torch.no_grad():
            future = opt.future
            pred = seq(test_input, future=future)
            test_loss = criterion(pred[:, :-future], test_target).item()
            print("test loss:", test_loss)
    loop_s = time.perf_counter() - started
    out = {"steps": opt.steps, "losses": losses, "test_loss": test_loss, "loop_s": loop_s}
    print("CORPUS " + json.dumps(out))


if __name__ == "__main__":
    main()
