"""A small GPT-style trainer: a Block class repeated in an nn.ModuleList, AdamW.

Its activations outweigh its weights (a long sequence, a wide MLP), so activation
checkpointing of its blocks lowers its peak memory. Options: --steps N, --batch B,
--seq T, --dim D, --blocks L, --flat (one big MLP instead of repeated blocks: nothing to
checkpoint), --print-loss (print each step's loss), --report-wrapped (print how many of
its blocks are CheckpointWrapper at the end).
"""

import argparse

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, 4, batch_first=True)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int, dim: int, blocks: int, seq: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(seq, dim))
        self.blocks = nn.ModuleList(Block(dim) for _ in range(blocks))
        self.head = nn.Linear(dim, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos[: idx.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class Flat(nn.Module):
    """The same interface with no repeated block: an embedding, one MLP, a head."""

    def __init__(self, vocab: int, dim: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.body = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.head = nn.Linear(dim, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.tok(idx)))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--blocks", type=int, default=6)
    p.add_argument("--vocab", type=int, default=128)
    p.add_argument("--flat", action="store_true")
    p.add_argument("--print-loss", action="store_true")
    p.add_argument("--report-wrapped", action="store_true")
    a = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = Flat(a.vocab, a.dim) if a.flat else GPT(a.vocab, a.dim, a.blocks, a.seq)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1)
    for step in range(a.steps):
        idx = torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=gen)
        logits = model(idx[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, a.vocab), idx[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if a.print_loss:
            print(f"loss {step} {loss.item():.6f}", flush=True)
    if a.report_wrapped:
        wrapped = sum(1 for m in model.modules() if type(m).__name__ == "CheckpointWrapper")
        print(f"wrapped {wrapped}", flush=True)


if __name__ == "__main__":
    main()
