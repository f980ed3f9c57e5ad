"""A hand-written decode loop whose every token costs --token-ms more (a sleep after each
forward): the same generation job made slower by a known factor, for `stepscope check`.

--requests N prompts of one token, --new T tokens each (greedy, no KV cache: the whole
sequence again per token), --token-ms M of sleep per token.
"""

import argparse
import time

import torch
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--requests", type=int, default=10)
p.add_argument("--new", type=int, default=8)
p.add_argument("--token-ms", type=float, default=5.0)
a = p.parse_args()
torch.manual_seed(0)
torch.set_num_threads(1)

model = nn.Sequential(nn.Embedding(64, 32), nn.Linear(32, 64)).eval()


@torch.no_grad()
def generate(idx: torch.Tensor, new: int) -> torch.Tensor:
    for _ in range(new):
        logits = model(idx)[:, -1, :]
        time.sleep(a.token_ms / 1000)
        idx = torch.cat((idx, logits.argmax(-1, keepdim=True)), dim=1)
    return idx


for i in range(a.requests):
    generate(torch.full((1, 1), i % 64, dtype=torch.long), a.new)
print("done")
