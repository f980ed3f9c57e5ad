"""SDPA attention for a Hugging Face model that runs the eager one.

transformers' "eager" attention is written out in PyTorch ops (a matmul, a mask, a
softmax, another matmul, each materialising the scores); "sdpa" calls
``torch.nn.functional.scaled_dot_product_attention``, whose fused kernels (FlashAttention
and memory-efficient ones on a GPU, a fused CPU kernel) compute the same thing without
the intermediate tensors. A model is eager where the script or its config asked for it
(``attn_implementation="eager"``, models of older code). Switched at its first
``generate()`` call with ``set_attn_implementation("sdpa")`` and read back from its
config; transformers raises where the model has no SDPA path, and the reason is
recorded. Not applied where the call asks for attention weights (``output_attentions``):
SDPA does not return them.
"""

from __future__ import annotations

from typing import Any

from stepscope.fixes.base import Fix, Typical
from stepscope.fixes.fitting import CUDA, TRAINING, fit_by_job
from stepscope.fixes.points import Change, GenerateCall
from stepscope.types import JobContext


def _on_generate(call: GenerateCall, params: dict[str, Any]) -> None:
    if not call.new_model:
        return  # one switch per model, at its first call
    model = call.model
    config = getattr(model, "config", None)
    impl = getattr(config, "_attn_implementation", None)
    if impl is None:
        call.refuse(f"{type(model).__name__} has no transformers attention implementation")
    elif impl == "sdpa":
        call.refuse(f"{type(model).__name__} already runs SDPA attention")
    elif impl != "eager":
        call.refuse(f"{type(model).__name__} runs {impl!r} attention (only eager is switched)")
    elif call.setting("output_attentions"):
        call.refuse("the call asks for attention weights (output_attentions), SDPA has none")
    elif not callable(getattr(model, "set_attn_implementation", None)):
        call.refuse("this transformers cannot switch a loaded model's attention")
    else:
        model.set_attn_implementation("sdpa")  # raises where the model has no SDPA path
        now = getattr(model.config, "_attn_implementation", None)
        call.record(
            Change(
                f"{type(model).__name__} attention eager -> sdpa (set_attn_implementation)",
                verified=now == "sdpa",
            )
        )


def _in_effect(ctx: JobContext) -> bool | None:
    impl = ctx.model.get("attn_implementation")
    return None if impl is None else impl == "sdpa"


BLOG_TYPICAL = Typical(
    1.0,
    1.3,
    "PyTorch blog 'Accelerating Large Language Models with Accelerated Transformers' "
    "(2023): nanoGPT training on an A100, 143 -> 113 ms per batch with SDPA's flash kernel "
    "(1.27x a whole step); on a CPU's short prompts attention is a small part of it",
)
SNIPPET = (
    'model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa")\n'
    '# or, on a loaded model: model.set_attn_implementation("sdpa")'
)


FIX = Fix(
    id="sdpa_attention",
    title="SDPA attention instead of eager (transformers)",
    addresses=("compute/long_prefill", "memory/decode_batch_one"),
    requires=("generate_call", "eager_attention"),
    changes_numerics=False,
    auto=True,
    why="eager attention materialises the scores and softmax of every head in separate "
    "ops; scaled_dot_product_attention fuses them into one kernel, which matters most "
    "where attention is large: long prompts",
    snippet=SNIPPET,
    typical=BLOG_TYPICAL,
    # measured training nanoGPT on an A100: a generation job (inference) gets no figure
    fit=fit_by_job({(CUDA, TRAINING): BLOG_TYPICAL}, SNIPPET),
    in_effect=_in_effect,
    target="a generate() call of a transformers model",
    on_generate=_on_generate,
)
