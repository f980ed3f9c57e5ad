"""Greedy generation the Hugging Face way, one prompt at a time, timed per request.

The script a user writes to see how fast a causal LM answers: a GPT-2 architecture built
from a `GPT2Config` (random weights: the hub is switched off before transformers is
imported; 6 layers as distilgpt2, but 256 wide over 8192 token ids, so that a request
takes about as long on two CPU cores as the issue's, ~200 ms), `model.eval()`, a list
of prompts of `--prompt-len` tokens, and for each one `model.generate(input_ids,
attention_mask=..., max_new_tokens=K, do_sample=False)` bracketed by
`time.perf_counter()`, printing the request's latency and its new tokens, then a summary.

Each `generate()` call runs one forward per new token (a prefill, then one token at a
time with the KV cache): read as forward steps, 30 requests are 960 "requests" of a few
milliseconds. A new token count is what the call returned beyond the prompt (up to the
end-of-sequence token, had greedy decoding met it: generate stops there for one row).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

# Before transformers is imported: nothing may try the network.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"

import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, set_seed  # noqa: E402


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Time greedy generation, one prompt per call")
    p.add_argument("--num-prompts", type=int, default=30)
    p.add_argument("--prompt-len", type=int, default=96)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--n-layer", type=int, default=6)
    p.add_argument("--n-embd", type=int, default=256)
    p.add_argument("--n-head", type=int, default=8)
    p.add_argument("--vocab-size", type=int, default=8192)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    set_seed(args.seed)
    eos = args.vocab_size - 1  # as GPT-2's <|endoftext|>, the last id
    config = GPT2Config(
        vocab_size=args.vocab_size,
        n_positions=max(1024, args.prompt_len + args.max_new_tokens),
        n_embd=args.n_embd,
        n_layer=args.n_layer,
        n_head=args.n_head,
        bos_token_id=eos,
        eos_token_id=eos,
    )
    model = GPT2LMHeadModel(config).to(args.device)
    model.eval()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: GPT-2 {args.n_layer} layers x {args.n_embd}, {n_params / 1e6:.1f}M parameters")

    # the prompts: random token ids (the benchmark's "96 tokens of text")
    prompts = [
        torch.randint(0, eos, (1, args.prompt_len), device=args.device)
        for _ in range(args.num_prompts)
    ]

    latencies: list[float] = []
    new_tokens: list[int] = []
    for i, input_ids in enumerate(prompts):
        attention_mask = torch.ones_like(input_ids)
        t0 = time.perf_counter()
        output = model.generate(
            input_ids,
            attention_mask=attention_mask,
            max_new_tokens=args.max_new_tokens,
            do_sample=False,
            pad_token_id=eos,
        )
        latency = time.perf_counter() - t0
        n_new = output.shape[1] - input_ids.shape[1]
        latencies.append(latency)
        new_tokens.append(n_new)
        print(f"request {i:3d}: {latency * 1000:7.1f} ms, {n_new} new tokens")

    total = sum(latencies)
    print(
        f"{len(latencies)} requests in {total:.2f} s: "
        f"p50 {statistics.median(latencies) * 1000:.1f} ms, "
        f"{len(latencies) / total:.2f} requests/s, {sum(new_tokens) / total:.1f} tokens/s"
    )
    corpus = {
        "requests": len(latencies),
        "new_tokens": new_tokens,
        "latencies_s": latencies,
        "prompt_tokens": [int(p.numel()) for p in prompts],
    }
    print("CORPUS " + json.dumps(corpus), flush=True)


if __name__ == "__main__":
    main()
