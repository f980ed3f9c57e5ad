"""A static KV cache in ``generate()``: ``cache_implementation="static"``.

transformers allocates the cache at its full length once (the prompt plus
``max_new_tokens``) instead of growing it token by token; its shapes stay the same
from step to step, which is what lets ``torch.compile`` or CUDA graphs capture the
decode step (``static_cache_compile``). Alone it changes no result and little time on
a CPU: measured by hand 0.9-1.0x (issue 22), so its predicted bound is that range. On a
GPU it is not alone: transformers compiles the decode step by itself whenever the cache
is static (``_valid_auto_compile_criteria``: a compileable cache on cuda/xpu/...). Seen
on an H200 (GPT-2 124M, greedy, 64 new tokens): the first request 20.9 s (compiling),
then 128 ms against 430 ms, the same as ``static_cache_compile``. So a CUDA job is
advised ``static_cache_compile`` only, which says what happens; this one is skipped.
Not applied where the call has no cache to make static (``use_cache=False``: the
``kv_cache`` fix comes first), passes a cache object of its own (transformers refuses
both), or where the model keeps no standard cache (transformers would ignore it).
"""

from __future__ import annotations

from typing import Any

from stepscope.fixes.base import Advice, Fix, Typical
from stepscope.fixes.points import GenerateCall
from stepscope.types import Finding, JobContext


def static_refusal(call: GenerateCall) -> str | None:
    """Why a static cache cannot be set on this call, or None."""
    if call.setting("use_cache") is False:
        return "the call decodes without a KV cache (use_cache=False): kv_cache comes first"
    if call.kwargs.get("cache") is not None or call.kwargs.get("past_key_values") is not None:
        return "the call passes a cache object of its own"
    if call.setting("assistant_model") is not None or call.setting("prompt_lookup_num_tokens"):
        # transformers' assisted generation checks candidate tokens past the static
        # cache's end (an index error in index_copy_), measured with prompt lookup
        return "the call uses assisted generation, which checks tokens past a static cache's end"
    supports = getattr(call.model, "_supports_default_dynamic_cache", None)
    if callable(supports) and not supports():
        return f"{type(call.model).__name__} keeps no standard KV cache (transformers ignores it)"
    return None


def _advise(finding: Finding, ev: Any) -> Advice | str:
    if ev.context.cuda is True:
        return (
            "on a GPU transformers compiles the decode step whenever the cache is static: "
            "that is static_cache_compile"
        )
    return Advice()


def _on_generate(call: GenerateCall, params: dict[str, Any]) -> None:
    why = static_refusal(call)
    if why is not None:
        call.refuse(why)
        return
    call.want("cache_implementation", "static")


def cache_in_effect(ctx: JobContext) -> bool | None:
    gen = ctx.facts.get("generation")
    return None if not gen else gen.get("cache_implementation") == "static"


FIX = Fix(
    id="static_cache",
    title="Static KV cache in generate()",
    addresses=("memory/decode_batch_one",),
    requires=("generate_call", "kv_cache_on"),
    changes_numerics=False,
    auto=True,
    why="the cache is allocated once at its full length instead of growing with every "
    "token, so the decode step keeps its shapes: the precondition for compiling it",
    snippet='model.generate(input_ids, max_new_tokens=64, cache_implementation="static")\n'
    '# or once: model.generation_config.cache_implementation = "static"',
    typical=Typical(
        0.9,
        1.0,
        "issue 22, measured by hand: 0.9-1.0x on a 6-layer GPT-2 on a CPU; its gain comes "
        "with compiling the decode step (static_cache_compile)",
    ),
    in_effect=cache_in_effect,
    advise=_advise,
    target="a generate() call",
    on_generate=_on_generate,
)
