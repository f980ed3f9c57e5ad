"""A tiny GPT trained the nanoGPT way (karpathy/nanoGPT train.py, single process).

Tokens come from a uint16 `np.memmap` file that `get_batch` cuts random windows from
(no DataLoader), gradient accumulation divides each micro-batch loss by the number of
micro-steps, and `estimate_loss()` runs `eval_iters` forward passes on each split,
under `model.eval()` and `@torch.no_grad()`, every `eval_interval` iterations,
iteration 0 included: before the first optimizer step the job has already made
2 * eval_iters forward calls that train nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

parser = argparse.ArgumentParser(description="nanoGPT-style training of a tiny GPT")
parser.add_argument("--max_iters", type=int, default=12)
parser.add_argument("--eval_interval", type=int, default=10)
parser.add_argument("--eval_iters", type=int, default=10)
parser.add_argument("--log_interval", type=int, default=1)
parser.add_argument("--gradient_accumulation_steps", type=int, default=4)
parser.add_argument("--batch_size", type=int, default=8)
parser.add_argument("--block_size", type=int, default=64)
parser.add_argument("--n_layer", type=int, default=2)
parser.add_argument("--n_head", type=int, default=2)
parser.add_argument("--n_embd", type=int, default=64)
parser.add_argument("--vocab_size", type=int, default=512)
parser.add_argument("--learning_rate", type=float, default=1e-3)
parser.add_argument("--weight_decay", type=float, default=0.1)
parser.add_argument("--grad_clip", type=float, default=1.0)
parser.add_argument("--compile", action="store_true", help="torch.compile the model")
parser.add_argument("--seed", type=int, default=1337)
args = parser.parse_args()


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int) -> None:
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.n_head = n_head
        self.n_embd = n_embd

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, n_embd: int) -> None:
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = MLP(n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size: int, block_size: int, n_layer: int, n_head: int, n_embd: int):
        super().__init__()
        self.block_size = block_size
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.h = nn.ModuleList([Block(n_embd, n_head) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss

    def configure_optimizers(self, weight_decay: float, learning_rate: float):
        params = [p for p in self.parameters() if p.requires_grad]
        decay = [p for p in params if p.dim() >= 2]
        nodecay = [p for p in params if p.dim() < 2]
        groups = [
            {"params": decay, "weight_decay": weight_decay},
            {"params": nodecay, "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=(0.9, 0.95))


torch.manual_seed(args.seed)
np.random.seed(args.seed)

# prepare.py's job: train.bin / val.bin as uint16 token files
data_tmp = tempfile.TemporaryDirectory(prefix="nanogpt_")  # removed at exit
data_dir = data_tmp.name
for split, n in (("train", 200_000), ("val", 20_000)):
    tokens = np.random.randint(0, args.vocab_size, size=n).astype(np.uint16)
    tokens.tofile(os.path.join(data_dir, f"{split}.bin"))


def get_batch(split: str) -> tuple[torch.Tensor, torch.Tensor]:
    # recreate np.memmap every batch to avoid a memory leak, as nanoGPT does
    data = np.memmap(os.path.join(data_dir, f"{split}.bin"), dtype=np.uint16, mode="r")
    ix = torch.randint(len(data) - args.block_size, (args.batch_size,))
    x = torch.stack([torch.from_numpy(data[i : i + args.block_size].astype(np.int64)) for i in ix])
    y = torch.stack(
        [torch.from_numpy(data[i + 1 : i + 1 + args.block_size].astype(np.int64)) for i in ix]
    )
    return x, y


model = GPT(args.vocab_size, args.block_size, args.n_layer, args.n_head, args.n_embd)
optimizer = model.configure_optimizers(args.weight_decay, args.learning_rate)
if args.compile:
    print("compiling the model... (takes a ~minute)")
    model = torch.compile(model)


@torch.no_grad()
def estimate_loss() -> dict[str, float]:
    out = {}
    model.eval()
    for split in ["train", "val"]:
        losses = torch.zeros(args.eval_iters)
        for k in range(args.eval_iters):
            X, Y = get_batch(split)
            logits, loss = model(X, Y)
            losses[k] = loss.item()
        out[split] = losses.mean().item()
    model.train()
    return out


X, Y = get_batch("train")  # fetch the very first batch
t0 = time.time()
iter_num = 0
printed: list[float] = []
while True:
    if iter_num % args.eval_interval == 0:
        losses = estimate_loss()
        print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")

    for micro_step in range(args.gradient_accumulation_steps):  # noqa: B007
        logits, loss = model(X, Y)
        loss = loss / args.gradient_accumulation_steps  # scale the loss to account for GA
        X, Y = get_batch("train")
        loss.backward()
    if args.grad_clip != 0.0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)

    t1 = time.time()
    dt = t1 - t0
    t0 = t1
    if iter_num % args.log_interval == 0:
        # the last micro-batch's loss, scaled back up (an approximation of the total loss)
        lossf = loss.item() * args.gradient_accumulation_steps
        print(f"iter {iter_num}: loss {lossf:.4f}, time {dt * 1000:.2f}ms")
        printed.append(lossf)
    iter_num += 1
    if iter_num >= args.max_iters:
        break

corpus = {
    "iterations": iter_num,
    "losses": printed[-5:],
    "batch_size": args.batch_size * args.gradient_accumulation_steps,
}
print("CORPUS " + json.dumps(corpus), flush=True)
