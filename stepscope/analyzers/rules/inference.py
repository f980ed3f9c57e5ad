"""Inference rules: a job that only runs its model forward, and how it runs it.

An inference job is one whose step timer saw forward steps and neither an optimizer nor
a backward (``collectors/facts/job_facts.py``: ``facts["forward"]``, counted once per step).
Three of its habits cost time or results, each a plain ``Evidence -> Finding | None``:

* ``inference_grad``: the forward runs under grad mode (no ``inference_mode`` or
  ``no_grad``): autograd records a graph nobody uses, and fused inference paths stay off;
* ``inference_train_mode``: the model is in training mode with dropout or batch norm
  layers: its outputs are not the model's predictions (a warning: share, no weight);
* ``small_batch``: one sample per step in a loop that is not waiting for data (not in a
  generation job, whose steps are requests: ``rules.generation.decode_batch_one``).

Compute-bound inference (GEMMs, convolutions) is ``rules.compute.device_compute``'s, whose
fixes include the inference ones (int8 quantisation on the CPU, CUDA graphs).
"""

from __future__ import annotations

from typing import Any

from stepscope.analyzers.rules.evidence import Evidence
from stepscope.analyzers.rules.readings import data_wait, pct, step_phase_shares
from stepscope.analyzers.rules.thresholds import (
    INFERENCE_GRAD_WEIGHT,
    INFERENCE_MODE_MIN,
    INPUT_HIGH,
    SMALL_BATCH_MAX,
    SMALL_BATCH_WEIGHT,
)
from stepscope.types import EvidenceItem, Finding

SOURCE = "job facts"


def inference_facts(ev: Evidence) -> dict[str, Any] | None:
    """The forward steps' counts of an inference job; None for any other job."""
    facts = ev.context.facts
    forward = facts.get("forward") or {}
    if not forward.get("steps") or facts.get("optimizer") or forward.get("backward"):
        return None
    return forward


def _forward_share(ev: Evidence) -> tuple[float, str]:
    """The forward phase's share of step time, else the step time not waiting for data."""
    shares, source = step_phase_shares(ev)
    if shares and shares.get("forward"):
        return float(shares["forward"]), source
    data, source = data_wait(ev)
    return 1.0 - (data or 0.0), source or "step timer"


def _model_item(ev: Evidence) -> list[EvidenceItem]:
    model = ev.context.model
    if not model.get("class"):
        return []
    params = model.get("parameters")
    text = f"model {model['class']}" + (f", {params:,} parameters" if params else "")
    return [EvidenceItem.of(text, params, SOURCE)]


def inference_grad(ev: Evidence) -> Finding | None:
    forward = inference_facts(ev)
    if forward is None:
        return None
    steps, grad = int(forward["steps"]), int(forward.get("grad_steps") or 0)
    fraction = grad / steps
    if fraction < INFERENCE_MODE_MIN:
        return None
    share, source = _forward_share(ev)
    evidence = [
        EvidenceItem.of(
            f"{grad} of {steps} forward steps ran under grad mode (autograd recording: "
            "no torch.inference_mode() or torch.no_grad())",
            fraction,
            SOURCE,
        ),
        EvidenceItem.of(
            "no optimizer and no backward in the job: the recorded graph is never used",
            None,
            SOURCE,
        ),
        EvidenceItem.of(f"forward {pct(share)} of step time", share, source),
        *_model_item(ev),
    ]
    return Finding(
        "compute",
        "inference_grad",
        "Inference records gradients: forward under grad mode, no backward",
        share * fraction,
        0.9,
        evidence,
        weight=INFERENCE_GRAD_WEIGHT,
        phase="forward",
    )


def inference_train_mode(ev: Evidence) -> Finding | None:
    forward = inference_facts(ev)
    layers = ev.context.model.get("mode_dependent")
    if forward is None or not layers:
        return None
    steps, train = int(forward["steps"]), int(forward.get("train_mode_steps") or 0)
    fraction = train / steps
    if fraction < INFERENCE_MODE_MIN:
        return None
    share, _ = _forward_share(ev)
    names = ", ".join(layers)
    evidence = [
        EvidenceItem.of(
            f"{train} of {steps} forward steps with the model in training mode", fraction, SOURCE
        ),
        EvidenceItem.of(
            f"it has {names} layers: in training mode dropout zeroes random activations and "
            "batch norm uses each batch's statistics (and updates its running ones)",
            None,
            SOURCE,
        ),
        EvidenceItem.of(
            "a warning about results, not a speed finding: eval() changes the outputs "
            "(applied only with consent)",
            None,
            "stepscope",
        ),
    ]
    return Finding(
        "compute",
        "inference_train_mode",
        f"Model in training mode during inference: {names} change its outputs",
        share * fraction,
        0.9,
        evidence,
        weight=0.0,  # ranks by nothing it costs: shown, after the findings that cost time
        phase="forward",
    )


def samples_per_step(ev: Evidence) -> tuple[float | None, str]:
    """Samples per step from the step timer's rates, else the loader's batch size."""
    steps = ev.steps or {}
    rate, step_rate = steps.get("samples_per_s"), steps.get("steps_per_s")
    if rate and step_rate:
        return float(rate) / float(step_rate), "step timer"
    sizes = [ld.get("batch_size") for ld in ev.context.loaders if ld.get("batch_size")]
    if sizes:
        return float(sizes[0]), SOURCE
    return None, ""


def small_batch(ev: Evidence) -> Finding | None:
    if inference_facts(ev) is None or ev.generation is not None:
        return None  # a generation job batches prompts, not a DataLoader (rules.generation)
    batch, source = samples_per_step(ev)
    if batch is None or batch > SMALL_BATCH_MAX:
        return None
    data, data_source = data_wait(ev)
    if data is not None and data >= INPUT_HIGH:
        return None  # waiting for data: the input rule's finding
    share = 1.0 - (data or 0.0)
    evidence = [
        EvidenceItem.of(f"{batch:g} sample per forward step", batch, source),
        EvidenceItem.of(
            f"not waiting for data {pct(share)} of step time", share, data_source or source
        ),
        EvidenceItem.of(
            "every call pays its fixed costs (Python, dispatch, reading the weights) for "
            "one sample; if the job serves requests one by one, a batch trades latency for "
            "throughput: `stepscope optimize RUN --sweep batch` measures samples/s and p99 "
            "latency per batch size",
            None,
            "stepscope",
        ),
    ]
    return Finding(
        "compute",
        "small_batch",
        "Batch size 1: per-call costs paid for every sample",
        share,
        0.7,
        evidence,
        weight=SMALL_BATCH_WEIGHT,
        phase="forward",
    )
