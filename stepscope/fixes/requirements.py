"""What a fix may need of the job, checked against what is known about it.

A requirement is a name a fix lists in ``requires``; its check reads the ``JobContext``
and answers True, False or None (unknown). A requirement that is unknown does not rule
a fix out (a trace file cannot say whether the job used a DataLoader), but it lowers the
recommendation's confidence; one that is known to be unmet always does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stepscope.types import JobContext


def all_loaders(ctx: JobContext, test: Callable[[dict[str, Any]], bool]) -> bool | None:
    """True when every recorded loader passes; None when no loader was recorded."""
    loaders = ctx.loaders
    if not loaders:
        return None
    return all(test(loader) for loader in loaders)


def _tensor_cores_bf16(ctx: JobContext) -> bool | None:
    if ctx.cuda is False:
        return False
    if ctx.vendor == "amd":
        name = (ctx.device_name or "").upper()
        return True if ("MI2" in name or "MI3" in name) else None
    if ctx.capability is None:
        return None
    return ctx.capability >= 8.0


def _fast_bf16(ctx: JobContext) -> bool | None:
    """Tensor Cores on a GPU; on a CPU job, native bf16 in oneDNN (AVX512-BF16 or AMX),
    as the job itself reported it. A CPU nobody asked (a bare trace) counts as without:
    emulated bf16 is several times slower than float32."""
    if ctx.cuda is False:
        return bool(ctx.settings.get("cpu_bf16"))
    return _tensor_cores_bf16(ctx)


def _tf32(ctx: JobContext) -> bool | None:
    if ctx.cuda is False or ctx.vendor == "amd":
        return False
    return None if ctx.capability is None else ctx.capability >= 8.0


def _cuda(ctx: JobContext) -> bool | None:
    return ctx.cuda


def _supports_fused(ctx: JobContext) -> bool | None:
    opt = ctx.optimizer
    if not opt:
        if ctx.facts:  # the job reported itself and stepped no torch.optim optimizer
            return False
        return ctx.training  # a bare trace: unknown
    return bool(opt.get("supports_fused")) or opt.get("foreach") is not None


def _inference(ctx: JobContext) -> bool | None:
    """No optimizer and no backward: the job only runs its model forward."""
    return None if ctx.training is None else not ctx.training


# transformers models whose blocks are ``transformers.pytorch_utils.Conv1D``, not
# nn.Linear (modeling_gpt2, modeling_openai, modeling_imagegpt, Decision Transformer's GPT-2):
# their only nn.Linear is the output head, so int8 dynamic quantisation has nothing of
# their blocks to act on (issue 39: offered to GPT-2 for its "Linear/LSTM" layers)
CONV1D_MODELS = ("GPT2", "OpenAIGPT", "ImageGPT", "DecisionTransformer")


def _quantizable(ctx: JobContext) -> bool | None:
    """Layers dynamic int8 quantisation replaces (nn.Linear, nn.LSTM) in the model's
    blocks: a model of Conv1D blocks (GPT-2) has none there, whatever its head is."""
    model = ctx.model
    if "quantizable" not in model:
        return None
    if str(model.get("class") or "").startswith(CONV1D_MODELS):
        return False
    return bool(set(model["quantizable"]) & {"Linear", "LSTM"})


def _nccl(ctx: JobContext) -> bool | None:
    """DDP over NCCL: bf16 gradient compression (``bf16_compress_hook``) is NCCL's; gloo
    has no bf16 all-reduce. A job without CUDA has no NCCL either."""
    ddp = ctx.model.get("ddp") if ctx.model else None
    backend = (ddp or {}).get("backend")
    if backend:
        return str(backend).lower() == "nccl"
    return False if ctx.cuda is False else None


def _several_epochs(ctx: JobContext) -> bool | None:
    """A DataLoader iterated more than once (``iterations``, where the job's loader facts
    count the ``iter(loader)`` calls): persistent workers only save the start-up of a
    second epoch. None where nothing counted them: it must be seen (``MUST_BE_SEEN``)."""
    counts = [ld["iterations"] for ld in ctx.loaders or [] if ld.get("iterations") is not None]
    if not counts:
        return None
    return max(int(n) for n in counts) > 1


def _mode_dependent(ctx: JobContext) -> bool | None:
    """Dropout or batch-norm layers: eval() changes what they compute."""
    model = ctx.model
    return bool(model["mode_dependent"]) if "mode_dependent" in model else None


def _generation(ctx: JobContext) -> dict[str, Any] | None:
    """How the job generates (``facts["generation"]``: what its requests showed), or
    None where the job is known to make no request ({}) or nothing is known (None)."""
    if not ctx.facts:
        return None
    return ctx.facts.get("generation") or {}


def _generate_call(ctx: JobContext) -> bool | None:
    """Its requests are Hugging Face ``generate()`` calls (where the in-job hook acts)."""
    gen = _generation(ctx)
    return None if gen is None else "generate" in (gen.get("sources") or [])


def _greedy(ctx: JobContext) -> bool | None:
    """Its generate() calls decode greedily (no sampling, one beam): the tokens are
    the argmax at each step, so a lossless fix must give the same tokens."""
    gen = _generation(ctx)
    return None if gen is None or not gen else gen.get("greedy")


def _one_row(ctx: JobContext) -> bool | None:
    """One prompt per generate() call: assisted generation (prompt lookup, a draft
    model) takes one row (transformers raises on more)."""
    gen = _generation(ctx)
    rows = None if gen is None else gen.get("rows")
    return None if rows is None else rows <= 1


def _kv_cache_on(ctx: JobContext) -> bool | None:
    """Its generate() calls keep a KV cache (no ``use_cache=False``)."""
    gen = _generation(ctx)
    return None if gen is None or not gen else gen.get("use_cache")


def _not_generation(ctx: JobContext) -> bool | None:
    """The job makes no generation request: compiling a whole forward whose sequence grows
    by one token a call recompiles it again and again (``static_cache_compile`` is the
    generation job's compile: a fixed-size cache, one graph)."""
    gen = _generation(ctx)
    return None if gen is None else not gen


def _eager_attention(ctx: JobContext) -> bool | None:
    """The model runs transformers' eager attention (its ``config._attn_implementation``,
    where the job's model facts carry it)."""
    impl = ctx.model.get("attn_implementation")
    return None if impl is None else impl == "eager"


# Requirement name -> check. The names are what a Fix lists in ``requires``.
REQUIREMENTS: dict[str, Callable[[JobContext], bool | None]] = {
    "cuda": _cuda,
    "bf16_tensor_cores": _tensor_cores_bf16,  # Ampere+ (sm80) or AMD CDNA2+ (MI200/MI300)
    "fast_bf16": _fast_bf16,  # those GPUs, or a CPU with AVX512-BF16 / AMX
    "tf32": _tf32,  # NVIDIA Ampere+ only
    "training": lambda c: c.training,
    "dataloader": lambda c: c.dataloader,
    "workers": lambda c: (
        all_loaders(c, lambda ld: ld.get("num_workers", 0) > 0)
        if c.dataloader is not False
        else False
    ),
    "conv2d": lambda c: c.conv2d,
    "ddp": lambda c: c.ddp,
    "nccl": _nccl,
    "several_epochs": _several_epochs,
    "dataparallel": lambda c: c.dataparallel,
    "fusable_optimizer": _supports_fused,
    "multi_core": lambda c: None if c.cpu_count is None else c.cpu_count > 1,
    "cpu_only": lambda c: None if c.cuda is None else not c.cuda,
    "inference": _inference,
    "linear_or_lstm": _quantizable,
    "dropout_or_batchnorm": _mode_dependent,
    "generate_call": _generate_call,
    "greedy_decoding": _greedy,
    "one_row_requests": _one_row,
    "kv_cache_on": _kv_cache_on,
    "eager_attention": _eager_attention,
    "not_generation": _not_generation,
    # a path given to `stepscope optimize --draft-model`: not a fact of the job, so never
    # known from it (the plan passes it; the job's hook says so where it is missing)
    "draft_model": lambda c: None,
}


# A specific set-up must have been seen to advise on it: "replace DataParallel" to a
# job nobody saw use DataParallel is noise, and so is "switch to SDPA" to a model nobody
# saw run eager attention (transformers' default is SDPA). A draft model is never seen in
# the job: speculative decoding is tried only when the user names one (the plan's path).
# Generic ones (CUDA, a DataLoader) may be unknown: the advice then says which
# requirement it could not check.
# Several epochs likewise: persistent workers to a one-epoch job save nothing.
MUST_BE_SEEN = frozenset(
    {"ddp", "dataparallel", "eager_attention", "draft_model", "several_epochs"}
)
