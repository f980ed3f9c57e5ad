"""Apply a plan of fixes inside the job, with no change to the user's script.

The bootstrap calls ``install_plan`` right after ``import torch`` when the launcher
passed a plan (``STEPSCOPE_PLAN``, see ``collectors/contract.py``). Fixes take effect
where the job creates the objects they concern, by wrapping constructors the script
calls anyway:

* ``DataLoader.__init__``: num_workers, persistent_workers, prefetch_factor,
  pin_memory, batch size (larger_batch);
* the ``torch.optim`` classes' ``__init__``: fused where the installed torch has fused
  kernels for the parameters' device (CUDA; the CPU since torch 2.4 for Adam, AdamW,
  SGD and Adagrad), else foreach, and the log says which;
* ``DistributedDataParallel.__init__``: bucket_cap_mb, gradient_as_bucket_view,
  static_graph, and the bf16 compression hook after construction;
* the models, found at their first top-level call (every module that owns optimizer
  parameters: a GAN's generator and discriminator both; or the first top-level module
  of an inference job): channels_last, bf16
  autocast around its forward only (backward runs outside, as the AMP recipe says), and
  torch.compile of its forward;
* global settings (TF32, cudnn.benchmark, thread count) at import and again at the
  model's first call, in case the script set them in between.

A value the user's code passed explicitly is replaced when the plan says
``override_explicit`` (the experiment's default: the user asked to try the fix, and
``num_workers=args.workers`` with a default of 0 is how most scripts are written), and
the log says what it replaced ("num_workers 0 -> 4 (the job set 0)"); without it the
value is kept and the fix is recorded as not applied.

Applied, then verified: after each change the real object is read back (the loader's
``num_workers``, the optimizer's ``defaults["fused"]``, autocast enabled inside the
wrapped forward, the compiled forward, the weights' memory format, the global
settings), and each entry of ``config.applied`` says ``verified`` true or false. The
experiment runner measures only candidates whose fixes took effect. Every change (and
every fix that could not be applied, with the reason) also goes to the run's log
(source ``apply``). A fix that fails is skipped with a line on stderr; the job itself
is never stopped by it.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import sys
import threading
from collections.abc import Callable
from typing import Any

from stepscope.errors import one_line_error

MODEL_FIXES = ("bf16_autocast", "torch_compile", "channels_last")
DDP_FIX_OF = {
    "bucket_cap_mb": "ddp_bucket_cap",
    "gradient_as_bucket_view": "ddp_gradient_as_bucket_view",
    "static_graph": "ddp_static_graph",
}
# Top-level module calls looked at before the model search gives up: global hooks run on
# every module call of the training step, so they must not stay when nothing matches.
MODEL_SEARCH_CALLS = 50
GLOBAL_FIXES = ("tf32", "cudnn_benchmark", "cpu_threads")


def load_plan(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as fh:
        plan = json.load(fh)
    if not isinstance(plan, dict) or not isinstance(plan.get("fixes", {}), dict):
        raise ValueError(f"{path}: a plan is an object with a 'fixes' object")
    return plan


class PlanApplier:
    """Installs the plan's patches in this process and reports what they changed."""

    def __init__(self, plan: dict[str, Any], writer: Callable[[], Any]) -> None:
        self.fixes: dict[str, dict[str, Any]] = {
            k: (v if isinstance(v, dict) else {}) for k, v in plan.get("fixes", {}).items()
        }
        self.override = bool(plan.get("override_explicit", True))
        self.seed = plan.get("seed")
        self._writer = writer
        self.applied: list[dict[str, Any]] = []
        self._loaders_logged = 0
        self._loader_changes: list[tuple[str, str, bool, str | None]] = []
        self._opt_params: set[int] = set()
        self._covered: set[int] = set()  # optimizer parameters of the models adopted
        self._models = 0
        self._model_found = False
        self._searched = 0
        self._hooks: list[Any] = []
        self._tls = threading.local()
        self._autocast_ctx: Any = None

    # -- reporting ----------------------------------------------------------------------
    def _record(
        self, fix: str, change: str, applied: bool = True, verified: bool | None = None
    ) -> None:
        self.applied.append(
            {"fix": fix, "change": change, "applied": applied, "verified": verified}
        )
        with contextlib.suppress(Exception):
            w = self._writer()
            w.log("info" if applied else "warning", "apply", f"{fix}: {change}")
            w.merge_run_json("config", {"applied": list(self.applied)})

    def _failed(self, fix: str, exc: BaseException) -> None:
        with contextlib.suppress(Exception):
            sys.stderr.write(f"stepscope: fix {fix} not applied ({type(exc).__name__}: {exc})\n")
        self._record(fix, f"not applied: {type(exc).__name__}: {exc}", applied=False)

    # -- installation ---------------------------------------------------------------------
    def install(self) -> None:
        import torch

        if self.seed is not None:
            self._seed(int(self.seed))
        self._apply_globals(torch)
        steps: list[tuple[str, Callable[[Any], None]]] = [
            ("dataloader", self._patch_dataloader),
            ("optimizer", self._patch_optimizers),
            ("ddp", self._patch_ddp),
            ("model", self._install_model_hooks),
        ]
        for name, fn in steps:
            try:
                fn(torch)
            except Exception as exc:
                self._failed(name, exc)

    def _seed(self, seed: int) -> None:
        import random

        import torch

        random.seed(seed)
        torch.manual_seed(seed)
        with contextlib.suppress(Exception):
            import numpy as np

            np.random.seed(seed)
        self._record(
            "seed", f"RNGs seeded with {seed} (the job's own seeding still wins)", verified=True
        )

    def _apply_globals(self, torch: Any, again: bool = False) -> None:
        """TF32, cudnn.benchmark and threads; ``again`` at the model's first call."""
        if "tf32" in self.fixes:
            before = torch.backends.cuda.matmul.allow_tf32
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
            if not again or not before:
                self._record(
                    "tf32",
                    "allow_tf32 = True (matmul and cuDNN)",
                    verified=bool(torch.backends.cuda.matmul.allow_tf32),
                )
        if "cudnn_benchmark" in self.fixes:
            before = torch.backends.cudnn.benchmark
            torch.backends.cudnn.benchmark = True
            if not again or not before:
                self._record(
                    "cudnn_benchmark",
                    "torch.backends.cudnn.benchmark = True",
                    verified=bool(torch.backends.cudnn.benchmark),
                )
        if "cpu_threads" in self.fixes:
            n = int(self.fixes["cpu_threads"].get("threads") or 1)
            before = torch.get_num_threads()
            if before != n:
                torch.set_num_threads(n)
                self._record(
                    "cpu_threads",
                    f"torch.set_num_threads({n}) (was {before})",
                    verified=torch.get_num_threads() == n,
                )
            elif not again:
                self._record("cpu_threads", f"the job already runs {n} threads", False)

    # -- DataLoader -----------------------------------------------------------------------
    def _patch_dataloader(self, torch: Any) -> None:
        wanted = {
            "dataloader_workers",
            "persistent_workers",
            "prefetch_factor",
            "pin_memory",
            "larger_batch",
        }
        if not wanted & set(self.fixes):
            return
        from torch.utils.data import DataLoader, IterableDataset

        original = DataLoader.__init__
        signature = inspect.signature(original)
        applier = self

        @functools.wraps(original)
        def __init__(loader: Any, *args: Any, **kwargs: Any) -> None:
            try:
                merged = applier._loader_kwargs(signature, loader, args, kwargs, IterableDataset)
            except Exception as exc:
                applier._failed("dataloader", exc)
                merged = None
            if merged is None:
                original(loader, *args, **kwargs)
                return
            original(loader, **merged)
            with contextlib.suppress(Exception):
                applier._verify_loader(loader, merged)

        DataLoader.__init__ = __init__

    def _verify_loader(self, loader: Any, wanted: dict[str, Any]) -> None:
        """Read the settings back from the loader the job will iterate."""
        changes, self._loader_changes = self._loader_changes, []
        if self._loaders_logged >= 4:
            return
        self._loaders_logged += 1
        for fix, what, applied, name in changes:
            verified = None
            if applied and name is not None:
                verified = getattr(loader, name, None) == wanted.get(name)
            self._record(fix, what, applied, verified)

    def _loader_kwargs(
        self, signature: inspect.Signature, loader: Any, args: tuple, kwargs: dict, iterable: type
    ) -> dict[str, Any] | None:
        bound = signature.bind(loader, *args, **kwargs)
        params = dict(bound.arguments)
        params.pop(next(iter(signature.parameters)))  # self
        explicit = set(params)
        changes: list[tuple[str, str, bool, str | None]] = []  # (fix, what, applied, attr)

        def want(name: str, value: Any, fix: str) -> None:
            current = params.get(name, signature.parameters[name].default)
            if current == value:
                changes.append((fix, f"{name} is already {value!r}", True, name))
                return
            if name in explicit and not self.override:
                changes.append(
                    (
                        fix,
                        f"not applied: kept the job's {name}={current!r} (set explicitly; "
                        "--keep-explicit)",
                        False,
                        None,
                    )
                )
                return
            params[name] = value
            origin = f"the job set {current!r}" if name in explicit else "torch's default"
            changes.append((fix, f"{name} {current!r} -> {value!r} ({origin})", True, name))

        dataset = params.get("dataset")
        if "dataloader_workers" in self.fixes:
            if isinstance(dataset, iterable):
                changes.append(
                    (
                        "dataloader_workers",
                        "not applied: an IterableDataset would yield every sample once per worker",
                        False,
                        None,
                    )
                )
            else:
                n = int(self.fixes["dataloader_workers"].get("num_workers") or 2)
                want("num_workers", n, "dataloader_workers")
        workers = params.get("num_workers", 0) or 0
        if workers > 0 and "persistent_workers" in self.fixes:
            want("persistent_workers", True, "persistent_workers")
        if workers > 0 and "prefetch_factor" in self.fixes:
            k = int(self.fixes["prefetch_factor"].get("prefetch_factor") or 4)
            want("prefetch_factor", k, "prefetch_factor")
        if "pin_memory" in self.fixes:
            import torch

            if torch.cuda.is_available():
                want("pin_memory", True, "pin_memory")
            else:
                changes.append(("pin_memory", "not applied: no CUDA device", False, None))
        if "larger_batch" in self.fixes and params.get("batch_sampler") is None:
            factor = int(self.fixes["larger_batch"].get("factor") or 2)
            size = params.get("batch_size", 1)
            if size:
                params["batch_size"] = size * factor  # the fix itself: consent was given
                changes.append(
                    ("larger_batch", f"batch_size {size} -> {size * factor}", True, "batch_size")
                )
        self._loader_changes = changes  # recorded once the loader exists (_verify_loader)
        return params

    # -- optimizers -----------------------------------------------------------------------
    def _patch_optimizers(self, torch: Any) -> None:
        # Optimizer construction is also where the model's parameters become known: the
        # model fixes look for the module that owns them.
        if not (set(MODEL_FIXES) | {"fused_optimizer"}) & set(self.fixes):
            return
        base_init = torch.optim.Optimizer.__init__
        applier = self

        @functools.wraps(base_init)
        def base(opt: Any, params: Any, *args: Any, **kwargs: Any) -> None:
            base_init(opt, params, *args, **kwargs)
            with contextlib.suppress(Exception):
                for group in opt.param_groups:
                    applier._opt_params.update(id(p) for p in group["params"])

        torch.optim.Optimizer.__init__ = base
        if "fused_optimizer" not in self.fixes:
            return
        for name in dir(torch.optim):
            cls = getattr(torch.optim, name)
            if (
                isinstance(cls, type)
                and issubclass(cls, torch.optim.Optimizer)
                and cls is not torch.optim.Optimizer
                and "foreach" in inspect.signature(cls.__init__).parameters
            ):
                cls.__init__ = self._fused_init(cls, cls.__init__, torch)

    def _fused_init(self, cls: type, original: Callable[..., None], torch: Any) -> Any:
        signature = inspect.signature(original)
        applier = self

        @functools.wraps(original)
        def __init__(opt: Any, params: Any, *args: Any, **kwargs: Any) -> None:
            if type(opt) is not cls:  # a subclass calling super().__init__: leave it
                return original(opt, params, *args, **kwargs)
            params = list(params)
            try:
                bound = signature.bind(opt, params, *args, **kwargs).arguments
                explicit = {"foreach", "fused"} & set(bound)
                if explicit and not applier.override:
                    applier._record(
                        "fused_optimizer",
                        f"not applied: kept the job's {cls.__name__} "
                        f"{', '.join(sorted(explicit))} (set explicitly; --keep-explicit)",
                        False,
                    )
                    return original(opt, params, *args, **kwargs)
                was = ", ".join(f"{k}={bound[k]!r}" for k in sorted(explicit)) or "torch's default"
                tensors = [p for g in params for p in (g["params"] if isinstance(g, dict) else [g])]
                devices = {getattr(t, "device", None) for t in tensors}
                use, why = fused_or_foreach(signature, devices, torch)
                extra = {use: True, ("foreach" if use == "fused" else "fused"): None}
                extra = {k: v for k, v in extra.items() if k in signature.parameters}
                try:
                    original(opt, params, *args, **{**kwargs, **extra})
                except (RuntimeError, ValueError, TypeError) as exc:
                    if use != "fused":
                        raise
                    # fused refused these parameters (a dtype, a device): foreach then
                    use, why = "foreach", f"fused refused: {one_line_error(type(exc), exc)}"
                    extra = {"foreach": True, "fused": None}
                    extra = {k: v for k, v in extra.items() if k in signature.parameters}
                    original(opt, params, *args, **{**kwargs, **extra})
                verified = bool(opt.defaults.get(use))
                applier._record(
                    "fused_optimizer",
                    f"{cls.__name__}({use}=True; was {was}; {why})",
                    True,
                    verified,
                )
            except Exception as exc:
                applier._failed("fused_optimizer", exc)
                original(opt, params, *args, **kwargs)

        return __init__

    # -- DDP ------------------------------------------------------------------------------
    def _patch_ddp(self, torch: Any) -> None:
        wanted = {
            "ddp_bucket_cap",
            "ddp_gradient_as_bucket_view",
            "ddp_static_graph",
            "ddp_bf16_compression",
        }
        if not wanted & set(self.fixes):
            return
        from torch.nn.parallel import DistributedDataParallel as DDP

        original = DDP.__init__
        signature = inspect.signature(original)
        applier = self

        @functools.wraps(original)
        def __init__(ddp: Any, *args: Any, **kwargs: Any) -> None:
            explicit = set(signature.bind_partial(ddp, *args, **kwargs).arguments)
            settings: dict[str, Any] = {}
            if "ddp_bucket_cap" in applier.fixes:
                settings["bucket_cap_mb"] = int(
                    applier.fixes["ddp_bucket_cap"].get("bucket_cap_mb") or 50
                )
            if "ddp_gradient_as_bucket_view" in applier.fixes:
                settings["gradient_as_bucket_view"] = True
            if "ddp_static_graph" in applier.fixes:
                settings["static_graph"] = True
            for key in list(settings):
                if key in explicit and not applier.override:
                    applier._record(
                        DDP_FIX_OF[key],
                        f"not applied: kept the job's {key} (set explicitly; --keep-explicit)",
                        False,
                    )
                    del settings[key]
            original(ddp, *args, **{**kwargs, **settings})
            for key, value in settings.items():
                was = "the job set it" if key in explicit else "torch's default"
                applier._record(
                    DDP_FIX_OF[key],
                    f"DistributedDataParallel({key}={value!r}) ({was})",
                    True,
                    _ddp_setting(ddp, key) == value if key != "bucket_cap_mb" else None,
                )
            if "ddp_bf16_compression" in applier.fixes:
                try:
                    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

                    ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
                    applier._record(
                        "ddp_bf16_compression", "bf16_compress_hook registered", True, True
                    )
                except Exception as exc:
                    applier._failed("ddp_bf16_compression", exc)

        DDP.__init__ = __init__

    # -- the model ------------------------------------------------------------------------
    def _install_model_hooks(self, torch: Any) -> None:
        if not (set(MODEL_FIXES) | set(GLOBAL_FIXES)) & set(self.fixes):
            return
        import torch.nn.modules.module as module_mod

        self._hooks = [
            module_mod.register_module_forward_pre_hook(self._pre_hook),
            module_mod.register_module_forward_hook(self._post_hook, always_call=True),
        ]

    def _pre_hook(self, module: Any, args: tuple) -> Any:
        depth = getattr(self._tls, "depth", 0)
        self._tls.depth = depth + 1
        if depth != 0 or self._model_found:
            return None
        if not self._is_a_model(module):
            self._searched += 1
            if self._searched >= MODEL_SEARCH_CALLS:
                self._model_found = True  # give up: the post-hook removes the hooks
                if not self._models:
                    for fix in MODEL_FIXES:
                        if fix in self.fixes:
                            self._record(
                                fix,
                                "not applied: no top-level module owns the optimizer's parameters",
                                applied=False,
                            )
            return None
        self._models += 1
        self._covered.update(id(p) for p in module.parameters())
        # every optimizer's model adopted (a GAN has two), or the inference model
        self._model_found = not self._opt_params or self._opt_params <= self._covered
        try:
            return self._adopt(module, args)
        except Exception as exc:
            self._failed("model", exc)
            return None

    def _post_hook(self, module: Any, args: Any, output: Any) -> None:
        self._tls.depth = max(0, getattr(self._tls, "depth", 1) - 1)
        if self._tls.depth == 0 and self._autocast_ctx is not None:
            ctx, self._autocast_ctx = self._autocast_ctx, None
            ctx.__exit__(None, None, None)
        if self._model_found and self._tls.depth == 0 and self._autocast_ctx is None:
            for handle in self._hooks:  # found and adopted: stop paying for global hooks
                handle.remove()
            self._hooks = []

    def _is_a_model(self, module: Any) -> bool:
        """A top-level module that owns optimizer parameters no adopted model owns."""
        if self._opt_params:
            return any(
                id(p) in self._opt_params and id(p) not in self._covered
                for p in module.parameters()
            )
        return next(module.parameters(), None) is not None  # inference: first with weights

    def _adopt(self, module: Any, args: tuple) -> Any:
        """Apply the model fixes to the module; returns new args for this first call."""
        import torch

        self._apply_globals(torch, again=True)
        inner = getattr(module, "module", module)  # DDP / DataParallel wrap the model
        device = next(module.parameters()).device
        new_args = None
        channels_last = "channels_last" in self.fixes and any(
            isinstance(m, torch.nn.Conv2d) for m in inner.modules()
        )
        if "channels_last" in self.fixes and not channels_last:
            self._record("channels_last", "not applied: the model has no Conv2d", False)
        if channels_last:
            module.to(memory_format=torch.channels_last)
            new_args = tuple(_to_channels_last(a, torch) for a in args)
            weights = [p for p in inner.parameters() if p.dim() == 4]
            self._record(
                "channels_last",
                f"{type(inner).__name__} and 4-D inputs in NHWC",
                verified=all(w.is_contiguous(memory_format=torch.channels_last) for w in weights),
            )
        autocast_dtype = None
        if "bf16_autocast" in self.fixes:
            if device.type == "cuda" or self.fixes["bf16_autocast"].get("cpu"):
                autocast_dtype = torch.bfloat16
                # this first call is already under way: wrap it from the hooks
                self._autocast_ctx = torch.autocast(device.type, dtype=autocast_dtype)
                self._autocast_ctx.__enter__()
                self._record(
                    "bf16_autocast",
                    f"forward of {type(inner).__name__} under "
                    f"torch.autocast({device.type!r}, bfloat16)",
                    verified=bool(torch.is_autocast_enabled(device.type))
                    and torch.get_autocast_dtype(device.type) == autocast_dtype,
                )
            else:
                self._record(
                    "bf16_autocast",
                    "not applied: CPU job (bf16 only on CUDA unless the plan sets cpu=true)",
                    False,
                )
        if "torch_compile" in self.fixes:
            # the inner model: DDP's own forward (bucketing, hooks) stays eager
            inner.forward = torch.compile(inner.forward)
            self._record(
                "torch_compile",
                f"torch.compile({type(inner).__name__}.forward)",
                verified=hasattr(inner.forward, "_torchdynamo_orig_callable"),
            )
        if channels_last or autocast_dtype is not None:
            module.forward = _wrapped_forward(
                module.forward, torch, channels_last, autocast_dtype, device.type
            )
        return new_args


