"""Sampling from a small GPT the nanoGPT way (karpathy/nanoGPT `sample.py`).

nanoGPT's model with its own `generate(idx, max_new_tokens, temperature, top_k)`,
decorated `@torch.no_grad()`: for every new token it crops the context to `block_size`
and runs the *whole* context through the model again (no KV cache), keeps the last
position's logits, applies temperature and top-k, samples with `torch.multinomial` and
appends. `sample.py` then encodes `--start`, and draws `num_samples` samples of
`max_new_tokens` each under `torch.manual_seed(seed)`. The vocabulary is
shakespeare_char's kind (`prepare.py`: the sorted characters of the training text,
`stoi`/`itos` in a `meta.pkl`), built here from generated text; the weights are random
(`init_from='scratch'`, nothing to download). Each sample is timed with
`time.perf_counter()` around `model.generate(...)`.

One sample is one request of `max_new_tokens` forwards, each over a context one token
longer than the last until it reaches `block_size`, then as long (cropped).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pickle
import random
import tempfile
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

parser = argparse.ArgumentParser(description="Sample from a nanoGPT-style model")
parser.add_argument("--start", default="\n", help="the prompt; 'FILE:path' reads a file")
parser.add_argument("--num_samples", type=int, default=4)
parser.add_argument("--max_new_tokens", type=int, default=120)
parser.add_argument("--temperature", type=float, default=0.8)
parser.add_argument("--top_k", type=int, default=200)
parser.add_argument("--seed", type=int, default=1337)
parser.add_argument("--block_size", type=int, default=64)
parser.add_argument("--n_layer", type=int, default=4)
parser.add_argument("--n_head", type=int, default=4)
parser.add_argument("--n_embd", type=int, default=128)
parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
parser.add_argument("--compile", action="store_true")
args = parser.parse_args()


@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True


class LayerNorm(nn.Module):
    """LayerNorm with an optional bias (PyTorch's has no bias=False in older releases)."""

    def __init__(self, ndim: int, bias: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.dropout = config.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0, is_causal=True
        )
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd),
                wpe=nn.Embedding(config.block_size, config.n_embd),
                drop=nn.Dropout(config.dropout),
                h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
                ln_f=LayerNorm(config.n_embd, bias=config.bias),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        device = idx.device
        b, t = idx.size()
        assert t <= self.config.block_size, f"sequence of {t} > block size {self.config.block_size}"
        pos = torch.arange(0, t, dtype=torch.long, device=device)
        tok_emb = self.transformer.wte(idx)
        pos_emb = self.transformer.wpe(pos)
        x = self.transformer.drop(tok_emb + pos_emb)
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        if targets is not None:
            logits = self.lm_head(x)
            loss = F.cross_entropy(
                logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1
            )
        else:
            # inference-time mini-optimization: only forward the lm_head on the last position
            logits = self.lm_head(x[:, [-1], :])
            loss = None
        return logits, loss

    @torch.no_grad()
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
    ) -> torch.Tensor:
        """Take a conditioning sequence of indices idx (LongTensor of shape (b,t)) and
        complete the sequence max_new_tokens times, feeding the predictions back into
        the model each time."""
        for _ in range(max_new_tokens):
            # if the sequence context is growing too long we must crop it at block_size
            idx_cond = (
                idx if idx.size(1) <= self.config.block_size else idx[:, -self.config.block_size :]
            )
            logits, _ = self(idx_cond)
            logits = logits[:, -1, :] / temperature
            if top_k is not None:
                v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits[logits < v[:, [-1]]] = -float("Inf")
            probs = F.softmax(logits, dim=-1)
            idx_next = torch.multinomial(probs, num_samples=1)
            idx = torch.cat((idx, idx_next), dim=1)
        return idx


def prepare(data_dir: str) -> None:
    """data/shakespeare_char/prepare.py's meta.pkl, from generated lines of verse."""
    rng = random.Random(0)
    words = ["thou", "art", "the", "sun", "and", "moon", "of", "my", "fair", "heart"]
    words += ["what", "light", "doth", "break", "yonder", "sweet", "night"]
    text = "\n".join(
        " ".join(rng.choice(words) for _ in range(rng.randint(4, 9))) for _ in range(500)
    )
    chars = sorted(set(text))
    meta = {
        "vocab_size": len(chars),
        "itos": dict(enumerate(chars)),
        "stoi": {ch: i for i, ch in enumerate(chars)},
    }
    with open(os.path.join(data_dir, "meta.pkl"), "wb") as f:
        pickle.dump(meta, f)


torch.manual_seed(args.seed)
data_tmp = tempfile.TemporaryDirectory(prefix="nanogpt_sample_")  # removed at exit
prepare(data_tmp.name)
meta_path = os.path.join(data_tmp.name, "meta.pkl")
print(f"Loading meta from {meta_path}...")
with open(meta_path, "rb") as f:
    meta = pickle.load(f)
stoi, itos = meta["stoi"], meta["itos"]


def encode(s: str) -> list[int]:
    return [stoi[c] for c in s]


def decode(tokens: list[int]) -> str:
    return "".join(itos[i] for i in tokens)


# init_from='scratch': the model's shape from the flags, random weights
gptconf = GPTConfig(
    block_size=args.block_size,
    vocab_size=meta["vocab_size"],
    n_layer=args.n_layer,
    n_head=args.n_head,
    n_embd=args.n_embd,
)
model = GPT(gptconf)
model.eval()
model.to(args.device)
if args.compile:
    model = torch.compile(model)  # requires PyTorch 2.0 (optional)

start = args.start
if start.startswith("FILE:"):
    with open(start[5:], encoding="utf-8") as f:
        start = f.read()
start_ids = encode(start)
x = torch.tensor(start_ids, dtype=torch.long, device=args.device)[None, ...]

latencies: list[float] = []
new_tokens: list[int] = []
with torch.no_grad():
    for k in range(args.num_samples):
        t0 = time.perf_counter()
        y = model.generate(x, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k)
        latencies.append(time.perf_counter() - t0)
        new_tokens.append(y.size(1) - x.size(1))
        print(decode(y[0].tolist()))
        print(f"--------------- sample {k}: {new_tokens[-1]} tokens in {latencies[-1]:.3f} s")

corpus = {
    "requests": args.num_samples,
    "new_tokens": new_tokens,
    "latencies_s": latencies,
    "prompt_tokens": [len(start_ids)] * args.num_samples,
}
print("CORPUS " + json.dumps(corpus), flush=True)
