"""A nanoGPT-style sampling script: a small causal transformer and its own ``generate``
loop, no KV cache (each new token re-runs the whole context), ``torch.multinomial``.

``--samples N`` samples of ``--new`` tokens each from a one-token prompt. The last line
says what the script did (``generated: {json}``), for the tests.
"""

import argparse
import json

import torch
import torch.nn.functional as F
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--samples", type=int, default=3)
p.add_argument("--new", type=int, default=24)
a = p.parse_args()
torch.manual_seed(0)
torch.set_num_threads(1)


class GPT(nn.Module):
    def __init__(self, vocab: int = 96, dim: int = 64, block: int = 64) -> None:
        super().__init__()
        self.block = block
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(block, dim)
        self.layer = nn.TransformerEncoderLayer(dim, 4, 4 * dim, batch_first=True)
        self.head = nn.Linear(dim, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t))
        mask = nn.Transformer.generate_square_subsequent_mask(t)
        return self.head(self.layer(x, src_mask=mask, is_causal=True))

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
        for _ in range(max_new_tokens):
            cond = idx if idx.size(1) <= self.block else idx[:, -self.block :]
            logits = self(cond)[:, -1, :]
            nxt = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)
            idx = torch.cat((idx, nxt), dim=1)
        return idx


model = GPT().eval()
done = {"requests": 0, "prompt_tokens": 0, "new_tokens": 0}
for _ in range(a.samples):
    start = torch.zeros((1, 1), dtype=torch.long)
    y = model.generate(start, a.new)
    done["requests"] += 1
    done["prompt_tokens"] += start.numel()
    done["new_tokens"] += y.shape[1] - start.shape[1]
print("generated: " + json.dumps(done))
