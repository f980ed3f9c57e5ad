"""A static KV cache with the decode step compiled: ``generate(cache_implementation=
"static", compile_config=CompileConfig(...))``.

With a static cache (``static_cache``) the decode step keeps its shapes, and transformers'
``generate()`` then runs it through ``torch.compile`` (``get_compiled_call``) where its
criteria hold (``GenerationMixin._valid_auto_compile_criteria``): a compileable cache, no
``disable_compile``, a quantiser that compiles, no CPU/disk offload, and a device of
``cuda``/``xpu``/``neuron``/``tpu``, or else ``compile_config._compile_all_devices`` set
(transformers' flag for compiling elsewhere, the CPU included: "often not optimal, but
useful", its comment says). On a GPU the config's default mode is "reduce-overhead" (CUDA
graphs: the per-token launches go); on the CPU there are no graphs to capture, so
"default" (inductor's fused C++ kernels). The prefill is not compiled: only the decode
step, whose shapes repeat.

Read back at the job's second generate() call: ``model._compiled_call`` exists once
generate() compiled the step; the change is recorded then, as applied only if it did (a
job of one request cannot show it). The first request pays the compilation (tens of
seconds on a CPU): ``slow_start``.
"""

from __future__ import annotations

from typing import Any

from stepscope.fixes.base import Fix, Typical
from stepscope.fixes.catalog.static_cache import static_refusal
from stepscope.fixes.fitting import CPU, CUDA, INFERENCE, TRAINING, fit_by_job
from stepscope.fixes.points import Change, GenerateCall

# A GPU's figure (CUDA graphs) and the CPU's own, measured here: each job gets its device's.
GPU_TYPICAL = Typical(
    0.9,
    4.0,
    "Hugging Face transformers docs, 'LLM inference optimization' (llm_optims): a "
    "static cache with torch.compile, up to 4x faster decoding on a GPU; measured by "
    "stepscope optimize: 2.92x tokens/s on an H200 (GPT-2 124M, batch 1, CUDA graphs)",
)
CPU_TYPICAL = Typical(
    0.9,
    1.7,
    "measured by stepscope optimize: 0.9-1.7x tokens/s on a 2-core CPU (6-layer GPT-2)",
)

SNIPPET = (
    "from transformers import CompileConfig\n"
    "out = model.generate(\n"
    '    input_ids, max_new_tokens=64, cache_implementation="static",\n'
    "    compile_config=CompileConfig(),  # the default mode: reduce-overhead (CUDA graphs)\n"
    ")"
)

# a CPU has no CUDA graphs: the plan compiles its decode step in the default mode, on every
# device (``_compile_all_devices``, as _config sets it)
CPU_SNIPPET = (
    "from transformers import CompileConfig\n"
    'config = CompileConfig(mode="default")\n'
    "config._compile_all_devices = True  # transformers compiles on accelerators only\n"
    "out = model.generate(\n"
    '    input_ids, max_new_tokens=64, cache_implementation="static", compile_config=config\n'
    ")"
)

# Devices transformers compiles the decode step on without ``_compile_all_devices``.
ACCELERATORS = ("cuda", "xpu", "neuron", "tpu")


def _compile_config_class(call: GenerateCall) -> tuple[Any, str | None]:
    """(transformers' CompileConfig, or None with why it cannot be used here)."""
    # local: transformers is loaded already (the job is calling generate())
    import transformers
    from transformers.generation import configuration_utils

    config_class = getattr(configuration_utils, "CompileConfig", None)
    version = getattr(transformers, "__version__", "?")
    if config_class is None:
        return None, f"transformers {version} has no CompileConfig to compile generate() with"
    device = str(getattr(getattr(call.model, "device", None), "type", "cpu"))
    if device not in ACCELERATORS and not hasattr(config_class, "_compile_all_devices"):
        return None, (
            f"transformers {version} compiles generate()'s decode step on accelerators only "
            f"(no CompileConfig._compile_all_devices for the {device})"
        )
    if call.setting("disable_compile"):
        return None, "the job turns generate()'s compilation off (disable_compile=True)"
    quantizer = getattr(call.model, "hf_quantizer", None)
    if quantizer is not None and not getattr(quantizer, "is_compileable", False):
        return None, "the model's quantisation cannot be compiled"
    return config_class, None


def _config(call: GenerateCall, params: dict[str, Any]) -> Any:
    """The CompileConfig to use (made once per job: the same object every call, so
    generate() compiles once)."""
    if "config" not in call.state:
        config_class, why = _compile_config_class(call)
        call.state["why"] = why
        config = None
        if config_class is not None:
            device = str(getattr(getattr(call.model, "device", None), "type", "cpu"))
            mode = params.get("mode") or ("reduce-overhead" if device == "cuda" else "default")
            config = config_class(mode=mode)
            if device not in ACCELERATORS:
                config._compile_all_devices = True
        call.state["config"] = config
    return call.state["config"]


def _on_generate(call: GenerateCall, params: dict[str, Any]) -> None:
    why = static_refusal(call)
    config = _config(call, params)
    why = why or call.state.get("why")
    kept = [n for n in ("cache_implementation", "compile_config") if n in call.explicit]
    if why is None and kept and not call.override:
        why = f"kept the call's {kept[0]} (set explicitly; --keep-explicit)"
    if why is not None:
        call.refuse(why)
        return
    call.kwargs["cache_implementation"] = "static"
    call.kwargs["compile_config"] = config
    calls = call.state.get("calls", 0)
    call.state["calls"] = calls + 1
    if calls == 0:
        return  # read back at the next call, once generate() has had the chance to compile
    if getattr(call.model, "_compiled_call", None) is None:
        call.refuse("generate() did not compile its decode step (its compile criteria failed)")
        return
    cpu = ", all devices" if getattr(config, "_compile_all_devices", None) else ""
    call.record(
        Change(
            f"generate(cache_implementation='static', compile_config=CompileConfig("
            f"mode={config.mode!r}{cpu})): the decode step ran compiled (model._compiled_call)",
            verified=call.reads_back("compile_config") and call.reads_back("cache_implementation"),
        )
    )


FIX = Fix(
    id="static_cache_compile",
    title="Static KV cache and a compiled decode step in generate()",
    # decode at batch one, and the host overhead of a small model's decode (an H200's
    # GPT-2 generate() was 95 % host overhead): the compiled step is one CUDA graph per
    # token instead of hundreds of launches, and fewer Python ops on a CPU
    addresses=("memory/decode_batch_one", "compute/host_overhead"),
    requires=("generate_call", "kv_cache_on"),
    changes_numerics=False,
    auto=True,
    why="with a static cache the decode step keeps its shapes, so torch.compile captures "
    "it once: fused kernels, and on a GPU one CUDA graph per token instead of hundreds of "
    "launches, which is most of a small batch's decode time",
    snippet=SNIPPET,
    typical=GPU_TYPICAL,
    fit=fit_by_job(
        {(CUDA, INFERENCE): GPU_TYPICAL, (CPU, INFERENCE): CPU_TYPICAL},
        SNIPPET,
        device_snippets={(CPU, INFERENCE): CPU_SNIPPET, (CPU, TRAINING): CPU_SNIPPET},
    ),
    slow_start=True,
    target="a second generate() call (where the compiled decode step is read back)",
    on_generate=_on_generate,
)
