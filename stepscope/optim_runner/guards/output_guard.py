"""Output guard: does an inference job still answer the same with a fix applied?

An inference job has no loss, so the loss guard (``quality.py``) has nothing to compare.
Each trial of an inference job records its model's outputs for the first calls
(``collectors/trials/output_record.py``); every arm runs with the same seed on the same inputs,
so a candidate's outputs are compared with the baseline's. Decisions, and why:

* **Classifier or regression.** An output of shape (batch, classes) or (batch, tokens,
  vocabulary) whose last dimension is > 1 is taken for logits: what matters is the class
  chosen, so the figure is top-1 agreement (the share of rows, or tokens, whose argmax
  is the baseline's). Otherwise (one value per row, a scalar, an image) the figures are
  the largest absolute difference and the largest relative one, relative to the
  baseline's largest magnitude (an element-wise ratio explodes near zero).
* **Defaults.** ``DEFAULT_MIN_AGREEMENT`` = 0.99: bf16 autocast flips the arg-max only
  of near-ties, well under 1 % of rows on a trained classifier, while a broken
  conversion flips many; ``DEFAULT_OUTPUT_TOLERANCE`` = 1e-2 relative: bf16 keeps 8
  bits of mantissa (a relative rounding of 2^-9 = 0.2 % per value) and a few layers add
  up to about 1 %, while TF32 and thread-count changes stay orders of magnitude below.
  Both are set per experiment (``--output-tolerance``, ``--min-agreement``).
* **The tolerance is never tighter than the noise**, as for losses: the baseline's own
  trials are compared with each other (a job that is not bit-exact between runs:
  reductions in another order, a non-deterministic kernel), and a candidate is failed
  only beyond ``NOISE_FACTOR`` times that.
* **Calls are compared in order, as one sequence of rows.** Same batch size: call by
  call. A candidate that changes the batch size (``larger_batch``) gives the same
  per-sample outputs in fewer calls; the rows both recorded are compared. A change of
  the rows' shape, or NaN/inf where the baseline is finite, fails at once.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from itertools import combinations
from typing import Any

import numpy as np

from stepscope.analyzers.steps.latency import is_inference as inference_steps
from stepscope.optim_runner.guards.limits import DEFAULT_MIN_AGREEMENT, DEFAULT_OUTPUT_TOLERANCE
from stepscope.optim_runner.guards.quality import NOISE_FACTOR, QualityCheck
from stepscope.store import bounded_read
from stepscope.store.artifacts import kind_files

DEFAULT_RECORDED_CALLS = 8  # model calls recorded per trial ("record_outputs" in the plan)
OUTPUTS_KIND = "outputs"  # the artifact's kind (collectors/trials/output_record.ARTIFACT_KIND)
_TINY = 1e-12


@dataclass(frozen=True)
class OutputCheck(QualityCheck):
    """The guard's outcome, a ``QualityCheck`` (``drift``: the disagreement share or the
    largest relative difference; ``tolerance``: the limit applied to it) with the
    figures behind it."""

    kind: str = "outputs"
    measure: str | None = None  # 'top1_agreement' | 'max_rel_diff'
    agreement: float | None = None
    max_abs_diff: float | None = None
    max_rel_diff: float | None = None
    rows: int | None = None

    def to_json(self) -> dict[str, Any]:
        out = super().to_json()
        out.update(
            kind=self.kind,
            measure=self.measure,
            agreement=_round(self.agreement),
            max_abs_diff=_round(self.max_abs_diff),
            max_rel_diff=_round(self.max_rel_diff),
            rows=self.rows,
        )
        return out


@dataclass(frozen=True)
class Diff:
    """One candidate trial against one baseline trial."""

    classifier: bool
    rows: int
    agreement: float | None
    max_abs: float
    max_rel: float
    problem: str | None = None  # a shape change, non-finite values


# -- reading the recorded outputs ----------------------------------------------------------
def is_inference(store: Any, run_id: int) -> bool:
    """A run whose steps all end with a forward, with no optimizer and no backward."""
    run = store.run(run_id)
    if (run.get("facts") or {}).get("optimizer"):
        return False
    return inference_steps(store.steps(run_id))


def output_path(store: Any, run_id: int) -> str | None:
    """The local file of the trial's outputs (``store.artifacts``: local, or a copy)."""
    files = kind_files(store.artifacts(run_id), store.home, OUTPUTS_KIND)
    return str(files[-1]) if files else None


def load_outputs(store: Any, run_id: int) -> list[np.ndarray] | None:
    """The outputs a trial recorded, call by call (None: it recorded none)."""
    path = output_path(store, run_id)
    if path is None:
        return None
    import torch  # local: only experiments on inference jobs read these files

    size, cap = os.path.getsize(path), bounded_read.max_json_bytes()
    if size > cap:  # the row names the file: no bigger than a trace may be
        raise bounded_read.too_large(path, size, cap, so_far=False)
    data = torch.load(path, map_location="cpu", weights_only=True)
    return [t.float().numpy() for t in data["outputs"]]


# -- comparing -----------------------------------------------------------------------------
def is_logits(shape: tuple[int, ...]) -> bool:
    """(batch, classes) or (batch, tokens, vocabulary) with more than one class: logits.
    Other shapes (one value per row, an image) are regression outputs."""
    return len(shape) in (2, 3) and shape[-1] > 1


