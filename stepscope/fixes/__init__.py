"""The fixes: one module per optimisation, each holding everything about it.

A fix module (``catalog/<id>.py``) declares one ``Fix`` (``base.py``): what it addresses,
what it requires, whether it changes numerics, how to tell it is in effect, its predicted
gain and its sources, and the hooks through which the analyzers (``advise``), the plan
(``choose_params``), the in-job installer (``install.py``) and the experiment
(``took_effect``) use it. This module is the catalog: the list of those modules, in the
order advice is given (most direct first, by area: input pipeline, inference, text
generation, precision, compute, memory, distributed). Adding a fix is one new module in
``catalog/``, listed here, plus its test.

Typical gains are quoted only with their source, and only to jobs of the device and kind
the source measured (``Fix.fit``, ``fitting.py``); where a fix cites none the prediction
is the Amdahl bound from the finding's share alone (``analyzers.rules.recommend.predict``), or
from its phases' share (``Fix.phases``) where that is smaller.
"""

from __future__ import annotations

from stepscope.fixes.base import Fix, Typical
from stepscope.fixes.catalog import (
    activation_checkpointing,
    avoid_syncs,
    bf16_autocast,
    channels_last,
    cpu_threads,
    cudnn_benchmark,
    dataloader_workers,
    dataparallel_to_ddp,
    ddp_bf16_compression,
    ddp_bucket_cap,
    ddp_gradient_as_bucket_view,
    ddp_static_graph,
    eval_mode,
    expandable_segments,
    fewer_param_tensors,
    fp16_grad_scaler,
    fused_optimizer,
    inference_mode,
    int8_dynamic_quant,
    kv_cache,
    larger_batch,
    non_blocking_copies,
    persistent_workers,
    pin_memory,
    prefetch_factor,
    prompt_lookup,
    sdpa_attention,
    speculative_decoding,
    static_cache,
    static_cache_compile,
    tf32,
    torch_compile,
)

MODULES = (
    # input pipeline and host-to-device copies
    dataloader_workers,
    persistent_workers,
    prefetch_factor,
    pin_memory,
    non_blocking_copies,
    # inference: autograd off, the model's eval mode
    inference_mode,
    eval_mode,
    # text generation: the KV cache, generate()'s own settings, the model's attention
    kv_cache,
    static_cache,
    static_cache_compile,
    sdpa_attention,
    prompt_lookup,
    speculative_decoding,
    # lower-precision arithmetic
    bf16_autocast,
    fp16_grad_scaler,
    tf32,
    int8_dynamic_quant,
    # compute and host overhead
    torch_compile,
    cudnn_benchmark,
    channels_last,
    fused_optimizer,
    fewer_param_tensors,
    cpu_threads,
    larger_batch,
    avoid_syncs,
    # device memory capacity
    expandable_segments,
    activation_checkpointing,
    # collective communication
    ddp_bucket_cap,
    ddp_gradient_as_bucket_view,
    ddp_static_graph,
    ddp_bf16_compression,
    dataparallel_to_ddp,
)

FIXES: dict[str, Fix] = {module.FIX.id: module.FIX for module in MODULES}


def get(fix_id: str) -> Fix:
    """The entry with this id; KeyError names the known ids (a typo in --fixes)."""
    try:
        return FIXES[fix_id]
    except KeyError:
        raise KeyError(f"unknown fix {fix_id!r}; known: {', '.join(sorted(FIXES))}") from None


def for_problem(klass: str, subtype: str) -> list[Fix]:
    """Entries addressing ``klass/subtype``, in catalog order (most direct first)."""
    key = f"{klass}/{subtype}"
    return [fix for fix in FIXES.values() if key in fix.addresses]


__all__ = ["FIXES", "MODULES", "Fix", "Typical", "for_problem", "get"]


# -- fixes from outside the catalog --------------------------------------------------------
# A plugin is a module that declares ``FIX = Fix(...)`` as the catalog's do, named in
# STEPSCOPE_FIX_MODULES (comma-separated module names) or in the ``stepscope.fixes``
# entry-point group of an installed package. The variable reaches every trial job (the
# runner passes its environment on), where the installer reads this same catalog. A module
# that fails to load, declares no Fix or reuses a known id is left out with one line on
# stderr; the job and the experiment go on.
PLUGIN_ENV = "STEPSCOPE_FIX_MODULES"
PLUGIN_GROUP = "stepscope.fixes"
PLUGIN_ERRORS: list[str] = []


def load_plugins(names: str | None = None) -> list[str]:
    """Add the plugin fixes to ``FIXES`` (after the catalog's); returns the ids added."""
    # local: stdlib needed only here, at the catalog's import
    import importlib
    import importlib.metadata
    import os
    import sys

    wanted = names if names is not None else os.environ.get(PLUGIN_ENV, "")
    sources: list[tuple[str, object]] = []
    for name in (n.strip() for n in wanted.split(",")):
        if name:
            sources.append((name, lambda name=name: importlib.import_module(name)))
    try:
        points = list(importlib.metadata.entry_points(group=PLUGIN_GROUP))
    except Exception:
        points = []
    for point in points:
        sources.append((f"{point.name} ({point.value})", point.load))
    added = []
    for label, load in sources:
        try:
            module = load()  # type: ignore[operator]
            fix = getattr(module, "FIX", None)
            if not isinstance(fix, Fix):
                raise TypeError("it declares no FIX = Fix(...)")
            if fix.id in FIXES:
                if FIXES[fix.id] is fix:
                    continue
                raise ValueError(f"fix id {fix.id!r} is taken")
        except Exception as exc:
            message = f"fix module {label} not loaded ({type(exc).__name__}: {exc})"
            PLUGIN_ERRORS.append(message)
            print(f"stepscope: {message}", file=sys.stderr)
            continue
        FIXES[fix.id] = fix
        added.append(fix.id)
    return added


load_plugins()
