"""A hand-written GPT-style trainer, the way people write their first transformer.

In the spirit of the many "GPT from scratch" training scripts (minGPT's model, the
PyTorch tutorials' `nn.Module` blocks, a blog post's loop): a `Block` class with
causal self-attention written out by hand (q @ k^T, mask, softmax, @ v) and an MLP,
the blocks in an `nn.ModuleList`, AdamW, random token batches, and argparse flags.
No gradient checkpointing, no mixed precision: every block keeps its activations
for the backward, and the attention matrices (batch x heads x seq x seq) are the
largest of them.

The trap: at `--batch 24` under a 2.5 GB process memory limit
(`stepscope run --memory-limit 2.5GB -- python examples/corpus/gpt_trainer.py --batch 24`)
the job runs out of memory in its first step (the CPU allocator's "can't allocate
memory: you tried to allocate N bytes"); at its default batch it fits.
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch
import torch.nn.functional as F
from torch import nn

parser = argparse.ArgumentParser(description="train a small GPT on random tokens")
parser.add_argument("--batch", type=int, default=4)
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--seq", type=int, default=512)
parser.add_argument("--layers", type=int, default=6)
parser.add_argument("--dim", type=int, default=256)
parser.add_argument("--heads", type=int, default=8)
parser.add_argument("--vocab", type=int, default=4096)
parser.add_argument("--lr", type=float, default=3e-4)
parser.add_argument("--seed", type=int, default=0)
args = parser.parse_args()


class CausalSelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int, seq: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        mask = torch.tril(torch.ones(seq, seq, dtype=torch.bool))
        self.register_buffer("mask", mask.view(1, 1, seq, seq))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q = q.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(~self.mask[:, :, :t, :t], float("-inf"))
        att = F.softmax(att, dim=-1)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, seq: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads, seq)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int, heads: int, seq: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList([Block(dim, heads, seq) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        t = idx.size(1)
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def main() -> None:
    torch.manual_seed(args.seed)
    model = GPT(args.vocab, args.dim, args.layers, args.heads, args.seq)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params / 1e6:.2f} M parameters, batch {args.batch}, seq {args.seq}")
    losses = []
    for step in range(args.steps):
        t0 = time.perf_counter()
        idx = torch.randint(0, args.vocab, (args.batch, args.seq))
        targets = torch.roll(idx, -1, dims=1)
        loss = model(idx, targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        print(f"step {step}: loss {losses[-1]:.4f}, {(time.perf_counter() - t0) * 1000:.0f} ms")
    record = {"iterations": args.steps, "losses": losses[-3:], "batch_size": args.batch}
    print("CORPUS " + json.dumps(record))


if __name__ == "__main__":
    main()
