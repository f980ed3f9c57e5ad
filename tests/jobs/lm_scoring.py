"""Scoring text with a causal LM, not generating: a Llama built from a config (random
weights, nothing downloaded) called on whole batches of token ids under inference mode,
as an evaluation script computes perplexity. Each call returns a KV cache (transformers'
``use_cache`` default) the script never uses; once it lets the output go, the cache must
be gone: the last line says whether every call's was (``freed: true``)."""

import gc
import json
import os
import weakref

os.environ["HF_HUB_OFFLINE"] = "1"

import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

torch.manual_seed(0)
torch.set_num_threads(1)
config = LlamaConfig(
    vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2,
)  # fmt: skip
model = LlamaForCausalLM(config).eval()
freed = []
with torch.inference_mode():
    for _ in range(4):
        ids = torch.randint(0, 128, (2, 24))
        out = model(input_ids=ids, labels=ids)
        cache = weakref.ref(out.past_key_values)
        print(f"loss {out.loss.item():.3f}", flush=True)
        del out
        gc.collect()
        freed.append(cache() is None)
print("freed: " + json.dumps(all(freed)))