def as_rows(calls: list[Any]) -> np.ndarray:
    """The calls' outputs as one sequence of rows: a row per sample, per token for
    (batch, tokens, vocabulary) logits; a scalar output is a row of one."""
    parts = [np.asarray(c, dtype=np.float64) for c in calls]
    parts = [p.reshape(-1, 1) if p.ndim <= 1 else p for p in parts]
    parts = [p.reshape(-1, p.shape[-1]) if is_logits(p.shape) else p for p in parts]
    parts = [p.reshape(p.shape[0], -1) if p.ndim > 2 else p for p in parts]
    widths = {p.shape[1] for p in parts}
    if len(widths) > 1:
        raise ValueError(f"the model's outputs change shape between calls ({sorted(widths)})")
    return np.concatenate(parts) if parts else np.zeros((0, 1))


def compare(baseline: list[Any], candidate: list[Any]) -> Diff:
    """Top-1 agreement (last dimension > 1: logits) or largest differences, over the rows
    both recorded."""
    shapes = [np.shape(c)[1:] for c in baseline[:1]], [np.shape(c)[1:] for c in candidate[:1]]
    if shapes[0] != shapes[1]:
        return Diff(
            False, 0, None, np.inf, np.inf, f"output shape changed: {shapes[0]} -> {shapes[1]}"
        )
    base, cand = as_rows(baseline), as_rows(candidate)
    n = min(len(base), len(cand))
    base, cand = base[:n], cand[:n]
    classifier = bool(baseline) and is_logits(np.shape(baseline[0]))
    finite = np.isfinite(base)
    if n == 0:
        return Diff(classifier, 0, None, 0.0, 0.0, "no outputs in common to compare")
    if (~np.isfinite(cand) & finite).any():
        return Diff(classifier, n, None, np.inf, np.inf, "outputs are NaN or infinite")
    diff = np.abs(np.where(finite, cand - base, 0.0))
    max_abs = float(diff.max())
    scale = float(np.abs(base[finite]).max()) if finite.any() else 0.0
    max_rel = max_abs / max(scale, _TINY)
    agreement = None
    if classifier:
        agreement = float(np.mean(base.argmax(axis=1) == cand.argmax(axis=1)))
    return Diff(classifier, n, agreement, max_abs, max_rel)


def check_outputs(
    baseline: list[list[Any]],
    candidate: list[list[Any]],
    tolerance: float = DEFAULT_OUTPUT_TOLERANCE,
    min_agreement: float = DEFAULT_MIN_AGREEMENT,
) -> OutputCheck:
    """Compare each candidate trial's outputs with the first baseline trial's; the worst
    trial decides. ``baseline``/``candidate``: per trial, the outputs call by call."""
    base = [b for b in baseline if b]
    cand = [c for c in candidate if c]
    if not base:
        return OutputCheck(None, "the baseline recorded no outputs: not checked")
    if not cand:
        return OutputCheck(False, "the candidate recorded no outputs while the baseline did")
    noise = [compare(a, b) for a, b in combinations(base, 2)]
    diffs = [compare(base[0], c) for c in cand]
    bad = next((d for d in diffs if d.problem), None)
    if bad is not None:
        return OutputCheck(False, f"outputs changed: {bad.problem}", kind="outputs")
    if diffs[0].classifier:
        noise_gap = max((_gap(d) for d in noise if not d.problem), default=0.0)
        allowed = max(1.0 - min_agreement, NOISE_FACTOR * noise_gap)
        worst = max(diffs, key=_gap)
        gap = _gap(worst)
        what = (
            f"top-1 agreement {100 * (1 - gap):.3g} % over {worst.rows} rows "
            f"(at least {100 * (1 - allowed):.3g} % needed; largest difference "
            f"{worst.max_rel:.2g} of the output's scale)"
        )
        return OutputCheck(
            gap <= allowed,
            ("outputs kept: " if gap <= allowed else "outputs changed: ") + what,
            gap,
            allowed,
            noise_gap,
            measure="top1_agreement",
            agreement=1 - gap,
            max_abs_diff=worst.max_abs,
            max_rel_diff=worst.max_rel,
            rows=worst.rows,
        )
    noise_rel = max((d.max_rel for d in noise if not d.problem), default=0.0)
    allowed = max(tolerance, NOISE_FACTOR * noise_rel)
    worst = max(diffs, key=lambda d: d.max_rel)
    what = (
        f"largest difference {worst.max_abs:.3g} ({worst.max_rel:.3g} of the output's "
        f"scale, tolerance {allowed:.3g}) over {worst.rows} rows"
    )
    ok = worst.max_rel <= allowed
    return OutputCheck(
        ok,
        ("outputs kept: " if ok else "outputs changed: ") + what,
        worst.max_rel,
        allowed,
        noise_rel,
        measure="max_rel_diff",
        max_abs_diff=worst.max_abs,
        max_rel_diff=worst.max_rel,
        rows=worst.rows,
    )


def check_limits(output_tolerance: float | None, min_agreement: float | None) -> None:
    """One line for a limit out of range (ValueError)."""
    if output_tolerance is not None and not output_tolerance >= 0:
        raise ValueError(f"--output-tolerance must be >= 0 (got {output_tolerance})")
    if min_agreement is not None and not 0 <= min_agreement <= 1:
        raise ValueError(f"--min-agreement must be between 0 and 1 (got {min_agreement})")


def _gap(diff: Diff) -> float:
    """The share of rows whose top-1 class differs."""
    return 0.0 if diff.agreement is None else 1.0 - diff.agreement


def _or(value: Any, default: float) -> float:
    return float(default if value is None else value)


def _round(value: float | None) -> float | None:
    return None if value is None or not np.isfinite(value) else round(float(value), 6)


__all__ = [
    "DEFAULT_MIN_AGREEMENT",
    "DEFAULT_OUTPUT_TOLERANCE",
    "DEFAULT_RECORDED_CALLS",
    "Diff",
    "OutputCheck",
    "as_rows",
    "is_logits",
    "check_limits",
    "check_outputs",
    "compare",
    "is_inference",
    "load_outputs",
]
