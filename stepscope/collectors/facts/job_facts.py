"""What the job has switched on: DataLoader, optimizer, model wrapping, precision.

The diagnosis must not recommend a fix that is already in effect (no "add workers" to
a loader that has eight) nor one whose requirements the job does not meet (no DDP
bucket advice without DDP, no channels_last without 4-D convolutions). Only the job's
own objects know these settings, so the step timer hands them here the first time it
sees each one, and the facts are written to the run's ``facts`` column at the first
step and again at the end (a second loader, e.g. for validation, comes later).

Reading attributes is all this does: nothing here changes the job, and every reader
is wrapped so that an odd object costs its own fact, never the job.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

MAX_LOADERS = 4  # a job with more loaders than this is recorded by its first few
# torch is imported inside the readers: they run from the step timer's hooks, once the
# job has imported torch, while this module is imported with the step timer, which
# must not import torch itself (``stepscope.mark_step`` imports it).


class JobFacts:
    """Accumulates facts in a plain dict; ``take_if_changed`` hands out what to write."""

    def __init__(self) -> None:
        self.facts: dict[str, Any] = {}
        self._seen: set[int] = set()
        self._changed = False
        self._loader_entries: dict[int, dict[str, Any]] = {}  # id(loader) -> its facts

    def _once(self, obj: Any) -> bool:
        key = id(obj)
        if key in self._seen:
            return False
        self._seen.add(key)
        return True

    def on_loader(self, loader: Any) -> None:
        """Each ``iter(loader)``: the first records the loader, each counts an epoch
        (``iterations``: persistent workers only help a loader iterated again)."""
        if not self._once(loader):
            entry = self._loader_entries.get(id(loader))
            if entry is not None:
                entry["iterations"] = entry.get("iterations", 1) + 1
                self._changed = True  # one write per epoch: the count stays true
            return
        loaders = self.facts.setdefault("dataloaders", [])
        if len(loaders) < MAX_LOADERS:
            with contextlib.suppress(Exception):
                entry = {**loader_facts(loader), "iterations": 1}
                loaders.append(entry)
                self._loader_entries[id(loader)] = entry
                self._changed = True

    def on_optimizer(self, optimizer: Any) -> None:
        if "optimizer" in self.facts or not self._once(optimizer):
            return
        with contextlib.suppress(Exception):
            self.facts["optimizer"] = optimizer_facts(optimizer)
            self._changed = True

    def on_top_forward(self, module: Any, args: Any) -> None:
        """The first top-level module call: the model as the job runs it."""
        if "model" in self.facts:
            return
        with contextlib.suppress(Exception):
            self.facts["model"] = model_facts(module, args)
            self._changed = True

    def on_forward_step(self, module: Any, grad: bool, backward_seen: bool) -> None:
        """A forward step ended (a call of the outermost module, in a job with no optimizer
        step yet): how it ran. Counted once per step, never per submodule call: whether
        autograd recorded it (grad mode on and not ``inference_mode``: ``grad`` is False
        inside inference_mode) and whether the model was in training mode. The diagnosis
        reads the shares (``analyzers/rules/inference.py``)."""
        fwd = self.facts.get("forward")
        if fwd is None:
            fwd = self.facts["forward"] = {"steps": 0, "grad_steps": 0, "train_mode_steps": 0}
        fwd["steps"] += 1
        fwd["grad_steps"] += bool(grad)
        fwd["train_mode_steps"] += bool(getattr(module, "training", False))
        fwd["backward"] = bool(backward_seen)
        self._changed = True

    def on_backward(self) -> None:
        """A job with no optimizer ran a backward (it updates its parameters by hand)."""
        forward = self.facts.get("forward")
        if forward is not None and not forward.get("backward"):
            forward["backward"] = True
            self._changed = True

    def take_if_changed(self) -> dict[str, Any] | None:
        """Global settings are read now (the job may set them after importing torch)."""
        with contextlib.suppress(Exception):
            settings = global_facts()
            if settings != self.facts.get("settings"):
                self.facts["settings"] = settings
                self._changed = True
        if not self._changed:
            return None
        self._changed = False
        return dict(self.facts)


def loader_facts(loader: Any) -> dict[str, Any]:
    from torch.utils.data import IterableDataset  # local: see the note on torch

    dataset = getattr(loader, "dataset", None)
    return {
        "num_workers": int(getattr(loader, "num_workers", 0) or 0),
        "pin_memory": bool(getattr(loader, "pin_memory", False)),
        "persistent_workers": bool(getattr(loader, "persistent_workers", False)),
        "prefetch_factor": getattr(loader, "prefetch_factor", None),
        "batch_size": getattr(loader, "batch_size", None),
        "iterable_dataset": isinstance(dataset, IterableDataset),
        "dataset": type(dataset).__name__,
    }


def optimizer_facts(optimizer: Any) -> dict[str, Any]:
    defaults = getattr(optimizer, "defaults", {}) or {}
    params = sum(len(g.get("params", ())) for g in getattr(optimizer, "param_groups", ()))
    return {
        "class": type(optimizer).__name__,
        "fused": defaults.get("fused"),
        "foreach": defaults.get("foreach"),
        "supports_fused": "fused" in defaults,
        "fused_kernels": _fused_kernel_devices(),
        "param_tensors": params,
    }


def _generation_facts(model: Any, params: list[Any]) -> dict[str, Any]:
    """What a generation finding reads off a Hugging Face model's config: its attention
    implementation (SDPA is a fix where it is eager) and the KV cache's bytes per token
    (2 x layers x KV heads x head size x element size: the decode's memory traffic
    besides the weights). Nothing for a model without such a config."""
    config = getattr(model, "config", None)
    if config is None or not params:
        return {}
    out: dict[str, Any] = {}
    attn = getattr(config, "_attn_implementation", None)
    if isinstance(attn, str):
        out["attn_implementation"] = attn
    try:
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        layers = int(getattr(text, "num_hidden_layers", None) or text.n_layer)
        heads = int(getattr(text, "num_attention_heads", None) or text.n_head)
        hidden = int(getattr(text, "hidden_size", None) or text.n_embd)
        kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(text, "head_dim", None) or hidden // heads)
        out["kv_bytes_per_token"] = 2 * layers * kv_heads * head_dim * params[0].element_size()
    except (AttributeError, TypeError, ValueError, ZeroDivisionError):
        pass
    return out


def model_facts(module: Any, args: Any) -> dict[str, Any]:
    import torch  # local: see the note on torch
    from torch import nn  # local: see the note on torch

    inner = module
    compiled = hasattr(module, "_orig_mod")
    if compiled:
        inner = module._orig_mod
    wrapper = None
    if isinstance(inner, nn.parallel.DistributedDataParallel):
        wrapper = "DistributedDataParallel"
    elif isinstance(inner, nn.DataParallel):
        wrapper = "DataParallel"
    modules = list(inner.modules())
    params = list(inner.parameters())
    mode_dependent = _mode_dependent_types(nn)
    out: dict[str, Any] = {
        "class": type(inner.module if wrapper else inner).__name__,
        "wrapper": wrapper,
        "compiled": compiled,
        "training": bool(inner.training),
        "modules": len(modules),
        "parameters": int(sum(p.numel() for p in params)),
        "param_dtype": str(params[0].dtype).replace("torch.", "") if params else None,
        "device": str(params[0].device) if params else None,
        "conv2d": any(isinstance(m, nn.Conv2d) for m in modules),
        # what inference fixes act on: layers dynamic int8 quantisation replaces, and
        # layers whose output depends on train()/eval() (dropout, batch statistics)
        "quantizable": sorted(
            {type(m).__name__ for m in modules if type(m) in (nn.Linear, nn.LSTM, nn.GRU)}
        ),
        "mode_dependent": sorted(
            {type(m).__name__ for m in modules if isinstance(m, mode_dependent)}
        ),
        "grad_enabled": torch.is_grad_enabled(),
        "inference_mode": torch.is_inference_mode_enabled(),
    }
    out.update(_generation_facts(inner, params))
    first = next((a for a in (args or ()) if isinstance(a, torch.Tensor)), None)
    if first is not None:
        out["input_shape"] = list(first.shape)
        out["input_dtype"] = str(first.dtype).replace("torch.", "")
        if first.dim() == 4:
            out["channels_last"] = bool(
                first.is_contiguous(memory_format=torch.channels_last) and not first.is_contiguous()
            )
    for device_type in ("cuda", "cpu"):
        with contextlib.suppress(Exception):
            if torch.is_autocast_enabled(device_type):
                dtype = torch.get_autocast_dtype(device_type)
                out["autocast"] = {"device": device_type, "dtype": str(dtype).split(".")[-1]}
    if wrapper == "DistributedDataParallel":
        out["ddp"] = {
            "bucket_cap_mb": round(getattr(inner, "bucket_bytes_cap", 0) / 2**20, 1),
            "gradient_as_bucket_view": bool(getattr(inner, "gradient_as_bucket_view", False)),
            "static_graph": bool(getattr(inner, "static_graph", False)),
            "comm_hook": bool(getattr(inner, "_comm_hooks", None)),
        }
        with contextlib.suppress(Exception):
            import torch.distributed as dist  # local: see the note on torch

            out["ddp"]["backend"] = dist.get_backend()
    return out


def _mode_dependent_types(nn: Any) -> tuple[type, ...]:
    """Layers that compute differently in train() and eval() mode."""
    return (nn.modules.dropout._DropoutNd, nn.modules.batchnorm._BatchNorm)


def global_facts() -> dict[str, Any]:
    import torch  # local: see the note on torch

    return {
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "tf32_matmul": bool(torch.backends.cuda.matmul.allow_tf32),
        "tf32_cudnn": bool(torch.backends.cudnn.allow_tf32),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "threads": torch.get_num_threads(),
        "cpu_capability": _cpu_capability(torch),
        "cpu_bf16": _cpu_bf16(torch),
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
        or os.environ.get("PYTORCH_ALLOC_CONF"),
    }


def _cpu_capability(torch: Any) -> str | None:
    """The vector ISA torch dispatches CPU kernels to (e.g. 'AVX512'); None if unknown."""
    try:
        return str(torch.backends.cpu.get_cpu_capability())
    except Exception:
        return None


def _cpu_bf16(torch: Any) -> bool | None:
    """Whether oneDNN runs bf16 natively here (AVX512-BF16 or AMX): only then is CPU
    autocast to bf16 worth trying; elsewhere it is emulated and slower than float32."""
    try:
        return bool(torch.backends.mkldnn.is_available()) and bool(
            torch.ops.mkldnn._is_mkldnn_bf16_supported()
        )
    except Exception:
        return None


def _fused_kernel_devices() -> list[str] | None:
    """Device types the installed torch has fused optimizer kernels for (the CPU since
    2.4); None where torch does not say (older versions: CUDA only)."""
    try:
        # local: a private name, not in every torch
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

        return list(_get_fused_kernels_supported_devices())
    except Exception:
        return None
