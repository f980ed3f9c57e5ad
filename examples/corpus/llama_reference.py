"""Text completion the way Meta's Llama reference code does it (meta-llama `generation.py`).

The reference model keeps its own KV cache (`cache_k` / `cache_v` tensors of
`max_batch_size x max_seq_len` in every attention layer, written at `start_pos`), its
`Transformer.forward(tokens, start_pos)` is decorated `@torch.inference_mode()`, and
`Llama.generate` fills a `tokens` buffer with the prompt and pad ids, then runs
`logits = self.model.forward(tokens[:, prev_pos:cur_pos], prev_pos)` for `cur_pos` from
the prompt's length on: the first call is the prefill, each later one feeds the one
token picked last (`sample_top_p` at `temperature > 0`, else `argmax`), until
`max_gen_len` tokens or the end-of-sequence token. Note the call: `self.model.forward(...)`,
not `self.model(...)`, so no module hook of the model itself fires; only those of its
layers, which it calls in turn.

Here the model is small and its weights random (`Llama.build` seeds them with
`torch.manual_seed(seed)`, as the reference does); the tokenizer is a byte-level BPE
trained with the `tokenizers` library on generated text (the reference loads a
SentencePiece or tiktoken model). `example_text_completion.py`'s loop, one prompt per
`text_completion` call, each timed with `time.perf_counter()`.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers
from torch import nn


@dataclass
class ModelArgs:
    dim: int = 256
    n_layers: int = 4
    n_heads: int = 8
    n_kv_heads: int | None = 2
    vocab_size: int = -1
    multiple_of: int = 64
    norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    max_batch_size: int = 4
    max_seq_len: int = 256


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._norm(x.float()).type_as(x) * self.weight


def precompute_freqs_cis(dim: int, end: int, theta: float = 10000.0) -> torch.Tensor:
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    t = torch.arange(end, device=freqs.device, dtype=torch.float32)
    freqs = torch.outer(t, freqs)
    return torch.polar(torch.ones_like(freqs), freqs)  # complex64


def apply_rotary_emb(
    xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    freqs_cis = freqs_cis.view(1, xq_.shape[1], 1, xq_.shape[-1])
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    bs, slen, n_kv_heads, head_dim = x.shape
    if n_rep == 1:
        return x
    return (
        x[:, :, :, None, :]
        .expand(bs, slen, n_kv_heads, n_rep, head_dim)
        .reshape(bs, slen, n_kv_heads * n_rep, head_dim)
    )


class Attention(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.n_kv_heads = args.n_heads if args.n_kv_heads is None else args.n_kv_heads
        self.n_local_heads = args.n_heads
        self.n_rep = self.n_local_heads // self.n_kv_heads
        self.head_dim = args.dim // args.n_heads
        self.wq = nn.Linear(args.dim, args.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * self.head_dim, args.dim, bias=False)
        shape = (args.max_batch_size, args.max_seq_len, self.n_kv_heads, self.head_dim)
        self.cache_k = torch.zeros(shape)
        self.cache_v = torch.zeros(shape)

    def forward(
        self,
        x: torch.Tensor,
        start_pos: int,
        freqs_cis: torch.Tensor,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        bsz, seqlen, _ = x.shape
        xq, xk, xv = self.wq(x), self.wk(x), self.wv(x)
        xq = xq.view(bsz, seqlen, self.n_local_heads, self.head_dim)
        xk = xk.view(bsz, seqlen, self.n_kv_heads, self.head_dim)
        xv = xv.view(bsz, seqlen, self.n_kv_heads, self.head_dim)
        xq, xk = apply_rotary_emb(xq, xk, freqs_cis=freqs_cis)

        self.cache_k = self.cache_k.to(xq)
        self.cache_v = self.cache_v.to(xq)
        self.cache_k[:bsz, start_pos : start_pos + seqlen] = xk
        self.cache_v[:bsz, start_pos : start_pos + seqlen] = xv
        keys = repeat_kv(self.cache_k[:bsz, : start_pos + seqlen], self.n_rep)
        values = repeat_kv(self.cache_v[:bsz, : start_pos + seqlen], self.n_rep)

        xq, keys, values = xq.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2)
        scores = torch.matmul(xq, keys.transpose(2, 3)) / math.sqrt(self.head_dim)
        if mask is not None:
            scores = scores + mask
        scores = F.softmax(scores.float(), dim=-1).type_as(xq)
        output = torch.matmul(scores, values)
        output = output.transpose(1, 2).contiguous().view(bsz, seqlen, -1)
        return self.wo(output)


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden_dim: int, multiple_of: int) -> None:
        super().__init__()
        hidden_dim = int(2 * hidden_dim / 3)
        hidden_dim = multiple_of * ((hidden_dim + multiple_of - 1) // multiple_of)
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, layer_id: int, args: ModelArgs) -> None:
        super().__init__()
        self.attention = Attention(args)
        self.feed_forward = FeedForward(args.dim, 4 * args.dim, args.multiple_of)
        self.layer_id = layer_id
        self.attention_norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.ffn_norm = RMSNorm(args.dim, eps=args.norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        start_pos: int,
        freqs_cis: torch.Tensor,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), start_pos, freqs_cis, mask)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, params: ModelArgs) -> None:
        super().__init__()
        self.params = params
        self.vocab_size = params.vocab_size
        self.n_layers = params.n_layers
        self.tok_embeddings = nn.Embedding(params.vocab_size, params.dim)
        self.layers = nn.ModuleList(TransformerBlock(i, params) for i in range(params.n_layers))
        self.norm = RMSNorm(params.dim, eps=params.norm_eps)
        self.output = nn.Linear(params.dim, params.vocab_size, bias=False)
        self.freqs_cis = precompute_freqs_cis(
            params.dim // params.n_heads, params.max_seq_len * 2, params.rope_theta
        )

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, start_pos: int) -> torch.Tensor:
        _bsz, seqlen = tokens.shape
        h = self.tok_embeddings(tokens)
        self.freqs_cis = self.freqs_cis.to(h.device)
        freqs_cis = self.freqs_cis[start_pos : start_pos + seqlen]
        mask = None
        if seqlen > 1:
            mask = torch.full((seqlen, seqlen), float("-inf"), device=tokens.device)
            mask = torch.triu(mask, diagonal=1)
            # with KV caching we compute attention scores only for the new sequence
            mask = torch.hstack([torch.zeros((seqlen, start_pos), device=tokens.device), mask])
            mask = mask.type_as(h)
        for layer in self.layers:
            h = layer(h, start_pos, freqs_cis, mask)
        h = self.norm(h)
        return self.output(h).float()


class Tokenizer:
    """The reference's Tokenizer interface (`encode(s, bos, eos)`, `decode`, `bos_id`,
    `eos_id`, `pad_id`) over a BPE trained here."""

    def __init__(self, texts: list[str], vocab_size: int) -> None:
        tok = HFTokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        )
        tok.train_from_iterator(texts, trainer=trainer)
        self.model = tok
        self.n_words = tok.get_vocab_size()
        self.bos_id = tok.token_to_id("<|begin_of_text|>")
        self.eos_id = tok.token_to_id("<|end_of_text|>")
        self.pad_id = -1

    def encode(self, s: str, bos: bool, eos: bool) -> list[int]:
        t = self.model.encode(s).ids
        return ([self.bos_id] if bos else []) + t + ([self.eos_id] if eos else [])

    def decode(self, t: list[int]) -> str:
        return self.model.decode(t)


def sample_top_p(probs: torch.Tensor, p: float) -> torch.Tensor:
    probs_sort, probs_idx = torch.sort(probs, dim=-1, descending=True)
    probs_sum = torch.cumsum(probs_sort, dim=-1)
    mask = probs_sum - probs_sort > p
    probs_sort[mask] = 0.0
    probs_sort.div_(probs_sort.sum(dim=-1, keepdim=True))
    next_token = torch.multinomial(probs_sort, num_samples=1)
    return torch.gather(probs_idx, -1, next_token)


class Llama:
    @staticmethod
    def build(texts: list[str], params: ModelArgs, seed: int = 1) -> Llama:
        torch.manual_seed(seed)  # seed must be the same in all processes
        tokenizer = Tokenizer(texts, params.vocab_size)
        params.vocab_size = tokenizer.n_words
        model = Transformer(params)
        return Llama(model, tokenizer)

    def __init__(self, model: Transformer, tokenizer: Tokenizer) -> None:
        self.model = model
        self.tokenizer = tokenizer

    @torch.inference_mode()
    def generate(
        self,
        prompt_tokens: list[list[int]],
        max_gen_len: int,
        temperature: float = 0.6,
        top_p: float = 0.9,
    ) -> tuple[list[list[int]], list[int]]:
        """(completion tokens per prompt, cut at the end-of-sequence token; tokens the
        loop generated per prompt, that token included)."""
        params = self.model.params
        bsz = len(prompt_tokens)
        assert bsz <= params.max_batch_size, (bsz, params.max_batch_size)
        min_prompt_len = min(len(t) for t in prompt_tokens)
        max_prompt_len = max(len(t) for t in prompt_tokens)
        assert max_prompt_len <= params.max_seq_len
        total_len = min(params.max_seq_len, max_gen_len + max_prompt_len)

        pad_id = self.tokenizer.pad_id
        tokens = torch.full((bsz, total_len), pad_id, dtype=torch.long)
        for k, t in enumerate(prompt_tokens):
            tokens[k, : len(t)] = torch.tensor(t, dtype=torch.long)
        prev_pos = 0
        eos_reached = torch.tensor([False] * bsz)
        input_text_mask = tokens != pad_id
        for cur_pos in range(min_prompt_len, total_len):
            logits = self.model.forward(tokens[:, prev_pos:cur_pos], prev_pos)
            if temperature > 0:
                probs = torch.softmax(logits[:, -1] / temperature, dim=-1)
                next_token = sample_top_p(probs, top_p)
            else:
                next_token = torch.argmax(logits[:, -1], dim=-1)
            next_token = next_token.reshape(-1)
            # only replace token if prompt has already been generated
            next_token = torch.where(input_text_mask[:, cur_pos], tokens[:, cur_pos], next_token)
            tokens[:, cur_pos] = next_token
            eos_reached |= (~input_text_mask[:, cur_pos]) & (next_token == self.tokenizer.eos_id)
            prev_pos = cur_pos
            if all(eos_reached):
                break

        out_tokens, generated = [], []
        for i, toks in enumerate(tokens.tolist()):
            start = len(prompt_tokens[i])
            toks = toks[start : len(prompt_tokens[i]) + max_gen_len]
            toks = toks[: max(0, prev_pos + 1 - start)]  # what the loop filled in
            if self.tokenizer.eos_id in toks:
                toks = toks[: toks.index(self.tokenizer.eos_id) + 1]
            generated.append(len(toks))
            out_tokens.append([t for t in toks if t != self.tokenizer.eos_id])
        return out_tokens, generated

    def text_completion(
        self, prompts: list[str], temperature: float, top_p: float, max_gen_len: int
    ) -> tuple[list[dict[str, str]], list[int]]:
        prompt_tokens = [self.tokenizer.encode(x, bos=True, eos=False) for x in prompts]
        generation_tokens, generated = self.generate(
            prompt_tokens, max_gen_len, temperature=temperature, top_p=top_p
        )
        return [{"generation": self.tokenizer.decode(t)} for t in generation_tokens], generated


def main() -> None:
    p = argparse.ArgumentParser(description="Text completion with the Llama reference loop")
    p.add_argument("--num-prompts", type=int, default=6)
    p.add_argument("--max-gen-len", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.6)
    p.add_argument("--top-p", type=float, default=0.9)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--n-layers", type=int, default=4)
    p.add_argument("--vocab-size", type=int, default=1000)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()

    rng = random.Random(args.seed)
    subjects = ["simply put, the theory", "the best way to learn", "a brief message to", "hi"]
    texts = [f"{rng.choice(subjects)} number {rng.randint(0, 99)} ." for _ in range(2000)]
    params = ModelArgs(dim=args.dim, n_layers=args.n_layers, vocab_size=args.vocab_size)
    generator = Llama.build(texts, params, seed=args.seed)
    prompts = [rng.choice(subjects) for _ in range(args.num_prompts)]

    latencies: list[float] = []
    new_tokens: list[int] = []
    prompt_tokens: list[int] = []
    for prompt in prompts:
        t0 = time.perf_counter()
        results, generated = generator.text_completion(
            [prompt], max_gen_len=args.max_gen_len, temperature=args.temperature, top_p=args.top_p
        )
        latencies.append(time.perf_counter() - t0)
        new_tokens.append(generated[0])
        prompt_tokens.append(len(generator.tokenizer.encode(prompt, bos=True, eos=False)))
        print(prompt)
        print(f"> {results[0]['generation']!r}")
        print(f"({generated[0]} tokens, {latencies[-1] * 1000:.1f} ms)")
        print("\n==================================\n")

    corpus = {
        "requests": len(prompts),
        "new_tokens": new_tokens,
        "latencies_s": latencies,
        "prompt_tokens": prompt_tokens,
    }
    print("CORPUS " + json.dumps(corpus), flush=True)


if __name__ == "__main__":
    main()
