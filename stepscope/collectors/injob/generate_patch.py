"""Hugging Face's ``generate()`` as a request: the wrapper the bootstrap installs.

Installed when ``transformers.generation.utils`` is imported (the bootstrap's import
hook), on ``GenerationMixin.generate``: every model's generate, a pipeline's included. A
call begins a request in the step timer (``steps/generation_steps.py``), gives the plan's
generation fixes their say on its arguments (``fixes/install.py``: a static cache,
prompt lookup, a draft model), and ends the request with what it returned or raised;
the call itself, its arguments (where no fix changed them), its result and its
exception pass through unchanged. A nested call (an assistant model's generate inside)
is part of the request around it.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

# What a plan's generation fixes do to a call: (model, kwargs, args) -> kwargs to use.
KwargsHook = Callable[[Any, dict[str, Any], tuple[Any, ...]], dict[str, Any]]
_kwargs_hooks: list[KwargsHook] = []


def add_kwargs_hook(hook: KwargsHook) -> None:
    """Called by the plan's installer: ``hook`` sees every outer generate() call first."""
    _kwargs_hooks.append(hook)


def install() -> bool:
    """Wrap ``GenerationMixin.generate`` once; False where transformers has none."""
    module = sys.modules.get("transformers.generation.utils")
    mixin = getattr(module, "GenerationMixin", None)
    original = getattr(mixin, "generate", None)
    if original is None or getattr(original, "__stepscope__", False):
        return False
    mixin.generate = _wrapped(original)
    return True


def uninstall() -> None:
    """Put the original generate() back (an attach detaching), unless something else
    has wrapped ours since: then ours stays, and records nothing once the timer is gone."""
    module = sys.modules.get("transformers.generation.utils")
    mixin = getattr(module, "GenerationMixin", None)
    current = getattr(mixin, "generate", None)
    if current is not None and getattr(current, "__stepscope__", False):
        mixin.generate = current.__wrapped__
    _kwargs_hooks.clear()


def _wrapped(original: Callable[..., Any]) -> Callable[..., Any]:
    # local: the step timer module is loaded already (torch came first); imported here so
    # that this module stays importable without it
    from stepscope.collectors.steps import step_timer

    @functools.wraps(original)
    def generate(self: Any, *args: Any, **kwargs: Any) -> Any:
        timer = step_timer.current()
        if timer is not None and timer.gen.sweep is not None and not timer.gen.sweep_done:
            timer.run_generation_sweep(original, self)  # a sweep trial: it ends the job
        request = timer.begin_generate(self, args, kwargs) if timer is not None else None
        if request is not None:
            for hook in _kwargs_hooks:
                try:
                    kwargs = hook(self, dict(kwargs), args)
                except Exception:  # the installer records its own failures
                    continue
            if _kwargs_hooks:
                timer.note_generate_settings(request, self, kwargs)  # as the fixes left them
        try:
            output = original(self, *args, **kwargs)
        except BaseException as exc:
            if timer is not None:
                timer.end_generate(request, None, exc)
            raise
        if timer is not None:
            timer.end_generate(request, output, None)
        return output

    generate.__stepscope__ = True  # type: ignore[attr-defined]
    return generate
