"""Apply a plan of fixes inside the job, with no change to the user's script.

The bootstrap calls ``install_plan`` right after ``import torch`` when the launcher
passed a plan (``STEPSCOPE_PLAN``, see ``collectors/launch/contract.py``). Fixes take effect
where the job creates the objects they concern, by wrapping constructors the script
calls anyway. The points are this module's; what happens at each is the fix's own hook
(``Fix.on_loader``, ``on_model``, ``ddp_kwargs``/``after_ddp``, ``set_global``, ``patch``),
called for the plan's fixes in catalog order:

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
  autocast around its forward only (backward runs outside, as the AMP recipe says),
  torch.compile of its forward (lazy: it traces at the first forward, after every model
  fix), activation checkpointing of its repeated blocks, and for inference jobs inference_mode and eval() (hooks
  of the model's own) and dynamic int8 quantisation of its Linear/LSTM layers;
* global settings (TF32, cudnn.benchmark, thread count) at import and again at the
  model's first call, in case the script set them in between;
* every outer ``generate()`` call (``on_generate``, ``install_generate.py``): its
  arguments (a static cache, compiling its decode step, prompt lookup, a draft model)
  and the model's attention implementation.

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

from stepscope import fixes as catalog
from stepscope.fixes.base import Fix
from stepscope.fixes.install_generate import GeneratePoint
from stepscope.fixes.points import (
    Change,
    LoaderCall,
    ModelCall,
    global_module_hooks_off,
    wrapped_forward,
)

# Top-level module calls looked at before the model search gives up: global hooks run on
# every module call of the training step, so they must not stay when nothing matches.
MODEL_SEARCH_CALLS = 50


def load_plan(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as fh:
        plan = json.load(fh)
    if not isinstance(plan, dict) or not isinstance(plan.get("fixes", {}), dict):
        raise ValueError(f"{path}: a plan is an object with a 'fixes' object")
    return plan


class PlanApplier(GeneratePoint):
    """Installs the plan's patches in this process and reports what they changed."""

    def __init__(self, plan: dict[str, Any], writer: Callable[[], Any]) -> None:
        wanted = {k: (v if isinstance(v, dict) else {}) for k, v in plan.get("fixes", {}).items()}
        self.unknown = sorted(set(wanted) - set(catalog.FIXES))
        # catalog order: a fix acting on what another creates comes after it
        self.fixes: list[tuple[Fix, dict[str, Any]]] = [
            (fix, wanted[fix.id]) for fix in catalog.FIXES.values() if fix.id in wanted
        ]
        self.override = bool(plan.get("override_explicit", True))
        self.seed = plan.get("seed")
        self._writer = writer
        self.applied: list[dict[str, Any]] = []
        self._loaders_logged = 0
        self._opt_params: set[int] = set()
        self._covered: set[int] = set()  # optimizer parameters of the models adopted
        self._models = 0
        self._model_found = False
        self._searched = 0
        self._hooks: list[Any] = []
        self._tls = threading.local()
        self._autocast_ctx: Any = None
        self._init_generate()

    def _with(self, hook: str) -> list[tuple[Fix, dict[str, Any]]]:
        """The plan's fixes that act at this point (``hook``: a Fix hook's name)."""
        return [(fix, params) for fix, params in self.fixes if getattr(fix, hook) is not None]

    # -- reporting ----------------------------------------------------------------------
    def record(
        self, fix: str, change: str, applied: bool = True, verified: bool | None = None
    ) -> None:
        entry = {"fix": fix, "change": change, "applied": applied, "verified": verified}
        self.applied.append(entry)
        with contextlib.suppress(Exception):
            w = self._writer()
            w.log("info" if applied else "warning", "apply", f"{fix}: {change}")
            # appended, not replaced: another process of the job that imports torch
            # (inductor's compile workers) installs the plan too and records its seeding
            w.merge_run_json("config", {"applied": [entry]}, appended=("applied",))

    def failed(self, fix: str, exc: BaseException) -> None:
        with contextlib.suppress(Exception):
            sys.stderr.write(f"stepscope: fix {fix} not applied ({type(exc).__name__}: {exc})\n")
        self.record(fix, f"not applied: {type(exc).__name__}: {exc}", applied=False)

    def _change(self, fix: str, change: Change) -> None:
        self.record(fix, change.text, change.applied, change.verified)

    # -- installation ---------------------------------------------------------------------
    def install(self) -> None:
        import torch  # in the job: torch is imported already when the bootstrap calls this

        for fix_id in self.unknown:
            self.record(fix_id, "not applied: not a fix of this stepscope", applied=False)
        if self.seed is not None:
            self._seed(int(self.seed))
        self._apply_globals(torch)
        steps: list[tuple[str, Callable[[Any], None]]] = [
            ("dataloader", self._patch_dataloader),
            ("optimizer", self._watch_optimizers),
            ("ddp", self._patch_ddp),
            ("model", self._install_model_hooks),
        ]
        for name, fn in steps:
            try:
                fn(torch)
            except Exception as exc:
                self.failed(name, exc)
        for fix, params in self._with("patch"):
            try:
                fix.patch(self, torch, params)
            except Exception as exc:
                self.failed(fix.id, exc)

    def _seed(self, seed: int) -> None:
        import random

        import torch

        random.seed(seed)
        torch.manual_seed(seed)
        with contextlib.suppress(Exception):
            import numpy as np

            np.random.seed(seed)
        self.record(
            "seed", f"RNGs seeded with {seed} (the job's own seeding still wins)", verified=True
        )

    def _apply_globals(self, torch: Any, again: bool = False) -> None:
        """Global switches; ``again`` at the model's first call, in case the script set
        them in between (logged again only if they had to change)."""
        for fix, params in self._with("set_global"):
            try:
                change = fix.set_global(torch, params)
            except Exception as exc:
                self.failed(fix.id, exc)
                continue
            if not again or change.changed:
                self._change(fix.id, change)

    # -- DataLoader -----------------------------------------------------------------------
    def _patch_dataloader(self, torch: Any) -> None:
        if not self._with("on_loader"):
            return
        from torch.utils.data import DataLoader, IterableDataset

        original = DataLoader.__init__
        signature = inspect.signature(original)
        applier = self

        @functools.wraps(original)
        def __init__(loader: Any, *args: Any, **kwargs: Any) -> None:
            try:
                call = applier._loader_call(signature, loader, args, kwargs, IterableDataset)
            except Exception as exc:
                applier.failed("dataloader", exc)
                call = None
            if call is None:
                original(loader, *args, **kwargs)
                return
            original(loader, **call.params)
            with contextlib.suppress(Exception):
                applier._verify_loader(loader, call)

        DataLoader.__init__ = __init__

    def _loader_call(
        self, signature: inspect.Signature, loader: Any, args: tuple, kwargs: dict, iterable: type
    ) -> LoaderCall:
        bound = signature.bind(loader, *args, **kwargs)
        params = dict(bound.arguments)
        params.pop(next(iter(signature.parameters)))  # self
        call = LoaderCall(
            fix="",
            params=params,
            explicit=set(params),
            signature=signature,
            override=self.override,
            iterable=isinstance(params.get("dataset"), iterable),
        )
        for fix, fix_params in self._with("on_loader"):
            call.fix = fix.id
            fix.on_loader(call, fix_params)
        return call

    def _verify_loader(self, loader: Any, call: LoaderCall) -> None:
        """Read the settings back from the loader the job will iterate."""
        if self._loaders_logged >= 4:
            return
        self._loaders_logged += 1
        for fix, what, applied, name in call.changes:
            verified = None
            if applied and name is not None:
                verified = getattr(loader, name, None) == call.params.get(name)
            self.record(fix, what, applied, verified)

    # -- optimizers: where the model's parameters become known ---------------------------
    def _watch_optimizers(self, torch: Any) -> None:
        """The model fixes look for the module that owns the optimizers' parameters."""
        if not (self._with("on_model") or self._with("patch")):
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

    # -- DDP ------------------------------------------------------------------------------
    def _patch_ddp(self, torch: Any) -> None:
        if not (self._with("ddp_kwargs") or self._with("after_ddp")):
            return
        from torch.nn.parallel import DistributedDataParallel as DDP

        original = DDP.__init__
        signature = inspect.signature(original)
        applier = self

        @functools.wraps(original)
        def __init__(ddp: Any, *args: Any, **kwargs: Any) -> None:
            explicit = set(signature.bind_partial(ddp, *args, **kwargs).arguments)
            settings: dict[str, tuple[str, Any]] = {}  # argument -> (fix, value)
            for fix, params in applier._with("ddp_kwargs"):
                for key, value in fix.ddp_kwargs(params).items():
                    if key in explicit and not applier.override:
                        applier.record(
                            fix.id,
                            f"not applied: kept the job's {key} (set explicitly; --keep-explicit)",
                            False,
                        )
                    else:
                        settings[key] = (fix.id, value)
            original(ddp, *args, **{**kwargs, **{k: v for k, (_, v) in settings.items()}})
            for key, (fix_id, value) in settings.items():
                was = (
                    "replacing the job's value" if key in explicit else "replacing torch's default"
                )
                # an argument DDP keeps as an attribute is read back; bucket_cap_mb is not
                verified = getattr(ddp, key) == value if hasattr(ddp, key) else None
                applier.record(
                    fix_id, f"DistributedDataParallel({key}={value!r}) ({was})", True, verified
                )
            for fix, params in applier._with("after_ddp"):
                try:
                    applier._change(fix.id, fix.after_ddp(ddp, params))
                except Exception as exc:
                    applier.failed(fix.id, exc)

        DDP.__init__ = __init__

    # -- the model ------------------------------------------------------------------------
    def _install_model_hooks(self, torch: Any) -> None:
        if not (self._with("on_model") or self._with("set_global")):
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
                    for fix, _ in self._with("on_model"):
                        self.record(
                            fix.id,
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
            self.failed("model", exc)
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
        import torch  # in the job: imported already

        self._apply_globals(torch, again=True)
        call = ModelCall(
            fix="",
            module=module,
            inner=getattr(module, "module", module),  # DDP / DataParallel wrap the model
            device=next(module.parameters()).device,
            args=args,
            torch=torch,
            report=self._change,
        )
        with global_module_hooks_off(torch):
            for fix, params in self._with("on_model"):
                call.fix = fix.id
                try:
                    fix.on_model(call, params)
                except Exception as exc:
                    self.failed(fix.id, exc)
        self._autocast_ctx = call.autocast_ctx  # this first call is already under way
        for fix_id, change in call.changes:
            self._change(fix_id, change)
        if call.channels_last or call.autocast_dtype is not None:
            module.forward = wrapped_forward(
                module.forward, torch, call.channels_last, call.autocast_dtype, call.device.type
            )
        return call.new_args


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
