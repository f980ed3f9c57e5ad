"""Prompt-lookup decoding in ``generate()``: ``prompt_lookup_num_tokens``.

Speculative decoding whose draft is an n-gram match in the prompt: where the text being
generated repeats a stretch of the prompt (a summary, a document's answer, code being
edited), the next tokens are proposed from it and the model checks several in one
forward, reading its weights once for all of them. With greedy decoding the tokens are
the model's own argmax at each step, so the answer is the same; with sampling it is
the same distribution but other tokens, so it is applied to greedy calls only. Like all
of transformers' assisted generation it takes one prompt row per call.
"""

from __future__ import annotations

from typing import Any

from stepscope.fixes.base import Fix, Typical
from stepscope.fixes.points import GenerateCall
from stepscope.types import JobContext

# Tokens proposed per lookup: the value the method's author and transformers' docs use.
TOKENS = 10


def assisted_refusal(call: GenerateCall, what: str) -> str | None:
    """Why assisted generation (prompt lookup, a draft model) cannot keep this call's
    tokens, or cannot run on it; None where it can."""
    if not call.greedy:
        how = "sampling" if call.setting("do_sample") else "beam search"
        return f"a {how} call: {what} keeps the tokens identical only for greedy decoding"
    if call.rows is None:
        return "the call's prompt rows could not be read (assisted generation takes one)"
    if call.rows > 1 or int(call.setting("num_return_sequences") or 1) > 1:
        return f"{call.rows} prompt rows per call: transformers' assisted generation takes one"
    if call.setting("assistant_model") is not None or call.setting("prompt_lookup_num_tokens"):
        return "the call already uses assisted generation"
    if call.setting("use_cache") is False:
        return "the call decodes without a KV cache (use_cache=False): kv_cache comes first"
    if call.setting("cache_implementation") == "static":
        return f"a static cache ends at the answer's length and {what} checks tokens past it"
    return None


def _on_generate(call: GenerateCall, params: dict[str, Any]) -> None:
    why = assisted_refusal(call, "prompt lookup")
    if why is not None:
        call.refuse(why)
        return
    call.want("prompt_lookup_num_tokens", int(params.get("tokens", TOKENS)))


def _in_effect(ctx: JobContext) -> bool | None:
    gen = ctx.facts.get("generation")
    return None if not gen else bool(gen.get("prompt_lookup"))


FIX = Fix(
    id="prompt_lookup",
    title="Prompt-lookup decoding in generate() (greedy)",
    addresses=("memory/decode_batch_one",),
    requires=("generate_call", "greedy_decoding", "one_row_requests", "kv_cache_on"),
    changes_numerics=False,
    auto=True,
    why="tokens the answer copies from the prompt are proposed by matching its n-grams and "
    "checked several per forward: the weights are read once for several tokens, and "
    "greedy decoding keeps exactly the same answer",
    snippet=f"model.generate(input_ids, max_new_tokens=64, prompt_lookup_num_tokens={TOKENS})",
    typical=Typical(
        0.9,
        4.0,
        "A. Saxena, 'Prompt Lookup Decoding' (2023, github.com/apoorvumang/"
        "prompt-lookup-decoding): 2-4x on input-grounded tasks (summarisation, document "
        "QA, code editing); Ludwig's pull request 3917 measured ~10 % slower on open-ended "
        "questions, where the prompt has nothing to copy",
    ),
    in_effect=_in_effect,
    target="a generate() call",
    on_generate=_on_generate,
)
