"""Decode with a KV cache: give the model only the new token, with the keys and values of
the earlier ones, instead of the whole sequence again for every token.

Without a cache each decode step recomputes every earlier position's projections, so its
time grows with the context (``rules.generation.no_kv_cache`` fits it); with one it
computes the new token only. A code change (the loop's calls, and for a model of one's
own its attention layers), so advice: the snippet names the loop's code line the
requests point to, or the ``generate(use_cache=False)`` calls. Its gain is the finding's
share in full (``removes`` 1.0): that share is the fit's estimate of what the cache
gives back (every token at the first position's cost), not a range quoted elsewhere.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from stepscope.fixes.base import Advice, Fix
from stepscope.types import Finding

LOOP = """\
# {where}: the loop gives the model the whole sequence for every new token.
# With a cache: the prompt once, then one token per call with the cache of the others
# (transformers 5 names it `cache=` / `out.cache`; 4.x `past_key_values`).
out = model(idx, use_cache=True)                   # prefill: the prompt, once
cache = out.cache
for _ in range(max_new_tokens):
    nxt = out.logits[:, -1:].argmax(-1)            # or sample, as the loop does now
    idx = torch.cat((idx, nxt), dim=1)
    out = model(nxt, cache=cache, use_cache=True)  # the new token only
    cache = out.cache
# A model of your own (nanoGPT's GPT) needs the cache in its attention: keep each
# layer's keys and values and attend the new token's query to all of them, as the Llama
# reference code's Attention does (cache_k / cache_v, written at start_pos).
"""

GENERATE = """\
# generate() with use_cache=False recomputes the whole context for every new token:
out = model.generate(input_ids, max_new_tokens=max_new_tokens, use_cache=True)
"""


def _advise(finding: Finding, ev: Any) -> Advice:
    """The snippet for what the requests show: the loop's code line, or generate()."""
    requests = getattr(ev, "requests", None)
    if requests is None or requests.empty:
        return Advice()
    metas = [m for m in requests["meta"] if isinstance(m, dict)]
    if any(m.get("use_cache") is False for m in metas):
        return Advice(snippet=GENERATE, evidence="generate() called with use_cache=False")
    sites = Counter(m["site"] for m in metas if m.get("site"))
    if not sites:
        return Advice()
    where = sites.most_common(1)[0][0]
    return Advice(snippet=LOOP.format(where=where), evidence=f"the decode loop: {where}")


FIX = Fix(
    id="kv_cache",
    title="Decode with a KV cache",
    addresses=("compute/no_kv_cache",),
    requires=(),
    changes_numerics=False,
    auto=False,
    why="without a cache every new token recomputes the keys and values of the whole "
    "context, so each step costs more than the last; with one, a step computes the new "
    "token only and reads the others' keys and values back",
    snippet=LOOP.format(where="the decode loop"),
    advise=_advise,
)
