"""Training loops written the ways that tripped the step timer on real scripts.

--pattern:
  eval-first       nanoGPT: the optimizer is made, then ``estimate_loss`` runs 10 eval
                   forwards under no_grad before the first iteration; 2 micro-batches a step
  eval-no-optim    an evaluation runs before any optimizer exists, then training starts
  manual           a language model updating its parameters by hand (no torch.optim)
  gan              two optimizers per iteration: D (two backward calls), then G
  lookahead        the loader is read one batch ahead (accelerate's DataLoaderShard)

Each prints ``LOSSES <json>``: the loss the script itself reports per iteration.
"""

import argparse
import json

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def eval_forwards(model: nn.Module, n: int) -> None:
    model.eval()
    with torch.no_grad():
        for _ in range(n):
            model(torch.randn(8, 16))
    model.train()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--pattern", required=True)
    p.add_argument("--iters", type=int, default=8)
    a = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    reported: list[float] = []

    if a.pattern in ("eval-first", "eval-no-optim"):
        if a.pattern == "eval-no-optim":
            eval_forwards(model, 10)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        if a.pattern == "eval-first":
            eval_forwards(model, 10)
        for _ in range(a.iters):
            total = 0.0
            for _micro in range(2):
                loss = model(torch.randn(8, 16)).pow(2).mean() / 2  # divided by accumulation
                loss.backward()
                total += loss.item()
            opt.step()
            opt.zero_grad(set_to_none=True)
            reported.append(total)
    elif a.pattern == "manual":
        lr = 0.01
        for _ in range(a.iters):
            loss = model(torch.randn(8, 16)).pow(2).mean()
            model.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
            for param in model.parameters():
                param.data.add_(param.grad, alpha=-lr)
            reported.append(loss.item())
    elif a.pattern == "gan":
        g, d = nn.Linear(4, 4), nn.Linear(4, 1)
        opt_d = torch.optim.Adam(d.parameters())
        opt_g = torch.optim.Adam(g.parameters())
        for _ in range(a.iters):
            z = torch.randn(5, 4)
            d.zero_grad()
            err_real = -d(torch.randn(5, 4)).mean()
            err_real.backward()
            err_fake = d(g(z).detach()).mean()
            err_fake.backward()
            opt_d.step()
            g.zero_grad()
            err_g = -d(g(z)).mean()
            err_g.backward()
            opt_g.step()
            reported.append((err_real + err_fake).item())
    elif a.pattern == "lookahead":
        data = TensorDataset(torch.randn(8 * (a.iters + 1), 16), torch.randn(8 * (a.iters + 1), 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)

        def ahead(loader: DataLoader):
            it = iter(loader)
            current = next(it)
            for upcoming in it:
                yield current
                current = upcoming
            yield current

        for step, (x, y) in enumerate(ahead(DataLoader(data, batch_size=8))):
            if step == a.iters:
                break
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            reported.append(loss.item())
    else:
        raise SystemExit(f"unknown pattern {a.pattern}")
    print("LOSSES " + json.dumps(reported))


if __name__ == "__main__":
    main()