def fused_or_foreach(
    signature: inspect.Signature, devices: set[Any], torch: Any
) -> tuple[str, str]:
    """'fused' where the optimizer class takes ``fused`` and the installed torch has fused
    kernels for every parameter device (CUDA; the CPU since torch 2.4), else 'foreach';
    with the reason, for the log."""
    if "fused" not in signature.parameters:
        return "foreach", "this optimizer has no fused implementation"
    try:
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

        supported = set(_get_fused_kernels_supported_devices())
    except Exception:  # older torch: fused on CUDA only
        supported = {"cuda"}
    kinds = {getattr(d, "type", None) for d in devices}
    if kinds and kinds <= supported:
        return (
            "fused",
            f"torch {torch.__version__.split('+')[0]} has fused kernels for {sorted(kinds)[0]}",
        )
    return (
        "foreach",
        f"no fused kernels for {', '.join(sorted(str(k) for k in kinds)) or 'these parameters'}",
    )


def _ddp_setting(ddp: Any, key: str) -> Any:
    if key == "static_graph":
        return bool(getattr(ddp, "static_graph", False))
    return getattr(ddp, key, None)


def _to_channels_last(value: Any, torch: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.dim() == 4:
        return value.contiguous(memory_format=torch.channels_last)
    return value


def _wrapped_forward(
    forward: Callable[..., Any], torch: Any, channels_last: bool, dtype: Any, device: str
) -> Callable[..., Any]:
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if channels_last:
            args = tuple(_to_channels_last(a, torch) for a in args)
        if dtype is not None:
            with torch.autocast(device, dtype=dtype):
                return forward(*args, **kwargs)
        return forward(*args, **kwargs)

    wrapped.__wrapped__ = forward  # type: ignore[attr-defined]
    return wrapped


def install_plan(path: str, writer: Callable[[], Any]) -> PlanApplier | None:
    """Entry point for the bootstrap: load and install, or say why not (one line)."""
    try:
        applier = PlanApplier(load_plan(path), writer)
        applier.install()
        return applier
    except Exception as exc:
        with contextlib.suppress(Exception):
            sys.stderr.write(f"stepscope: plan {path} not applied ({type(exc).__name__}: {exc})\n")
            writer().log("warning", "apply", f"plan not applied: {exc!r}")
        return None


__all__ = ["PlanApplier", "install_plan", "load_plan"]
