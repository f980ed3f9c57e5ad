"""Sampling story continuations with `generate(do_sample=True, top_p=..., temperature=...)`.

A script that wants varied answers: prompts go in batches (`padding_side="left"`, as a
decoder-only model needs), each batch is one `model.generate(**inputs, do_sample=True,
top_p=0.9, temperature=0.8, num_return_sequences=2, max_new_tokens=K)` call, and no
seed is set for the sampling, so two runs print different stories. The weights are
fixed (built under a seed of their own, standing in for `from_pretrained`); the
vocabulary is a word-level tokenizer trained here with the `tokenizers` library on
generated text, wrapped in a `PreTrainedTokenizerFast`; nothing is downloaded.

Each call is one request of `batch-size x num_return_sequences` rows. The vocabulary is
small, so a sampled end-of-sequence token is common: the row stops there and is padded
(with the same id) until every row has stopped or reached `max_new_tokens`. The script
counts each row's new tokens up to and including its first end-of-sequence token, the
figure its tokens/s needs, and times each call with `time.perf_counter()`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time

# Before transformers is imported: nothing may try the network.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"

import torch  # noqa: E402
from tokenizers import Tokenizer, models, pre_tokenizers, trainers  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast  # noqa: E402

OPENINGS = ["once upon a time", "long ago", "in a quiet village", "on a cold night"]
CHARACTERS = ["a fox", "an old sailor", "two sisters", "the king", "a lonely giant"]
EVENTS = ["found a door", "lost the way", "heard a song", "built a boat", "met a stranger"]
PLACES = ["by the sea", "under the bridge", "in the forest", "near the castle"]


def story(rng: random.Random) -> str:
    parts = (OPENINGS, CHARACTERS, EVENTS, PLACES)
    return " ".join(rng.choice(p) for p in parts) + " ."


def train_tokenizer(texts: list[str]) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(
        texts, trainer=trainers.WordLevelTrainer(special_tokens=["<unk>", "<|end|>"])
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", eos_token="<|end|>", pad_token="<|end|>"
    )
    tokenizer.padding_side = "left"
    return tokenizer


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Sample story continuations in batches")
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--num-return-sequences", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--top-p", type=float, default=0.9)
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=256)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    return p.parse_args()


def count_new_tokens(new: torch.Tensor, eos_token_id: int) -> list[int]:
    """Per row: the tokens up to and including the first end-of-sequence token."""
    counts = []
    for row in new.tolist():
        counts.append(row.index(eos_token_id) + 1 if eos_token_id in row else len(row))
    return counts


def main() -> None:
    args = parse_args()
    text_rng = random.Random(1234)  # the training text and the prompts: the same every run
    tokenizer = train_tokenizer([story(text_rng) for _ in range(2000)])
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=256,
        n_embd=args.n_embd,
        n_layer=args.n_layer,
        n_head=args.n_head,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):  # fixed weights; the sampling below stays unseeded
        torch.manual_seed(0)
        model = GPT2LMHeadModel(config).to(args.device).eval()

    prompts = [
        " ".join(story(text_rng).split()[: text_rng.randint(2, 8)]) for _ in range(args.num_prompts)
    ]
    latencies: list[float] = []
    new_tokens: list[int] = []
    prompt_tokens: list[int] = []
    rows: list[int] = []
    for start in range(0, len(prompts), args.batch_size):
        batch = prompts[start : start + args.batch_size]
        inputs = tokenizer(batch, return_tensors="pt", padding=True).to(args.device)
        t0 = time.perf_counter()
        with torch.no_grad():
            output = model.generate(
                **inputs,
                do_sample=True,
                top_p=args.top_p,
                temperature=args.temperature,
                num_return_sequences=args.num_return_sequences,
                max_new_tokens=args.max_new_tokens,
            )
        latency = time.perf_counter() - t0
        new = output[:, inputs["input_ids"].shape[1] :]
        counts = count_new_tokens(new, tokenizer.eos_token_id)
        latencies.append(latency)
        new_tokens.append(sum(counts))
        prompt_tokens.append(int(inputs["attention_mask"].sum()))
        rows.append(int(output.shape[0]))
        texts = tokenizer.batch_decode(new, skip_special_tokens=True)
        for j, text in enumerate(texts):
            prompt = batch[j // args.num_return_sequences]
            print(f"  {prompt!r} ... {text.strip()[:70]!r} ({counts[j]} tokens)")
        print(
            f"batch {start // args.batch_size}: {len(texts)} samples, {sum(counts)} tokens "
            f"in {latency * 1000:.1f} ms"
        )

    corpus = {
        "requests": len(latencies),
        "new_tokens": new_tokens,
        "latencies_s": latencies,
        "prompt_tokens": prompt_tokens,
        "rows": rows,
    }
    print("CORPUS " + json.dumps(corpus), flush=True)


if __name__ == "__main__":
    main()
