"""Speculative decoding with a draft model the user names: ``generate(assistant_model=...)``.

A smaller model sharing the tokenizer proposes several tokens; the model checks them in
one forward and keeps the ones it would have produced itself, reading its weights once
for several tokens. With greedy decoding the answer is the model's own (Leviathan et
al.: the output distribution is unchanged, and greedy keeps the argmax), so it is
applied to greedy calls only, and like all of transformers' assisted generation to one
prompt row per call. The draft is a path given to ``stepscope optimize RUN
--draft-model PATH`` (the plan's ``path``), loaded once in the job with
``AutoModelForCausalLM.from_pretrained`` on the model's device and dtype; a draft whose
vocabulary differs from the model's is refused (it must share the tokenizer).
"""

from __future__ import annotations

import os
from typing import Any

from stepscope.fixes.base import Advice, Fix, Typical
from stepscope.fixes.catalog.prompt_lookup import assisted_refusal
from stepscope.fixes.points import GenerateCall
from stepscope.types import Finding, JobContext

NO_DRAFT = "no draft model given (`stepscope optimize RUN --draft-model PATH`)"


def _vocab(model: Any) -> int | None:
    config = getattr(model, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return getattr(text, "vocab_size", None)


def _load(call: GenerateCall, path: str) -> Any:
    """The draft model, loaded once (or why not, kept in the fix's state)."""
    state = call.state
    if "draft" in state or "error" in state:
        return state.get("draft")
    if not os.path.isdir(path):
        state["error"] = f"no model folder at {path} (the draft model given)"
        return None
    try:
        # local: transformers is loaded already (the job is calling generate())
        from transformers import AutoModelForCausalLM

        model = call.model
        draft = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(model, "dtype", None))
        draft = draft.to(model.device).eval()
    except Exception as exc:
        state["error"] = f"the draft model {path} did not load ({type(exc).__name__}: {exc})"
        return None
    if _vocab(draft) != _vocab(call.model):
        state["error"] = (
            f"the draft model's vocabulary ({_vocab(draft)}) is not the model's "
            f"({_vocab(call.model)}): it must share the tokenizer"
        )
        return None
    state["draft"] = draft
    return draft


def _on_generate(call: GenerateCall, params: dict[str, Any]) -> None:
    path = params.get("path")
    why = NO_DRAFT if not path else assisted_refusal(call, "speculative decoding")
    draft = _load(call, str(path)) if why is None else None
    why = why or call.state.get("error")
    if why is not None or draft is None:
        call.refuse(why or "the draft model did not load")
        return
    call.want("assistant_model", draft, f"{type(draft).__name__} from {path}")


def _choose_params(ctx: Any, finding: str | None) -> tuple[dict[str, Any], str]:
    """The draft model's path from the plan's context (``optimize --draft-model``)."""
    path = getattr(ctx, "draft_model", None)
    if not path:
        return {}, NO_DRAFT
    return {"path": str(path)}, f"the draft model given: {path}"


def _advise(finding: Finding, ev: Any) -> Advice:
    return Advice(
        evidence="needs a draft model: a smaller model sharing the tokenizer, given with "
        "`stepscope optimize RUN --draft-model PATH`"
    )


def _in_effect(ctx: JobContext) -> bool | None:
    gen = ctx.facts.get("generation")
    return None if not gen else bool(gen.get("assistant"))


FIX = Fix(
    id="speculative_decoding",
    title="Speculative decoding with a draft model (greedy)",
    addresses=("memory/decode_batch_one",),
    requires=("generate_call", "greedy_decoding", "one_row_requests", "draft_model"),
    changes_numerics=False,
    auto=True,
    why="a small draft model proposes several tokens and the model checks them in one "
    "forward: its weights are read once for every token it accepts, and greedy decoding "
    "keeps exactly its own answer",
    snippet="draft = AutoModelForCausalLM.from_pretrained(DRAFT_PATH).to(model.device)\n"
    "out = model.generate(input_ids, max_new_tokens=64, assistant_model=draft)",
    typical=Typical(
        1.0,
        3.0,
        "Leviathan, Kalman, Matias, 'Fast Inference from Transformers via Speculative "
        "Decoding' (ICML 2023): 2-3x on T5-XXL with identical outputs; the gain follows "
        "how many of the draft's tokens the model accepts",
    ),
    in_effect=_in_effect,
    target="a generate() call",
    advise=_advise,
    choose_params=_choose_params,
    on_generate=_on_generate,
)
