"""The model's outputs of an inference trial, for the output guard (``optim_runner/guards/output_guard``).

An inference job has no loss to compare, so an experiment asks each trial of an inference
job to keep what its model returned for the first calls (``"record_outputs": N`` in the
plan file): every arm runs with the same seed on the same inputs, so the baseline's and a
candidate's outputs can be compared call by call.

Decisions, and why:

* **The model's top-level calls only.** A global forward hook sees every module call;
  nested calls (depth > 0) are the model's own layers, and top-level calls of other
  modules (a softmax or a loss applied to the output) are not the model. The first
  top-level module that has weights is the model, as the fixes' installer decides.
* **The first tensor of the output**: a tensor; the first tensor of a tuple or list;
  ``logits`` of a dict or a ``ModelOutput`` (Hugging Face), else its first tensor.
  Detached and copied to the CPU as float32, so the comparison does not depend on the
  device or on a lower precision the candidate computed in.
* **Bounded.** At most ``MAX_ELEMENTS`` values over all calls (the first rows of the
  call that crosses it), so that a language model's logits cannot fill the disk; the
  rows kept are a prefix of the job's outputs, which is what the guard compares.
* **Out of the step timing as far as possible.** The hooks go as soon as N calls are
  recorded (global hooks take every module call off torch's fast path); the file is
  written in a thread when N is reached and at exit otherwise.
* **Never breaks the job.** Any failure removes the hooks and says so once in the run's
  log (source ``outputs``).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

PLAN_KEY = "record_outputs"
OUTPUTS_FILE = "outputs.pt"
ARTIFACT_KIND = "outputs"
# 4 M float32 values: 16 MB per trial at most.
MAX_ELEMENTS = 4 * 1024 * 1024


def calls_wanted(plan_path: str | None) -> int:
    """N from the plan file (0: record nothing)."""
    if not plan_path:
        return 0
    try:
        with open(plan_path, encoding="utf-8") as fh:
            plan = json.load(fh)
        return max(0, int(plan.get(PLAN_KEY) or 0)) if isinstance(plan, dict) else 0
    except Exception:
        return 0  # the plan's own loader says what is wrong with the file


def first_tensor(output: Any, torch: Any) -> Any:
    """The tensor that stands for a model's output; None when it returned none."""
    if isinstance(output, torch.Tensor):
        return output
    logits = None
    with contextlib.suppress(Exception):
        logits = output["logits"] if hasattr(output, "keys") else getattr(output, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if hasattr(output, "values"):
        output = list(output.values())
    if isinstance(output, (tuple, list)):
        for item in output:
            found = first_tensor(item, torch)
            if found is not None:
                return found
    return None


class OutputRecorder:
    """Global forward hooks that keep the model's first ``calls`` outputs."""

    def __init__(self, calls: int, run_dir: str, writer: Callable[[], Any], torch: Any) -> None:
        self.calls = calls
        self.path = os.path.join(run_dir, OUTPUTS_FILE)
        self._writer = writer
        self._torch = torch
        self._tls = threading.local()
        self._model: Any = None
        self.outputs: list[Any] = []
        self._elements = 0
        self._handles: list[Any] = []
        self._saved = False
        self._saver: threading.Thread | None = None
        self._lock = threading.Lock()

    def install(self) -> None:
        import torch.nn.modules.module as module_mod  # in the job: torch is imported

        self._handles = [
            module_mod.register_module_forward_pre_hook(self._pre_hook),
            module_mod.register_module_forward_hook(self._post_hook, always_call=True),
        ]

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    # -- hooks ----------------------------------------------------------------------------
    def _pre_hook(self, module: Any, args: Any) -> None:
        self._tls.depth = getattr(self._tls, "depth", 0) + 1

    def _post_hook(self, module: Any, args: Any, output: Any) -> None:
        depth = max(0, getattr(self._tls, "depth", 1) - 1)
        self._tls.depth = depth
        if depth != 0 or not self._handles:
            return
        try:
            self._top_level(module, output)
        except Exception as exc:
            self.disable(exc)

    def _top_level(self, module: Any, output: Any) -> None:
        if self._model is None:
            if next(module.parameters(), None) is None:
                return  # a softmax or a loss called on its own: not the model
            self._model = module
        elif module is not self._model:
            return
        tensor = first_tensor(output, self._torch)
        if tensor is None:
            raise TypeError(f"{type(module).__name__} returned no tensor to record")
        self._keep(tensor)
        if len(self.outputs) >= self.calls or self._elements >= MAX_ELEMENTS:
            self.remove()
            self._saver = threading.Thread(target=self.save, name="stepscope-outputs")
            self._saver.daemon = True
            self._saver.start()

    def _keep(self, tensor: Any) -> None:
        value = tensor.detach()
        if value.dim() == 0:
            value = value.reshape(1)
        room = MAX_ELEMENTS - self._elements
        row = max(1, value[0].numel())
        if value.numel() > room:
            value = value[: max(1, room // row)]
        self.outputs.append(value.to("cpu", self._torch.float32).clone())
        self._elements += value.numel()

    # -- the file -------------------------------------------------------------------------
    def save(self) -> None:
        """Write the outputs once (N reached, or at exit) and list the file as an artifact."""
        with self._lock:
            if self._saved or not self.outputs:
                return
            self._saved = True
            try:
                meta = {"model": type(self._model).__name__, "calls": len(self.outputs)}
                self._torch.save({"outputs": list(self.outputs), **meta}, self.path)
                self._writer().add_artifact(ARTIFACT_KIND, self.path, meta)
            except Exception as exc:
                self._log(f"outputs not recorded: {exc!r}")

    def at_exit(self) -> None:
        self.remove()
        saver = self._saver
        if saver is not None:
            saver.join(timeout=30)
        self.save()

    def disable(self, exc: BaseException) -> None:
        self.remove()
        self.outputs = []
        self._log(f"output recording disabled: {type(exc).__name__}: {exc}")

    def _log(self, message: str) -> None:
        with contextlib.suppress(Exception):
            sys.stderr.write(f"stepscope: {message}\n")
        with contextlib.suppress(Exception):
            self._writer().log("warning", "outputs", message)


def install_from_plan(
    plan_path: str | None, run_dir: str | None, writer: Callable[[], Any]
) -> OutputRecorder | None:
    """Entry point for the bootstrap: record the outputs when the plan asks for them.

    Returns the recorder (its ``at_exit`` is for the bootstrap's exit path), or None.
    """
    calls = calls_wanted(plan_path)
    if not calls or not run_dir:
        return None
    recorder = None
    try:
        import torch  # in the job: called right after the job imported torch

        recorder = OutputRecorder(calls, run_dir, writer, torch)
        recorder.install()
        return recorder
    except Exception as exc:
        if recorder is not None:
            recorder.disable(exc)
        else:
            with contextlib.suppress(Exception):
                writer().log("warning", "outputs", f"output recording disabled: {exc!r}")
        return None


__all__ = [
    "ARTIFACT_KIND",
    "MAX_ELEMENTS",
    "OUTPUTS_FILE",
    "PLAN_KEY",
    "OutputRecorder",
    "calls_wanted",
    "first_tensor",
    "install_from_plan",
]
