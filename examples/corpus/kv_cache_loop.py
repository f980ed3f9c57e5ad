"""A hand-written greedy decode loop with a KV cache, over a Hugging Face Llama.

What people write when they want the loop in their own hands instead of `generate()`
(to stream tokens, to add a stopping rule, to learn how decoding works): a prefill call
with the prompt, `model(input_ids=prompt, past_key_values=None, use_cache=True)`, then
one call per new token with only that token and the cache the last call returned, the
next token picked by `argmax` over the last position's logits, stopping at
`max_new_tokens` or at the end-of-sequence token. The function is decorated
`@torch.inference_mode()`, as the Llama reference code's `generate` is.

The model is a `LlamaForCausalLM` built from a small `LlamaConfig` (grouped-query
attention, random weights, nothing downloaded); prompts and answers are text through a
byte-level BPE tokenizer trained here with the `tokenizers` library on generated text.
Each prompt is timed with `time.perf_counter()` (the request, and its first token: the
prefill plus picking it), and its answer printed.
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
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, set_seed  # noqa: E402

TOPICS = ["weather", "river", "market", "library", "garden", "station", "kitchen", "harbour"]
PHRASES = [
    "tell me about the {t}",
    "what happened at the {t} yesterday",
    "write a short note about the {t}",
    "why is the {t} closed today",
    "describe the {t} in the morning",
]


def training_text(n: int, rng: random.Random) -> list[str]:
    return [rng.choice(PHRASES).format(t=rng.choice(TOPICS)) + "." for _ in range(n)]


def train_tokenizer(texts: list[str], vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


@torch.inference_mode()
def greedy_generate(
    model: LlamaForCausalLM, input_ids: torch.Tensor, max_new_tokens: int, eos_token_id: int
) -> tuple[list[int], float]:
    """Greedy decoding with the model's KV cache: (new token ids, seconds to the first)."""
    t0 = time.perf_counter()
    past_key_values = None
    next_input = input_ids
    generated: list[int] = []
    ttft = 0.0
    for _ in range(max_new_tokens):
        outputs = model(input_ids=next_input, past_key_values=past_key_values, use_cache=True)
        past_key_values = outputs.past_key_values
        next_token = outputs.logits[:, -1, :].argmax(dim=-1, keepdim=True)
        generated.append(int(next_token))
        if len(generated) == 1:
            ttft = time.perf_counter() - t0
        if generated[-1] == eos_token_id:
            break
        next_input = next_token
    return generated, ttft


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Greedy decoding with a hand-written KV-cache loop")
    p.add_argument("--num-prompts", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--hidden-size", type=int, default=256)
    p.add_argument("--num-layers", type=int, default=4)
    p.add_argument("--num-heads", type=int, default=8)
    p.add_argument("--num-kv-heads", type=int, default=2)
    p.add_argument("--vocab-size", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    set_seed(args.seed)
    rng = random.Random(args.seed)
    tokenizer = train_tokenizer(training_text(2000, rng), args.vocab_size)
    bos, eos = tokenizer.token_to_id("<s>"), tokenizer.token_to_id("</s>")
    config = LlamaConfig(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=args.hidden_size,
        intermediate_size=int(args.hidden_size * 8 / 3),
        num_hidden_layers=args.num_layers,
        num_attention_heads=args.num_heads,
        num_key_value_heads=args.num_kv_heads,
        max_position_embeddings=512,
        bos_token_id=bos,
        eos_token_id=eos,
    )
    model = LlamaForCausalLM(config).to(args.device)
    model.eval()
    print(f"vocabulary {config.vocab_size}, {model.num_parameters() / 1e6:.2f}M parameters")

    prompts = training_text(args.num_prompts, rng)
    latencies: list[float] = []
    ttfts: list[float] = []
    new_tokens: list[int] = []
    prompt_tokens: list[int] = []
    for i, prompt in enumerate(prompts):
        ids = [bos, *tokenizer.encode(prompt).ids]
        input_ids = torch.tensor([ids], device=args.device)
        t0 = time.perf_counter()
        generated, ttft = greedy_generate(model, input_ids, args.max_new_tokens, eos)
        latency = time.perf_counter() - t0
        latencies.append(latency)
        ttfts.append(ttft)
        new_tokens.append(len(generated))
        prompt_tokens.append(len(ids))
        answer = tokenizer.decode(generated)
        print(
            f"[{i}] {prompt} -> {answer[:60]!r} "
            f"({len(generated)} tokens, {latency * 1000:.1f} ms, first {ttft * 1000:.1f} ms)"
        )

    corpus = {
        "requests": len(prompts),
        "new_tokens": new_tokens,
        "latencies_s": latencies,
        "ttft_s": ttfts,
        "prompt_tokens": prompt_tokens,
    }
    print("CORPUS " + json.dumps(corpus), flush=True)


if __name__ == "__main__":
    main()
