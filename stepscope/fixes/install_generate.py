"""The installer's ``generate()`` point: the plan's generation fixes at every outer call.

Hugging Face's ``GenerationMixin.generate`` is wrapped by the collectors
(``collectors/injob/generate_patch.py``, a layer above: the fixes may not import it); the
bootstrap hands this point's ``on_generate`` to that wrapper (``add_kwargs_hook``), which
calls it with the model and the call's keyword arguments before each outer call. Each
generation fix (``Fix.on_generate``) sees a ``GenerateCall`` (``points.py``) and says
which arguments it wants changed (a static cache, prompt lookup, a draft model) or
changes the model (its attention implementation). A mixin of ``install.PlanApplier``:
the installer's reporting (``record``, ``failed``) and its plan (``_with``) are its own.
"""

from __future__ import annotations

from typing import Any

from stepscope.fixes.points import GenerateCall, prompt_rows


class GeneratePoint:
    """``PlanApplier``'s generate() point (see the module docstring)."""

    override: bool

    def _init_generate(self) -> None:
        self._gen_state: dict[str, dict[str, Any]] = {}  # per generation fix, across calls
        self._gen_seen: set[tuple[str, int]] = set()  # (fix, model) pairs already seen
        self._gen_logged: set[tuple[str, str]] = set()  # changes recorded once per job

    def on_generate(
        self, model: Any, kwargs: dict[str, Any], args: tuple[Any, ...] = ()
    ) -> dict[str, Any]:
        """At every outer generate() call: the plan's generation fixes in catalog order;
        returns the keyword arguments to call it with. A change is recorded once per job
        (read back from those arguments); a fix that fails leaves them as they were, and
        nothing raises into the job."""
        fixes = self._with("on_generate")
        if not fixes:
            return kwargs
        try:
            import torch  # in the job: imported already

            rows = prompt_rows(args, kwargs, torch)
            call = GenerateCall("", model, dict(kwargs), set(kwargs), rows, self.override, torch)
            for fix, params in fixes:
                call.fix, call.state = fix.id, self._gen_state.setdefault(fix.id, {})
                call.new_model = (fix.id, id(model)) not in self._gen_seen
                self._gen_seen.add((fix.id, id(model)))
                before = dict(call.kwargs)
                try:
                    fix.on_generate(call, params)
                except Exception as exc:
                    call.kwargs = before
                    call.refuse(f"{type(exc).__name__}: {exc}")
            for fix_id, change, name in call.changes:
                if (fix_id, change.text) not in self._gen_logged:
                    self._gen_logged.add((fix_id, change.text))
                    verified = call.reads_back(name) if name else change.verified
                    self.record(fix_id, change.text, change.applied, verified)
            return call.kwargs
        except Exception as exc:
            if ("generate", repr(exc)) not in self._gen_logged:
                self._gen_logged.add(("generate", repr(exc)))
                self.failed("generate", exc)
            return kwargs


__all__ = ["GeneratePoint"]
