"""How many bytes a generation job's KV cache holds, read from the tensors that hold it.

The KV cache is what a decode keeps of every position so far: for each layer, the keys
and values of the context, growing by one position per token (or allocated whole at the
start: a static cache, a model's own buffers). It is the part of a generation job's
memory that grows with the batch and the context, so it is the figure that says how
many requests, how long, fit. torch's memory timeline has no category for it (its bytes
fall among "activations" or "unknown"), so it is measured where the cache is:

* the cache a model call returns: a Hugging Face ``Cache`` object (``DynamicCache``,
  ``StaticCache``: ``layers`` of ``keys``/``values``, or ``key_cache``/``value_cache``
  lists before transformers 4.56) as ``output.past_key_values`` (``output.cache`` where
  the call passed ``cache=``, transformers 5.24 on), or the legacy form, a
  tuple of per-layer ``(key, value)`` tensors, as ``past_key_values`` or as the second
  item of a tuple output (``logits, past = model(x, past)``);
* tensors a model keeps as attributes or buffers under a cache's name (``cache_k``,
  ``cache_v``, ``k_cache``, ``kv_cache``...: Meta's Llama reference code, nanoGPT-style
  forks). Rotary tables (``cos_cached``) are not caches and are not matched.

Storages are counted once each (a key and its view share one) and whole (a static cache
reserves its full length from the start: that is what it holds); tensors of fewer than
two dimensions (a layer's position counter) are not keys or values.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

CACHE_NAME = re.compile(r"^(?:(?:k|v|kv|key|value)_?cache|cache_?(?:k|v|kv|key|value)s?)$")
#: where an output carries it: ``cache`` from transformers 5.24 (``past_key_values`` is
#: deprecated there as the forward's argument, and the output follows the argument)
RETURNED_AS = ("past_key_values", "cache")
_LEGACY_DEPTH = 3  # tuple of layers, of (key, value), of tensors (a few models nest once more)


def cache_of(output: Any) -> Any:
    """The cache a model call returned, or None (a call that returned none)."""
    found = None
    for name in RETURNED_AS:
        found = getattr(output, name, None)
        if found is None and isinstance(output, dict):
            found = output.get(name)
        if found is not None and (name == "past_key_values" or is_cache_object(found)):
            break
        found = None
    if found is None and isinstance(output, tuple) and len(output) >= 2:
        second = output[1]
        if is_cache_object(second) or _legacy_pairs(second):
            found = second
    return found


def is_cache_object(cache: Any) -> bool:
    """A cache object that is updated in place across the calls of one request (a
    Hugging Face ``Cache``): one reference, read once at the request's end, is enough."""
    return hasattr(cache, "layers") or hasattr(cache, "key_cache")


def allocated_whole(cache: Any) -> bool:
    """A cache that reserves its full length at the start (Hugging Face's static,
    sliding-window and hybrid caches) rather than growing a position per token."""
    name = type(cache).__name__
    return any(word in name for word in ("Static", "Sliding", "Hybrid"))


def _legacy_pairs(value: Any) -> bool:
    return (
        isinstance(value, (tuple, list))
        and len(value) > 0
        and all(isinstance(layer, (tuple, list)) and len(layer) >= 2 for layer in value)
    )


def _tensors(value: Any, torch: Any, depth: int = 0) -> Iterator[Any]:
    if isinstance(value, torch.Tensor):
        if value.dim() >= 2:  # keys and values, not a layer's position counter
            yield value
    elif isinstance(value, (tuple, list)) and depth < _LEGACY_DEPTH:
        for item in value:
            yield from _tensors(item, torch, depth + 1)


def cache_tensors(cache: Any, torch: Any) -> Iterator[Any]:
    """The tensors of a returned cache (see the module docstring for its forms)."""
    layers = getattr(cache, "layers", None)
    if layers is not None:
        for layer in layers:
            for value in vars(layer).values():
                yield from _tensors(value, torch, 1)
        return
    if hasattr(cache, "key_cache"):
        for name in ("key_cache", "value_cache"):
            yield from _tensors(getattr(cache, name, None), torch, 1)
        return
    yield from _tensors(cache, torch)


def module_cache_tensors(model: Any, torch: Any) -> Iterator[Any]:
    """Tensors the model's modules keep under a cache's name (attributes or buffers)."""
    for module in model.modules():
        own = vars(module)
        for name, value in [*own.items(), *own.get("_buffers", {}).items()]:
            if isinstance(value, torch.Tensor) and CACHE_NAME.match(name):
                yield value


def held_bytes(tensors: Iterator[Any]) -> int:
    """The bytes of the storages behind ``tensors``, each storage once."""
    seen: set[int] = set()
    total = 0
    for t in tensors:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in seen:
            seen.add(ptr)
            total += storage.nbytes()
    return total


def cache_figures(
    cache: Any, measured: int, roots: list[Any], torch: Any, *, whole: bool = False
) -> dict[str, Any] | None:
    """A request's cache at its end, as its meta keeps it: ``kv_cache_bytes`` (the cache
    object its calls returned, or the largest measured at a call, and the cache tensors
    of the ``roots`` modules) and ``kv_cache_grows`` (per position figures make sense
    only for a cache that grows with the context; ``whole``: one measured at a call was
    allocated whole); None where there is none."""
    returned = measured
    if cache is not None:
        returned = max(returned, held_bytes(cache_tensors(cache, torch)))
    unique = {id(m): m for m in roots if m is not None}.values()
    own = held_bytes(t for root in unique for t in module_cache_tensors(root, torch))
    if not (returned or own):
        return None
    whole = whole or own > 0 or (cache is not None and allocated_whole(cache))
    return {"kv_cache_bytes": returned + own, "kv_cache_grows": bool(returned) and not whole}
