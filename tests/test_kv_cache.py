"""The KV cache's bytes, read where the cache is held (``collectors/steps/kv_cache.py``).

In process: a real Hugging Face ``DynamicCache`` and ``StaticCache`` from a small Llama
(random weights, nothing downloaded), the legacy tuple form, and a model that keeps its
cache in attributes, each held against the bytes its shapes make. Then a real job, Meta's
Llama reference code as people run it (examples/corpus/llama_reference.py: a cache of
``max_batch_size x max_seq_len`` in every attention layer, its forward called directly),
recorded with the CLI.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
from dashboard_helpers import stepscope

from stepscope.analyzers.steps.generation import generation_summary
from stepscope.collectors.steps.kv_cache import (
    CACHE_NAME,
    allocated_whole,
    cache_of,
    cache_tensors,
    held_bytes,
    is_cache_object,
    module_cache_tensors,
)
from stepscope.store import RunStore

REPO = Path(__file__).resolve().parents[1]
LAYERS, KV_HEADS, HEAD_DIM = 3, 2, 16


def _llama() -> torch.nn.Module:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS,
        num_attention_heads=4, num_key_value_heads=KV_HEADS, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def test_a_dynamic_cache_is_its_keys_and_values() -> None:
    model = _llama()
    ids = torch.randint(0, 128, (2, 10))
    with torch.inference_mode():
        out = model(input_ids=ids, use_cache=True)
        cache = cache_of(out)
        assert is_cache_object(cache) and not allocated_whole(cache)
        out = model(input_ids=ids[:, :1], past_key_values=cache, use_cache=True)
    assert cache_of(out) is cache  # updated in place: one reference is enough
    expected = 2 * LAYERS * 2 * KV_HEADS * 11 * HEAD_DIM * 4
    assert held_bytes(cache_tensors(cache, torch)) == expected


def test_a_static_cache_is_allocated_whole() -> None:
    transformers = pytest.importorskip("transformers")
    model = _llama()
    cache = transformers.StaticCache(config=model.config, max_cache_len=40)
    with torch.inference_mode():
        out = model(input_ids=torch.randint(0, 128, (1, 5)), cache=cache, use_cache=True)
    assert cache_of(out) is cache and allocated_whole(cache)  # returned as ``out.cache``
    assert held_bytes(cache_tensors(cache, torch)) == 2 * LAYERS * KV_HEADS * 40 * HEAD_DIM * 4


def test_the_legacy_tuple_form_and_shared_storages() -> None:
    k = torch.zeros(1, 2, 8, 4)
    past = ((k, torch.zeros(1, 2, 8, 4)), (k[:, :1], torch.zeros(1, 2, 8, 4)))  # a view of k
    logits = torch.zeros(1, 1, 10)
    assert cache_of((logits, past)) is past and not is_cache_object(past)
    assert held_bytes(cache_tensors(past, torch)) == 3 * k.nbytes
    assert cache_of({"logits": logits, "past_key_values": past}) is past
    assert cache_of((logits, logits)) is None  # two tensors are not a cache
    assert cache_of(logits) is None


def test_cache_names_and_not_rotary_tables() -> None:
    for name in ("cache_k", "cache_v", "k_cache", "v_cache", "kv_cache", "key_cache", "cache_kv"):
        assert CACHE_NAME.match(name), name
    for name in ("cos_cached", "sin_cached", "cache_position", "cached_mask", "weight"):
        assert not CACHE_NAME.match(name), name

    class Attention(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(4, 4)
            self.cache_k = torch.zeros(2, 16, 4)
            self.register_buffer("v_cache", torch.zeros(2, 16, 4), persistent=False)
            self.register_buffer("cos_cached", torch.zeros(16, 4), persistent=False)

    model = torch.nn.Sequential(Attention(), Attention())
    assert held_bytes(module_cache_tensors(model, torch)) == 4 * 2 * 16 * 4 * 4


@pytest.mark.slow
def test_the_llama_reference_codes_own_cache(tmp_path: Path) -> None:
    """Each attention layer's ``cache_k``/``cache_v`` (4 x 256 x 2 x 32 floats): held
    whole from the first token, found though the script calls ``model.forward``."""
    home = tmp_path / "home"
    job = REPO / "examples" / "corpus" / "llama_reference.py"
    stepscope(
        home, "run", "--no-profile", "--", sys.executable, str(job), "--num-prompts", "3",
        "--max-gen-len", "8",
    )  # fmt: skip
    with RunStore(home) as store:
        run_id = store.resolve_run("last")
        requests, steps = store.requests(run_id), store.steps(run_id)
    whole = 4 * 2 * (4 * 256 * 2 * 32 * 4)  # layers x (k, v) x max batch x max seq x kv heads
    assert len(requests) == 3
    for meta in requests["meta"]:
        assert meta["kv_cache_bytes"] == whole and meta["kv_cache_grows"] is False, meta
    kv = generation_summary(requests, steps)["kv_cache"]
    assert kv["allocated_whole"] and kv["per_token"] is None
    out = stepscope(home, "show", str(run_id)).stdout
    assert "allocated whole" in out


@pytest.mark.slow
def test_an_inference_jobs_unused_cache_is_not_held(tmp_path: Path) -> None:
    """A causal LM scoring batches returns a cache at every call, and the step timer
    holds each first call back as a possible prefill: the cache is measured then, never
    held, so the job's memory is its own (the job checks each cache is freed once it
    drops the output)."""
    home = tmp_path / "home"
    job = REPO / "tests" / "jobs" / "lm_scoring.py"
    out = stepscope(home, "run", "--no-profile", "--", sys.executable, str(job))
    assert out.stdout.strip().splitlines()[-1] == "freed: true", out.stdout[-2000:]
