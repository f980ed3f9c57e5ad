"""Answering prompts with a `pipeline("text-generation")`, the way the docs show it.

A word-level tokenizer trained here with the `tokenizers` library on generated stories
(nothing is downloaded), wrapped in a `PreTrainedTokenizerFast`; a small GPT-2 built
from a `GPT2Config` over that vocabulary (random weights); then `generator =
pipeline("text-generation", model=model, tokenizer=tokenizer)` and, for each text
prompt, `generator(prompt, max_new_tokens=K, do_sample=False)`, timed with
`time.perf_counter()`, printing the answer and its latency.

The pipeline tokenizes the prompt, calls `model.generate()` once, and decodes the
answer: one request per prompt, whose forwards (one per new token) are not requests.
The script's clock also covers the pipeline's tokenizing and decoding around the
`generate()` call. The answer keeps its special tokens (`skip_special_tokens=False`) so
that the script can count its new tokens by encoding it again: a word-level vocabulary
gives each word back as one token, and an end-of-sequence token met by greedy decoding
is counted as generate() returned it.
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
from transformers import (  # noqa: E402
    GPT2Config,
    GPT2LMHeadModel,
    PreTrainedTokenizerFast,
    pipeline,
    set_seed,
)

SUBJECTS = ["the old fisherman", "a young queen", "the tired robot", "my neighbour", "the baker"]
VERBS = ["walked to", "dreamed of", "painted", "carried", "searched for", "sang about"]
OBJECTS = ["the harbour", "a silver key", "the empty market", "an old map", "the northern hills"]
ENDINGS = ["at dawn", "in the rain", "without a word", "before supper", "for the last time"]


def stories(n: int, rng: random.Random) -> list[str]:
    """`n` generated sentences: the corpus the tokenizer is trained on."""
    return [
        f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} {rng.choice(ENDINGS)} ."
        for _ in range(n)
    ]


def train_tokenizer(texts: list[str]) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(special_tokens=["<unk>", "<eos>"])
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>", pad_token="<eos>"
    )


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Answer prompts with a text-generation pipeline")
    p.add_argument("--num-prompts", type=int, default=12)
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=256)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    set_seed(args.seed)
    rng = random.Random(args.seed)
    tokenizer = train_tokenizer(stories(2000, rng))
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
    model = GPT2LMHeadModel(config).eval()
    generator = pipeline("text-generation", model=model, tokenizer=tokenizer, device=args.device)
    print(f"vocabulary: {len(tokenizer)} words; model: {model.num_parameters() / 1e6:.2f}M")

    prompts = [" ".join(s.split()[: rng.randint(3, 7)]) for s in stories(args.num_prompts, rng)]
    latencies: list[float] = []
    new_tokens: list[int] = []
    prompt_tokens: list[int] = []
    for i, prompt in enumerate(prompts):
        t0 = time.perf_counter()
        out = generator(
            prompt,
            max_new_tokens=args.max_new_tokens,
            do_sample=False,
            return_full_text=False,
            skip_special_tokens=False,
        )
        latency = time.perf_counter() - t0
        answer = out[0]["generated_text"]
        latencies.append(latency)
        new_tokens.append(len(tokenizer(answer, add_special_tokens=False)["input_ids"]))
        prompt_tokens.append(len(tokenizer(prompt)["input_ids"]))
        print(f"[{i}] {prompt!r} -> {answer.strip()!r} ({latency * 1000:.1f} ms)")

    print(f"{len(prompts)} answers, mean {sum(latencies) / len(latencies) * 1000:.1f} ms")
    corpus = {
        "requests": len(latencies),
        "new_tokens": new_tokens,
        "latencies_s": latencies,
        "prompt_tokens": prompt_tokens,
    }
    print("CORPUS " + json.dumps(corpus), flush=True)


if __name__ == "__main__":
    main()
