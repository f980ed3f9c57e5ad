"""Generation jobs for the generation findings: one way of decoding per ``--mode``.

--mode nocache    a nanoGPT-style sampling loop with no KV cache: ``GPT.generate`` feeds
                  the whole sequence to the model for every new token (greedy here)
--mode generate   Hugging Face ``generate()`` with its KV cache, one prompt per call
--mode off        the same ``generate()`` calls with ``use_cache=False``

``--requests`` prompts of ``--prompt`` tokens, ``--new`` new tokens each (long prompts and
few new tokens: a prefill-bound job). Models are built from configs (random weights,
nothing downloaded), one thread. The last line says what the script did
(``generated: {json}``).
"""

import argparse
import json

import torch
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--mode", default="nocache")
p.add_argument("--requests", type=int, default=3)
p.add_argument("--prompt", type=int, default=8)
p.add_argument("--new", type=int, default=192)
a = p.parse_args()
torch.manual_seed(0)
torch.set_num_threads(1)


class GPT(nn.Module):
    """nanoGPT's shape: token and position embeddings, causal blocks, a head."""

    def __init__(self, vocab: int = 96, dim: int = 384, block: int = 256, layers: int = 2):
        super().__init__()
        self.block = block
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(block, dim)
        layer = nn.TransformerEncoderLayer(dim, 6, 4 * dim, dropout=0.0, batch_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t))
        mask = nn.Transformer.generate_square_subsequent_mask(t)
        return self.head(self.blocks(x, mask=mask, is_causal=True))

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
        for _ in range(max_new_tokens):
            cond = idx if idx.size(1) <= self.block else idx[:, -self.block :]
            logits = self(cond)[:, -1, :]
            idx = torch.cat((idx, logits.argmax(-1, keepdim=True)), dim=1)
        return idx


done = {"requests": 0, "new_tokens": 0}
if a.mode == "nocache":
    model = GPT().eval()
    for _ in range(a.requests):
        y = model.generate(torch.randint(0, 96, (1, a.prompt)), a.new)
        done["requests"] += 1
        done["new_tokens"] += y.shape[1] - a.prompt
else:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        n_layer=2, n_head=4, n_embd=128, vocab_size=512, n_positions=1024,
        bos_token_id=None, eos_token_id=None, pad_token_id=0,
    )  # fmt: skip
    model = GPT2LMHeadModel(config).eval()
    for _ in range(a.requests):
        ids = torch.randint(1, 512, (1, a.prompt))
        out = model.generate(
            ids, max_new_tokens=a.new, do_sample=False, use_cache=a.mode != "off", pad_token_id=0
        )
        done["requests"] += 1
        done["new_tokens"] += out.shape[1] - a.prompt
print("generated: " + json.dumps(done))
