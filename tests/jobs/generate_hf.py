"""Hugging Face generation, the way a script serves prompts: a GPT-2 built from a config
(random weights, nothing downloaded), ``model.generate()`` once per request.

``--requests N`` single-prompt requests, then one batched request of two prompts of
different lengths (left padding, attention mask), then with ``--fail`` one request that
raises (a token id outside the vocabulary), caught as a server would. The last line says
what the script did (``generated: {json}``), for the tests to hold the record against.
"""

import argparse
import json

import torch
from transformers import GPT2Config, GPT2LMHeadModel

p = argparse.ArgumentParser()
p.add_argument("--requests", type=int, default=3)
p.add_argument("--prompt", type=int, default=12)
p.add_argument("--new", type=int, default=8)
p.add_argument("--fail", action="store_true")
a = p.parse_args()
torch.manual_seed(0)
torch.set_num_threads(1)
VOCAB = 500
config = GPT2Config(
    n_layer=2, n_head=2, n_embd=64, vocab_size=VOCAB, n_positions=128,
    bos_token_id=None, eos_token_id=None, pad_token_id=0,
)  # fmt: skip
model = GPT2LMHeadModel(config).eval()

# every call counts as a request, a failed one too (its prompt was sent)
done = {"requests": 0, "prompt_tokens": 0, "new_tokens": 0, "failed": 0}


def serve(ids: torch.Tensor, mask: torch.Tensor) -> None:
    out = model.generate(
        input_ids=ids, attention_mask=mask, max_new_tokens=a.new, do_sample=False, pad_token_id=0
    )
    done["requests"] += 1
    done["prompt_tokens"] += int(mask.sum())
    done["new_tokens"] += int(out.shape[0] * (out.shape[1] - ids.shape[1]))


for _ in range(a.requests):
    ids = torch.randint(1, VOCAB, (1, a.prompt))
    serve(ids, torch.ones_like(ids))

short = a.prompt // 2  # two prompts in one call, the shorter padded on the left
ids = torch.randint(1, VOCAB, (2, a.prompt))
ids[1, :short] = 0
mask = torch.ones_like(ids)
mask[1, :short] = 0
serve(ids, mask)

if a.fail:
    done["requests"] += 1
    done["prompt_tokens"] += a.prompt
    try:
        model.generate(torch.full((1, a.prompt), VOCAB + 7), max_new_tokens=a.new)
    except (IndexError, RuntimeError) as exc:
        done["failed"] += 1
        print(f"request failed: {type(exc).__name__}")
print("generated: " + json.dumps(done))
