"""A Hugging Face generation job for the generation fixes: a GPT-2 built from a config
(random weights, nothing downloaded), ``generate()`` once per prompt, greedy by default.

--requests N   prompts, each 8 random tokens said three times (prompt lookup can match)
--new N        new tokens per request
--sample       do_sample=True (seeded)
--rows N       prompt rows per generate() call
--eager        the model runs transformers' eager attention
--save-draft PATH   only save a smaller GPT-2 with the same vocabulary to PATH (a draft
                    model for speculative decoding), then exit

The last line is ``PROBE {json}``: the generated tokens of each request and what the
model looked like after its last call.
"""

import argparse
import json

import torch
from transformers import GPT2Config, GPT2LMHeadModel

p = argparse.ArgumentParser()
p.add_argument("--requests", type=int, default=3)
p.add_argument("--new", type=int, default=12)
p.add_argument("--sample", action="store_true")
p.add_argument("--rows", type=int, default=1)
p.add_argument("--eager", action="store_true")
p.add_argument("--save-draft")
a = p.parse_args()
torch.manual_seed(0)
torch.set_num_threads(1)
VOCAB = 256


def gpt2(layers: int, width: int) -> GPT2LMHeadModel:
    """Untied head: a random GPT-2 with tied embeddings repeats its last input token."""
    config = GPT2Config(
        n_layer=layers, n_head=2, n_embd=width, vocab_size=VOCAB, n_positions=256,
        bos_token_id=None, eos_token_id=None, pad_token_id=0, tie_word_embeddings=False,
        attn_implementation="eager" if a.eager else "sdpa",
    )  # fmt: skip
    return GPT2LMHeadModel(config).eval()


if a.save_draft:
    gpt2(1, 32).save_pretrained(a.save_draft)
    raise SystemExit(0)

model = gpt2(2, 64)
answers = []
for _ in range(a.requests):
    ids = torch.randint(1, VOCAB, (a.rows, 8)).repeat(1, 3)
    out = model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=a.new,
        do_sample=a.sample,
        pad_token_id=0,
    )
    answers.append(out[:, ids.shape[1] :].tolist())
probe = {
    "answers": answers,
    "attn_implementation": model.config._attn_implementation,
    "compiled": getattr(model, "_compiled_call", None) is not None,
}
print("PROBE " + json.dumps(probe))
