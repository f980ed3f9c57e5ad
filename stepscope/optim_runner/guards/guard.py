"""Which guard judges a candidate: its generated tokens, its outputs, or its losses.

A trial keeps what its job's answer is: a generation job its generated tokens
(``token_guard``), an inference job its model's outputs (``output_guard``), a training
job its losses (``quality``). The baseline's trials say which one this experiment has.
"""

from __future__ import annotations

from typing import Any

from stepscope.optim_runner.guards.output_guard import (
    DEFAULT_MIN_AGREEMENT,
    DEFAULT_OUTPUT_TOLERANCE,
    check_outputs,
    load_outputs,
)
from stepscope.optim_runner.guards.quality import QualityCheck, check_quality, loss_series
from stepscope.optim_runner.guards.token_guard import check_tokens, load_tokens


def guard_candidate(
    store: Any,
    baseline_runs: list[int],
    candidate_runs: list[int],
    tolerance: float,
    limits: dict[str, Any] | None = None,
    lossless: bool = False,
) -> QualityCheck:
    """The guard for one candidate: on its generated tokens when the baseline trials
    kept tokens (a generation job), on its outputs when they recorded outputs (an
    inference job), else on its losses (``quality.check_quality``).

    ``limits``: ``output_tolerance`` and ``min_agreement`` (None: the defaults);
    ``lossless``: the candidate's fixes keep numerics (its tokens must all stay).
    """
    limits = limits or {}
    min_agreement = _or(limits.get("min_agreement"), DEFAULT_MIN_AGREEMENT)
    base_tokens = [load_tokens(store, r) for r in baseline_runs]
    if any(t is not None for t in base_tokens):
        return check_tokens(
            [t or [] for t in base_tokens],
            [load_tokens(store, r) or [] for r in candidate_runs],
            min_agreement=min_agreement,
            lossless=lossless,
        )
    base_outputs = [load_outputs(store, r) for r in baseline_runs]
    if any(o is not None for o in base_outputs):
        return check_outputs(
            [o or [] for o in base_outputs],
            [load_outputs(store, r) or [] for r in candidate_runs],
            tolerance=_or(limits.get("output_tolerance"), DEFAULT_OUTPUT_TOLERANCE),
            min_agreement=min_agreement,
        )
    losses = [loss_series(store.steps(r)) for r in baseline_runs]
    return check_quality(losses, [loss_series(store.steps(r)) for r in candidate_runs], tolerance)


def _or(value: Any, default: float) -> float:
    return float(default if value is None else value)


__all__ = ["guard_candidate"]
